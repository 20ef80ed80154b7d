"""The client side of the wire: one pipelined connection per bookie, on the client's loop.

Requests carry an id; responses may come back in any order and complete the
future waiting on that id. A lost connection fails everything in flight with
a retryable error; the next request reconnects.

The connection is an asyncio.Protocol (``_Frames``): a response completes its caller's
future in the read callback, and the caller awaits that future with a timer of its own. A
StreamReader's reader task and asyncio.wait_for cost two more loop iterations and a future
per answer: 64 -> 28 us of client CPU per call on loopback (a canned-answer bookie).
"""
from __future__ import annotations

import asyncio
import itertools
import logging

from embedlog.errors import (CorruptedDataError, EmbedlogError, TimeoutError, from_wire_code,
                             UnauthorizedAccessError)
from embedlog.net import protocol as P

log = logging.getLogger("embedlog.client")


class BookieUnavailableError(EmbedlogError):
    """A bookie that cannot be reached (connection refused, reset, timed out)."""
    code, wire_code = -8, 101          # BookieHandleNotAvailable


class _Frames(asyncio.Protocol):
    """One connection's bytes: response frames cut out as they arrive and each handed to the
    future waiting on its request id, in the read callback itself (no reader task, no
    StreamReader: a lone add's answer reaches its caller one loop iteration after it is read,
    where a reader task and asyncio.wait_for took three)."""

    def __init__(self, conn: "BookieConnection"):
        self.conn = conn
        self.pending: dict[int, asyncio.Future] = {}
        self.transport: asyncio.Transport | None = None
        self.auth: asyncio.Future | None = None     # set while AUTH's answer is awaited
        self.buf = bytearray()
        self.error: BaseException | None = None     # what the calls in flight fail with
        self.broken = False                          # a bad frame: nothing more is read

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        buf = self.buf
        if buf:
            buf += data
            src = buf
        else:
            src = data
        size = len(src)
        pos = 0
        limit = self.conn.max_frame_bytes
        try:
            while size - pos >= 4:
                (n,) = P.LENGTH.unpack_from(src, pos)
                P.check_frame_length(n, limit)
                end = pos + 4 + n
                if end > size:
                    break
                # bytes of its own (a response's body outlives the buffer)
                resp = P.parse_response(bytes(src[pos + 4:end]) if src is buf else src[pos + 4:end])
                pos = end
                self._deliver(resp)
                if self.broken:
                    return
        except EmbedlogError as exc:
            self._break(CorruptedDataError(f"bad response from bookie {self.conn.address}: {exc}"))
            return
        if src is buf:
            del buf[:pos]
        elif pos < size:
            buf += memoryview(data)[pos:]

    def _deliver(self, resp) -> None:
        auth = self.auth
        if auth is not None:
            self.auth = None
            if not auth.done():
                auth.set_result(resp)
            return
        fut = self.pending.pop(resp.request_id, None)
        if fut is not None:
            if not fut.done():
                fut.set_result(resp)
        elif resp.request_id == 0 and resp.op == P.GOAWAY:
            # the bookie closes this idle connection soon: new requests go on a new one,
            # the answers to those already sent still come here
            self.conn._lost(self)
        elif resp.request_id == 0 and resp.status:
            self.error = from_wire_code(resp.status, f"bookie {self.conn.address}: {resp.message}")

    def _break(self, error: BaseException) -> None:
        self.broken = True
        self.error = error
        self.conn._lost(self)
        self.transport.close()

    def closing(self) -> bool:
        return self.broken or self.transport.is_closing()

    def connection_lost(self, exc) -> None:
        self.broken = True
        self.conn._lost(self)
        auth, self.auth = self.auth, None
        if auth is not None and not auth.done():
            auth.set_exception(BookieUnavailableError(
                f"bookie {self.conn.address} closed the connection during authentication"
                + (f": {exc}" if exc else "")))
        error = self.error or BookieUnavailableError(f"connection to bookie {self.conn.address} lost")
        pending = list(self.pending.values())
        self.pending.clear()
        for fut in pending:
            if not fut.done():
                fut.set_exception(error)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


def _status_error(address: str, resp) -> EmbedlogError:
    return from_wire_code(resp.status, f"bookie {address}: {resp.message}")


def _timeout_error(address: str, timeout_s: float) -> TimeoutError:
    return TimeoutError(f"bookie {address} did not answer in {timeout_s} s")


class _Answer:
    """A request of ``BookieConnection.send`` waiting in ``pending`` where a call's future
    would: its answer (or error) goes to ``on_answer(resp, error)`` in the read callback
    itself, with the errors ``call`` raises. No task and no future: a lone add's frame is
    written in the loop iteration that takes it, and its acknowledgement is counted in the
    one that reads the answer (a task per frame took two iterations more)."""

    __slots__ = ("conn", "wire", "rid", "timeout_s", "on_answer", "timer")

    def __init__(self, conn, wire, rid, timeout_s, on_answer):
        self.conn, self.wire, self.rid = conn, wire, rid
        self.timeout_s, self.on_answer = timeout_s, on_answer
        self.timer = None

    def done(self) -> bool:
        return self.on_answer is None

    def set_result(self, resp) -> None:
        if resp.status != P.EOK:
            self._finish(None, _status_error(self.conn.address, resp))
        else:
            self._finish(resp, None)

    def set_exception(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.TimeoutError):
            exc = _timeout_error(self.conn.address, self.timeout_s)
        self._finish(None, exc)

    def _finish(self, resp, error) -> None:
        fn, self.on_answer = self.on_answer, None
        if fn is None:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.wire.pending.pop(self.rid, None)
        try:
            fn(resp, error)
        except Exception:           # the read callback goes on with the next answer
            log.exception("answer callback %r failed", fn)


class BookieConnection:
    def __init__(self, address: str, *, connect_timeout_s: float = 2.0,
                 max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES, ssl_context=None,
                 auth_token: bytes | None = None):
        self.address = address
        self.ssl_context = ssl_context      # TLS: verifies the bookie, may present our certificate
        self.auth_token = auth_token        # sent as AUTH before any other request
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        # each connection has its own pending requests: after a GOAWAY the old one still
        # answers what was sent on it while new requests use the next
        self._wire: _Frames | None = None
        self._ids = itertools.count(1)
        self._connecting: asyncio.Future | None = None
        self.closed = False

    async def _connect(self) -> _Frames:
        wire = self._wire
        if wire is not None and not wire.closing():
            return wire
        if self._connecting is None:
            # the attempt is a task of its own: a caller that gives up (cancelled, timed
            # out) must not fail the other callers waiting for the same connection
            self._connecting = asyncio.get_running_loop().create_task(self._open())
        return await asyncio.shield(self._connecting)

    async def _open(self) -> _Frames:
        try:
            loop = asyncio.get_running_loop()
            try:
                _t, wire = await asyncio.wait_for(
                    loop.create_connection(lambda: _Frames(self), self.host, self.port,
                                           ssl=self.ssl_context,
                                           server_hostname=self.host if self.ssl_context else None),
                    self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError) as exc:
                raise BookieUnavailableError(f"cannot connect to bookie {self.address}: {exc}") from None
            if self.auth_token is not None:
                try:
                    await asyncio.wait_for(self._authenticate(wire), self.connect_timeout_s)
                except BaseException:
                    wire.transport.close()
                    raise
            self._wire = wire
            return wire
        finally:
            self._connecting = None

    async def _authenticate(self, wire: _Frames) -> None:
        """AUTH with the token, before anything else on this connection."""
        wire.auth = asyncio.get_running_loop().create_future()
        wire.transport.write(P.auth_request(0, self.auth_token))
        resp = await wire.auth
        if resp.status != P.EOK:
            raise UnauthorizedAccessError(f"bookie {self.address} refused the token: {resp.message}")

    def _lost(self, wire: _Frames) -> None:
        if self._wire is wire:
            self._wire = None

    async def call(self, build, timeout_s: float) -> P.Response:
        """Send the frame ``build(request_id)`` and wait for its response (status checked)."""
        if self.closed:
            raise BookieUnavailableError(f"connection to {self.address} is closed")
        wire = self._wire
        if wire is None or wire.closing():
            wire = await self._connect()
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        pending = wire.pending
        if wire.closing():
            # lost under us: writing would only make asyncio log "socket.send() raised"
            raise BookieUnavailableError(f"bookie {self.address}: connection lost")
        pending[rid] = fut
        try:
            wire.transport.write(build(rid))
        except ConnectionError as exc:
            pending.pop(rid, None)
            raise BookieUnavailableError(f"bookie {self.address}: {exc}") from None
        except BaseException:
            pending.pop(rid, None)
            raise
        # the future is awaited itself, with a timer that fails it (asyncio.wait_for would
        # add a future and two loop iterations to every answer)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            resp = await fut
        except asyncio.TimeoutError:
            raise _timeout_error(self.address, timeout_s) from None
        finally:
            timer.cancel()
            pending.pop(rid, None)             # answered, timed out or cancelled
        if resp.status != P.EOK:
            raise _status_error(self.address, resp)
        return resp

    def send(self, build, timeout_s: float, on_answer) -> bool:
        """``call`` without a task, on a connection already open: writes ``build(request_id)``
        and hands ``on_answer(resp, None)`` or ``on_answer(None, error)`` (call's errors) the
        outcome, on the loop. False, with nothing sent, when there is no open connection."""
        wire = self._wire
        if self.closed or wire is None or wire.closing():
            return False
        rid = next(self._ids)
        answer = _Answer(self, wire, rid, timeout_s, on_answer)
        pending = wire.pending
        pending[rid] = answer
        try:
            wire.transport.write(build(rid))
        except ConnectionError:
            pending.pop(rid, None)
            return False                 # call() reconnects
        except BaseException:
            pending.pop(rid, None)
            raise
        answer.timer = asyncio.get_running_loop().call_later(timeout_s, _expire, answer)
        return True

    def close(self) -> None:
        self.closed = True
        wire, self._wire = self._wire, None
        if wire is not None and wire.transport is not None:
            wire.transport.close()


class _ReplyCatcher:
    """Stands in for the server's StreamWriter: completes the caller's future."""

    def __init__(self, fut):
        self.fut = fut

    def is_closing(self) -> bool:
        return self.fut.done()

    def write(self, data) -> None:
        if not self.fut.done():
            self.fut.set_result(P.parse_response(memoryview(data)[4:]))

    def writelines(self, parts) -> None:
        self.write(b"".join(parts))

    def close(self) -> None:
        pass


class InProcessConnection:
    """The wire protocol without a socket: each request goes straight to a BookieServer's
    handlers on the client's own loop. The embedded log serves its streams this way, and
    the benchmarks use it to show what the network costs."""

    def __init__(self, server):
        self.server = server
        self.address = "in-process"
        self.closed = False
        self._ids = itertools.count(1)

    async def call(self, build, timeout_s: float) -> P.Response:
        frame = build(next(self._ids))
        req = P.parse_request(memoryview(frame)[4:])
        fut = asyncio.get_running_loop().create_future()
        self.server.dispatch(req, _ReplyCatcher(fut))
        try:
            resp = await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"in-process bookie did not answer in {timeout_s} s") from None
        if resp.status != P.EOK:
            raise from_wire_code(resp.status, f"bookie: {resp.message}")
        return resp

    def close(self) -> None:
        self.closed = True
