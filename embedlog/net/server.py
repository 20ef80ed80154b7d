"""The bookie server: one Bookie's connections on asyncio, their limits and flow control.

What a request does is the RequestProcessor's (net/processor.py), whatever its protocol.
Every connection has one read loop here (_read_frames), which reads each frame's length,
keeps the limits and the flow control, and hands the frame to its protocol's decoder:
embedlog's (net/elserver.py's EmbedlogFrames: AUTH, and refusals past the throttle time),
or BookKeeper's v3 and v2 (net/bkserver.py's BookKeeperSession: back-pressure only), told
apart by the first byte of a connection's first message. The whole frames of a read that
comes while the loop waits between frames are taken in the transport's callback
(_take_frames), whatever the protocol.

Adds are framed and journalled on the event loop (the bookie's lock is held only to
frame them); the reply is sent once they are durable. The adds of one loop step wait
together: when the journal is idle and its fdatasync quick (under 0.5 ms), the loop syncs
them itself, so a lone add crosses no thread; otherwise the journal thread syncs them and
hands completions over through one queue (net/completions.py: one wake-up per group
commit, one write per connection per drain), and the loop never waits. A malformed,
oversized or truncated frame of embedlog's gets an error reply and the connection is
closed; other connections go on.

Resource limits (docs/SECURITY.md): each request read holds a share of the connection's
and the bookie's in-flight limits until it is answered; at a limit the connection is not
read (back-pressure) for up to max_throttle_time_ms, then its requests get
ETOOMANYREQUESTS. A frame still arriving holds the bytes that arrived of it, not the length
it declares, and frames still arriving may together hold half of max_in_flight_bytes (one
address a share of that); a long poll waiting for the LAC holds no share of the in-flight
limits but one of the long-poll bounds. Connections past max_connections are refused unless
an idle one gives way (the least recently used), idle ones get GOAWAY.
"""
from __future__ import annotations

import asyncio
import fcntl
import logging
import struct
import termios
import time

from embedlog.net import protocol as P
from embedlog.net.bkserver import BookKeeperSession, first_byte_protocol
from embedlog.net.completions import Completions
from embedlog.net.elserver import EmbedlogFrames, EmbedlogRequests
from embedlog.net.framereader import FrameReader
from embedlog.net.longpolls import LongPolls
from embedlog.net.processor import RequestProcessor

log = logging.getLogger("embedlog.server")


AUTH_TIMEOUT_S = 10.0       # to finish the TLS handshake, and to AUTH when a token is set
MAX_AUTH_FAILURES = 10      # refused requests before an unauthenticated connection is closed
GOAWAY_GRACE_S = 2.0        # after GOAWAY, requests already on their way are still served
READ_BUFFER_BYTES = 64 * 1024   # what a connection's reader holds ahead of the frame asked for
SKIP_CHUNK = 64 * 1024      # a refused frame is read and dropped this much at a time
UNPROVEN_GRACE_S = 1.0      # a new connection's time to send its first request before a
                            # newer one may take its slot at the connection limits; and
                            # how long a connection must have been idle to give its slot
IDLE_FRAME_S = 1.0          # a partial frame that got no byte for this long gives its bytes
                            # (and its connection) back when another frame needs the room
ROOM_RECHECK_S = 0.1        # a frame waiting for room looks again for idle frames this often


class _Connection:
    """One client connection: what it has in flight, when it last sent a frame."""
    __slots__ = ("writer", "requests", "bytes", "opened", "last_active", "authenticated",
                 "auth_failures", "goaway_at", "closed", "refusing", "frame_started", "address",
                 "proven", "kind", "arriving", "progress_at", "held_back", "polls", "frame_left")

    def __init__(self, writer, now: float, authenticated: bool, address=None):
        self.writer = writer
        self.address = address
        self.frame_started = None  # loop time the frame being read began (None: between frames)
        self.progress_at = now     # loop time a byte of the frame being read last came
        self.arriving = 0          # bytes of frames not yet whole held (BookieServer.reading_bytes)
        self.frame_left = 0        # bytes of the frame being read still to come
        self.held_back = False     # waiting for room in the bookie's limits (not read meanwhile)
        self.polls: dict = {}      # its long polls waiting for the LAC (_Poll -> None)
        self.requests = self.bytes = self.auth_failures = 0
        self.opened = self.last_active = now
        self.authenticated = authenticated
        self.goaway_at = None
        self.closed = False
        self.refusing = False      # a throttle ran out: refuse at once until there is room
        self.proven = False        # a request of it got past the checks (AUTH, if asked)
        self.kind = "embedlog"     # or "bookkeeper": a BookKeeper client's (net/bkserver.py)


class ServerObserver:
    """What a BookieServer tells the objects in its ``observers`` list (the admin server's
    metrics are one): subclass it or give the same methods. They run on the server's event
    loop, so they must be quick and never block."""

    def request_done(self, op: str, status: int, seconds: float | None, key=None,
                     entries: int = 0, requests: int = 1) -> None:
        """``requests`` requests were answered alike, whatever their protocol (a run of a
        BookKeeper client's adds is answered at once): ``op`` as embedlog's protocol names
        it ("add", "read", "read_lac", "write_lac", ...), ``status`` embedlog's code (EOK =
        0), ``seconds`` after they were read (None for a long poll: it waits on purpose),
        ``key`` their ledger's (scope, id), ``entries`` the entries a writer's adds wrote
        (0 for recovery adds: a copy, not a write)."""

    def bookie_info(self) -> dict:
        """Figures to add to this bookie's BOOKIE_INFO answer."""
        return {}


class _Exchange:
    """Where one request's reply goes (the handlers' ``writer``): the first reply releases
    the request's share of the in-flight limits, even when the connection is gone, and is
    reported to the server's observers."""
    __slots__ = ("server", "conn", "nbytes", "answered", "req", "started")

    def __init__(self, server, conn, nbytes: int, req=None, started: float = 0.0):
        self.server, self.conn, self.nbytes, self.answered = server, conn, nbytes, False
        self.req, self.started = req, started

    def is_closing(self) -> bool:
        return self.answered

    def park(self) -> None:
        """The request waits without its share of the in-flight limits (a long poll): given
        back now, not again at the answer."""
        if not self.answered and self.nbytes is not None:
            self.server._release(self.conn, self.nbytes)
            self.nbytes = None

    def write(self, data) -> None:
        self._answer(data, data)

    def writelines(self, parts) -> None:
        """One reply in parts (the first holds its header): a read's entries go out as the
        reader framed them."""
        self._answer(parts, parts[0])

    def _answer(self, out, head) -> None:
        self.answered = True
        if self.nbytes is not None:
            self.server._release(self.conn, self.nbytes)
        if out is head:                # an add's answer: one part
            self.server.send(self.conn.writer, out)
        else:
            self.server.send(self.conn.writer, *out)
        if self.req is not None:
            self.server._observe(self.req, head, self.started)


class BookieServer:
    def __init__(self, bookie, host: str = "127.0.0.1", port: int = 0, *,
                 max_frame_bytes: int | None = None, max_long_poll_ms: int = 60_000,
                 ssl_context=None, auth_token: bytes | None = None, observers=(), loop=None,
                 bookkeeper_protocols: bool = True):
        """``observers``: ServerObservers told of every answered request (more may be
        appended to ``self.observers`` before start). ``loop``: the event loop ``dispatch``
        answers on when the server does not listen (net/transport.py's InProcessConnection).
        ``bookkeeper_protocols``: BookKeeper's v3 and v2 clients are served on the same port,
        told apart by the first byte of a connection's first message (net/bkserver.py); not
        with TLS or an auth token, which BookKeeper's clients here cannot meet."""
        self.bookie = bookie
        self.observers: list = list(observers)
        self.info: dict = {}                  # more fields for BOOKIE_INFO (the admin address)
        self.ssl_context = ssl_context        # an ssl.SSLContext: TLS on every connection
        self.auth_token = auth_token          # when set, each connection must AUTH first
        self.host, self.port = host, port
        self.bookkeeper_protocols = bookkeeper_protocols and ssl_context is None and auth_token is None
        cfg = bookie.config
        self.max_frame_bytes = max_frame_bytes or cfg.max_frame_size_bytes
        self.max_long_poll_ms = max_long_poll_ms
        self.max_connections = cfg.max_connections
        self.max_per_address = cfg.max_connections_per_address
        self.frame_timeout_s = cfg.frame_read_timeout_ms / 1000.0
        self._per_address: dict = {}      # remote address -> connections open
        self.max_requests_per_conn = cfg.max_in_flight_requests_per_connection
        self.max_bytes_per_conn = cfg.max_in_flight_bytes_per_connection
        self.max_requests = cfg.max_in_flight_requests
        self.max_bytes = cfg.max_in_flight_bytes
        self.max_throttle_s = cfg.max_throttle_time_ms / 1000.0
        self.idle_timeout_s = cfg.connection_idle_timeout_ms / 1000.0
        self.in_flight_requests = 0           # read, not yet answered, all connections
        self.in_flight_bytes = 0
        # bytes of frames not yet whole, counted as they arrive (a length prefix alone holds
        # nothing): they count against max_in_flight_bytes with those in flight, so partial
        # frames cannot hold more than it bookie-wide; together they may hold half of it,
        # so whole frames always find the other half, and one address a share of that half
        self.reading_bytes = 0
        # bytes of partial frames whose connection went before they were whole, ever: the
        # serving process gives the heap they held back to the system (cli/serve.py)
        self.dropped_frame_bytes = 0
        self.arriving_share = max(1, self.max_bytes // 2)
        self.address_share = min(self.arriving_share, max(self.max_bytes // 8, self.max_frame_bytes))
        self._arriving: set = set()          # connections holding bytes of a partial frame
        self._arriving_by_address: dict = {}  # remote address -> bytes of its partial frames
        # the one frame that may read on past the shares while others wait for room: it
        # finishes (or gives way when it stops arriving), so partial frames never all wait
        self._lead = None
        self._room_made_at = 0.0              # when _make_arrival_room last looked
        self._throttled = 0                   # connections waiting for room
        self._room_freed: asyncio.Event | None = None
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._conns: dict = {}            # writer -> _Connection
        # the journal thread's completions, one wake-up per group commit (net/completions.py)
        self.completions = Completions(loop)
        self.complete, self.send = self.completions.complete, self.completions.send
        self.stats = {"connections": 0, "requests": 0, "bad_frames": 0, "errors": 0,
                      "auth_failures": 0, "refused_connections": 0, "throttled": 0,
                      "rejected_requests": 0, "idle_closed": 0, "arrival_waits": 0,
                      "idle_frames_closed": 0, "long_polls_over_bound": 0}
        # what a request asks of the bookie, whatever its protocol (net/processor.py), and
        # embedlog's protocol on it (net/elserver.py; BookKeeper's: net/bkserver.py)
        self.polls = LongPolls(bookie, cfg.max_long_polls, cfg.max_long_polls_per_connection,
                               self.stats)
        self.processor = RequestProcessor(bookie, self.complete, self.polls, self.stats, loop)
        self.when_durable = self.processor.when_durable
        self.sync_before_read = self.processor.sync_before_read
        self.requests = EmbedlogRequests(self)
        self.dispatch = self.requests.dispatch    # InProcessConnection's way in too

    async def start(self) -> None:
        self._loop = self.completions.loop = self.processor.loop = asyncio.get_running_loop()
        self._room_freed = asyncio.Event()
        tls = {} if self.ssl_context is None else {
            "ssl": self.ssl_context, "ssl_handshake_timeout": AUTH_TIMEOUT_S}
        # a small reader limit: a frame is read with read_frame (which reads past it), so
        # the limit only bounds what a connection buffers ahead of the frame it is on
        # (asyncio.start_server with a FrameReader: the same protocol and limit)
        loop = self._loop

        def connection():
            reader = FrameReader(limit=READ_BUFFER_BYTES, loop=loop)
            return asyncio.StreamReaderProtocol(reader, self._serve, loop=loop)

        self._server = await loop.create_server(connection, self.host, self.port, **tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = self._loop.create_task(self._sweep())

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def loop(self):
        """The event loop the server answers on."""
        return self._loop

    @property
    def long_polls(self) -> int:
        """Long polls waiting for the LAC, all connections."""
        return self.polls.count

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            await self._server.wait_closed()

    # -- connections ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats["connections"] += 1
        peer = writer.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) else str(peer)
        refused = None
        if len(self._conns) >= self.max_connections and not self._evict_idle(None):
            refused = f"too many connections (max_connections={self.max_connections})"
        elif self._per_address.get(address, 0) >= self.max_per_address and \
                not self._evict_idle(address):
            refused = (f"too many connections from {address} "
                       f"(max_connections_per_address={self.max_per_address})")
        if refused is not None:
            self.stats["refused_connections"] += 1
            writer.write(P.error_response(0, 0, 0, P.ETOOMANYREQUESTS, 0, 0, refused))
            try:
                await writer.drain()
            except ConnectionError:
                pass
            writer.close()
            return
        conn = _Connection(writer, self._loop.time(), self.auth_token is None, address)
        self._conns[writer] = conn
        self._per_address[address] = self._per_address.get(address, 0) + 1
        # a frame not whole at once is charged as its bytes come (FrameReader.charge)
        reader.charge = lambda k: self._arrived(conn, k, reader.frame_left())
        reader.room = lambda: self.wait_arrival_room(conn, reader)
        try:
            await self._read_frames(conn, reader, writer)
        finally:
            self._drop(conn)
            writer.close()

    def _frames_of(self, conn, writer, kind: str):
        """The frame decoder of a connection whose first message began as ``kind`` says."""
        if kind == "embedlog":
            return EmbedlogFrames(self, conn)
        conn.kind = "bookkeeper"
        conn.authenticated = True
        key = f"bk_{kind}_connections"
        self.stats[key] = self.stats.get(key, 0) + 1
        return BookKeeperSession(self, conn, writer, kind)

    async def _read_frames(self, conn, reader, writer) -> None:
        """A connection's one read loop, whatever its protocol: each frame's length read, its
        size checked against the decoder's limits, room waited for in the in-flight limits
        (at most max_throttle_time_ms, then refused, for a decoder that ``refuses``;
        otherwise as long as it takes), the frame read (counted as its bytes arrive) and
        handed to the decoder, which decodes it and takes its requests. Between frames, the
        whole frames of a read that comes (or is already buffered) are taken at once
        (_take_frames). The decoder (``frames``) is told by the first byte of the first
        message (bkserver.first_byte_protocol): embedlog's (net/elserver.py) or BookKeeper's
        v3 and v2 (net/bkserver.py)."""
        stats, loop = self.stats, self._loop
        frames = None if self.bookkeeper_protocols else EmbedlogFrames(self, conn)
        first_frame = True

        def take_frames(data) -> int:
            return self._take_frames(conn, frames, reader, data, False)

        def take_buffered(data) -> int:
            return self._take_frames(conn, frames, reader, data, True)

        while True:
            try:
                if conn.authenticated and not first_frame:
                    if reader.has_data():
                        reader.take_buffered(take_buffered)
                    reader.take_frames = take_frames
                # a frame's clock starts at its first byte: a trickled frame is cut off
                # (the sweeper), an idle connection between frames is not
                self.sync_before_read(reader)
                try:
                    first = await reader.readexactly(1)
                finally:
                    reader.take_frames = None
                conn.frame_started = conn.progress_at = loop.time()
                head = first + await reader.readexactly(3)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            (n,) = P.LENGTH.unpack(head)
            peek = b""
            if frames is None:
                kind = "embedlog"
                if n >= 1:
                    # the first message's first byte: embedlog's version (0x01), a v3
                    # Request's header tag (0x0A) or a v2 packet's version (2, 3)
                    try:
                        peek = await reader.readexactly(1)
                    except (asyncio.IncompleteReadError, ConnectionError):
                        return
                    kind = first_byte_protocol(peek[0])
                frames = self._frames_of(conn, writer, kind)
            first_frame = False
            limit = frames.frame_limit()
            if n > limit or n < frames.min_frame_bytes:
                stats["bad_frames"] += 1
                answer = frames.bad_size(n, limit)
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
                return
            # back-pressure: while a limit is reached, the rest of the frame stays in the
            # socket (and TCP pushes back on the client); past the throttle time, refuse
            if self._has_room(conn, n):
                admitted, conn.refusing = True, False
            elif not frames.refuses:
                await self._hold_back(conn, n)
                if conn.closed:
                    return
                admitted = True
            elif conn.refusing:
                admitted = False
            else:
                admitted = await self._throttle(conn, n)
                conn.refusing = not admitted
            try:
                if admitted:
                    if frames.prefixed:      # the decoder reads the length with the frame
                        message = await reader.read_frame(4 + n, head=head + peek)
                    elif peek:
                        message = peek + await reader.read_frame(n - len(peek))
                    else:
                        message = await reader.read_frame(n)
                    # whole: its bytes are the request's now (a read that failed ends the
                    # connection, and _drop gives them back as dropped_frame_bytes)
                    self.set_arriving(conn, 0)
                else:
                    # refused: its header is all the answer needs; the rest is read
                    # and dropped a little at a time, never held whole
                    message = peek + await reader.readexactly(frames.refused_head - len(peek))
                    left = n - frames.refused_head
                    while left:
                        left -= len(await reader.readexactly(min(left, SKIP_CHUNK)))
            except (asyncio.IncompleteReadError, ConnectionError):
                stats["bad_frames"] += 1
                return
            conn.frame_started = None
            conn.last_active = loop.time()
            reqs, error = frames.decode_frame(message)
            if error is not None:
                stats["bad_frames"] += 1
                answer = frames.malformed(error)
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
                return
            stats["requests"] += len(reqs)
            if not admitted:
                stats["rejected_requests"] += len(reqs)
                writer.write(frames.refusal(reqs))
            elif conn.authenticated or frames.authenticate(reqs):
                conn.proven = True
                frames.take(reqs)
            elif conn.auth_failures >= MAX_AUTH_FAILURES:
                await writer.drain()
                return
            if writer.transport.get_write_buffer_size() > self.max_frame_bytes:
                await writer.drain()      # a slow reader gets back-pressure, not memory

    async def _hold_back(self, conn, n: int) -> None:
        """Back-pressure only (a decoder that never refuses): the connection is not read
        until there is room for ``n`` more bytes, however long; waiting holds no frame, so
        it is not a slow frame (frame_started)."""
        conn.frame_started = None
        self.stats["throttled"] += 1
        self._throttled += 1
        conn.held_back = True
        try:
            while not self._has_room(conn, n) and not conn.closed:
                self._room_freed.clear()
                await self._room_freed.wait()
        finally:
            conn.held_back = False
            self._throttled -= 1
        conn.frame_started = conn.progress_at = self._loop.time()

    def admit(self, conn, req, n: int) -> None:
        """Dispatch an embedlog request let in: it holds its share of the in-flight limits
        until answered (its _Exchange's first reply)."""
        self.hold(conn, 1, n)
        if self.observers:
            exchange = _Exchange(self, conn, n, req, time.perf_counter())
        else:
            exchange = _Exchange(self, conn, n)
        self.dispatch(req, exchange)

    def _take_frames(self, conn, frames, reader, data, buffered: bool) -> int:
        """The whole frames at the front of ``data``, a read that came while the connection's
        task waits between frames (or what its reader holds when the task comes back for
        the next frame: ``buffered``, then every request is copied out of it), taken here:
        a lone add does not wait a loop step for the task to wake and read its frame in
        three awaits. Each frame is checked against the limits and handed to the decoder
        (``take_at``: embedlog's takes its request at once, BookKeeper's decodes the frames
        of the read together in ``flush``, so runs of adds form). Returns the bytes taken.
        The task gets the rest from the first frame that needs it: one not whole, outside
        the frame limits, without room in flight, malformed, or behind a write buffer that
        wants draining; it handles that frame as any other."""
        if conn.closed or conn.refusing:
            return 0
        at, end = 0, len(data)
        view = memoryview(data)
        buffered_out = conn.writer.transport.get_write_buffer_size
        high, low, take_at = frames.max_frame_bytes, frames.min_frame_bytes, frames.take_at
        # a decoder that takes its requests at the end (``defers``) holds nothing yet: what
        # its frames will hold counts against the limits as they are walked
        defers = frames.defers
        count = held = 0
        while end - at >= 4:
            (n,) = P.LENGTH.unpack_from(view, at)
            # a request answered at once (a read) may fill the write buffer: past a frame's
            # worth the rest waits for the task, which drains it (a slow reader gets
            # back-pressure, not memory)
            if n > high or n < low or n > end - at - 4 or conn.closed or conn.refusing or \
                    not self._has_room(conn, n, count, held) or \
                    buffered_out() > self.max_frame_bytes or \
                    not take_at(view, at, n, buffered or n + 4 < end):
                break
            at += 4 + n
            if defers:
                count += 1
                held += n
        if at:
            at = frames.flush(view, at)
        if not at:
            return 0
        conn.proven = True
        conn.last_active = self._loop.time()
        if at == end and not buffered:
            self.sync_before_read(reader)
        return at

    def _evict_idle(self, address) -> bool:
        """Make room for a new connection (from ``address``, or any): close an idle one. First
        the oldest that never sent a request past the checks in UNPROVEN_GRACE_S; else the
        least recently used of those with nothing in flight (a long poll waiting for the
        LAC holds nothing in flight), no frame arriving (or one that got no byte in
        UNPROVEN_GRACE_S) and no request in UNPROVEN_GRACE_S: of either protocol, so idle
        connections never lock new clients out. One a client is using is never closed."""
        now = self._loop.time()
        idle = [c for c in self._conns.values()
                if not c.closed and c.requests == 0 and not c.held_back and c.goaway_at is None
                and (c.frame_started is None or now - c.progress_at > UNPROVEN_GRACE_S)
                and now - c.last_active > UNPROVEN_GRACE_S
                and (address is None or c.address == address)]
        if not idle:
            return False
        unproven = [c for c in idle if not c.proven]
        if unproven:
            victim = min(unproven, key=lambda c: c.opened)
            self.stats["evicted_idle"] = self.stats.get("evicted_idle", 0) + 1
        else:
            victim = min(idle, key=lambda c: c.last_active)
            self.stats["evicted_lru"] = self.stats.get("evicted_lru", 0) + 1
            if victim.kind == "embedlog":
                # its client opens a new connection for its next request (as after an idle
                # GOAWAY); nothing is in flight on this one
                victim.writer.write(P.goaway())
        self._drop(victim)            # its slot is free now; its task ends on the close
        victim.writer.close()
        return True

    # -- frames still arriving -----------------------------------------------------------

    def _arrived(self, conn, k: int, left: int) -> bool:
        """``k`` more bytes of the frame ``conn`` reads arrived (FrameReader.charge), ``left``
        still to come: counted now. False when it may take no more until there is room
        (arrival_room)."""
        if conn.closed:
            return False
        conn.frame_left = left
        self.set_arriving(conn, conn.arriving + k)
        return self.arrival_room(conn)

    def set_arriving(self, conn, k: int) -> None:
        """``conn`` holds ``k`` bytes of frames not yet whole (0: none, its frame is whole or
        gone)."""
        if conn.closed:
            k = 0                     # its bytes were given back when it was dropped
        delta = k - conn.arriving
        if not delta:
            return
        conn.arriving = k
        self.reading_bytes += delta
        by = self._arriving_by_address
        left = by.get(conn.address, 0) + delta
        if left > 0:
            by[conn.address] = left
        else:
            by.pop(conn.address, None)
        if delta > 0:
            conn.progress_at = self._loop.time()
            self._arriving.add(conn)
            return
        if not k:
            self._arriving.discard(conn)
            if self._lead is conn:
                self._lead = None
        if self._throttled:
            self._room_freed.set()

    def arrival_room(self, conn) -> bool:
        """May ``conn`` take more of the frame it is reading? Within max_in_flight_bytes
        (bytes in flight and arriving), and, but for the lead, within the half of it frames
        still arriving may hold and its address's share of that half."""
        if self.in_flight_bytes and self.in_flight_bytes + self.reading_bytes >= self.max_bytes:
            return False
        if conn is self._lead:
            return True
        return (self.reading_bytes < self.arriving_share
                and self._arriving_by_address.get(conn.address, 0) < self.address_share)

    async def wait_arrival_room(self, conn, reader) -> None:
        """Wait, not reading ``conn``, until it may take more of the frame it is reading, or
        it is gone (the frame's deadline still runs: the sweeper may close it)."""
        self.stats["arrival_waits"] += 1
        conn.held_back = True
        self._throttled += 1
        try:
            while not self.arrival_room(conn):
                if conn.closed or conn.writer.is_closing() or reader.exception() is not None:
                    return
                self._make_arrival_room()
                if self.arrival_room(conn):
                    return
                self._room_freed.clear()
                try:
                    await asyncio.wait_for(self._room_freed.wait(), ROOM_RECHECK_S)
                except asyncio.TimeoutError:
                    pass
        finally:
            conn.held_back = False
            self._throttled -= 1
            conn.progress_at = self._loop.time()

    def _make_arrival_room(self) -> None:
        """Frames wait for room (at most once a ROOM_RECHECK_S): partial frames that got no
        byte in IDLE_FRAME_S are closed, their bytes given back, when their client stopped
        sending them (being read, or waiting for room with nothing more of theirs in the
        socket: a client the bookie holds back has the socket's buffer full); and when no
        frame leads, a waiting one leads: it reads on past the shares until it is whole, so
        frames waiting for each other's room always finish. The lead is one whose rest is
        already in its socket if there is one (a client that sent its whole frame; one that
        keeps its last bytes back is not), else the frame that began last: frames that have
        been arriving longest are the likeliest to have stopped coming (a stalled lead is
        closed after IDLE_FRAME_S and the next one leads). Not the frame read last: a
        partial frame given freed room reads on from what its socket already holds, which
        says nothing of its client, and so outranked a whole frame waiting behind it, once
        per stalled lead, past the whole frame's client's timeout."""
        now = self._loop.time()
        if now - self._room_made_at < ROOM_RECHECK_S and self._lead is not None:
            return
        self._room_made_at = now
        queued = {}
        for c in list(self._arriving):
            if c.closed or now - c.progress_at <= IDLE_FRAME_S:
                continue
            if c.held_back:
                queued[c] = _queued_bytes(c)
                if queued[c]:
                    continue
            self.stats["idle_frames_closed"] += 1
            log.info("closing the connection from %s: its partial frame got no byte in %.1f s "
                     "while others wait for room", c.address, now - c.progress_at)
            self._drop(c)
            c.writer.close()
        lead = self._lead
        if lead is None or lead.closed or not lead.arriving:
            waiting = [c for c in self._arriving if c.held_back and not c.closed]
            if not waiting:
                self._lead = None
                return

            def rank(c):
                q = queued[c] if c in queued else _queued_bytes(c)
                return (q >= c.frame_left, c.frame_started or 0.0)
            self._lead = max(waiting, key=rank)
            self._room_freed.set()

    def _has_room(self, conn, n: int, count: int = 0, nbytes: int = 0) -> bool:
        # ``count`` requests of ``nbytes`` taken with it but not yet held count as held;
        # a frame is always let in when nothing else is in flight or arriving, so one larger
        # than a byte limit is not refused for ever; frames still arriving count up to their
        # share (the reads that crossed it while it filled hold the rest), so whole frames
        # always find the other half
        held = self.in_flight_bytes + nbytes + min(self.reading_bytes, self.arriving_share)
        mine = conn.bytes + nbytes
        return (conn.requests + count < self.max_requests_per_conn
                and (mine == 0 or mine + n <= self.max_bytes_per_conn)
                and self.in_flight_requests + count < self.max_requests
                and (held == 0 or held + n <= self.max_bytes))

    async def _throttle(self, conn, n: int) -> bool:
        """Wait (not reading this connection) until there is room for ``n`` more bytes;
        False after max_throttle_time_ms."""
        self.stats["throttled"] += 1
        deadline = self._loop.time() + self.max_throttle_s
        self._throttled += 1
        conn.held_back = True
        try:
            while not self._has_room(conn, n):
                left = deadline - self._loop.time()
                if left <= 0:
                    return False
                self._room_freed.clear()
                try:
                    await asyncio.wait_for(self._room_freed.wait(), left)
                except asyncio.TimeoutError:
                    pass
            return True
        finally:
            conn.held_back = False
            self._throttled -= 1

    def hold(self, conn, count: int, nbytes: int) -> None:
        """``count`` requests of ``nbytes`` read from ``conn`` hold their share of the
        in-flight limits until they are answered (release_many)."""
        conn.requests += count
        conn.bytes += nbytes
        self.in_flight_requests += count
        self.in_flight_bytes += nbytes

    def _release(self, conn, nbytes: int) -> None:
        self.release_many(conn, 1, nbytes)

    def release_many(self, conn, count: int, nbytes: int) -> None:
        if conn.closed:
            return
        conn.requests -= count
        conn.bytes -= nbytes
        self.in_flight_requests -= count
        self.in_flight_bytes -= nbytes
        if self._throttled:
            self._room_freed.set()

    def _drop(self, conn) -> None:
        """A connection ended: what it still had in flight no longer counts against the bookie
        (those requests finish; their replies go nowhere)."""
        if conn.closed:
            return                    # dropped already (evicted)
        self._conns.pop(conn.writer, None)
        left = self._per_address.get(conn.address, 1) - 1
        if left > 0:
            self._per_address[conn.address] = left
        else:
            self._per_address.pop(conn.address, None)
        self.dropped_frame_bytes += conn.arriving
        conn.closed = True
        self.in_flight_requests -= conn.requests
        self.in_flight_bytes -= conn.bytes
        self.set_arriving(conn, 0)
        if conn.polls:
            # answered as at their timeout, now: their slots of the long-poll bounds go with
            # the connection (the answers go nowhere)
            self.polls.end(list(conn.polls))
        if self._throttled:
            self._room_freed.set()

    async def _sweep(self) -> None:
        """Close connections that did not authenticate in time, and tell idle ones to go away
        (GOAWAY), closing them once the grace period is over and nothing is in flight."""
        period = min(1.0, max(0.05, (self.idle_timeout_s or 1.0) / 4, self.frame_timeout_s / 4))
        period = min(period, self.frame_timeout_s / 2)
        while True:
            await asyncio.sleep(period)
            now = self._loop.time()
            for conn in list(self._conns.values()):
                if conn.frame_started is not None and now - conn.frame_started > self.frame_timeout_s:
                    self.stats["slow_frames_closed"] = self.stats.get("slow_frames_closed", 0) + 1
                    conn.writer.close()          # a frame that never finishes arriving
                elif not conn.authenticated:
                    if now - conn.opened > AUTH_TIMEOUT_S:
                        conn.writer.close()
                elif conn.goaway_at is not None:
                    waited = now - conn.goaway_at
                    if waited > GOAWAY_GRACE_S and (conn.requests == 0 and not conn.polls
                                                    or waited > 10 * GOAWAY_GRACE_S):
                        conn.writer.close()
                elif (self.idle_timeout_s and conn.requests == 0 and not conn.polls
                      and conn.kind == "embedlog" and now - conn.last_active > self.idle_timeout_s):
                    self.stats["idle_closed"] += 1
                    conn.goaway_at = now
                    conn.writer.write(P.goaway())

    def _observe(self, req, data, started: float) -> None:
        """An embedlog request's answer, told to the observers (observe)."""
        status = P.RESP_HEAD.unpack_from(data, 4)[4] if len(data) >= 4 + P.RESP_HEAD.size else P.EIO
        entries = 0
        if req.op == P.ADD and status == P.EOK and not req.flags & P.FLAG_RECOVERY_ADD \
                and len(req.body) >= 4:
            entries = P.U32.unpack_from(req.body)[0]
        seconds = None if req.flags & P.FLAG_LONG_POLL else time.perf_counter() - started
        self.observe(P.OPS.get(req.op, "other"), status, seconds, (req.scope, req.ledger), entries)

    def observe(self, op: str, status: int, seconds: float | None, key=None,
                entries: int = 0, requests: int = 1) -> None:
        """Tell the observers requests were answered (ServerObserver.request_done)."""
        for observer in self.observers:
            try:
                observer.request_done(op, status, seconds, key, entries, requests)
            except Exception:              # an observer's bug must not cost the reply path
                log.exception("server observer %r failed", observer)


def _queued_bytes(conn) -> int:
    """Bytes the kernel holds for ``conn``, not read yet (0 when it cannot tell)."""
    sock = conn.writer.get_extra_info("socket")
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError, AttributeError):
        return 0
