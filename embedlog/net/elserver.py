"""embedlog's own protocol (net/protocol.py) on a BookieServer: each request decoded, handed
to the server's RequestProcessor (net/processor.py), and its answer encoded. The server's
read loop (net/server.py) reads the frames and keeps the limits; EmbedlogFrames decodes
them for it, checks AUTH and hands each request to ``dispatch``;
InProcessConnection (net/transport.py) calls it too, without a socket.

What only embedlog's protocol has: scopes (128-bit ledger ids), terms (a stream's recovery
read or LAC read adopts the term instead of fencing), TRIM, READ's long poll with a range,
BOOKIE_INFO as JSON (the server's figures and its observers'), and error answers that
carry a message.
"""
from __future__ import annotations

import hmac
import json
import logging
import os
import time

from embedlog._native.format import LedgerId, parse_entry_header
from embedlog.errors import EmbedlogError, IllegalOpError, status_of
from embedlog.net import protocol as P

log = logging.getLogger("embedlog.server")
MAX_READ_ENTRIES = P.MAX_READ_ENTRIES


PRE_AUTH_MAX_FRAME = 4096   # bytes a frame may have before AUTH succeeds (AUTH is tiny)


class EmbedlogFrames:
    """embedlog's frames for one connection of the server's read loop
    (BookieServer._read_frames): its limits (a frame's size, and a smaller one before AUTH),
    its answers to a frame it will not serve (an error reply with the reason, then the
    connection is closed; ETOOMANYREQUESTS past the throttle time), AUTH, and its requests
    decoded and handed to the server (BookieServer.admit, then EmbedlogRequests.dispatch)."""

    protocol = "embedlog"
    prefixed = False                  # frames are handed over without their length
    refuses = True                    # past max_throttle_time_ms: ETOOMANYREQUESTS
    min_frame_bytes = P.REQ_HEAD.size
    refused_head = P.REQ_HEAD.size    # what of a refused frame is read for its answer

    def __init__(self, server, conn):
        self.server, self.conn = server, conn
        self.max_frame_bytes = server.max_frame_bytes

    def frame_limit(self) -> int:
        return self.max_frame_bytes if self.conn.authenticated else PRE_AUTH_MAX_FRAME

    def bad_size(self, n: int, limit: int) -> bytes:
        return P.error_response(0, 0, 0, P.EBADREQ, 0, 0,
                                f"frame of {n} bytes is outside {P.REQ_HEAD.size}..{limit}"
                                + ("" if self.conn.authenticated else " before AUTH"))

    def decode_frame(self, message):
        """([(request, frame bytes)], None), or (None, the error) when malformed."""
        try:
            return [(P.parse_request(message), len(message))], None
        except EmbedlogError as exc:
            return None, exc

    defers = False                    # take_at takes each request at once

    def take_at(self, view, at: int, n: int, copy: bool) -> bool:
        """Take the request of the whole frame of ``n`` bytes at ``view[at]`` (its limits
        checked by the server); False, taking nothing, when it is malformed (the server's
        loop answers it). ``copy``: the frame is not the whole read, so it is copied out, and
        the request does not keep the read, and what follows its frame, alive."""
        message = view[at + 4:at + 4 + n]
        try:
            req = P.parse_request(bytes(message) if copy else message)
        except EmbedlogError:
            return False
        self.server.stats["requests"] += 1
        self.server.admit(self.conn, req, n)
        return True

    def flush(self, view, end: int) -> int:
        """The frames take_at took end at ``end``: nothing more to take."""
        return end

    def malformed(self, exc) -> bytes:
        return P.error_response(0, 0, 0, exc.wire_code or P.EBADREQ, 0, 0, str(exc))

    def refusal(self, reqs) -> bytes:
        req = reqs[0][0]
        return P.error_response(req.op, req.flags, req.request_id, P.ETOOMANYREQUESTS,
                                req.scope, req.ledger, "too many requests in flight")

    def authenticate(self, reqs) -> bool:
        """The first request of a connection to a bookie with a token: AUTH with the right
        token lets it through (the AUTH handler answers EOK); anything else gets EUA."""
        req, conn, server = reqs[0][0], self.conn, self.server
        if req.op == P.AUTH and hmac.compare_digest(bytes(req.body), server.auth_token):
            conn.authenticated = True
            return True
        server.stats["auth_failures"] += 1
        conn.auth_failures += 1
        conn.writer.write(P.error_response(req.op, req.flags, req.request_id, P.EUA,
                                           req.scope, req.ledger, "not authenticated"))
        return False

    def take(self, reqs) -> None:
        admit, conn = self.server.admit, self.conn
        for req, n in reqs:
            admit(conn, req, n)


class EmbedlogRequests:
    """The handlers of embedlog's requests for one server (``writer``: where the answer goes,
    the server's _Exchange or a stand-in)."""

    def __init__(self, server):
        self.server = server
        self.processor = server.processor
        self.bookie = server.bookie

    def dispatch(self, req, writer) -> None:
        """Answer one parsed request: at once, or once the ledger's facts are here."""
        kind = _facts_kind(req)
        if kind is None:
            self._handle(req, writer)
            return
        self.processor.with_facts(req.scope, req.ledger, kind, self._handle, self._fail, req, writer)

    def _handle(self, req, writer) -> None:
        try:
            handler = self._handlers[req.op]
            handler(self, req, writer)
        except Exception as exc:  # every failure becomes a status; the server goes on
            self._fail(req, writer, exc)

    # -- answers ---------------------------------------------------------------------------

    def _reply(self, writer, data: bytes) -> None:
        if not writer.is_closing():
            writer.write(data)

    def _fail(self, req, writer, exc: BaseException) -> None:
        status = self.processor.failed(exc)
        if not isinstance(exc, EmbedlogError):
            log.exception("request %r failed", req)
        self._reply(writer, P.error_response(req.op, req.flags, req.request_id, status.embedlog,
                                             req.scope, req.ledger, f"{type(exc).__name__}: {exc}"))

    def _durable(self, req, writer):
        """The callback of a durable wait: the request's EOK, or the error's status."""
        def done(error):
            if error is not None:
                data = _error_answer(req, error)
            else:
                data = P.response(req.op, req.flags, req.request_id, P.EOK, req.scope, req.ledger)
            self._durable_reply(writer, data)
        return done

    def _durable_reply(self, writer, data) -> None:
        self._reply(writer, data)

    # -- operations ------------------------------------------------------------------------

    def _add(self, req, writer) -> None:
        entries = P.parse_add_body(req.body)
        ok = None

        def done(error):
            self._durable_reply(writer, ok if error is None else _error_answer(req, error))
        # the bookie checks every entry belongs to the request's ledger before ``ok`` is made
        # of the first one's id (done runs at the end of this loop step at the earliest)
        self.processor.add((req.scope, req.ledger), entries, req.master_key, done,
                           recovery=bool(req.flags & P.FLAG_RECOVERY_ADD), term=req.term,
                           truncate=bool(req.flags & P.FLAG_TRUNCATE))
        first = parse_entry_header(entries[0])[3]
        ok = P.response(req.op, req.flags, req.request_id, P.EOK, req.scope, req.ledger,
                        P.ADD_RESP.pack(first, len(entries)))

    def _fence_then(self, req, writer, then) -> None:
        """Fenced (journalled and durable) before ``then(req, writer)``, as BookKeeper's
        fencing read does; for a stream's recovery read, its term checked and adopted."""
        term = req.term if req.flags & P.FLAG_RECOVERY_READ else None
        self.processor.fence_then(_lid(req), req.master_key, lambda: then(req, writer),
                                  lambda exc: self._fail(req, writer, exc), term=term)

    def _read(self, req, writer) -> None:
        first, count, previous_lac, timeout_ms = P.parse_read_request(req.body)
        if first < 0 or count < 1 or count > MAX_READ_ENTRIES:
            raise IllegalOpError(f"bad read range: first {first}, count {count}")
        # the body is parsed once, here; what reads later is handed first and count
        if req.flags & (P.FLAG_FENCE | P.FLAG_RECOVERY_READ):
            self._fence_then(req, writer, lambda r, w: self._read_now(r, w, first, count))
            return
        if req.flags & P.FLAG_LONG_POLL:
            lac, _last = self.processor.lac(_lid(req))
            if lac <= previous_lac:
                self._long_poll(req, writer, first, count, previous_lac,
                                min(timeout_ms, self.server.max_long_poll_ms), lac)
                return
        self._read_now(req, writer, first, count)

    def _read_now(self, req, writer, first: int, count: int) -> None:
        lid = _lid(req)
        # the reader asks again for the rest: frames stay bounded
        k, framed = self.processor.read_entries(lid, first, count, self.server.max_frame_bytes // 2)
        lac, _last = self.processor.lac(lid)
        if not writer.is_closing():
            writer.writelines(P.read_response_framed(req.request_id, req.flags, req.scope,
                                                     req.ledger, lac, k, framed))

    def _long_poll(self, req, writer, first: int, count: int, previous_lac: int,
                   timeout_ms: int, lac: int) -> None:
        def answer(lac=None):
            try:
                if lac is None:
                    lac, _last = self.processor.lac(_lid(req))
                if lac > previous_lac:
                    self._read_now(req, writer, first, count)
                else:   # timed out (or past the long-poll bounds): the LAC and no entry
                    self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK,
                                                   req.scope, req.ledger, P.read_response_body(lac, [])))
            except Exception as exc:
                self._fail(req, writer, exc)

        if not self.processor.long_poll(getattr(writer, "conn", None), writer,
                                        (req.scope, req.ledger), previous_lac, timeout_ms, answer):
            answer(lac)

    def _read_lac(self, req, writer) -> None:
        if req.flags & (P.FLAG_FENCE | P.FLAG_RECOVERY_READ):
            self._fence_then(req, writer, self._read_lac_now)
        else:
            self._read_lac_now(req, writer)

    def _read_lac_now(self, req, writer) -> None:
        lac, last, data, _ = self.processor.read_lac(_lid(req))
        data = data if data is not None else b""
        self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK, req.scope, req.ledger,
                                       P.READ_LAC_RESP.pack(lac, last, len(data)) + data))

    def _write_lac(self, req, writer) -> None:
        lac = P.parse_i64_body(req.body)
        self.processor.write_lac(_lid(req), lac, req.master_key, self._durable(req, writer),
                                 term=req.term)

    def _trim(self, req, writer) -> None:
        first_kept = P.parse_i64_body(req.body)
        self.processor.trim(_lid(req), req.master_key, req.term, first_kept,
                            self._durable(req, writer))

    def _bookie_info(self, req, writer) -> None:
        server, bookie = self.server, self.bookie
        usage = self.processor.disk_usage()
        st = bookie.stats
        info = {"bookie_id": bookie.bookie_id, "address": server.address,
                "free_bytes": usage.free, "total_bytes": usage.total,
                "ledgers": len(bookie.ledgers), "time": time.time(), "pid": os.getpid(),
                "read_only": bool(bookie.read_only),
                "read_only_reasons": sorted(bookie.read_only_reasons),
                "add_entries": st.get("adds", 0), "read_entries": st.get("reads", 0),
                "checkpoints": st.get("checkpoints", 0),
                "checkpoint_failures": bookie.checkpointer.failures,
                "server": {**server.stats, "in_flight_requests": server.in_flight_requests,
                           "in_flight_bytes": server.in_flight_bytes,
                           "reading_bytes": server.reading_bytes, "long_polls": server.long_polls},
                **server.info}
        for observer in server.observers:
            info.update(observer.bookie_info())
        self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK, 0, 0,
                                       json.dumps(info).encode()))

    def _auth(self, req, writer) -> None:
        # the first AUTH was checked by EmbedlogFrames.authenticate; a later one
        # (or one to a bookie without a token) is answered the same way and changes nothing
        token = self.server.auth_token
        if token is None or hmac.compare_digest(bytes(req.body), token):
            self._reply(writer, P.response(req.op, req.flags, req.request_id, P.EOK, 0, 0))
        else:
            self._reply(writer, P.error_response(req.op, req.flags, req.request_id, P.EUA, 0, 0,
                                                 "wrong token"))

    _handlers = {P.AUTH: _auth, P.ADD: _add, P.READ: _read, P.READ_LAC: _read_lac,
                 P.WRITE_LAC: _write_lac, P.BOOKIE_INFO: _bookie_info, P.TRIM: _trim}


def _facts_kind(req) -> str | None:
    """What a request does to a ledger, for Bookie.needs_ledger_facts (None: nothing): a
    request that may create the ledger or carries a term waits for one metadata read (the
    ledger's key, digest, boundedness, incarnation); so does any request for a held ledger
    whose metadata changed since it was read."""
    if req.op in (P.ADD, P.WRITE_LAC, P.TRIM):
        return "create"
    if req.op in (P.READ, P.READ_LAC):
        return "fence" if req.flags & (P.FLAG_FENCE | P.FLAG_RECOVERY_READ) else "read"
    return None


def _error_answer(req, error) -> bytes:
    return P.error_response(req.op, req.flags, req.request_id, status_of(error).embedlog,
                            req.scope, req.ledger, str(error))


def _lid(req):
    return LedgerId(req.scope, req.ledger)
