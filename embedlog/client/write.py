"""The writer of one ledger: pending adds, quorum acks in order, ensemble changes, close.

Seed 004's rules, with what BookKeeper learned since (docs/PROTOCOL.md, "Writing"):

- Entry e goes to the Qw bookies from index e % E of the current ensemble. It is
  acknowledged once Qa bookies *of its current write set* have acknowledged it and every
  lower entry is acknowledged; the LAC each entry carries is the last entry acknowledged
  when it was sent.
- A failed bookie is replaced by a new fragment starting at LAC + 1. While the change is
  being written no acknowledgement is given (the LAC stays where the fragment starts);
  afterwards every pending entry, that is every entry from the fragment's first on, is
  sent to the replacement, and the replaced bookie's acknowledgements no longer count.
- ``close()`` marks the handle closed first: adds not yet acknowledged fail with
  LedgerClosedError and nothing more is sent, so the LAC frozen at that moment covers
  every acknowledgement ever given; then CLOSED is written at that LAC by CAS.
- An unrecoverable add error (no replacement bookie, metadata gone, fencing) fails every
  pending add and closes the handle at its LAC, as BookKeeper does; a stream's writer
  (unbounded ledger) only fails, as a stream never closes.
- A recovery writer (``recovery=True``: write-back of bounded-ledger recovery and of a
  stream's take-over) keeps its ensemble changes in memory (``local_metadata``); the
  recovery commits them with its close, so a recovery that fails leaves the metadata as
  it found it (BOOKKEEPER-355).

All state lives on the client's event loop; callers in other threads hand work in
through an inbox and wait on concurrent futures.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from embedlog._native import addpath
from embedlog._native.addpath import PendingAdd
from embedlog._native.format import mac_key, master_key
from embedlog.errors import (BadVersionError, EmbedlogError, EntryTooLargeError, IllegalOpError,
                             InvalidTermError, LedgerExistsError,
                             LedgerClosedError, LedgerFencedError, NoSuchLedgerError,
                             NotEnoughBookiesError, TooManyRequestsError, UnauthorizedAccessError)
from embedlog.meta.api import DigestType, LedgerMetadata, LedgerState, Versioned
from embedlog.client.inflight import AddFuture, InFlight
from embedlog.client.lifecycle import check_incarnation, close_ledger
from embedlog.client.producer import Producer, limits as producer_limits
from embedlog.client.schedule import write_quorums
from embedlog.net import protocol as P
from embedlog.net.bookkeeper import WriteLac

if TYPE_CHECKING:
    from embedlog._types import Payload

log = logging.getLogger("embedlog.client")
_PRODUCE_TAKE_BYTES = 1 << 20     # what the loop takes from the produce queue at once
# produced bytes sent and not yet acknowledged: past this the loop waits for answers. More
# only fills the sockets' and asyncio's buffers (copied, and paged in afresh): 3/3/2 1 KiB
# producers with 20 MB out cost 9-10 us of client CPU per add, with 5 MB 5
_PRODUCE_SENT_BYTES_MAX = 4 << 20
_ID_MAX = (1 << 63) - 2            # bookies check a ledger's own bound (2^32 - 1, 2^40 - 1)
TOO_MANY_REQUESTS_RETRIES = 5      # sends to a bookie answering ETOOMANYREQUESTS, 50 ms .. 0.8 s apart
_FATAL = (LedgerFencedError, UnauthorizedAccessError, InvalidTermError)   # from a bookie: stop writing


def with_fragment(md, first: int, ensemble) -> "object":
    """``md`` with a fragment of ``ensemble`` from entry ``first`` (replacing one that starts
    there already); an unbounded ledger also records when the fragment began."""
    frags = list(md.fragments)
    times = list(md.fragment_ctimes_ms) or [md.ctime_ms] * len(frags)
    if frags[-1][0] == first:
        frags[-1] = (first, tuple(ensemble))
    elif frags[-1][0] < first:
        frags.append((first, tuple(ensemble)))
        times.append(int(time.time() * 1000))
    else:
        raise IllegalOpError(f"a fragment at entry {first} would start before the last one "
                             f"({frags[-1][0]})")
    extra = {"fragment_ctimes_ms": tuple(times)} if md.unbounded else {}
    return md.with_(fragments=tuple(frags), **extra)


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
        self._recovery = recovery          # recovery adds; ensemble changes stay in memory
        self._term = term                  # unbounded ledgers: every add carries it
        self._ensemble = list(self._md.fragments[-1][1])
        self._next = self._md.last_entry_id + 1 if recovery else 0
        self._lac = -1
        self._lac_length = 0
        self._length = 0
        self._pending: collections.OrderedDict[int, PendingAdd] = collections.OrderedDict()
        self._failed: set = set()
        self._refused: set = set()       # bookies holding another ledger of this id: never again
        self._changing = False             # an ensemble change is under way: acks wait
        self._error: BaseException | None = None
        self._closed = False               # set first by close(): nothing is sent after it
        self._close_task: asyncio.Task | None = None
        self._slots = InFlight(ctx.config.max_pending_adds)
        self._max_entry_size = ctx.config.max_entry_size_bytes
        self._idle = asyncio.Event()       # no add pending
        self._idle.set()
        self._change_done = asyncio.Event()   # no ensemble change under way
        self._change_done.set()
        self._lac_sent = -1                # the last LAC sent with WRITE_LAC
        self._lac_timer = None
        self._inbox: collections.deque = collections.deque()
        self._inbox_scheduled = False
        self._handing_in = threading.Lock()
        self._prod: Producer | None = None     # produce()'s queue, made on first use
        self._producer_options = producer_limits()
        self._starved = False              # staged messages wait for a slot (_complete takes them)
        ctx.writers.add(self)

    # -- caller threads --------------------------------------------------------------------

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._lac_length

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def version(self) -> object:
        """The metadata version this writer's next CAS expects."""
        return self._version

    @property
    def next_entry_id(self) -> int:
        return self._next

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _check(self):
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")

    def append_async(self, data: Payload, on_done=None) -> concurrent.futures.Future[int]:
        """One add. ``on_done(future)`` is the future's first done-callback, set before the
        add is handed in (Stream's, without add_done_callback's lock). From a caller's
        thread it goes through produce()'s queue (so the loop frames many calls as one
        batch, as runs of ids where E == Qw), and waits while ``max_pending_adds`` adds are
        in flight; from the client's loop (a done-callback) it is handed in alone."""
        if self._error is not None or self._closed:
            self._check()
        if self._prod is not None or not self._ctx.on_loop():
            return self._produce_future(data, on_done, window=True)
        if type(data) is not bytes or len(data) > self._max_entry_size:
            self._check_item(data)
            data = bytes(data)        # a copy the caller cannot change under us
        fut = AddFuture(on_done)
        self._hand_in_from_loop([data], [fut])
        return fut

    def _produce_future(self, data, on_done=None, window: bool = False, wait: bool = False):
        """produce() with a future; with ``window`` (append_async's back-pressure), first
        wait while max_pending_adds messages are in flight, and with ``window`` or ``wait``
        wait for room in a full queue (never on the loop, which frees them)."""
        p = self._prod
        if p is None:
            p = self._start_producer()
        if window and p.queue.in_flight_messages >= self._slots.limit and not self._ctx.on_loop():
            p.wait_in_flight_below(self._slots.limit, self._check)
        fut = AddFuture(on_done)
        try:
            eid = self.produce(data)
        except BufferError:              # a queue smaller than the window: append_async waits
            if not (window or wait) or self._ctx.on_loop():
                raise
            eid = p.full(data, self._check, block=True)
        p.add_future(eid, fut)
        return fut

    def append_many_async(self, items: list[Payload], on_done=None) -> list[concurrent.futures.Future[int]]:
        """Adds of consecutive ids; ``on_done`` as for append_async, on the last add only
        (adds complete in order, and once one fails every later one fails too)."""
        self._check()
        for item in items:
            self._check_item(item)
        if self._prod is not None:
            return self._produce_futures(items, on_done)
        futs = [AddFuture() for _ in items]
        if futs and on_done is not None:
            futs[-1] = AddFuture(on_done)
        if self._ctx.on_loop():
            self._hand_in_from_loop(items, futs)
            return futs
        start = 0
        with self._handing_in:          # one call's entries take consecutive ids
            if self._prod is not None:
                return self._produce_futures(items, on_done)
            while start < len(items):
                # back-pressure: bounded adds in flight; those taken go in before waiting
                # for more (a call larger than the bound would otherwise wait for itself)
                n = self._slots.take(len(items) - start)
                self._hand_in([bytes(i) for i in items[start:start + n]], futs[start:start + n])
                start += n
        return futs

    def _produce_futures(self, items: list, on_done=None) -> list:
        # consecutive ids as long as the call fits in the queue (the producer's lock keeps
        # other callers' produce() out of the middle of it only through the GIL: a call
        # larger than the queue's room is queued in pieces as room comes); the window is
        # waited for once, before the first, so a call is not cut by it
        return [self._produce_future(d, on_done if k == len(items) - 1 else None,
                                     window=k == 0, wait=True)
                for k, d in enumerate(items)]

    # -- the producer (confluent-kafka's produce / poll / flush) -----------------------------

    def configure_producer(self, **options: Any) -> None:
        """Limits of produce()'s queue, before the first produce() or append_async():
        ``queue_buffering_max_messages`` (default 100,000), ``queue_buffering_max_kbytes``
        (default 1 GiB) or ``queue_buffering_max_bytes``, and ``block``: when either is
        reached, produce() raises BufferError (False, the default) or waits (True)."""
        opts = producer_limits(**options)
        if self._prod is not None:
            raise IllegalOpError("configure_producer comes before the first produce()")
        self._producer_options = opts

    def produce(self, value: Payload, on_delivery: Callable[[Any, int], Any] | None = None) -> int:
        """Queue one entry and return its entry id at once (confluent-kafka's produce).

        The client's loop takes what is queued as one batch (one ADD frame per bookie);
        ``on_delivery(error, entry_id)`` runs in the thread that calls poll() or flush()
        once the entry is acknowledged by Qa bookies, in id order (error None), or failed
        (after a failure, an error for every later entry too). The value is copied.
        BufferError when the queue is full (configure_producer). Entries still queued
        when close() is called fail with LedgerClosedError: flush() first."""
        p = self._prod
        if p is None:
            p = self._start_producer()
        try:
            eid = p.queue.add(value)
        except BufferError:
            if not p.block or self._ctx.on_loop():
                raise
            eid = p.full(value, self._check)
        if self._error is not None or self._closed:
            self._refuse_staged()
        if on_delivery is not None:
            p.room_for_callback()
            p.callbacks.append((eid, on_delivery))
        return eid

    def produce_after(self, head: bytes, value: Payload,
                      on_delivery: Callable[[Any, int], Any] | None = None) -> int:
        """produce() of ``head`` + ``value``, joined as they are copied into the queue (a
        stream's entry header: no joined copy made per message)."""
        if self._error is not None or self._closed:
            self._check()
        p = self._prod
        if p is None:
            p = self._start_producer()
        try:
            eid = p.queue.add(value, head)
        except BufferError:
            if not p.block or self._ctx.on_loop():
                raise
            eid = p.full(head + bytes(value), self._check)
        if self._error is not None or self._closed:
            self._refuse_staged()
        if on_delivery is not None:
            p.room_for_callback()
            p.callbacks.append((eid, on_delivery))
        return eid

    def poll(self, timeout: float | None = 0) -> int:
        """Run the delivery callbacks that are due, waiting up to ``timeout`` s for one;
        returns how many ran (confluent-kafka's poll)."""
        return self._prod.poll(timeout) if self._prod is not None else 0

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every produced entry is acknowledged or failed, running callbacks;
        returns how many are still in flight (0 unless ``timeout`` s ran out)."""
        if self._prod is None:
            return 0
        if self._ctx.on_loop():
            raise RuntimeError("flush() from the client's own loop would wait for itself")
        return self._prod.flush(timeout)

    def __len__(self) -> int:
        return len(self._prod) if self._prod is not None else 0

    def _start_producer(self) -> Producer:
        self._check()
        if self._ctx.on_loop():
            self._make_producer()
        else:
            with self._handing_in:           # no append_async is handing in meanwhile
                if self._prod is None:
                    async def make():
                        self._make_producer()
                    self._ctx.run(make())
        return self._prod

    def _make_producer(self) -> None:
        # on the loop, with the inbox taken: the queue's first id is the next one framed
        if self._prod is None:
            self._take_inbox()
            self._prod = Producer(self._next, self._max_entry_size, self._kick_produced,
                                  _ID_MAX, self._producer_options)

    def _kick_produced(self) -> None:
        if self._ctx.on_loop():
            self._ctx.loop.call_soon(self._drain_produced)
        else:
            self._ctx.loop.call_soon_threadsafe(self._drain_produced)

    def _refuse_staged(self) -> None:
        """The writer failed or closed: what is staged fails with its error."""
        p = self._prod
        first, count, _nbytes = p.queue.discard()
        if count:
            p.settle(first, first + count - 1, 0, 0, self._error or
                     LedgerClosedError(f"ledger {self.ledger_id} is closed"))
        self._check()

    def _drain_produced(self) -> None:
        """On the loop: take what is staged, as many as there are slots for, as batches of
        adds; sleep (arm the queue) once it is empty, or wait for slots (_complete)."""
        p = self._prod
        q = p.queue
        while True:
            if self._error is not None or self._closed:
                first, count, _nbytes = q.discard()
                if count:
                    p.settle(first, first + count - 1, 0, 0, self._error or
                             LedgerClosedError(f"ledger {self.ledger_id} is closed"))
                q.take(0, True)            # empty: the next produce() kicks (and is refused)
                return
            staged = q.staged
            n = self._slots.take(staged, block=False) if staged else 0
            if n and self._pending and \
                    q.in_flight_bytes - q.staged_bytes >= _PRODUCE_SENT_BYTES_MAX:
                self._slots.give(n)        # enough sent and unanswered: wait for answers
                n = 0
            if n == 0:
                if staged:
                    self._starved = True   # _complete gives slots back and drains again
                    return
                if q.take(0, True) is None and not q.staged:
                    return
                continue
            first, packed, nbytes = q.take_packed(_PRODUCE_TAKE_BYTES, False, n)
            count = len(packed[1]) >> 3        # int64 ends, one per message
            if count < n:
                self._slots.give(n - count)
            if first != self._next:          # never: every queued message takes the next id
                self._slots.give(count)
                error = EmbedlogError(f"ledger {self.ledger_id}: produced entry {first} "
                                      f"would be framed as {self._next}")
                p.settle(first, first + count - 1, count, nbytes, error)
                self._unrecoverable(error)
                continue
            self._submit_produced(p, first, packed, count, nbytes)

    def _submit_produced(self, p: Producer, first: int, packed: tuple, count: int,
                         nbytes: int) -> None:
        """Frame and send a batch taken from the produce queue (its slots taken), one
        future for the batch, on its last add. Where every entry goes to the same bookies
        (E == Qw) the batch goes as runs of ids, each a frame's worth and one PendingAdd;
        otherwise a PendingAdd per entry."""
        last = AddFuture(_RangeSettler(self, p, first, count, packed[1], nbytes))
        ops: list = []
        cfg = self._ctx.config
        runs = self._E == self._Qw
        try:
            self._next, self._length = addpath.encode_produced(
                packed, last, self._scope, self._lid, self._next, self._lac, self._length,
                self._digest, self._mac_key, self._pending, ops,
                cfg.max_frame_payload_bytes, cfg.max_entries_per_frame if runs else 1)
        except Exception as exc:
            # never after the queue's checks but a bug or no memory; the ids are spent, and
            # no message may wait for ever on it
            if not isinstance(exc, EmbedlogError):
                log.exception("ledger %r: produced adds could not be sent", self.ledger_id)
                error = EmbedlogError(f"ledger {self.ledger_id}: adds could not be sent: {exc!r}")
                error.__cause__ = exc
                exc = error
            done = sum(op.count for op in ops)
            self._next = first + count
            self._slots.give(count - done)
            if ops:
                ops[-1].future = last        # the encoded head settles with the rest
            else:
                last.set_exception(exc)
            self._send_ops(ops)
            self._unrecoverable(exc)
            return
        if ops:
            self._idle.clear()
        self._send_ops(ops)

    def _check_item(self, item) -> None:
        if not isinstance(item, (bytes, bytearray, memoryview)):
            raise IllegalOpError(f"entries are bytes-like, got {type(item).__name__}")
        if len(item) > self._ctx.config.max_entry_size_bytes:
            # refused here, not by every bookie in turn (which would end the ledger)
            raise EntryTooLargeError(f"entry of {len(item)} bytes is over max_entry_size_bytes "
                                     f"({self._ctx.config.max_entry_size_bytes})")

    def _hand_in_from_loop(self, items: list, futs: list) -> None:
        """Adds made by a done-callback, on the loop that frees the slots: waiting for a slot,
        or for a thread that waits for one, would stop it for good. They go in whole at once
        or not at all (TooManyRequestsError), and may fall between the pieces of another
        thread's call that is larger than the free slots."""
        n = self._slots.take(len(items), block=False)
        if n < len(items):
            if n:
                self._slots.give(n)
            raise TooManyRequestsError(
                f"ledger {self.ledger_id}: {len(items)} adds from a done-callback on the "
                f"client's loop with max_pending_adds ({self._ctx.config.max_pending_adds}) "
                f"reached; the loop cannot wait for the slots it frees")
        self._hand_in([bytes(i) for i in items], futs)

    def _hand_in(self, datas: list, futs: list) -> None:
        """Queue adds (bytes, each with its future) for the loop, whose slots are taken."""
        # adds queue up here and the loop takes them all at once, so a burst of
        # append_async calls travels as a few frames, not one frame (and task) per add.
        # No lock (it was a quarter of a producer thread's samples, contended with the
        # loop): deque.extend and popleft are atomic under the GIL, and the loop clears
        # the flag before it drains, so an add it does not drain finds the flag clear
        # and schedules another take
        self._inbox.extend(zip(datas, futs))
        self._schedule_take()

    def _schedule_take(self) -> None:
        """Have the loop take the inbox, unless a take is already due."""
        if not self._inbox_scheduled:
            self._inbox_scheduled = True
            self._ctx.loop.call_soon_threadsafe(self._take_inbox)

    def _take_inbox(self) -> None:
        self._inbox_scheduled = False
        inbox = self._inbox
        batch = [inbox.popleft() for _ in range(len(inbox))]
        try:
            self._submit(batch)
        except Exception as exc:      # a bug, or no memory: no add may wait for ever on it
            log.exception("ledger %r: adds could not be sent", self.ledger_id)
            error = EmbedlogError(f"ledger {self.ledger_id}: adds could not be sent: {exc!r}")
            error.__cause__ = exc
            taken = {id(op.future) for op in self._pending.values()}
            lost = [fut for _data, fut in batch if id(fut) not in taken and not fut.done()]
            self._slots.give(len(lost))       # pending ones are given back as they fail
            for fut in lost:
                fut.set_exception(error)
            self._unrecoverable(error)

    def append(self, data: Payload) -> int:
        return self.append_async(data).result()

    def append_many(self, items: Iterable[Payload]) -> int:
        items = list(items)
        if not items:
            raise IllegalOpError("append_many needs at least one entry")
        last = None
        for f in self.append_many_async(items):
            last = f.result()
        return last

    def close(self) -> None:
        """Close the handle, then the ledger at the LAC (seed 004, BookKeeper's close).

        Adds not yet acknowledged when close() is called fail with LedgerClosedError (wait
        for their futures first to keep them). Raises LedgerFencedError if another client is
        recovering the ledger and LedgerClosedError if it closed it at another entry."""
        self._ctx.run(self.close_async())

    async def close_async(self) -> None:
        if self._close_task is None:
            self._close_task = asyncio.get_running_loop().create_task(
                self._close(LedgerClosedError(f"ledger {self.ledger_id} was closed")))
        await asyncio.shield(self._close_task)

    async def drain(self) -> None:
        """Wait until every add is answered and no ensemble change is under way (streams:
        before a take-over or a rollover; a ledger's close does not wait)."""
        while (not self._idle.is_set() or self._changing) and self._error is None and not self._closed:
            await self._idle.wait()
            await self._change_done.wait()

    def __enter__(self) -> WriteHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"WriteHandle({self.ledger_id}, {state}, E/Qw/Qa {self._E}/{self._Qw}/{self._Qa}, "
                f"last_add_confirmed={self._lac})")

    # -- the loop ----------------------------------------------------------------------------

    @property
    def _ensemble(self) -> list:
        return self._bookies

    @_ensemble.setter
    def _ensemble(self, bookies) -> None:
        self._bookies = list(bookies)
        # its E write quorums, looked up per entry on every send and acknowledgement
        self._quorums = write_quorums(self._md, self._bookies)

    def _submit(self, batch) -> None:
        """Frame and send (data, future) pairs handed in, in order."""
        refused = self._error if self._error is not None else (
            LedgerClosedError(f"ledger {self.ledger_id} is closed") if self._closed else None)
        if refused is not None:
            self._slots.give(len(batch))
            for _data, fut in batch:
                fut.set_exception(refused)
            return
        ops: list = []
        self._next, self._length, failed = addpath.encode_adds(
            batch, self._scope, self._lid, self._next, self._lac, self._length, self._digest,
            self._mac_key, self._pending, ops)
        if failed:
            self._slots.give(failed)
        if ops:
            self._idle.clear()
        self._send_ops(ops)

    def submit_recovered(self, entries: list) -> list:
        """Recovery write-back (on the loop): (entry id, encoded entry, length) re-added with
        the recovery flag; returns their futures."""
        self._check()
        ops = []
        for eid, encoded, length in entries:
            self._slots.take()
            op = PendingAdd(eid, addpath.sized(encoded), length, AddFuture())
            self._pending[eid] = op
            self._next = max(self._next, eid + 1)
            ops.append(op)
        if ops:
            self._idle.clear()
        self._send_ops(ops)
        return [op.future for op in ops]

    def _send_ops(self, ops: list, only: set | None = None) -> None:
        if self._closed or not ops:
            return
        if only is None and len(self._quorums[0]) == len(self._bookies) and not ops[0].acked:
            # E == Qw and adds not sent before (all of a batch alike): all go to every bookie
            per_bookie = dict.fromkeys(self._bookies, ops)
        else:
            per_bookie = addpath.by_bookie(ops, self._quorums, only)
        cuts: dict = {}     # E == Qw: every bookie has the same list, cut into frames once
        for b, bops in per_bookie.items():
            frames = cuts.get(id(bops))
            if frames is None:
                frames = cuts[id(bops)] = self._frames(bops)
            for fops, build in frames:
                self._send_frame(b, fops, build)

    def _frames(self, ops: list) -> list:
        """``ops`` cut into ADD frames under the bookie's limits: (ops, builder) for each."""
        cuts = addpath.frame_cuts(ops, self._ctx.config.max_frame_payload_bytes,
                                  self._ctx.config.max_entries_per_frame)
        frames = [ops[a:b] for a, b in zip([0] + cuts, cuts)] if len(cuts) > 1 else [ops]
        return [(fops, self._add_frame(fops)) for fops in frames]

    def _add_frame(self, ops: list):
        """``request_id -> ADD frame`` of ``ops`` (the frame is built when sent)."""
        parts = [op.data for op in ops]       # each op's entries, sized as the frame has them
        flags = P.FLAG_RECOVERY_ADD if self._recovery else 0
        return lambda rid: P.add_request_sized(rid, self._scope, self._lid, self._master_key,
                                               parts, flags, self._term)

    def _send_frame(self, bookie: str, ops: list, build) -> None:
        """One ADD frame (``build``: its builder, shared by the bookies it goes to): written
        now where the context can (an open connection), its answer counted in the read
        callback; otherwise, or once it fails, by a _send task."""
        if not self._ctx.send(bookie, build, self._ctx.config.add_timeout_s,
                              lambda resp, error: self._answered(bookie, ops, error)):
            self._ctx.loop.create_task(self._send(bookie, ops))

    def _answered(self, bookie: str, ops: list, error) -> None:
        if error is None:
            addpath.ack(ops, bookie, self._pending, self._quorums)
            self._complete()
        else:       # retried, or the bookie replaced, as when call() raises it
            self._ctx.loop.create_task(self._send(bookie, ops, error))

    async def _send(self, bookie: str, ops: list, failed: BaseException | None = None) -> None:
        """Send ``ops`` to ``bookie`` and count its acknowledgement; ``failed`` is the error of
        a first attempt already made (_send_frame), handled as if this one had met it."""
        build = self._add_frame(ops)
        for attempt in range(TOO_MANY_REQUESTS_RETRIES + 1):
            try:
                if failed is not None:
                    error, failed = failed, None
                    raise error
                await self._ctx.call(bookie, build, self._ctx.config.add_timeout_s)
                break
            except TooManyRequestsError:
                # an overloaded bookie pushed back past its throttle time: wait and send again
                # before replacing it (the entries are the same, the bookie stores them once)
                if attempt == TOO_MANY_REQUESTS_RETRIES or self._closed:
                    self._bookie_failed(bookie)
                    return
                await asyncio.sleep(0.05 * 2 ** attempt)
            except _FATAL as exc:
                if bookie in self._ensemble:      # a replaced bookie's answer says nothing now
                    self._unrecoverable(exc)
                return
            except EmbedlogError as exc:
                if isinstance(exc, LedgerExistsError):
                    # the bookie holds another ledger of this id: it refuses this one for good
                    self._refused.add(bookie)
                self._bookie_failed(bookie)
                return
        # an acknowledgement counts only from a bookie still in the entry's write set:
        # once replaced, a bookie's late answer says nothing about the new fragment
        addpath.ack(ops, bookie, self._pending, self._quorums)
        self._complete()

    def _complete(self) -> None:
        if self._changing or self._closed:
            return                             # acknowledgements wait for the new fragment
        pending = self._pending
        done = addpath.acknowledged_run(pending, self._Qa, self._quorums)
        if done:
            self._lac = done[-1].last_id
            self._lac_length = done[-1].length
            # the run's slots back at once, before any of its futures completes (a done-callback
            # may add again at once): a lock and a wake-up per add were 9% of the loop's time
            # under a full window (benchmarks/vs_bookkeeper.py). Pending ids are consecutive
            self._slots.give(done[-1].last_id - done[0].entry_id + 1)
            addpath.set_results(done)
            if self._starved:
                self._starved = False
                self._drain_produced()
        if not pending:
            self._idle.set()
        if self._lac > self._lac_sent and self._lac_timer is None and not self._recovery:
            # BookKeeper's explicit LAC: the last entries' LAC would otherwise only travel
            # with the next add, so readers would not see them while the writer is quiet
            self._lac_timer = self._ctx.loop.call_later(
                self._ctx.config.explicit_lac_interval_ms / 1000.0, self._send_lac)

    def _send_lac(self) -> None:
        self._lac_timer = None
        if not self._ctx.loop.is_closed():
            self._ctx.loop.create_task(self.flush_lac())

    def stop_lac_timer(self) -> None:
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    async def flush_lac(self) -> None:
        """Send the LAC to the ensemble now (WRITE_LAC) and wait for the answers."""
        if self._error is not None or self._lac <= self._lac_sent:
            return
        lac = self._lac_sent = self._lac

        async def one(b):
            try:
                # embedlog's frame when called; a Java bookie's connection asks it for the
                # digest-protected body BookKeeper stores (it needs the ledger's digest)
                await self._ctx.call(b, WriteLac(self._scope, self._lid, self._master_key, lac,
                                                 self._term, self._digest, self._mac_key),
                                     self._ctx.config.add_timeout_s)
            except EmbedlogError:
                pass                # best effort: the next add carries the LAC anyway

        await asyncio.gather(*(one(b) for b in set(self._ensemble)))

    def _fail_pending(self, exc: BaseException) -> None:
        """Fail every add not yet acknowledged (and those still in the inbox) with ``exc``."""
        pending, self._pending = self._pending, collections.OrderedDict()
        self._slots.give(sum(op.count for op in pending.values()))
        for op in pending.values():
            if op.future is not None and not op.future.done():    # None: a produced add
                op.future.set_exception(exc)
        self._take_inbox()            # refused there: the handle is closed or failed
        if self._prod is not None:
            self._starved = False
            self._drain_produced()    # refused there too
        self._idle.set()

    def _fail_all(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._fail_pending(self._error)

    def _unrecoverable(self, exc: BaseException) -> None:
        """An add can never succeed: fail what is pending; a ledger writer also closes the
        ledger at its LAC (BookKeeper's handleUnrecoverableErrorDuringAdd)."""
        if self._error is not None or self._closed:
            return
        log.info("ledger %r: unrecoverable add error, closing at entry %d: %s",
                    self.ledger_id, self._lac, exc)
        self._fail_all(exc)
        if not self._recovery and not self._md.unbounded and self._close_task is None:
            self._close_task = self._ctx.loop.create_task(self._close(exc))
            self._close_task.add_done_callback(_quiet)

    async def _close(self, exc: BaseException) -> None:
        self._closed = True                      # from here on nothing is sent or acknowledged
        self.stop_lac_timer()
        self._fail_pending(exc)
        last, length = self._lac, self._lac_length
        await self._change_done.wait()           # a fragment being written lands first
        v = await self._ctx.offload(
            close_ledger, Versioned(self._md, self._version), last, length,
            self._ctx.write_metadata_sync, self._ctx.metadata.ledger_manager.read_ledger_metadata,
            lambda: self._ctx.failpoint("client.close.before_metadata"))
        self._md, self._version = v.value, v.version

    # -- ensemble changes ---------------------------------------------------------------------

    @property
    def local_metadata(self):
        """The metadata with this writer's ensemble changes (a recovery writer's are not
        in the store until the recovery commits them)."""
        return self._md

    async def roll(self, ensemble: list | None = None) -> None:
        """Start a new fragment at the next entry on a new ensemble (stream rollover):
        pending adds finish on the old one first."""
        await self.drain()
        self._check()
        if ensemble is None:
            ensemble = await self._ctx.offload(self._ctx.choose_bookies, self._E)
        v = await self._ctx.write_metadata("ensemble_change",
                                           with_fragment(self._md, self._next, ensemble), self._version)
        self._md, self._version = v.value, v.version
        self._ensemble = list(ensemble)

    def adopt_metadata(self, versioned) -> None:
        """Metadata another operation of this writer's owner wrote (stream retention), on the loop."""
        self._md, self._version = versioned.value, versioned.version

    def _bookie_failed(self, bookie: str) -> None:
        if bookie not in self._ensemble or self._error is not None or self._closed:
            return
        self._ctx.quarantine(bookie)
        self._failed.add(bookie)
        if not self._changing:
            self._changing = True
            self._change_done.clear()
            self._ctx.loop.create_task(self._change_ensemble())

    async def replace_bookies(self, bookies) -> None:
        """Replace ``bookies`` now (a recovery's no-op found them down) and wait until done."""
        for b in bookies:
            self._bookie_failed(b)
        await self._change_done.wait()
        self._check_usable()

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error

    async def _change_ensemble(self) -> None:
        cancelled = False
        try:
            for _ in range(self._ctx.config.ensemble_change_retries):
                failed = [b for b in self._failed if b in self._ensemble]
                if not failed or self._closed or self._error is not None:
                    return
                try:
                    fresh = await self._ctx.offload(
                        self._ctx.choose_bookies, len(failed),
                        set(self._ensemble) | self._failed | self._refused)
                except NotEnoughBookiesError as exc:
                    raise NotEnoughBookiesError(
                        f"ledger {self.ledger_id}: cannot replace unreachable bookie"
                        f"{'s' if len(failed) > 1 else ''} {', '.join(failed)}: {exc}") from None
                new = list(self._ensemble)
                for old, repl in zip(failed, fresh):
                    new[new.index(old)] = repl
                # acks are held, so the LAC is where the new fragment starts
                changed = with_fragment(self._md, self._lac + 1, new)
                if self._recovery:
                    self._md = changed            # committed by the recovery, or never
                else:
                    try:
                        v = await self._ctx.write_metadata("ensemble_change", changed, self._version)
                    except BadVersionError:
                        await self._reread_after_conflict()
                        continue
                    await self._ctx.offload(self._ctx.failpoint, "client.ensemble_change.after_metadata")
                    self._md, self._version = v.value, v.version
                if self._closed:
                    return
                self._ensemble = new
                self._failed.difference_update(failed)
                gone = set(failed)
                pending = list(self._pending.values())
                for op in pending:
                    addpath.forget_acks(op, gone)
                # every entry from the fragment's first on goes to the replacements
                self._send_ops(pending, only=set(fresh))
            if any(b in self._ensemble for b in self._failed):
                self._unrecoverable(NotEnoughBookiesError(
                    f"could not replace failed bookies of ledger {self.ledger_id}"))
        except (LedgerFencedError, InvalidTermError, NoSuchLedgerError) as exc:
            self._fail_all(exc)
        except NotEnoughBookiesError as exc:
            self._unrecoverable(exc)
        except Exception as exc:  # metadata unreachable and the like: the handle is done
            self._unrecoverable(exc if isinstance(exc, EmbedlogError) else
                                EmbedlogError(f"ensemble change failed: {exc}"))
        except asyncio.CancelledError:
            cancelled = True          # the client is closing: start no other attempt
            raise
        finally:
            self._changing = False
            if (not cancelled and self._error is None and not self._closed
                    and not self._ctx.loop.is_closed()
                    and any(b in self._ensemble for b in self._failed)):
                self._changing = True
                self._ctx.loop.create_task(self._change_ensemble())
            else:
                self._change_done.set()
                self._complete()

    async def _reread_after_conflict(self) -> None:
        """Our fragment lost a CAS: carry on only if we may still write (seed 004)."""
        v = await self._ctx.read_metadata(self.ledger_id)
        md = v.value
        check_incarnation(self._md, md)
        if md.unbounded and md.term != self._term:
            raise InvalidTermError(f"stream ledger {self.ledger_id} moved to term {md.term}; "
                                   f"this writer had term {self._term}")
        if md.state != LedgerState.OPEN:
            raise LedgerFencedError(f"ledger {self.ledger_id} is {md.state.name}: another client "
                                    "recovered or closed it")
        self._md, self._version = md, v.version
        self._ensemble = list(md.fragments[-1][1])

    # -- recovery ------------------------------------------------------------------------------

    def start_recovered_range(self, lac: int, length: int) -> None:
        """A recovery writer: entries up to ``lac`` are settled; write-back begins after it."""
        self._lac, self._lac_length = lac, length
        self._next = lac + 1
        self._length = length
        self._prod = None                  # a writer's producer starts at its next id

    def require_write_quorum(self) -> None:
        """Guaranteed write quorum (a stream's recovery): every add needs all Qw bookies."""
        self._Qa = self._Qw

    def promote(self, versioned, lac: int, length: int) -> None:
        """A stream's recovery writer becomes the term's writer: committed metadata, normal
        adds, ensemble changes by CAS."""
        self._md, self._version = versioned.value, versioned.version
        self._ensemble = list(self._md.fragments[-1][1])
        self._recovery = False
        self._Qa = self._md.ack_quorum
        self._lac, self._lac_length = lac, length
        self._next, self._length = lac + 1, length
        self._prod = None                  # a writer's producer starts at its next id

    def abandon(self, exc: BaseException) -> None:
        """Stop this writer (a failed recovery, a lost term): fail what is pending, send nothing."""
        self._fail_all(exc)
        self._closed = True
        self.stop_lac_timer()


class _RangeSettler:
    """The done-callback of a produced batch's last add: settles the batch as one range
    (adds complete in order, so the last is the last to complete). On a failure, the
    head the writer acknowledged (up to its LAC) and the failed rest settle apart."""
    __slots__ = ("handle", "producer", "first", "count", "ends", "nbytes")

    def __init__(self, handle: WriteHandle, producer: Producer, first: int, count: int,
                 ends: bytes, nbytes: int):
        self.handle, self.producer, self.first, self.count = handle, producer, first, count
        self.ends, self.nbytes = ends, nbytes       # the payloads' int64 end offsets

    def __call__(self, fut) -> None:
        first, n = self.first, self.count
        error = fut.exception()
        if error is None:
            self.producer.settle(first, first + n - 1, n, self.nbytes, None)
            return
        k = min(max(self.handle.last_add_confirmed - first + 1, 0), n)
        head = memoryview(self.ends).cast("q")[k - 1] if k else 0
        if k:
            self.producer.settle(first, first + k - 1, k, head, None)
        self.producer.settle(first + k, first + n - 1, n - k, self.nbytes - head, error)


def _quiet(task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.info("automatic close failed: %s", task.exception())
