"""The client side of Apache BookKeeper's v3 protocol: a Java bookie behind the same
interface as an embedlog bookie (transport.BookieConnection).

The client's operations build embedlog request frames (protocol.py); ``call`` parses the
frame and sends the v3 operations that do the same thing, pipelined on one connection and
matched by txnId, then answers with an embedlog ``Response`` (embedlog's body layout,
status checked). The encoding and the decoding of many frames at once are native
(embedlog/_native/bkwire.pyx); what is here runs once per embedlog request.

    embedlog request                   v3 requests                              answer
    ADD of k entries                   k AddRequests (body = the V1 entry),     first_entry, k
      FLAG_RECOVERY_ADD                  flag RECOVERY_ADD
    READ first, count                  count ReadRequests                       the found prefix;
      FLAG_FENCE                         flag FENCE_LEDGER + masterKey            lac = maxLAC
      FLAG_LONG_POLL                   one ReadRequest of entry -1, flag        lac = maxLAC, the
                                         ENTRY_PIGGYBACK, previousLAC, timeOut    piggybacked entry
    READ_LAC                           ReadLacRequest                           max(explicit LAC,
                                                                                  last entry's LAC)
      FLAG_FENCE                       ReadRequest of entry -1, FENCE_LEDGER    the last entry's
    WRITE_LAC (a WriteLac build)       WriteLacRequest, digest-protected body
    BOOKIE_INFO                        GetBookieInfoRequest                     JSON

Not expressible in BookKeeper's protocol, refused before anything is sent
(IllegalOpError): 128-bit ledger ids (scope != 0), terms and the stream flags
(RECOVERY_READ, TRUNCATE), TRIM, AUTH tokens and TLS (BookKeeper authenticates with its
own plugins and negotiates TLS with START_TLS; neither is spoken here yet).
"""
from __future__ import annotations

import asyncio
import json

from embedlog._native import bkwire as W
from embedlog._native import bkencode as E
from embedlog.errors import (V3_TO_EMBEDLOG, CorruptedDataError, EmbedlogError, IllegalOpError,
                             TimeoutError, from_wire_code)
from embedlog.net import protocol as P
from embedlog.net.transport import BookieUnavailableError

# BookKeeper's v3 status -> embedlog's (errors.STATUSES; EUNKNOWNLEDGERSTATE, a ledger a Java
# bookie lost track of, is EIO: its answer counts neither as an entry nor as an absence)
STATUS_TO_WIRE = V3_TO_EMBEDLOG
# the add error that says most when the entries of one ADD fail differently: the ones
# that stop a writer first (BookKeeper's client reacts to these without an ensemble change)
_ADD_PRECEDENCE = {W.EFENCED: 0, W.EUA: 1}
_OK = W.EOK
PROTOCOL = "bookkeeper"            # BookieRegistration.info["protocol"] of a Java bookie


def status_error(status: int, message: str) -> EmbedlogError:
    """embedlog's exception for a v3 status (unknown statuses are EIO)."""
    name = W.STATUS_NAMES.get(status, f"status {status}")
    return from_wire_code(STATUS_TO_WIRE.get(status, P.EIO), f"{message}: {name}")


class WriteLac:
    """A WRITE_LAC build a BookKeeper bookie can take: called with a request id it is
    embedlog's frame (protocol.write_lac_request), and ``bk_body()`` is the body a Java
    bookie stores and Java readers check: ``ledgerId lac digest`` in the ledger's digest
    type (BookKeeper's DigestManager.computeDigestAndPackageForSendingLac). The digest needs
    the ledger's digest type and MAC key, which embedlog's frame does not carry."""

    __slots__ = ("scope", "ledger", "master_key", "lac", "term", "digest", "mac_key")

    def __init__(self, scope: int, ledger: int, master_key: bytes, lac: int, term: int,
                 digest: int, mac_key: bytes | None):
        self.scope, self.ledger, self.master_key, self.lac = scope, ledger, master_key, lac
        self.term, self.digest, self.mac_key = term, digest, mac_key

    def __call__(self, request_id: int) -> bytes:
        return P.write_lac_request(request_id, self.scope, self.ledger, self.master_key, self.lac,
                                   self.term)

    def bk_body(self) -> bytes:
        return E.lac_body(self.ledger, self.lac, self.digest, self.mac_key)


class _Call:
    """The v3 requests of one embedlog request: txn ids first..first+count-1, of one operation."""
    __slots__ = ("first", "remaining", "results", "fut", "op")

    def __init__(self, first: int, count: int, op: int, fut: asyncio.Future):
        self.first, self.remaining, self.op, self.fut = first, count, op, fut
        self.results: list = [None] * count


class _Wire(asyncio.Protocol):
    """The socket's bytes: frames decoded natively, many per read; answers matched by txnId."""

    def __init__(self, conn: "BookKeeperConnection"):
        self.conn = conn
        self.pending: dict[int, _Call] = {}
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.writable: asyncio.Future | None = None       # set while the socket pushes back
        self.error: BaseException | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        if buf:
            buf += data
            src = buf
        else:
            src = data
        resps, pos, err = W.decode_responses(src, 0, -1, self.conn.max_frame_bytes)
        pending = self.pending
        for r in resps:
            call = pending.pop(r.txn_id, None)
            if call is None:
                continue                      # timed out or cancelled meanwhile
            if r.operation != call.op:
                # BookKeeper's client keys its completions by (txnId, operation) too; the call
                # fails with the connection, as everything still pending on it
                pending[r.txn_id] = call
                err = CorruptedDataError(f"a {W.OPERATIONS.get(r.operation, r.operation)} answer to "
                                         f"a {W.OPERATIONS.get(call.op, call.op)} request (txn {r.txn_id})")
                break
            call.results[r.txn_id - call.first] = r
            call.remaining -= 1
            if call.remaining == 0 and not call.fut.done():
                call.fut.set_result(call.results)
        if err is not None:
            self.error = CorruptedDataError(f"bad response from bookie {self.conn.address}: {err}")
            self.transport.close()
            return
        if src is buf:
            del buf[:pos]
        elif pos < len(data):
            buf += memoryview(data)[pos:]

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        w, self.writable = self.writable, None
        if w is not None and not w.done():
            w.set_result(None)

    def connection_lost(self, exc) -> None:
        error = self.error or BookieUnavailableError(
            f"connection to bookie {self.conn.address} lost" + (f": {exc}" if exc else ""))
        calls = {id(c): c for c in self.pending.values()}
        self.pending.clear()
        for c in calls.values():
            if not c.fut.done():
                c.fut.set_exception(error)
        self.resume_writing()
        self.conn._lost(self)


class BookKeeperConnection:
    """A Java bookie speaking BookKeeper's v3 protocol, with BookieConnection's interface:
    ``await call(build, timeout_s)`` -> protocol.Response (status checked), ``close()``,
    ``closed``. A lost connection fails what is in flight with BookieUnavailableError; the
    next call reconnects."""

    def __init__(self, address: str, *, connect_timeout_s: float = 2.0,
                 max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES, ssl_context=None,
                 auth_token: bytes | None = None):
        self.address = address
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes          # largest response frame read
        self.send_max_frame_bytes = W.MAX_FRAME_BYTES   # the bookie's nettyMaxFrameSizeBytes
        self.ssl_context = ssl_context
        self.auth_token = auth_token
        self._wire: _Wire | None = None
        self._connecting: asyncio.Future | None = None
        self._next_txn = 1                               # txn ids: one per v3 request
        self.closed = False

    # -- the connection --------------------------------------------------------------------

    async def _connect(self) -> _Wire:
        wire = self._wire
        if wire is not None and not wire.transport.is_closing():
            return wire
        if self._connecting is None:
            # the attempt is a task of its own: a caller that gives up must not fail the
            # others waiting for the same connection
            self._connecting = asyncio.get_running_loop().create_task(self._open())
        return await asyncio.shield(self._connecting)

    async def _open(self) -> _Wire:
        try:
            loop = asyncio.get_running_loop()
            try:
                _t, wire = await asyncio.wait_for(
                    loop.create_connection(lambda: _Wire(self), self.host, self.port),
                    self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError) as exc:
                raise BookieUnavailableError(f"cannot connect to bookie {self.address}: {exc}") from None
            # BookKeeper's bookies without an auth plugin take requests at once: no AUTH first
            self._wire = wire
            return wire
        finally:
            self._connecting = None

    def _lost(self, wire: _Wire) -> None:
        if self._wire is wire:
            self._wire = None

    def close(self) -> None:
        self.closed = True
        wire, self._wire = self._wire, None
        if wire is not None and wire.transport is not None:
            wire.transport.close()

    # -- requests --------------------------------------------------------------------------

    async def _send(self, data: bytes, count: int, first: int, op: int, timeout_s: float) -> list:
        """Write ``count`` v3 frames of ``op`` (txn ids first..) and wait for all their answers."""
        wire = await self._connect()
        if wire.writable is not None:
            await wire.writable                  # the socket's buffer is full: wait for room
            if wire.transport.is_closing():
                raise BookieUnavailableError(f"connection to bookie {self.address} lost")
        if wire.transport.is_closing():
            raise BookieUnavailableError(f"connection to bookie {self.address} lost")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        call = _Call(first, count, op, fut)
        pending = wire.pending
        for txn in range(first, first + count):
            pending[txn] = call
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            wire.transport.write(data)
            return await fut
        except asyncio.TimeoutError:
            raise TimeoutError(f"bookie {self.address} did not answer in {timeout_s} s") from None
        finally:
            timer.cancel()
            if call.remaining:
                for txn in range(first, first + count):
                    pending.pop(txn, None)

    def _txn_range(self, count: int) -> int:
        """``count`` txn ids in a row (the loop's thread only: no lock)."""
        first = self._next_txn
        self._next_txn = first + count
        return first

    async def call(self, build, timeout_s: float) -> P.Response:
        """Send what the embedlog frame ``build(request_id)`` asks, as v3 requests, and
        answer as an embedlog bookie would (a non-EOK status raises its error)."""
        if self.closed:
            raise BookieUnavailableError(f"connection to {self.address} is closed")
        if self.ssl_context is not None or self.auth_token is not None:
            raise IllegalOpError(f"bookie {self.address} speaks BookKeeper's protocol: embedlog's "
                                 "TLS and auth token are not spoken to it (BookKeeper negotiates TLS "
                                 "with START_TLS and authenticates with its own plugins)")
        rid = self._txn_range(1)
        frame = build(rid)
        req = P.parse_request(memoryview(frame)[4:])
        if req.scope != 0 or req.ledger >> 63:
            raise IllegalOpError(f"ledger ({req.scope}, {req.ledger}) has a 128-bit id: a BookKeeper "
                                 "bookie holds 63-bit ledger ids only")
        if req.term != 0:
            raise IllegalOpError("streams (terms) cannot be written to a BookKeeper bookie")
        op = req.op
        if op == P.ADD:
            body = await self._add(req, timeout_s)
        elif op == P.READ:
            body = await self._read(req, timeout_s)
        elif op == P.READ_LAC:
            body = await self._read_lac(req, timeout_s)
        elif op == P.WRITE_LAC:
            body = await self._write_lac(req, build, timeout_s)
        elif op == P.BOOKIE_INFO:
            body = await self._bookie_info(timeout_s)
        else:
            raise IllegalOpError(f"{P.OPS.get(op, op)} has no BookKeeper v3 equivalent")
        return P.Response(op, req.flags, rid, P.EOK, req.scope, req.ledger, body)

    def _error(self, r, what: str) -> EmbedlogError:
        return status_error(r.status, f"bookie {self.address}: {what}")

    async def _add(self, req, timeout_s: float) -> bytes:
        if req.flags & ~(P.FLAG_RECOVERY_ADD | P.FLAG_HIGH_PRIORITY):
            raise IllegalOpError(f"add flags {req.flags:#x} have no BookKeeper v3 equivalent")
        n = P.U32.unpack_from(req.body)[0] if len(req.body) >= 4 else 0
        first = self._txn_range(max(n, 1))
        data, count, first_entry = E.encode_adds(first, req.ledger, req.master_key, req.body,
                                                 bool(req.flags & P.FLAG_RECOVERY_ADD),
                                                 self.send_max_frame_bytes)
        results = await self._send(data, count, first, W.ADD_ENTRY, timeout_s)
        worst = None
        for r in results:
            if r.status != _OK and (worst is None or _ADD_PRECEDENCE.get(r.status, 9)
                                    < _ADD_PRECEDENCE.get(worst.status, 9)):
                worst = r
        if worst is not None:
            raise self._error(worst, f"add of entry {worst.entry_id} of ledger {req.ledger}")
        return P.ADD_RESP.pack(first_entry, count)

    async def _read(self, req, timeout_s: float) -> bytes:
        first, count, previous_lac, timeout_ms = P.parse_read_request(req.body)
        if first < 0 or count < 1 or count > P.MAX_READ_ENTRIES:
            raise IllegalOpError(f"bad read range: first {first}, count {count}")
        if req.flags & ~(P.FLAG_FENCE | P.FLAG_LONG_POLL | P.FLAG_HIGH_PRIORITY):
            raise IllegalOpError(f"read flags {req.flags:#x} have no BookKeeper v3 equivalent")
        if req.flags & P.FLAG_LONG_POLL and not req.flags & P.FLAG_FENCE:
            return await self._long_poll(req, first, count, previous_lac, timeout_ms, timeout_s)
        fence = bool(req.flags & P.FLAG_FENCE)
        lac, entries = await self._read_range(req, first, count, fence, timeout_s)
        return P.read_response_body(lac, entries)

    async def _read_range(self, req, first: int, count: int, fence: bool, timeout_s: float):
        txn = self._txn_range(count)
        data = E.encode_reads(txn, req.ledger, first, count, W.FENCE_LEDGER if fence else 0,
                              req.master_key if fence else None)
        results = await self._send(data, count, txn, W.READ_ENTRY, timeout_s)
        lac, out, size = -1, [], 0
        for i, r in enumerate(results):
            if r.status != _OK:
                if not out:
                    raise self._error(r, f"read of entry {first + i} of ledger {req.ledger}")
                break
            if r.body is None:
                raise CorruptedDataError(f"bookie {self.address} answered a read of entry "
                                         f"{first + i} of ledger {req.ledger} without the entry")
            eid, entry_lac = E.entry_ids(r.body, req.ledger)
            if eid != first + i:
                raise CorruptedDataError(f"bookie {self.address} answered a read of entry "
                                         f"{first + i} of ledger {req.ledger} with entry {eid}")
            size += len(r.body) + P.ENTRY_HEAD.size
            if out and size > self.max_frame_bytes // 2:
                break               # the reader asks again for the rest, as from embedlog's bookie
            lac = max(lac, r.max_lac if r.max_lac is not None else entry_lac)
            out.append((eid, r.body))
        return lac, out

    async def _long_poll(self, req, first: int, count: int, previous_lac: int, timeout_ms: int,
                         timeout_s: float) -> bytes:
        txn = self._txn_range(1)
        data = E.encode_request(txn, W.READ_ENTRY, ledger_id=req.ledger,
                                entry_id=W.LAST_ADD_CONFIRMED, flag=W.ENTRY_PIGGYBACK,
                                previous_lac=previous_lac, timeout_ms=timeout_ms)
        (r,) = await self._send(data, 1, txn, W.READ_ENTRY, timeout_s)
        if r.status != _OK:
            raise self._error(r, f"long-poll read of ledger {req.ledger}")
        lac = r.max_lac if r.max_lac is not None else -1
        entries = []
        if r.body is not None:
            eid, _entry_lac = E.entry_ids(r.body, req.ledger)
            if eid == first:
                entries.append((eid, r.body))
        last = min(first + count - 1, lac)
        nxt = first + len(entries)
        if nxt <= last and (entries or first != previous_lac + 1):
            # the rest of what was asked and is now confirmed (a piggyback carries one entry)
            try:
                more_lac, more = await self._read_range(req, nxt, last - nxt + 1, False, timeout_s)
                lac = max(lac, more_lac)
                entries += more
            except EmbedlogError:
                if not entries:
                    raise
        return P.read_response_body(lac, entries)

    async def _read_lac(self, req, timeout_s: float) -> bytes:
        if req.flags & ~(P.FLAG_FENCE | P.FLAG_HIGH_PRIORITY):
            raise IllegalOpError(f"LAC-read flags {req.flags:#x} have no BookKeeper v3 equivalent")
        txn = self._txn_range(1)
        if req.flags & P.FLAG_FENCE:
            # BookKeeper's recovery fences with a read of the last entry (ReadLastConfirmedOp)
            data = E.encode_request(txn, W.READ_ENTRY, ledger_id=req.ledger,
                                    entry_id=W.LAST_ADD_CONFIRMED, master_key=req.master_key,
                                    flag=W.FENCE_LEDGER)
            (r,) = await self._send(data, 1, txn, W.READ_ENTRY, timeout_s)
            if r.status != _OK:
                raise self._error(r, f"fencing read of ledger {req.ledger}")
            if r.body is None:
                raise CorruptedDataError(f"bookie {self.address} answered a fencing read of "
                                         f"ledger {req.ledger} without the entry")
            eid, lac = E.entry_ids(r.body, req.ledger)
            return P.READ_LAC_RESP.pack(lac, eid, len(r.body)) + r.body
        data = E.encode_request(txn, W.READ_LAC, ledger_id=req.ledger)
        (r,) = await self._send(data, 1, txn, W.READ_LAC, timeout_s)
        if r.lac_body is None and r.last_entry_body is None:
            raise self._error(r, f"LAC read of ledger {req.ledger}")
        # 4.16/4.17 answer EIO beside an explicit LAC when the ledger has no entry yet: the LAC
        # is still the bookie's answer
        lac, last, entry = -1, -1, b""
        if r.lac_body is not None:
            lac = E.lac_of_body(r.lac_body, req.ledger)
        if r.last_entry_body is not None:
            last, entry_lac = E.entry_ids(r.last_entry_body, req.ledger)
            lac = max(lac, entry_lac)
            entry = r.last_entry_body
        return P.READ_LAC_RESP.pack(lac, last, len(entry)) + entry

    async def _write_lac(self, req, build, timeout_s: float) -> bytes:
        if not isinstance(build, WriteLac):
            raise IllegalOpError("a WRITE_LAC to a BookKeeper bookie carries the LAC under the "
                                 "ledger's digest: build it with embedlog.net.bookkeeper.WriteLac")
        lac = P.parse_i64_body(req.body)
        txn = self._txn_range(1)
        data = E.encode_request(txn, W.WRITE_LAC, ledger_id=req.ledger, lac=lac,
                                master_key=req.master_key, body=build.bk_body())
        (r,) = await self._send(data, 1, txn, W.WRITE_LAC, timeout_s)
        if r.status != _OK:
            raise self._error(r, f"LAC write of ledger {req.ledger}")
        return b""

    async def _bookie_info(self, timeout_s: float) -> bytes:
        txn = self._txn_range(1)
        data = E.encode_request(txn, W.GET_BOOKIE_INFO,
                                requested=W.TOTAL_DISK_CAPACITY | W.FREE_DISK_SPACE)
        (r,) = await self._send(data, 1, txn, W.GET_BOOKIE_INFO, timeout_s)
        if r.status != _OK:
            raise self._error(r, "bookie info")
        return json.dumps({"address": self.address, "protocol": PROTOCOL,
                           "free_bytes": r.free_disk_space, "total_bytes": r.total_disk_capacity}).encode()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())


__all__ = ["BookKeeperConnection", "WriteLac", "PROTOCOL", "STATUS_TO_WIRE", "status_error"]
