"""The bookie server: the wire protocol (embedlog.net.protocol) over one Bookie, on asyncio.

Adds are framed and journalled on the event loop (the bookie's lock is held only to
frame them); the reply is sent from the journal's durability callback, so the loop
never waits for an fdatasync. A malformed, oversized or truncated frame gets an
error reply and the connection is closed; other connections go on.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import shutil
import time

from embedlog._native.format import LedgerId, parse_entry_header
from embedlog.errors import EmbedlogError, IllegalOpError, NoSuchEntryError
from embedlog.net import protocol as P

log = logging.getLogger("embedlog.server")
MAX_READ_ENTRIES = 1024


class BookieServer:
    def __init__(self, bookie, host: str = "127.0.0.1", port: int = 0, *,
                 max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES, max_long_poll_ms: int = 60_000,
                 ssl_context=None, auth_token: bytes | None = None):
        self.bookie = bookie
        self.ssl_context = ssl_context        # an ssl.SSLContext: TLS on every connection
        self.auth_token = auth_token          # when set, each connection's first frame is AUTH
        self.host, self.port = host, port
        self.max_frame_bytes = max_frame_bytes
        self.max_long_poll_ms = max_long_poll_ms
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pollers: dict = {}          # (scope, lid) -> list of (previous_lac, future)
        self._writers: set = set()
        self.stats = {"connections": 0, "requests": 0, "bad_frames": 0, "errors": 0,
                      "auth_failures": 0}

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=self.max_frame_bytes + 8,
                                                  ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            await self._server.wait_closed()

    # -- connections ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats["connections"] += 1
        self._writers.add(writer)
        authenticated = self.auth_token is None
        try:
            while True:
                try:
                    head = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                (n,) = P.LENGTH.unpack(head)
                if n > self.max_frame_bytes or n < P.REQ_HEAD.size:
                    self.stats["bad_frames"] += 1
                    status = P.EBADREQ
                    writer.write(P.error_response(0, 0, 0, status, 0, 0,
                                                  f"frame of {n} bytes is outside 64..{self.max_frame_bytes}"))
                    await writer.drain()
                    return
                try:
                    message = await reader.readexactly(n)
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.stats["bad_frames"] += 1
                    return
                try:
                    req = P.parse_request(message)
                except EmbedlogError as exc:
                    self.stats["bad_frames"] += 1
                    writer.write(P.error_response(0, 0, 0, exc.wire_code or P.EBADREQ, 0, 0, str(exc)))
                    await writer.drain()
                    return
                self.stats["requests"] += 1
                if not authenticated:
                    # the first frame must be AUTH with the token; anything else ends the connection
                    if req.op != P.AUTH or not hmac.compare_digest(bytes(req.body), self.auth_token):
                        self.stats["auth_failures"] += 1
                        writer.write(P.error_response(req.op, req.flags, req.request_id, P.EUA,
                                                      req.scope, req.ledger, "not authenticated"))
                        await writer.drain()
                        return
                    authenticated = True
                self._dispatch(req, writer)
                if writer.transport.get_write_buffer_size() > 4 * self.max_frame_bytes:
                    await writer.drain()      # a slow reader gets back-pressure, not memory
        finally:
            self._writers.discard(writer)
            writer.close()

    def _reply(self, writer, data: bytes) -> None:
        if not writer.is_closing():
            writer.write(data)

    def _reply_threadsafe(self, writer, data: bytes) -> None:
        self._loop.call_soon_threadsafe(self._reply, writer, data)

    def _fail(self, writer, req, exc: BaseException) -> None:
        self.stats["errors"] += 1
        code = exc.wire_code if isinstance(exc, EmbedlogError) else P.EIO
        if not isinstance(exc, EmbedlogError):
            log.exception("request %r failed", req)
        self._reply(writer, P.error_response(req.op, req.flags, req.request_id, code, req.scope,
                                             req.ledger, f"{type(exc).__name__}: {exc}"))

    def _when_durable(self, seq: int, writer, req, ok: bytes, after=None) -> None:
        def done(error):
            if error is not None:
                code = error.wire_code if isinstance(error, EmbedlogError) else P.EIO
                data = P.error_response(req.op, req.flags, req.request_id, code, req.scope,
                                        req.ledger, str(error))
            else:
                data = ok
            self._loop.call_soon_threadsafe(self._durable_reply, writer, data, after)

        self.bookie.on_durable(seq, done)

    def _durable_reply(self, writer, data, after) -> None:
        self._reply(writer, data)
        if after is not None:
            after()

    # -- operations ------------------------------------------------------------------------

    def _dispatch(self, req, writer) -> None:
        try:
            handler = self._handlers[req.op]
            handler(self, req, writer)
        except Exception as exc:  # every failure becomes a status; the server goes on
            self._fail(writer, req, exc)

    def _add(self, req, writer) -> None:
        entries = P.parse_add_body(req.body)
        # the bookie checks every entry belongs to the request's ledger
        seq = self.bookie.add_entries(entries, req.master_key,
                                      recovery=bool(req.flags & P.FLAG_RECOVERY_ADD),
                                      term=req.term, truncate=bool(req.flags & P.FLAG_TRUNCATE),
                                      ledger=(req.scope, req.ledger))
        first = parse_entry_header(entries[0])[3]
        ok = P.response(req.op, req.flags, req.request_id, P.EOK, req.scope, req.ledger,
                        P.ADD_RESP.pack(first, len(entries)))
        self._when_durable(seq, writer, req, ok, after=lambda: self._wake_pollers((req.scope, req.ledger)))

    def _fence_then(self, req, writer, then) -> None:
        """Fence (journalled and durable) before answering, as BookKeeper's fencing read does;
        for a stream's recovery read, check and adopt its term instead."""
        if req.flags & P.FLAG_RECOVERY_READ:
            seq = self.bookie.check_term(_lid(req), req.master_key, req.term)
        else:
            seq = self.bookie.fence(_lid(req), req.master_key)

        def done(error):
            self._loop.call_soon_threadsafe(self._after_fence, req, writer, then, error)

        self.bookie.on_durable(seq, done)

    def _after_fence(self, req, writer, then, error) -> None:
        if error is not None:
            self._fail(writer, req, error)
            return
        try:
            then(req, writer)
        except Exception as exc:
            self._fail(writer, req, exc)

    def _read(self, req, writer) -> None:
        if len(req.body) != P.READ_REQ.size:
            raise IllegalOpError("read request body has the wrong size")
        first, count, previous_lac, timeout_ms = P.READ_REQ.unpack(req.body)
        if first < 0 or count < 1 or count > MAX_READ_ENTRIES:
            raise IllegalOpError(f"bad read range: first {first}, count {count}")
        if req.flags & (P.FLAG_FENCE | P.FLAG_RECOVERY_READ):
            self._fence_then(req, writer, self._read_now)
            return
        if req.flags & P.FLAG_LONG_POLL:
            lac, _last = self.bookie.last_add_confirmed(_lid(req))
            if lac <= previous_lac:
                self._long_poll(req, writer, previous_lac, min(timeout_ms, self.max_long_poll_ms))
                return
        self._read_now(req, writer)

    def _read_now(self, req, writer) -> None:
        first, count, _prev, _t = P.READ_REQ.unpack(req.body)
        lid = _lid(req)
        out, size = [], 0
        for eid in range(first, first + count):
            try:
                data = self.bookie.read_entry(lid, eid)
            except NoSuchEntryError:
                if not out:
                    raise
                break
            size += len(data) + 12
            if out and size > self.max_frame_bytes // 2:
                break               # the reader asks again for the rest: frames stay bounded
            out.append((eid, data))
        lac, _last = self.bookie.last_add_confirmed(lid)
        self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK, req.scope,
                                       req.ledger, P.read_response_body(lac, out)))

    def _long_poll(self, req, writer, previous_lac: int, timeout_ms: int) -> None:
        fut = self._loop.create_future()
        key = (req.scope, req.ledger)
        self._pollers.setdefault(key, []).append((previous_lac, fut))

        def finish(_f=None):
            waiting = self._pollers.get(key, [])
            if (previous_lac, fut) in waiting:
                waiting.remove((previous_lac, fut))
            try:
                lac, _last = self.bookie.last_add_confirmed(_lid(req))
                if lac > previous_lac:
                    self._read_now(req, writer)
                else:   # timed out: answer with the LAC and no entry
                    self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK,
                                                   req.scope, req.ledger, P.read_response_body(lac, [])))
            except Exception as exc:
                self._fail(writer, req, exc)

        handle = self._loop.call_later(timeout_ms / 1000.0, lambda: fut.done() or fut.set_result(None))
        fut.add_done_callback(lambda f: (handle.cancel(), finish()))

    def _wake_pollers(self, key) -> None:
        waiting = self._pollers.get(key)
        if not waiting:
            return
        try:
            lac, _ = self.bookie.last_add_confirmed(key)
        except EmbedlogError:
            return
        for prev, fut in list(waiting):
            if lac > prev and not fut.done():
                fut.set_result(None)

    def _read_lac(self, req, writer) -> None:
        if req.flags & (P.FLAG_FENCE | P.FLAG_RECOVERY_READ):
            self._fence_then(req, writer, self._read_lac_now)
        else:
            self._read_lac_now(req, writer)

    def _read_lac_now(self, req, writer) -> None:
        lid = _lid(req)
        lac, last = self.bookie.last_add_confirmed(lid)
        data = self.bookie.read_entry(lid, last) if last >= 0 else b""
        self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK, req.scope, req.ledger,
                                       P.READ_LAC_RESP.pack(lac, last, len(data)) + data))

    def _write_lac(self, req, writer) -> None:
        if len(req.body) != 8:
            raise IllegalOpError("write_lac request body has the wrong size")
        (lac,) = P.I64.unpack(req.body)
        seq = self.bookie.set_explicit_lac(_lid(req), lac, req.master_key)
        ok = P.response(req.op, req.flags, req.request_id, P.EOK, req.scope, req.ledger)
        self._when_durable(seq, writer, req, ok, after=lambda: self._wake_pollers((req.scope, req.ledger)))

    def _trim(self, req, writer) -> None:
        if len(req.body) != 8:
            raise IllegalOpError("trim request body has the wrong size")
        (first_kept,) = P.I64.unpack(req.body)
        seq = self.bookie.trim(_lid(req), req.master_key, req.term, first_kept)
        self._when_durable(seq, writer, req, P.response(req.op, req.flags, req.request_id, P.EOK,
                                                         req.scope, req.ledger))

    def _bookie_info(self, req, writer) -> None:
        usage = shutil.disk_usage(self.bookie.directory)
        info = {"bookie_id": self.bookie.bookie_id, "address": self.address,
                "free_bytes": usage.free, "total_bytes": usage.total,
                "ledgers": len(self.bookie.ledgers), "time": time.time(), "pid": os.getpid(),
                "server": self.stats}
        self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK, 0, 0,
                                       json.dumps(info).encode()))

    def _auth(self, req, writer) -> None:
        # the first AUTH was checked in _serve; a later one (or one to a bookie without a
        # token) is answered the same way and changes nothing
        ok = self.auth_token is None or hmac.compare_digest(bytes(req.body), self.auth_token)
        if ok:
            self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK, 0, 0))
        else:
            self._reply(writer, P.error_response(req.op, req.flags, req.request_id, P.EUA, 0, 0,
                                                 "wrong token"))

    _handlers = {P.AUTH: _auth, P.ADD: _add, P.READ: _read, P.READ_LAC: _read_lac, P.WRITE_LAC: _write_lac,
                 P.BOOKIE_INFO: _bookie_info, P.TRIM: _trim}


def _lid(req):
    return LedgerId(req.scope, req.ledger)
