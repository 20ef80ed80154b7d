"""The writer of one ledger: pending adds, quorum acks in order, ensemble changes, close.

Seed 004's rules: entry e goes to the Qw bookies starting at index e % E of the
current ensemble; it is acknowledged once Qa of them have acknowledged it *and*
every lower entry is acknowledged; the LAC each entry carries is the last entry
acknowledged when it was sent. A failed bookie is replaced by a new fragment
starting at the first unacknowledged entry, written by CAS on the metadata
(reread and retry, or fail if the ledger is no longer OPEN), and the pending
entries are re-sent to the replacement.

All state lives on the client's event loop; callers in other threads hand work in
with call_soon_threadsafe and wait on concurrent futures.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading

from embedlog._native.format import encode_entry, mac_key, master_key
from embedlog.errors import (BadVersionError, EmbedlogError, IllegalOpError, InvalidTermError,
                             LedgerClosedError, LedgerFencedError, NotEnoughBookiesError,
                             TooManyRequestsError, UnauthorizedAccessError)
from embedlog.meta.api import DigestType, LedgerState
from embedlog.net import protocol as P

TOO_MANY_REQUESTS_RETRIES = 5      # sends to a bookie answering ETOOMANYREQUESTS, 50 ms .. 0.8 s apart


class PendingAdd:
    __slots__ = ("entry_id", "data", "length", "acked", "future")

    def __init__(self, entry_id, data, length, future):
        self.entry_id, self.data, self.length, self.future = entry_id, data, length, future
        self.acked: set = set()


class WriteHandle:
    """Appends to one ledger (the single writer). Thread-safe; durable on Qa bookies on return."""

    def __init__(self, ctx, versioned, password: bytes, *, recovery: bool = False, term: int = 0):
        self._ctx = ctx
        self._md = versioned.value
        self._version = versioned.version
        self.ledger_id = self._md.ledger_id
        self._scope, self._lid = self.ledger_id.scope_id, self.ledger_id.ledger_id
        self._E, self._Qw, self._Qa = self._md.ensemble_size, self._md.write_quorum, self._md.ack_quorum
        self._digest = int(self._md.digest_type)
        self._mac_key = mac_key(password) if self._md.digest_type == DigestType.MAC else None
        self._master_key = master_key(password)
        self._recovery = recovery
        self._term = term                  # unbounded ledgers: every add carries it
        self._ensemble = list(self._md.fragments[-1][1])
        self._next = self._md.last_entry_id + 1 if recovery else 0
        self._lac = -1
        self._lac_length = 0
        self._length = 0
        self._pending: collections.OrderedDict[int, PendingAdd] = collections.OrderedDict()
        self._failed: set = set()
        self._changing = False
        self._error: BaseException | None = None
        self._closed = False
        self._slots = threading.BoundedSemaphore(ctx.config.max_pending_adds)
        self._idle = asyncio.Event()
        self._idle.set()
        self._lac_sent = -1                # the last LAC sent with WRITE_LAC
        self._lac_timer = None
        self._inbox: collections.deque = collections.deque()
        self._inbox_lock = threading.Lock()
        self._inbox_scheduled = False
        ctx.writers.add(self)

    # -- caller threads --------------------------------------------------------------------

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._lac_length

    @property
    def metadata(self):
        return self._md

    def _check(self):
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LedgerClosedError(f"ledger {self.ledger_id!r} is closed")

    def append_async(self, data) -> concurrent.futures.Future:
        return self._append_many_async([data])[-1]

    def _append_many_async(self, items: list) -> list:
        self._check()
        for item in items:
            if not isinstance(item, (bytes, bytearray, memoryview)):
                raise IllegalOpError(f"entries are bytes-like, got {type(item).__name__}")
        futures = []
        for _ in items:
            self._slots.acquire()          # back-pressure: bounded adds in flight
            futures.append(concurrent.futures.Future())
        # adds queue up here and the loop takes them all at once, so a burst of
        # append_async calls travels as a few frames, not one frame (and task) per add
        with self._inbox_lock:
            self._inbox.extend(zip([bytes(i) for i in items], futures))
            wake = not self._inbox_scheduled
            self._inbox_scheduled = True
        if wake:
            self._ctx.loop.call_soon_threadsafe(self._take_inbox)
        return futures

    def _take_inbox(self) -> None:
        with self._inbox_lock:
            batch = list(self._inbox)
            self._inbox.clear()
            self._inbox_scheduled = False
        self._submit([d for d, _f in batch], [f for _d, f in batch])

    def append(self, data) -> int:
        return self.append_async(data).result()

    def append_many(self, items) -> int:
        items = list(items)
        if not items:
            raise IllegalOpError("append_many needs at least one entry")
        last = None
        step = self._ctx.config.max_entries_per_frame
        futures = []
        for i in range(0, len(items), step):
            futures.extend(self._append_many_async(items[i:i + step]))
        for f in futures:
            last = f.result()
        return last

    def close(self) -> None:
        """Wait for pending adds, then CLOSE the ledger in metadata at the LAC (seed 004)."""
        if self._closed:
            return
        self._ctx.run(self._drain())
        self._closed = True
        if self._error is not None:
            raise self._error
        lm = self._ctx.metadata.ledger_manager
        md, version = self._md, self._version
        for _ in range(64):
            if md.state == LedgerState.CLOSED:
                if md.last_entry_id == self._lac:
                    return
                raise LedgerClosedError(f"ledger {self.ledger_id!r} was closed by another client "
                                        f"at entry {md.last_entry_id}, not {self._lac}")
            if md.state == LedgerState.IN_RECOVERY and not self._recovery:
                raise LedgerFencedError(f"ledger {self.ledger_id!r} is being recovered")
            try:
                v = lm.write_ledger_metadata(md.with_(state=LedgerState.CLOSED, last_entry_id=self._lac,
                                                      length=self._lac_length), version)
                self._md, self._version = v.value, v.version
                return
            except BadVersionError:
                v = lm.read_ledger_metadata(self.ledger_id)
                md, version = v.value, v.version
        raise BadVersionError(f"could not close ledger {self.ledger_id!r}")

    async def _drain(self) -> None:
        # every add answered, and no ensemble change still writing metadata
        while (self._pending or self._changing) and self._error is None:
            if self._pending:
                self._idle.clear()
                await self._idle.wait()
            else:
                await asyncio.sleep(0.005)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the loop ----------------------------------------------------------------------------

    def _write_set(self, entry_id: int) -> list:
        e = self._E
        return [self._ensemble[(entry_id + k) % e] for k in range(self._Qw)]

    def _submit(self, items: list, futures: list) -> None:
        ops = []
        for data, fut in zip(items, futures):
            if self._error is not None:
                self._slots.release()
                fut.set_exception(self._error)
                continue
            eid = self._next
            self._next += 1
            self._length += len(data)
            try:
                encoded = encode_entry(self._scope, self._lid, eid, self._lac, self._length,
                                       self._digest, data, self._mac_key)
            except EmbedlogError as exc:
                self._slots.release()
                fut.set_exception(exc)
                continue
            op = PendingAdd(eid, encoded, self._length, fut)
            self._pending[eid] = op
            ops.append(op)
        self._send_ops(ops)

    def submit_recovered(self, entries: list) -> list:
        """Recovery write-back (on the loop): (entry id, encoded entry, length) re-added with
        the recovery flag, through a fenced ledger; returns their futures."""
        ops = []
        for eid, encoded, length in entries:
            fut = concurrent.futures.Future()
            self._slots.acquire()
            op = PendingAdd(eid, encoded, length, fut)
            self._pending[eid] = op
            self._next = max(self._next, eid + 1)
            ops.append(op)
        self._send_ops(ops)
        return [op.future for op in ops]

    def _send_ops(self, ops: list, only: set | None = None) -> None:
        per_bookie: dict = {}
        for op in ops:
            for b in self._write_set(op.entry_id):
                if (only is None or b in only) and b not in op.acked:
                    per_bookie.setdefault(b, []).append(op)
        limit = self._ctx.config.max_frame_payload_bytes
        for b, bops in per_bookie.items():
            start, size = 0, 0
            for i, op in enumerate(bops):          # frames stay under the bookie's limit
                size += len(op.data) + 4
                if size > limit and i > start:
                    self._ctx.loop.create_task(self._send(b, bops[start:i]))
                    start, size = i, len(op.data) + 4
            self._ctx.loop.create_task(self._send(b, bops[start:]))

    async def _send(self, bookie: str, ops: list) -> None:
        flags = P.FLAG_RECOVERY_ADD if self._recovery else 0
        entries = [op.data for op in ops]
        for attempt in range(TOO_MANY_REQUESTS_RETRIES + 1):
            try:
                await self._ctx.call(
                    bookie, lambda rid: P.add_request(rid, self._scope, self._lid, self._master_key,
                                                      entries, flags, self._term),
                    self._ctx.config.add_timeout_s)
                break
            except TooManyRequestsError:
                # an overloaded bookie pushed back past its throttle time: wait and send again
                # before replacing it (the entries are the same, the bookie stores them once)
                if attempt == TOO_MANY_REQUESTS_RETRIES:
                    self._bookie_failed(bookie)
                    return
                await asyncio.sleep(0.05 * 2 ** attempt)
            except (LedgerFencedError, UnauthorizedAccessError, InvalidTermError) as exc:
                self._fail_all(exc)
                return
            except EmbedlogError:
                self._bookie_failed(bookie)
                return
        for op in ops:
            if self._pending.get(op.entry_id) is op:
                op.acked.add(bookie)
        self._complete()

    def _complete(self) -> None:
        pending = self._pending
        while pending:
            eid, op = next(iter(pending.items()))
            ws = self._write_set(eid)
            if sum(1 for b in op.acked if b in ws) < self._Qa:
                break
            pending.popitem(last=False)
            self._lac = eid
            self._lac_length = op.length
            self._slots.release()
            op.future.set_result(eid)
        if not pending:
            self._idle.set()
        if self._lac > self._lac_sent and self._lac_timer is None and not self._recovery:
            # BookKeeper's explicit LAC: the last entries' LAC would otherwise only travel
            # with the next add, so readers would not see them while the writer is quiet
            self._lac_timer = self._ctx.loop.call_later(
                self._ctx.config.explicit_lac_interval_ms / 1000.0, self._send_lac)

    def _send_lac(self) -> None:
        self._lac_timer = None
        self._ctx.loop.create_task(self.flush_lac())

    async def flush_lac(self) -> None:
        """Send the LAC to the ensemble now (WRITE_LAC) and wait for the answers."""
        if self._error is not None or self._lac <= self._lac_sent:
            return
        lac = self._lac_sent = self._lac

        async def one(b):
            try:
                await self._ctx.call(b, lambda rid: P.write_lac_request(
                    rid, self._scope, self._lid, self._master_key, lac, self._term),
                    self._ctx.config.add_timeout_s)
            except EmbedlogError:
                pass                # best effort: the next add carries the LAC anyway

        await asyncio.gather(*(one(b) for b in set(self._ensemble)))

    def _fail_all(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        pending, self._pending = self._pending, collections.OrderedDict()
        for op in pending.values():
            self._slots.release()
            if not op.future.done():
                op.future.set_exception(self._error)
        self._idle.set()

    # -- ensemble changes ---------------------------------------------------------------------

    def _cas_fragment(self, first: int, ensemble: list):
        """CAS a fragment starting at ``first`` onto the metadata (replacing one that starts
        there already); streams also record when it began."""
        import time
        frags = list(self._md.fragments)
        times = list(self._md.fragment_ctimes_ms) or [self._md.ctime_ms] * len(frags)
        if frags[-1][0] == first:
            frags[-1] = (first, tuple(ensemble))
        else:
            frags.append((first, tuple(ensemble)))
            times.append(int(time.time() * 1000))
        extra = {"fragment_ctimes_ms": tuple(times)} if self._md.unbounded else {}
        return self._ctx.metadata.ledger_manager.write_ledger_metadata(
            self._md.with_(fragments=tuple(frags), **extra), self._version)

    async def roll(self, ensemble: list | None = None) -> None:
        """Start a new fragment at the next entry on a new ensemble (stream rollover):
        pending adds finish on the old one first."""
        await self._drain()
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        if ensemble is None:
            ensemble = await loop.run_in_executor(None, self._ctx.choose_bookies, self._E)
        v = await loop.run_in_executor(None, self._cas_fragment, self._next, ensemble)
        self._md, self._version = v.value, v.version
        self._ensemble = list(ensemble)

    def _bookie_failed(self, bookie: str) -> None:
        if bookie not in self._ensemble or self._error is not None:
            return
        self._ctx.quarantine(bookie)
        self._failed.add(bookie)
        if not self._changing:
            self._changing = True
            self._ctx.loop.create_task(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        loop = asyncio.get_running_loop()
        lm = self._ctx.metadata.ledger_manager
        try:
            for _ in range(self._ctx.config.ensemble_change_retries):
                failed = [b for b in self._failed if b in self._ensemble]
                if not failed:
                    return
                try:
                    fresh = await loop.run_in_executor(
                        None, self._ctx.choose_bookies, len(failed), set(self._ensemble) | self._failed)
                except NotEnoughBookiesError as exc:
                    self._fail_all(exc)
                    return
                new = list(self._ensemble)
                for old, repl in zip(failed, fresh):
                    new[new.index(old)] = repl
                try:
                    v = await loop.run_in_executor(None, self._cas_fragment, self._lac + 1, new)
                except BadVersionError:
                    v = await loop.run_in_executor(None, lm.read_ledger_metadata, self.ledger_id)
                    if v.value.unbounded and v.value.term != self._term:
                        self._fail_all(InvalidTermError(
                            f"stream ledger {self.ledger_id!r} moved to term {v.value.term}; "
                            f"this writer had term {self._term}"))
                        return
                    allowed = ((LedgerState.IN_RECOVERY,) if self._recovery and not v.value.unbounded
                               else (LedgerState.OPEN,))
                    if v.value.state not in allowed:
                        self._fail_all(LedgerFencedError(
                            f"ledger {self.ledger_id!r} is {v.value.state.name}: another client "
                            "recovered or closed it"))
                        return
                    self._md, self._version = v.value, v.version
                    self._ensemble = list(self._md.fragments[-1][1])
                    continue
                self._md, self._version = v.value, v.version
                self._ensemble = new
                self._failed.difference_update(failed)
                # the replacements get every pending entry of their write sets
                self._send_ops(list(self._pending.values()), only=set(fresh))
            if any(b in self._ensemble for b in self._failed):
                self._fail_all(NotEnoughBookiesError(
                    f"could not replace failed bookies of ledger {self.ledger_id!r}"))
        except Exception as exc:  # metadata unreachable and the like: the handle is done
            self._fail_all(exc if isinstance(exc, EmbedlogError) else
                           EmbedlogError(f"ensemble change failed: {exc}"))
        finally:
            self._changing = False
            if (self._error is None and not self._ctx.loop.is_closed()
                    and any(b in self._ensemble for b in self._failed)):
                self._changing = True
                self._ctx.loop.create_task(self._change_ensemble())
