"""The client side of the wire: one pipelined connection per bookie, on the client's loop.

Requests carry an id; responses may come back in any order and complete the
future waiting on that id. A lost connection fails everything in flight with
a retryable error; the next request reconnects.
"""
from __future__ import annotations

import asyncio
import itertools

from embedlog.errors import (CorruptedDataError, EmbedlogError, TimeoutError, from_wire_code,
                             UnauthorizedAccessError)
from embedlog.net import protocol as P


class BookieUnavailableError(EmbedlogError):
    """A bookie that cannot be reached (connection refused, reset, timed out)."""
    code, wire_code = -8, 101          # BookieHandleNotAvailable


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
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._connecting: asyncio.Future | None = None
        self.closed = False

    async def _connect(self) -> None:
        if self._writer is not None and not self._writer.is_closing():
            return
        if self._connecting is None:
            # the attempt is a task of its own: a caller that gives up (cancelled, timed
            # out) must not fail the other callers waiting for the same connection
            self._connecting = asyncio.get_running_loop().create_task(self._open())
        await asyncio.shield(self._connecting)

    async def _open(self) -> None:
        try:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, limit=self.max_frame_bytes + 8,
                                            ssl=self.ssl_context,
                                            server_hostname=self.host if self.ssl_context else None),
                    self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError) as exc:
                raise BookieUnavailableError(f"cannot connect to bookie {self.address}: {exc}") from None
            if self.auth_token is not None:
                try:
                    await asyncio.wait_for(self._authenticate(reader, writer), self.connect_timeout_s)
                except BaseException:
                    writer.close()
                    raise
            # each connection has its own pending requests: after a GOAWAY the old one
            # still answers what was sent on it while new requests use the next
            self._pending = {}
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(
                self._read_loop(reader, writer, self._pending))
        finally:
            self._connecting = None

    async def _authenticate(self, reader, writer) -> None:
        """AUTH with the token, before anything else on this connection."""
        try:
            writer.write(P.auth_request(0, self.auth_token))
            (n,) = P.LENGTH.unpack(await reader.readexactly(4))
            P.check_frame_length(n, self.max_frame_bytes)
            resp = P.parse_response(await reader.readexactly(n))
        except (asyncio.IncompleteReadError, OSError) as exc:
            raise BookieUnavailableError(f"bookie {self.address} closed the connection "
                                         f"during authentication: {exc}") from None
        if resp.status != P.EOK:
            raise UnauthorizedAccessError(f"bookie {self.address} refused the token: {resp.message}")

    async def _read_loop(self, reader, writer, pending: dict) -> None:
        error: BaseException = BookieUnavailableError(f"connection to bookie {self.address} lost")
        try:
            while True:
                head = await reader.readexactly(4)
                (n,) = P.LENGTH.unpack(head)
                P.check_frame_length(n, self.max_frame_bytes)
                resp = P.parse_response(await reader.readexactly(n))
                fut = pending.pop(resp.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
                elif resp.request_id == 0 and resp.op == P.GOAWAY:
                    # the bookie closes this idle connection soon: new requests go on a new
                    # one, the answers to those already sent still come here
                    if self._writer is writer:
                        self._writer = None
                elif resp.request_id == 0 and resp.status:
                    error = from_wire_code(resp.status, f"bookie {self.address}: {resp.message}")
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except EmbedlogError as exc:
            error = CorruptedDataError(f"bad response from bookie {self.address}: {exc}")
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()
            for fut in list(pending.values()):
                if not fut.done():
                    fut.set_exception(error)
            pending.clear()

    async def call(self, build, timeout_s: float) -> P.Response:
        """Send the frame ``build(request_id)`` and wait for its response (status checked)."""
        if self.closed:
            raise BookieUnavailableError(f"connection to {self.address} is closed")
        await self._connect()
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        pending = self._pending
        pending[rid] = fut
        writer = self._writer
        try:
            if writer is None or writer.is_closing():
                # lost under us: writing would only make asyncio log "socket.send() raised"
                raise ConnectionError("connection lost")
            writer.write(build(rid))
        except ConnectionError as exc:
            pending.pop(rid, None)
            raise BookieUnavailableError(f"bookie {self.address}: {exc}") from None
        try:
            resp = await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"bookie {self.address} did not answer in {timeout_s} s") from None
        finally:
            pending.pop(rid, None)             # answered, timed out or cancelled
        if resp.status != P.EOK:
            raise from_wire_code(resp.status, f"bookie {self.address}: {resp.message}")
        return resp

    def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None


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
