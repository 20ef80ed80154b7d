"""Hostile clients for the harness: a reader that never reads its answers, a flood of
requests, connections that send a frame's length and nothing more, to show a bookie's
back-pressure and bounded memory (docs/SECURITY.md; tests/net/test_limits.py,
tests/net/test_cheap_denials.py and benchmarks/backpressure.py use them); and a steady
well-behaved writer whose errors and latency show what an attack costs others."""
from __future__ import annotations

import collections
import socket
import threading
import time

from embedlog._native import bkencode as E
from embedlog._native import bkwire as W
from embedlog.errors import CorruptedDataError
from embedlog.net import protocol as P


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise CorruptedDataError(f"no VmRSS for process {pid}")


class RawConnection:
    """A bare socket speaking the wire protocol, with none of the client's manners."""

    def __init__(self, address: str, *, rcvbuf: int | None = None, timeout_s: float = 10.0,
                 source: str | None = None):
        """``source``: the local address to connect from (another loopback address, such as
        127.0.0.2, stands for another host)."""
        host, _, port = address.rpartition(":")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if source is not None:
            self.sock.bind((source, 0))
        self.sock.settimeout(timeout_s)
        self.sock.connect((host, int(port)))
        self.backlog = bytearray()          # bytes try_send could not hand to the socket yet

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def try_send(self, data: bytes, timeout_s: float) -> bool:
        """Queue ``data`` and send what the socket takes within ``timeout_s``; False when
        the bookie stopped taking bytes (back-pressure) and some are still queued."""
        self.backlog += data
        self.sock.settimeout(timeout_s)
        try:
            while self.backlog:
                del self.backlog[:self.sock.send(self.backlog)]
        except (socket.timeout, BlockingIOError):
            pass
        return not self.backlog

    def recv_response(self, timeout_s: float = 10.0) -> P.Response | None:
        """The next response, or None when the bookie closed the connection."""
        self.sock.settimeout(timeout_s)
        head = self._recv_exactly(4)
        if head is None:
            return None
        (n,) = P.LENGTH.unpack(head)
        body = self._recv_exactly(n)
        if body is None:
            return None
        return P.parse_response(body)

    def _recv_exactly(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def flood(address: str, frames: list, timeout_s: float = 30.0) -> dict:
    """Send every frame at once, then read every answer: statuses counted, how long the
    first refusal and the last answer took, and when each answer came (in order)."""
    conn = RawConnection(address, timeout_s=timeout_s)
    try:
        t0 = time.monotonic()
        conn.send(b"".join(frames))
        statuses: collections.Counter = collections.Counter()
        first_refusal = None
        answered_s = []
        for _ in frames:
            resp = conn.recv_response(timeout_s)
            if resp is None:
                break
            answered_s.append(time.monotonic() - t0)
            statuses[resp.status] += 1
            if resp.status == P.ETOOMANYREQUESTS and first_refusal is None:
                first_refusal = time.monotonic() - t0
        return {"statuses": dict(statuses), "first_refusal_s": first_refusal,
                "seconds": time.monotonic() - t0, "answered_s": answered_s}
    finally:
        conn.close()


def slow_reader(address: str, build, seconds: float, reply_bytes: int, sample=None,
                sample_every_s: float = 0.5, until=None) -> dict:
    """Send requests built by ``build(request_id)`` and never read an answer: for ``seconds``,
    or, with ``until``, until ``until(figures)`` holds (``seconds`` then bounds the wait).

    The bookie stops reading once its send buffer for this connection is full, so the
    socket stops taking requests: ``requests_sent`` times ``reply_bytes`` is what an
    unbounded bookie would have had to hold. ``sample()`` runs every ``sample_every_s``
    (for example: the bookie's RSS, a well-behaved client's latency), at least twice when
    ``until`` ends it. Ending on a condition rather than a time keeps a test valid on a
    loaded machine, where a few seconds may not fill the bookie's buffers."""
    conn = RawConnection(address, rcvbuf=64 * 1024)
    samples, stalls, rid = [], 0, 0

    def figures() -> dict:
        sent = rid - (1 if conn.backlog else 0)
        return {"requests_sent": sent, "stalled_sends": stalls,
                "reply_bytes_owed": sent * reply_bytes, "samples": samples}

    try:
        deadline = time.monotonic() + seconds
        next_sample = time.monotonic()
        while time.monotonic() < deadline:
            if until is not None and len(samples) >= 2 and until(figures()):
                break
            data = b""
            if not conn.backlog:            # whole frames only: the stream stays parseable
                rid += 1
                data = build(rid)
            if not conn.try_send(data, 0.05):
                stalls += 1
            if sample is not None and time.monotonic() >= next_sample:
                samples.append(sample())
                next_sample = time.monotonic() + sample_every_s
        return figures()
    finally:
        conn.close()


# -- cheap denials of service (docs/SECURITY.md, "What a client can still do") ----------------

PROTOCOL_BYTE = {"embedlog": b"\x01", "v3": b"\x0a", "v2": b"\x03"}


def length_prefix(length: int, protocol: str) -> bytes:
    """The first five bytes of a connection's first frame of ``length`` bytes: its length and
    the byte that names the protocol (embedlog's version 0x01, a v3 Request's header tag 0x0A,
    a v2 packet's protocol version 3)."""
    return length.to_bytes(4, "big") + PROTOCOL_BYTE[protocol]


def hold_length_prefixes(address: str, count: int, length: int, protocol: str,
                         sources: list) -> list:
    """``count`` connections that each send only the first five bytes of a frame of
    ``length`` bytes, then nothing: from ``sources`` in turn (loopback addresses stand for
    other hosts, as one host may hold max_connections_per_address). The caller closes them."""
    conns = []
    try:
        for i in range(count):
            c = RawConnection(address, source=sources[i % len(sources)])
            conns.append(c)
            c.send(length_prefix(length, protocol))
    except BaseException:
        for c in conns:
            c.close()
        raise
    return conns


def one_request(address: str, protocol: str, source: str, request_id: int) -> socket.socket:
    """A connection from ``source`` that sends one cheap request in ``protocol``: a v3
    GET_BOOKIE_INFO, a v2 read of a ledger nobody holds, an embedlog BOOKIE_INFO."""
    host, _, port = address.rpartition(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(30)
    s.bind((source, 0))
    s.connect((host, int(port)))
    if protocol == "v3":
        s.sendall(E.encode_request(request_id, W.GET_BOOKIE_INFO, requested=3))
    elif protocol == "v2":
        s.sendall(P.LENGTH.pack(44) + b"\x02\x02\x00\x00" + (10 ** 12 + request_id).to_bytes(8, "big")
                  + bytes(32))
    else:
        s.sendall(P.bookie_info_request(request_id))
    return s


def idle_connections(address: str, count: int, sources: list, protocols: list) -> list:
    """``count`` connections (from ``sources`` and in ``protocols`` in turn) that each made
    one request and got its answer, then sit idle. The caller closes them."""
    socks = []
    try:
        for i in range(count):
            socks.append(one_request(address, protocols[i % len(protocols)],
                                     sources[i % len(sources)], i + 1))
        for s in socks:
            if not s.recv(65536):
                raise CorruptedDataError("a connection closed before its answer")
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class SteadyWriter:
    """A well-behaved client's writer beside an attack: one append at a time (each durable
    before the next) in a thread, each one's latency and error kept. ``new_ledger()`` gives
    the write handle, again after an error (as an application would go on)."""

    def __init__(self, new_ledger, payload: bytes = b"x" * 100):
        self.new_ledger, self.payload = new_ledger, payload
        self.samples: list = []           # (seconds, error or None), in order
        self._t0 = None                   # when the append under way began
        self._stop = False
        self._thread = None

    def start(self) -> "SteadyWriter":
        self._thread = threading.Thread(target=self._run, daemon=True, name="steady-writer")
        self._thread.start()
        return self

    def _run(self) -> None:
        w = None
        while not self._stop:
            t0 = self._t0 = time.monotonic()
            try:
                if w is None:
                    w = self.new_ledger()
                w.append(self.payload)
                self.samples.append((time.monotonic() - t0, None))
            except Exception as exc:      # counted: the figure the tests assert on
                self.samples.append((time.monotonic() - t0, exc))
                w = None
                time.sleep(0.05)
            finally:
                self._t0 = None

    def mark(self) -> int:
        return len(self.samples)

    def figures(self, since: int = 0) -> dict:
        """adds, errors, the first error, and p50 / p99 / max in ms of the appends since
        ``since`` (a mark()); an append still under way counts with the time it has taken
        so far (one stuck for the whole attack is its worst)."""
        got = self.samples[since:]
        times = sorted(s for s, _ in got)
        t0 = self._t0
        if t0 is not None:
            times.append(time.monotonic() - t0)
            times.sort()
        errors = [e for _, e in got if e is not None]

        def pct(q):
            return round(1000 * times[min(len(times) - 1, int(q * len(times)))], 1) if times else None
        return {"adds": len(got), "errors": len(errors),
                "first_error": repr(errors[0]) if errors else None,
                "p50_ms": pct(0.5), "p99_ms": pct(0.99),
                "max_ms": round(1000 * times[-1], 1) if times else None}

    def stop(self) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join(60)
