"""What every client operation shares: the event loop thread, the metadata store,
bookie connections and the bookie id -> address map (from registrations).

Operations are small state machines (write.py, read.py, recovery.py) that take
this context, so tests can drive them with the collaborators they need.

Every message to a bookie goes through ``call`` and every ledger metadata write of the
protocol through ``write_metadata``: the two seams where a fault injector (``faults``,
embedlog.harness.faults) may drop, delay, hold or fail a message, or pause a metadata
write, so a race is reproduced on purpose. Without one they cost an attribute test.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import random
import threading
import time
import weakref
from dataclasses import dataclass, field

from embedlog import failpoints, forking
from embedlog._native.wire_sizes import MAX_FRAME_BYTES
from embedlog.errors import ClientClosedError, NotEnoughBookiesError
from embedlog.net import loop as event_loop
from embedlog.net import security
from embedlog.net.bookkeeper import PROTOCOL as BOOKKEEPER_PROTOCOL, BookKeeperConnection
from embedlog.net.transport import BookieConnection, BookieUnavailableError


@dataclass
class ClientConfig:
    add_timeout_s: float = 10.0           # BookKeeper addEntryTimeout
    read_timeout_s: float = 10.0          # BookKeeper readEntryTimeout
    connect_timeout_s: float = 2.0
    max_pending_adds: int = 20_000        # back-pressure on append_async
    max_entry_size_bytes: int = MAX_FRAME_BYTES   # the bookies' default: larger adds are refused here
    max_entries_per_frame: int = 1000      # entries per ADD frame (bytes are bounded below too)
    max_frame_payload_bytes: int = 4 * 1024 * 1024   # under the bookie's 5 MiB frame limit
    ensemble_change_retries: int = 16
    quarantine_s: float = 30.0            # a bookie that failed is avoided this long in placement
    explicit_lac_interval_ms: float = 100.0   # after this quiet time the writer sends its LAC
    ensemble_check_interval_s: float = 2.0    # a stream's leader looks for lost bookies (0: never)
    # security (docs/SECURITY.md), all off by default: TLS when tls_ca_file is set (the bookies'
    # certificates are verified against it), a client certificate for bookies that require one,
    # and a shared token sent as AUTH first on every connection
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_check_hostname: bool = True       # turn off only for certificates without the bookie's address
    auth_token_file: str | None = None
    auth_token: bytes | None = field(default=None, repr=False)   # the token itself, instead of a file
    client_name: str = ""                 # names this client in logs and in fault rules


# kinds of ledger metadata writes the protocol makes (a fault injector gates them by kind)
METADATA_WRITES = ("recovery", "ensemble_change", "close", "term", "term_commit", "truncate",
                   "rereplicate", "release", "links")
SHUTDOWN_FLUSH_S = 1.0     # a client's close waits this long for its writers' last WRITE_LAC
# threads for blocking work (metadata store calls): a gated write holds one for its pause
_WORKERS = 16


# contexts still open: closed at interpreter exit, so a client the program never closed
# does not leave its loop's tasks to be destroyed pending ("Task was destroyed but it is
# pending!") when the interpreter tears the loop down
_OPEN: "weakref.WeakSet[ClientContext]" = weakref.WeakSet()


@atexit.register
def _close_open_contexts() -> None:
    for ctx in list(_OPEN):
        try:
            ctx.close()
        except Exception:           # exiting anyway: a bookie that does not answer is no error
            pass


class ClientContext:
    def __init__(self, metadata, config: ClientConfig, faults=None):
        # TLS and token first: a bad file fails here, before the loop thread starts
        self._ssl = (security.client_context(config.tls_ca_file, config.tls_cert_file,
                                             config.tls_key_file, config.tls_check_hostname)
                     if config.tls_ca_file or config.tls_cert_file else None)
        self._token = (bytes(config.auth_token) if config.auth_token
                       else security.read_token(config.auth_token_file) if config.auth_token_file else None)
        self.metadata = metadata
        self.config = config
        self.name = config.client_name
        self.faults = faults                          # a fault injector (testing), or None
        self._workers = concurrent.futures.ThreadPoolExecutor(_WORKERS, "embedlog-client-io")
        self.loop = event_loop.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="embedlog-client", daemon=True)
        self._thread.start()
        self._conns: dict[str, BookieConnection] = {}
        self._addresses: dict[str, str] = {}
        self._protocols: dict[str, str] = {}         # address -> "bookkeeper" for Java bookies
        self._quarantine: dict[str, float] = {}      # bookie id -> when it last failed
        self._local: dict = {}                        # bookie id -> in-process connection
        self.writers = weakref.WeakSet()              # open writers: their LAC is sent at close
        self._lock = threading.Lock()
        self._closed = False
        _OPEN.add(self)
        forking.track(self)

    def _after_fork(self, gone) -> None:
        # a forked child (embedlog.forking): the loop thread, the connections and the
        # metadata connection are the parent's; every call raises, close() does nothing
        self._closed = True
        _OPEN.discard(self)
        self.loop = self.metadata = gone

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # stopped by close(): a task made after the shutdown (a writer's explicit-LAC timer
        # firing meanwhile) is cancelled and run to its end here, in the loop's own thread,
        # and the loop closed, so nothing is left to be destroyed pending at exit
        for _ in range(8):            # a cancelled task may have started another: again
            left = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            if not left:
                break
            for t in left:
                t.cancel()
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def on_loop(self) -> bool:
        """True in the client's own loop thread, where add callbacks run: it must not block."""
        return threading.current_thread() is self._thread

    def run(self, coro, timeout: float | None = None):
        """Run a coroutine on the client loop from any other thread and wait for it."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking client call from the client's own loop")
        return self.submit(coro).result(timeout)

    def submit(self, coro) -> concurrent.futures.Future:
        """Start a coroutine on the client loop from any other thread; its Future (embedlog.aio
        awaits it from the caller's own loop). ClientClosedError once the client is closed."""
        if self.loop.is_closed():
            coro.close()
            raise ClientClosedError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def offload(self, fn, *args):
        """Run blocking ``fn(*args)`` (a metadata store call) off the loop, on the client's
        own threads (a paused metadata write must not starve the default executor)."""
        return await asyncio.get_running_loop().run_in_executor(self._workers, fn, *args)

    # -- metadata writes ----------------------------------------------------------------

    def write_metadata_sync(self, kind: str, md, version):
        """CAS ``md`` at ``version`` (BadVersionError if it moved); ``kind`` is one of
        METADATA_WRITES. Never call it on the loop: stores block, and a gate may pause it."""
        if self.faults is not None:
            return self.faults.metadata_write(self, kind, md, version,
                                              self.metadata.ledger_manager.write_ledger_metadata)
        return self.metadata.ledger_manager.write_ledger_metadata(md, version)

    async def write_metadata(self, kind: str, md, version):
        return await self.offload(self.write_metadata_sync, kind, md, version)

    async def read_metadata(self, ledger_id):
        return await self.offload(self.metadata.ledger_manager.read_ledger_metadata, ledger_id)

    @staticmethod
    def failpoint(name: str) -> None:
        failpoints.hit(name)

    # -- bookies -----------------------------------------------------------------------

    def refresh_bookies(self) -> tuple[list[str], list[str]]:
        """(writable, read-only) bookie ids, refreshing the address map."""
        regs = self.metadata.registration_client.get_all_bookies()
        writable = [r for r in regs if not r.read_only]
        readonly = [r for r in regs if r.read_only]
        with self._lock:
            for reg in regs:
                addr = (reg.info or {}).get("address")
                if addr:
                    self._addresses[reg.bookie_id] = addr
                    self._protocols[addr] = (reg.info or {}).get("protocol") or "embedlog"
        return [r.bookie_id for r in writable], [r.bookie_id for r in readonly]

    def address_of(self, bookie_id: str) -> str:
        with self._lock:
            addr = self._addresses.get(bookie_id)
        if addr is None:
            self.refresh_bookies()
            with self._lock:
                addr = self._addresses.get(bookie_id)
        if addr is None:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered")
        return addr

    async def address_of_async(self, bookie_id: str) -> str:
        with self._lock:
            addr = self._addresses.get(bookie_id)
        if addr is not None:
            return addr
        return await self.offload(self.address_of, bookie_id)

    def add_local_bookie(self, bookie_id: str, connection) -> None:
        """Serve ``bookie_id`` in this process (the embedded log), without a socket."""
        self._local[bookie_id] = connection

    async def connection(self, bookie_id: str) -> BookieConnection:
        local = self._local.get(bookie_id)
        if local is not None:
            return local
        addr = await self.address_of_async(bookie_id)
        conn = self._conns.get(addr)
        # a Java bookie (its registration says protocol "bookkeeper") speaks BookKeeper's v3
        kind = (BookKeeperConnection if self._protocols.get(addr) == BOOKKEEPER_PROTOCOL
                else BookieConnection)
        if conn is None or conn.closed or type(conn) is not kind:
            if conn is not None:
                conn.close()                  # another kind of bookie took over the address
            conn = kind(addr, connect_timeout_s=self.config.connect_timeout_s,
                        ssl_context=self._ssl, auth_token=self._token)
            self._conns[addr] = conn
        return conn

    async def call(self, bookie_id: str, build, timeout_s: float):
        """Send ``build(request_id)`` to a bookie and wait for its answer (status checked)."""
        if self.faults is not None:
            return await self.faults.message(self, bookie_id, build, timeout_s, self._call)
        return await self._call(bookie_id, build, timeout_s)

    async def _call(self, bookie_id: str, build, timeout_s: float):
        conn = await self.connection(bookie_id)
        try:
            return await conn.call(build, timeout_s)
        except BookieUnavailableError as exc:
            self.call_failed(bookie_id, exc)
            raise

    def send(self, bookie_id: str, build, timeout_s: float, on_answer) -> bool:
        """``call`` without a task where it can be (on the loop): on an open connection to
        an embedlog bookie, with no fault rule set, ``build(request_id)`` is written now and
        ``on_answer(resp, error)`` gets the outcome (an error after ``call_failed``, as
        call's). False, with nothing sent, where only ``call`` can: an in-process or Java
        bookie, an address or connection not yet known, a fault rule that may apply."""
        if (self.faults is not None and not self.faults.quiet()) or bookie_id in self._local:
            return False
        addr = self._addresses.get(bookie_id)
        conn = self._conns.get(addr) if addr is not None else None
        if type(conn) is not BookieConnection or self._protocols.get(addr) == BOOKKEEPER_PROTOCOL:
            return False

        def answered(resp, error) -> None:
            if error is not None:
                self.call_failed(bookie_id, error)
            on_answer(resp, error)
        return conn.send(build, timeout_s, answered)

    def call_failed(self, bookie_id: str, exc: BaseException) -> None:
        """What a call's error says of the bookie: unreachable, it may have restarted
        elsewhere (its address is forgotten and asked again next time) and is avoided."""
        if isinstance(exc, BookieUnavailableError):
            with self._lock:
                self._addresses.pop(bookie_id, None)
            self.quarantine(bookie_id)

    def quarantine(self, bookie_id: str) -> None:
        """Avoid a failed bookie in placement for a while: its registration may outlive it."""
        with self._lock:
            self._quarantine[bookie_id] = time.monotonic()

    def forget_address(self, bookie_id: str) -> None:
        with self._lock:
            self._addresses.pop(bookie_id, None)

    def choose_bookies(self, count: int, exclude=()) -> list[str]:
        """``count`` distinct writable bookies, avoiding ``exclude`` (random placement)."""
        writable, _ = self.refresh_bookies() if not self._local else (list(self._local), [])
        exclude = set(exclude)
        candidates = [b for b in writable if b not in exclude]
        now = time.monotonic()
        with self._lock:
            healthy = [b for b in candidates
                       if now - self._quarantine.get(b, -1e9) > self.config.quarantine_s]
        if len(healthy) >= count:        # quarantined bookies only when nothing else will do
            return random.sample(healthy, count)
        if len(candidates) < count:
            inside = sorted(set(writable) & exclude)
            raise NotEnoughBookiesError(
                f"need {count} writable bookie{'s' if count != 1 else ''}"
                + (f" outside the ensemble ({', '.join(sorted(exclude))})" if exclude else "")
                + f", {len(candidates)} available ({len(writable)} registered writable"
                + (f", {len(inside)} of them in the ensemble: no spare" if inside else "") + ")")
        return random.sample(candidates, count)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)

        async def shutdown():
            writers = [w for w in list(self.writers) if not w.is_closed]
            for w in writers:
                w.stop_lac_timer()
            # best effort: a reader of an abandoned writer's ledger sees its last LAC
            # sooner; a bookie that does not answer must not hold the close up
            flushes = asyncio.gather(*(w.flush_lac() for w in writers), return_exceptions=True)
            try:
                await asyncio.wait_for(flushes, SHUTDOWN_FLUSH_S)
            except asyncio.TimeoutError:
                pass
            # an add still unacknowledged fails, as BookKeeper's ClientClosedException:
            # its connection goes next, so it would otherwise never complete
            closed = ClientClosedError("the client was closed with this add in flight")
            for w in writers:
                w.abandon(closed)
            for c in self._conns.values():
                c.close()
            # what is still in flight (an abandoned writer's sends) ends here, quietly
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        try:
            self.run(shutdown(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            # a metadata call still running finishes before the caller closes the store
            self._workers.shutdown(wait=True, cancel_futures=True)
