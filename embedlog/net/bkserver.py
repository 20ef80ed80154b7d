"""BookKeeper's clients on an embedlog bookie: v3 (protobuf) and v2 (binary, Pulsar's)
connections of a BookieServer, answered by the same Bookie as embedlog's protocol.

The server tells a connection's protocol by the first byte of its first frame's message
(server.py): embedlog's messages begin with their version, 0x01; a v3 Request with its
header field's tag, 0x0A; a v2 packet with its protocol version, 2 or 3. A connection keeps
the protocol of its first frame (a BookKeeper client opens v2 and v3 connections apart).

Each request is decoded here, handed to the server's RequestProcessor (net/processor.py),
the operations embedlog's protocol uses too (no second copy of the bookie's logic), and its
answer encoded here: adds (runs of them, the recovery and priority flags), fence-then-read,
reads and long polls, READ_LAC and WRITE_LAC, FORCE_LEDGER, GET_BOOKIE_INFO, the facts a
create fetches first, every durable answer by one path, errors mapped by one table
(errors.STATUSES: each error's v2 and v3 code). The bytes are read by the server's one read
loop (BookieServer._read_frames), which keeps the limits and the flow control and hands
each frame to this decoder.

What differs from embedlog's connections, as BookKeeper's clients need:

- Back-pressure only: at an in-flight limit the connection is not read until there is
  room, however long (a Java client changes its ensemble on any add error but fenced and
  unauthorized, so ETOOMANYREQUESTS would cost a bookie its place in every ensemble).
  The bytes of a frame still arriving count against the bookie-wide limits as they arrive
  (server.reading_bytes and its shares, as embedlog's frames do) until it is decoded: a
  length prefix alone holds nothing.
- No GOAWAY (BookKeeper's clients cannot read it) and no idle close: BookKeeper's bookie
  closes no idle connection (no idle handler in BookieNettyServer; TCP keepalive only).
  A frame that stops arriving half way is still cut off after frame_read_timeout_ms, and
  at the connection limits the least recently used idle connection gives its slot to a
  new client (server._evict_idle), as embedlog's do; one with a request in flight never.
- A malformed frame closes the connection (BookKeeper's decoder throws and Netty closes
  it); an unknown v3 operation is answered EBADREQ, as BookieRequestProcessor does.
- Adds are taken in runs: the consecutive adds of one ledger (same key, recovery flag and
  v2 version) decoded from one read of the socket are journalled with one add, waited for
  with one ``when_durable`` and answered, once durable, with one buffer of their
  responses in request order (a run the bookie refuses as a whole is retried entry by
  entry, so each add gets its own answer as before). Any other request ends the run first.
- Everything BookKeeper cannot express (scopes, terms, TRIM, tokens, TLS) stays on
  embedlog's protocol: BookKeeper requests name scope 0 ledgers only.
- WRITE_LAC's body (ledger id, LAC and the writer's digest of them) is kept for
  READ_LAC's lacBody across restarts, as BookKeeper keeps it (it journals the body): the
  bookie journals the LAC value and keeps the body in the ledger's index header, synced
  before the WRITE_LAC is answered (Bookie.sync_ledger_header).
"""
from __future__ import annotations

import logging
import time

from embedlog._native import bkserve as S
from embedlog._native import bkwire as W
from embedlog._native import bkencode as E
from embedlog._native.format import LedgerId
from embedlog._native.wire_sizes import MASTER_KEY_BYTES, MAX_FRAME_BYTES
from embedlog import failpoints
from embedlog.errors import STATUS, EmbedlogError, NoSuchEntryError, NoSuchLedgerError, status_of
from embedlog.net.bkreply import FaultyReply, ObservedReply, Reply

log = logging.getLogger("embedlog.server.bookkeeper")

AUTH_DISABLED_PLUGIN = b"AuthDisabledPlugin"    # what a bookie without auth names itself
EOK = STATUS["EOK"].v2
MAX_BATCH_ENTRIES = 1024        # a v2 batch read answers at most this many entries
BATCH_HEAD_BYTES = 64           # room a batch read's answer keeps in its frame for its head
V2_ADD_OVERHEAD_BYTES = 44      # what an add's v2 frame holds besides its entry
V3_OVERHEAD_BYTES = 64          # what a v3 request holds besides its body


def first_byte_protocol(byte: int) -> str:
    """"embedlog", "v3" or "v2" by the first byte of a connection's first message."""
    if byte == 0x0A:
        return "v3"
    if byte in (2, 3):
        return "v2"
    return "embedlog"


def _v2(exc: BaseException) -> int:
    return status_of(exc).v2


def _v3(exc: BaseException) -> int:
    return status_of(exc).v3


class _AddRun:
    """Consecutive adds of one ledger from one read of a connection (module doc)."""
    __slots__ = ("lid", "key", "recovery", "version", "bodies", "txns", "eids", "sizes",
                 "started")

    def __init__(self, lid: int, key: bytes, recovery: bool, version: int):
        self.lid, self.key, self.recovery, self.version = lid, key, recovery, version
        self.bodies, self.txns, self.eids, self.sizes = [], [], [], []
        self.started = time.perf_counter()


class BookKeeperSession:
    """One BookKeeper client's connection (module doc): the server's read loop
    (BookieServer._read_frames) hands it whole frames (``decode_frame``, or ``take_at``
    and ``flush`` for the frames of one read) and the requests decoded from them
    (``take``); it calls the server's RequestProcessor and encodes the answers."""

    def __init__(self, server, conn, writer, protocol: str):
        self.server, self.conn, self.writer = server, conn, writer
        self.processor = server.processor
        self.protocol = protocol
        self.v2 = protocol == "v2"
        self.max_frame_bytes = min(server.max_frame_bytes, MAX_FRAME_BYTES)
        self._decode = S.decode_v2 if self.v2 else W.decode_requests

    # -- decode ----------------------------------------------------------------------------

    # what the server's read loop (BookieServer._read_frames) asks of a decoder
    prefixed = True                   # frames are handed over with their length
    refuses = False                   # back-pressure only (module doc)
    min_frame_bytes = 1
    refused_head = 0

    def frame_limit(self) -> int:
        return self.max_frame_bytes

    def bad_size(self, n: int, limit: int) -> None:
        log.warning("BookKeeper %s connection from %s: a frame of %d bytes (limit %d); "
                    "closing it", self.protocol, self.conn.address, n, limit)

    def decode_frame(self, frame):
        """(requests, None) of one whole frame, or (None, the error) when malformed."""
        try:
            reqs, pos, err = self._decode(frame, 0, -1, self.max_frame_bytes)
        except EmbedlogError as exc:
            return None, exc
        if err is None and pos != len(frame):
            err = EmbedlogError(f"a frame of {len(frame)} bytes decoded as {pos}")
        return (None, err) if err is not None else (reqs, None)

    defers = True                     # the frames of one read are decoded and taken together

    def take_at(self, view, at: int, n: int, copy: bool) -> bool:
        """A whole frame the server walked: decoded with the others of its read (flush)."""
        return True

    def flush(self, view, end: int) -> int:
        """Decode the frames the server walked, ``view[:end]``, and take their requests (runs
        of adds form across them); the bytes taken: up to the first malformed frame, which
        is left for decode_frame (the connection is closed). The decoders copy what they
        keep."""
        try:
            reqs, pos, _err = self._decode(view, 0, end, self.max_frame_bytes)
        except EmbedlogError:
            return 0
        if reqs:
            self.server.stats["requests"] += len(reqs)
            self.take(reqs)
        return pos

    def malformed(self, exc) -> None:
        log.warning("BookKeeper %s connection from %s: %s; closing it",
                    self.protocol, self.conn.address, exc)

    def take(self, reqs) -> None:
        """The requests of one read, in order; runs of adds go together (module doc)."""
        if failpoints.active():       # a test's message faults act on requests one by one
            for req in reqs:
                self._admit(req)
            return
        run = None
        known = {}                 # ledger id -> its facts are here (needs no metadata read)
        overhead = V2_ADD_OVERHEAD_BYTES if self.v2 else V3_OVERHEAD_BYTES
        for req in reqs:
            add = self._runnable_v2(req, known) if self.v2 else self._runnable_v3(req, known)
            if add is None:
                if run is not None:
                    self._add_run(run)
                    run = None
                self._admit(req)
                continue
            lid, key, recovery, version, txn, eid, body = add
            if run is not None and (run.lid != lid or run.key != key or
                                    run.recovery != recovery or run.version != version):
                self._add_run(run)
                run = None
            if run is None:
                run = _AddRun(lid, key, recovery, version)
            run.bodies.append(body)
            run.txns.append(txn)
            run.eids.append(eid)
            run.sizes.append(len(body) + overhead)
        if run is not None:
            self._add_run(run)

    def _facts_known(self, lid: int, known: dict) -> bool:
        ok = known.get(lid)
        if ok is None:
            ok = known[lid] = self.processor.has_facts(LedgerId(0, lid))
        return ok

    def _runnable_v3(self, req, known):
        """An add that can join a run: ``(lid, key, recovery, 0, txn, eid, body)``; None for
        anything else (_admit answers it alone, errors included)."""
        if req.operation != W.ADD_ENTRY or req.priority:
            return None
        lid, eid, key, body = req.ledger_id, req.entry_id, req.master_key, req.body
        if lid is None or lid < 0 or eid is None or key is None or \
                len(key) != MASTER_KEY_BYTES or body is None:
            return None
        try:
            if E.entry_ids(body, lid)[0] != eid:
                return None
        except EmbedlogError:
            return None
        if not self._facts_known(lid, known):
            return None
        return lid, key, req.flag == W.RECOVERY_ADD, 0, req.txn_id, eid, body

    def _runnable_v2(self, req, known):
        op, version, flags, lid, eid, key, entry = req
        if op != S.ADDENTRY or flags & S.FLAG_HIGH_PRIORITY or lid < 0 or \
                not self._facts_known(lid, known):
            return None
        return lid, key, bool(flags & S.FLAG_RECOVERY_ADD), version, 0, eid, entry

    # -- call ------------------------------------------------------------------------------

    def _add_run(self, run: _AddRun) -> None:
        """Journal a run with one add; answer it with one write once durable."""
        conn, server = self.conn, self.server
        k, nbytes = len(run.bodies), sum(run.sizes)
        server.hold(conn, k, nbytes)
        try:
            self.processor.add((0, run.lid), run.bodies, run.key,
                               lambda error: self._run_durable(run, nbytes, error),
                               recovery=run.recovery)
        except Exception:
            # refused as a whole: each add again on its own, for its own answer
            for i in range(k):
                self._add_one(run, i, Reply(server, conn, run.sizes[i]))

    def _run_durable(self, run: _AddRun, nbytes: int, error) -> None:
        server = self.server
        server.release_many(self.conn, len(run.eids), nbytes)
        if self.v2:
            code = EOK if error is None else _v2(error)
            data = S.v2_add_responses(run.version, code, run.lid, run.eids)
        else:
            code = W.EOK if error is None else _v3(error)
            data = E.v3_add_responses(run.txns, code, run.lid, run.eids)
        server.send(self.writer, data)
        if server.observers:
            status = 0 if error is None else status_of(error).embedlog
            server.observe("add", status, time.perf_counter() - run.started, (0, run.lid),
                           0 if run.recovery or error is not None else len(run.eids),
                           len(run.eids))

    def _add_one(self, run: _AddRun, i: int, reply) -> None:
        lid, eid, txn, version = run.lid, run.eids[i], run.txns[i], run.version
        if self.v2:
            ok = S.v2_response(version, S.ADDENTRY, EOK, lid, eid)
            fail = lambda exc: S.v2_response(version, S.ADDENTRY, _v2(exc), lid, eid)  # noqa: E731
        else:
            ok = E.v3_add_response(txn, W.EOK, lid, eid)
            fail = lambda exc: E.v3_add_response(txn, _v3(exc), lid, eid)  # noqa: E731
        self._add(lid, eid, run.key, run.bodies[i], run.recovery, reply, ok, fail)

    def _admit(self, req) -> None:
        conn, server = self.conn, self.server
        if self.v2:
            n = len(req[6]) + V2_ADD_OVERHEAD_BYTES if req[6] is not None and req[0] == S.ADDENTRY \
                else V3_OVERHEAD_BYTES
        else:
            n = len(req.body) + V3_OVERHEAD_BYTES if req.body is not None else V3_OVERHEAD_BYTES
        server.hold(conn, 1, n)
        reply = self._observed(req, n) if server.observers else Reply(server, conn, n)
        if failpoints.active():
            reply = self._faulty(req, reply)
            if reply is None:
                return
        try:
            if self.v2:
                self._dispatch_v2(req, reply)
            else:
                self._dispatch_v3(req, reply)
        except Exception as exc:            # every failure becomes a status; the server goes on
            log.exception("BookKeeper request %r failed", req)
            self._fail(req, reply, exc)

    def _observed(self, req, n: int):
        """The reply of a request holding ``n`` bytes that tells the server's observers of
        its answer (ObservedReply), for the operations embedlog's metrics name."""
        server, conn = self.server, self.conn
        if self.v2:
            op, flags, lid = req[0], req[2], req[3]
            if op == S.ADDENTRY:
                return ObservedReply(server, conn, n, "add", (0, lid),
                                     0 if flags & S.FLAG_RECOVERY_ADD else 1, True)
            if op in (S.READENTRY, S.BATCH_READ_ENTRY):
                return ObservedReply(server, conn, n, "read", (0, lid), 0, True)
            return Reply(server, conn, n)
        op, lid = req.operation, req.ledger_id or 0
        if op == W.ADD_ENTRY:
            return ObservedReply(server, conn, n, "add", (0, lid),
                                 0 if req.flag == W.RECOVERY_ADD else 1, False)
        if op == W.READ_ENTRY:
            return ObservedReply(server, conn, n, "read", (0, lid), 0, False,
                                 timed=req.previous_lac is None)
        if op in (W.READ_LAC, W.WRITE_LAC):
            return ObservedReply(server, conn, n, "read_lac" if op == W.READ_LAC else "write_lac",
                                 (0, lid), 0, False)
        return Reply(server, conn, n)

    def _faulty(self, req, reply):
        """The reply an armed message failpoint makes of an add's or read's (tests only):
        None when the request was answered EIO instead of done."""
        op = req[0] if self.v2 else req.operation
        if op in ((S.ADDENTRY,) if self.v2 else (W.ADD_ENTRY,)):
            point = "bkserver.add"
        elif op in ((S.READENTRY, S.BATCH_READ_ENTRY) if self.v2 else (W.READ_ENTRY,)):
            point = "bkserver.read"
        else:
            return reply
        fault = failpoints.fault(point)
        if fault is None:
            return reply
        log.warning("failpoint %s: %s of %s", point, fault, req)
        if fault[0] == "error":
            self._fail(req, reply, OSError(f"failpoint {point}"))
            return None
        return FaultyReply(reply, fault, self.server.loop)

    def _fail(self, req, reply, exc: BaseException) -> None:
        status = self.processor.failed(exc)
        if self.v2:
            op, version, lid, eid = req[0], req[1], req[3], req[4]
            if op == S.BATCH_READ_ENTRY:
                reply.send(S.v2_batch_response(version, status.v2, lid, eid, req[6][0]))
            elif op in (S.ADDENTRY, S.READENTRY):
                reply.send(S.v2_response(version, op, status.v2, lid, eid))
            else:
                reply.send(b"")
                self.writer.close()
            return
        op = req.operation
        if op == W.ADD_ENTRY:
            reply.send(E.v3_add_response(req.txn_id, status.v3, req.ledger_id, req.entry_id))
        elif op == W.READ_ENTRY:
            reply.send(E.v3_read_head(req.txn_id, status.v3, req.ledger_id, req.entry_id))
        else:
            reply.send(_status_only(req, status.v3))

    def _with_facts(self, lid, req, reply, then, kind: str = "create") -> None:
        """``then(req, reply)`` once the ledger's facts are here (RequestProcessor.with_facts)."""
        if lid is None or lid < 0:
            self._fail(req, reply, NoSuchLedgerError(f"ledger id {lid}"))
            return
        self.processor.with_facts(0, lid, kind, then, self._fail, req, reply)

    def _add(self, lid: int, eid: int, key: bytes, body, recovery: bool, reply, ok, fail,
             high_priority: bool = False) -> None:
        def durable(error):
            reply.send(ok if error is None else fail(error))
        try:
            self.processor.add((0, lid), [body], key, durable, recovery=recovery,
                               high_priority=high_priority)
        except Exception as exc:
            reply.send(fail(exc))
            if not isinstance(exc, EmbedlogError):
                log.exception("add of ledger %d entry %d failed", lid, eid)

    def _fence_then(self, lid, key, req, reply, then) -> None:
        def fail(exc):
            self._fail(req, reply, exc)
        try:
            self.processor.fence_then(LedgerId(0, lid), key, then, fail)
        except Exception as exc:
            fail(exc)

    # -- v3 ------------------------------------------------------------------------------

    def _dispatch_v3(self, req, reply) -> None:
        op = req.operation
        if op == W.ADD_ENTRY:
            self._with_facts(req.ledger_id, req, reply, self._add_v3)
        elif op == W.READ_ENTRY:
            fence = bool((req.flag or 0) == W.FENCE_LEDGER)
            self._with_facts(req.ledger_id, req, reply, self._read_v3, "fence" if fence else "read")
        elif op == W.READ_LAC:
            self._with_facts(req.ledger_id, req, reply, self._read_lac_v3, "read")
        elif op == W.WRITE_LAC:
            self._with_facts(req.ledger_id, req, reply, self._write_lac_v3)
        elif op == W.FORCE_LEDGER:
            self._force_v3(req, reply)
        elif op == W.GET_BOOKIE_INFO:
            self._bookie_info_v3(req, reply)
        elif op == W.AUTH:
            # no auth configured: BookieRequestProcessor's answer to an AUTH it ignores
            reply.send(E.encode_response(req.txn_id, W.AUTH, W.EOK,
                                         auth_plugin=AUTH_DISABLED_PLUGIN, auth_payload=b""))
        else:
            # START_TLS (no TLS here), GET_LIST_OF_ENTRIES_OF_LEDGER, unknown operations
            reply.send(_status_only(req, W.EBADREQ))

    def _add_v3(self, req, reply) -> None:
        lid, eid, txn = req.ledger_id, req.entry_id, req.txn_id
        if req.master_key is None or len(req.master_key) != MASTER_KEY_BYTES:
            reply.send(E.v3_add_response(txn, W.EUA, lid, eid))
            return
        try:
            ids_match = eid is not None and E.entry_ids(req.body, lid)[0] == eid
        except EmbedlogError:            # shorter than an entry header, or another ledger's
            ids_match = False
        if not ids_match:
            reply.send(E.v3_add_response(txn, W.EBADREQ, lid, eid if eid is not None else -1))
            return
        self._add(lid, eid, req.master_key, req.body, req.flag == W.RECOVERY_ADD, reply,
                  E.v3_add_response(txn, W.EOK, lid, eid),
                  lambda exc: E.v3_add_response(txn, _v3(exc), lid, eid),
                  high_priority=bool(req.priority))

    def _read_v3(self, req, reply) -> None:
        lid, eid, txn = req.ledger_id, req.entry_id, req.txn_id
        if lid is None or eid is None:
            reply.send(E.v3_read_head(txn, W.EBADREQ, lid or 0, eid if eid is not None else -1))
            return
        if req.flag == W.FENCE_LEDGER:
            if req.master_key is None:
                reply.send(E.v3_read_head(txn, W.EUA, lid, eid))
                return
            self._fence_then(lid, req.master_key, req, reply,
                             lambda: self._read_entry_v3(req, reply, lid, eid))
            return
        if req.previous_lac is not None:
            self._long_poll_v3(req, reply, lid, eid)
            return
        self._read_entry_v3(req, reply, lid, eid)

    def _read_entry_v3(self, req, reply, lid, eid) -> None:
        processor = self.processor
        try:
            body = processor.read_entry(LedgerId(0, lid), eid)
            lac, _last = processor.lac(LedgerId(0, lid))
        except Exception as exc:
            self._fail(req, reply, exc)
            return
        reply.send(E.v3_read_head(req.txn_id, W.EOK, lid, eid, lac, len(body)), body)

    def _long_poll_v3(self, req, reply, lid, eid) -> None:
        # LongPollReadEntryProcessorV3: wait up to timeOut for the LAC to pass previousLAC;
        # with ENTRY_PIGGYBACK the answer carries entry previousLAC + 1 when it is here
        previous = req.previous_lac
        piggyback = req.flag == W.ENTRY_PIGGYBACK
        if piggyback and eid != W.LAST_ADD_CONFIRMED:
            reply.send(E.v3_read_head(req.txn_id, W.EBADREQ, lid, eid))
            return
        processor = self.processor
        try:
            lac, _last = processor.lac(LedgerId(0, lid))
        except Exception as exc:
            self._fail(req, reply, exc)
            return

        def answer():
            try:
                known, _ = processor.lac(LedgerId(0, lid))
                if not piggyback:
                    self._read_entry_v3(req, reply, lid, eid)
                    return
                if known > previous:
                    try:
                        body = processor.read_entry(LedgerId(0, lid), previous + 1)
                    except NoSuchEntryError:
                        reply.send(E.v3_read_head(req.txn_id, W.EOK, lid, eid, known))
                        return
                    reply.send(E.v3_read_head(req.txn_id, W.EOK, lid, previous + 1, known,
                                              len(body)), body)
                else:
                    reply.send(E.v3_read_head(req.txn_id, W.EOK, lid, eid, known))
            except Exception as exc:
                self._fail(req, reply, exc)

        if lac > previous or not req.timeout_ms:
            answer()
            return
        timeout_ms = min(int(req.timeout_ms), self.server.max_long_poll_ms)
        if not processor.long_poll(self.conn, reply, (0, lid), previous, timeout_ms, answer):
            answer()               # past the long-poll bounds: at once, as at a timeout

    def _read_lac_v3(self, req, reply) -> None:
        lid = req.ledger_id
        try:
            _lac, _last, last_body, lac_body = self.processor.read_lac(LedgerId(0, lid), with_body=True)
        except NoSuchLedgerError:
            reply.send(_status_only(req, W.ENOLEDGER))
            return
        except Exception as exc:
            self._fail(req, reply, exc)
            return
        if lac_body is None and last_body is None:
            reply.send(_status_only(req, W.ENOENTRY))
            return
        reply.send(E.encode_response(req.txn_id, W.READ_LAC, W.EOK, ledger_id=lid,
                                     lac_body=lac_body, last_entry_body=last_body))

    def _write_lac_v3(self, req, reply) -> None:
        lid, txn = req.ledger_id, req.txn_id
        if req.master_key is None or len(req.master_key) != MASTER_KEY_BYTES:
            reply.send(_status_only(req, W.EUA))
            return
        ok = E.encode_response(txn, W.WRITE_LAC, W.EOK, ledger_id=lid)

        def durable(error):
            reply.send(ok if error is None else
                       E.encode_response(txn, W.WRITE_LAC, _v3(error), ledger_id=lid))
        try:
            # the body is kept in the index header, synced before the answer
            self.processor.write_lac(LedgerId(0, lid), req.lac, req.master_key, durable,
                                     body=req.body)
        except Exception as exc:
            self._fail(req, reply, exc)

    def _force_v3(self, req, reply) -> None:
        txn, lid = req.txn_id, req.ledger_id
        ok = E.encode_response(txn, W.FORCE_LEDGER, W.EOK, ledger_id=lid)

        def durable(error):
            reply.send(ok if error is None else
                       E.encode_response(txn, W.FORCE_LEDGER, _v3(error), ledger_id=lid))
        self.processor.force(durable)

    def _bookie_info_v3(self, req, reply) -> None:
        requested = req.requested or 0
        try:
            usage = self.processor.disk_usage()
        except OSError:
            reply.send(_status_only(req, W.EIO))
            return
        fields = {}
        if requested & W.FREE_DISK_SPACE:
            fields["free_disk_space"] = usage.free
        if requested & W.TOTAL_DISK_CAPACITY:
            fields["total_disk_capacity"] = usage.total
        reply.send(E.encode_response(req.txn_id, W.GET_BOOKIE_INFO, W.EOK, **fields))

    # -- v2 ------------------------------------------------------------------------------

    def _dispatch_v2(self, req, reply) -> None:
        op, version, flags, lid, eid, key, rest = req
        if op == S.ADDENTRY:
            self._with_facts(lid, req, reply, self._add_v2)
        elif op == S.READENTRY or op == S.BATCH_READ_ENTRY:
            fence = flags & S.FLAG_DO_FENCING and key is not None
            self._with_facts(lid, req, reply, self._read_v2, "fence" if fence else "read")
        else:                                            # AUTH: authentication is off here
            reply.send(S.v2_auth_response(version, AUTH_DISABLED_PLUGIN))

    def _add_v2(self, req, reply) -> None:
        op, version, flags, lid, eid, key, entry = req
        self._add(lid, eid, key, entry, bool(flags & S.FLAG_RECOVERY_ADD), reply,
                  S.v2_response(version, op, EOK, lid, eid),
                  lambda exc: S.v2_response(version, op, _v2(exc), lid, eid),
                  high_priority=bool(flags & S.FLAG_HIGH_PRIORITY))

    def _read_v2(self, req, reply) -> None:
        op, version, flags, lid, eid, key, rest = req
        if flags & S.FLAG_DO_FENCING and version >= 2:
            self._fence_then(lid, key, req, reply, lambda: self._read_now_v2(req, reply))
        else:
            self._read_now_v2(req, reply)

    def _read_now_v2(self, req, reply) -> None:
        op, version, flags, lid, eid, key, rest = req
        processor = self.processor
        if op == S.READENTRY:
            try:
                body = processor.read_entry(LedgerId(0, lid), eid)
            except Exception as exc:
                self._fail(req, reply, exc)
                return
            reply.send(S.v2_response(version, op, EOK, lid, eid, len(body)), body)
            return
        request_id, max_count, max_size = rest
        processor.count("bk_batch_reads")
        # BatchedReadEntryProcessor: from eid on, up to max_count entries and max_size
        # bytes (the first entry whatever its size); an error only if the first is missing
        count = max(1, min(int(max_count), MAX_BATCH_ENTRIES))
        budget = max(0, min(int(max_size), self.max_frame_bytes - BATCH_HEAD_BYTES))
        try:
            if eid < 0:
                raise NoSuchEntryError(f"batch read from entry {eid}")
            k, framed = processor.read_entries(LedgerId(0, lid), eid, count, budget)
            if k == 0:
                raise NoSuchEntryError(f"ledger {lid} has no entry {eid} on this bookie")
        except Exception as exc:
            self._fail(req, reply, exc)
            return
        reply.send(S.v2_batch_response(version, EOK, lid, eid, request_id, framed, k))


def _status_only(req, status: int) -> bytes:
    """A v3 response of the request's operation with ``status`` (and its ledger id)."""
    op = req.operation
    if op in (W.WRITE_LAC, W.READ_LAC, W.FORCE_LEDGER) and req.ledger_id is not None:
        return E.encode_response(req.txn_id, op, status, ledger_id=req.ledger_id)
    if op == W.GET_BOOKIE_INFO:
        return E.encode_response(req.txn_id, op, status)
    if op == W.ADD_ENTRY:
        return E.v3_add_response(req.txn_id, status, req.ledger_id or 0, req.entry_id or 0)
    if op == W.READ_ENTRY:
        return E.v3_read_head(req.txn_id, status, req.ledger_id or 0, req.entry_id or 0)
    return E.v3_status_response(req.txn_id, op & 0xFFFFFFFF if op >= 0 else 0, status)
