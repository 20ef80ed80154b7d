"""The producer of one writer: produce() / poll() / flush() in confluent-kafka's shape.

``produce(value, on_delivery)`` copies the value into the writer's native ProduceQueue and
returns its entry id at once; the writer's drainer (the embedded handle's flusher thread, the
client's loop) takes the queue's staged batch whole and frames it as one batch, and reports
the batch back here as one range of ids: ``settle(first, last, count, nbytes, error)``.
Nothing is kept per message except what a caller asked for: an ``on_delivery`` callback
(run by ``poll``/``flush`` in the caller's thread, as librdkafka's delivery reports) or an
``append_async`` future (completed by the settling thread).

Ranges are counted settled in id order: one reported early (a batch refused at once while an
earlier one waits for its sync) waits for those before it, so no callback runs before every
lower id has its outcome. Once a range fails every later one fails too (the writer takes no
more adds): so a message's outcome is known from the last id settled and the few failed
ranges, each with its error (every message of a failed range gets that range's error; a
range after a failed one gets its own, as an add after a hole always has: LedgerClosedError).

Limits (librdkafka's names): ``queue_buffering_max_messages`` (default 100,000) and
``queue_buffering_max_kbytes`` (default 1,048,576 KiB; or ``queue_buffering_max_bytes``)
bound the messages produced and not yet delivered, and ``block`` says what produce() does
when either is reached: raise BufferError (False, the default, as confluent-kafka) or wait
for deliveries, running due callbacks meanwhile (True). Delivery callbacks waiting for a
poll count too: at max_messages of them, produce() runs the due ones first.
"""
from __future__ import annotations

import bisect
import collections
import threading
import time
from typing import Any, Callable

from embedlog._native.addpath import complete_ids
from embedlog._native.produce_queue import ProduceQueue
from embedlog.errors import IllegalOpError

MAX_MESSAGES_DEFAULT = 100_000          # librdkafka's queue.buffering.max.messages
MAX_KBYTES_DEFAULT = 1_048_576          # librdkafka's queue.buffering.max.kbytes (1 GiB)

DeliveryCallback = Callable[[Any, int], Any]      # on_delivery(error or None, id)


def limits(queue_buffering_max_messages: int = MAX_MESSAGES_DEFAULT,
           queue_buffering_max_kbytes: int | None = None,
           queue_buffering_max_bytes: int | None = None, block: bool = False) -> dict:
    """The producer options checked and in one unit: {max_messages, max_bytes, block}."""
    if queue_buffering_max_kbytes is not None and queue_buffering_max_bytes is not None:
        raise IllegalOpError("give queue_buffering_max_kbytes or queue_buffering_max_bytes, not both")
    if queue_buffering_max_bytes is None:
        kib = MAX_KBYTES_DEFAULT if queue_buffering_max_kbytes is None else queue_buffering_max_kbytes
        queue_buffering_max_bytes = int(kib) * 1024
    return {"max_messages": int(queue_buffering_max_messages),
            "max_bytes": int(queue_buffering_max_bytes), "block": bool(block)}


class Producer:
    """The produce state of one writer. ``to_user`` maps an entry id to what the caller sees
    (a stream's position); ``check`` raises when the writer takes no more messages."""

    def __init__(self, first_id: int, entry_max_bytes: int, kick: Callable[[], Any],
                 id_max: int, options: dict | None = None, to_user: Callable[[int], Any] | None = None):
        opts = options or limits()
        self.queue = ProduceQueue(first_id, opts["max_messages"], opts["max_bytes"],
                                  entry_max_bytes, id_max, kick)
        self.block = opts["block"]
        self.to_user = to_user
        self.callbacks: collections.deque = collections.deque()   # (id, on_delivery), id order
        self.futures: collections.deque = collections.deque()     # (id, future), id order
        self.settled = first_id - 1         # every id up to here is delivered or failed
        self.failed_from: int | None = None     # the first id that failed
        self.failures: list = []                # (first id, error) of each failed range
        self._early: dict = {}                  # first id -> last id of ranges settled early
        self._cv = threading.Condition(threading.Lock())
        self._waiting = 0
        self._lock = threading.Lock()       # futures registered against ranges settling

    # -- the settling side (journal thread, client loop) -------------------------------------

    def settle(self, first: int, last: int, count: int, nbytes: int,
               error: BaseException | None) -> None:
        """Messages first..last (count of them, nbytes) were delivered (error None) or failed."""
        with self._lock:
            if error is not None:
                if self.failed_from is None or first < self.failed_from:
                    self.failed_from = first
                bisect.insort(self.failures, (first, error), key=lambda f: f[0])
            if first == self.settled + 1:
                self.settled = last
                early = self._early
                while early and self.settled + 1 in early:
                    self.settled = early.pop(self.settled + 1)
            elif last > self.settled:
                self._early[first] = last
            if self.futures:
                self._complete_futures()
        self.queue.settle(count, nbytes)
        if self._waiting:
            with self._cv:
                self._cv.notify_all()

    def _complete_futures(self) -> None:
        futures, settled, failed_from = self.futures, self.settled, self.failed_from
        to_user = self.to_user
        if failed_from is None and to_user is None:
            complete_ids(futures, settled)        # one C pass, one hold of the futures' lock
            return
        while futures and futures[0][0] <= settled:
            eid, fut = futures.popleft()
            if failed_from is not None and eid >= failed_from:
                fut.set_exception(self.error_of(eid))
            else:
                fut.set_result(eid if to_user is None else to_user(eid))

    def skip(self, first: int, last: int) -> None:
        """Ids first..last went to a caller that frames them itself (append, append_many):
        no message of this queue has them, and they settle nothing here."""
        if last >= first:
            self.settle(first, last, 0, 0, None)

    def error_of(self, eid: int) -> BaseException | None:
        """The error message ``eid`` (settled) failed with, or None if it was delivered."""
        if self.failed_from is None or eid < self.failed_from:
            return None
        for first, error in reversed(self.failures):
            if first <= eid:
                return error
        return None

    def add_future(self, eid: int, fut) -> None:
        """append_async's future for message ``eid``, completed when its range settles."""
        # no lock to append: deque.append is atomic under the GIL, and settle() moves
        # ``settled`` before it looks at the futures, so a future appended after that look
        # finds its id settled here and is completed under the lock
        self.futures.append((eid, fut))
        if eid <= self.settled:
            with self._lock:
                self._complete_futures()

    # -- the caller's side -----------------------------------------------------------------

    def full(self, value, check: Callable[[], None], block: bool | None = None) -> int:
        """add() met a full queue: raise BufferError, or (``block``, by default the
        producer's) wait for room and add."""
        block = self.block if block is None else block
        while True:
            try:
                return self.queue.add(value)
            except BufferError:
                if not block:
                    raise
            check()
            self.poll(0)
            self._wait(lambda: self.queue.in_flight_messages < self.queue.max_messages
                       and self.queue.in_flight_bytes + len(value) <= self.queue.max_bytes, 0.5)

    def wait_in_flight_below(self, limit: int, check: Callable[[], None]) -> None:
        """Wait until fewer than ``limit`` messages are in flight (append_async's window,
        max_pending_adds), running due callbacks; ``check`` raises once the writer is done."""
        q = self.queue
        while q.in_flight_messages >= limit:
            check()
            self.poll(0)
            self._wait(lambda: q.in_flight_messages < limit, 0.5)

    def room_for_callback(self) -> None:
        """Before queueing a delivery callback: at max_messages waiting, run the due ones."""
        if len(self.callbacks) >= self.queue.max_messages:
            self.poll(0)
            while len(self.callbacks) >= self.queue.max_messages:
                if not self.block:
                    raise BufferError(f"{len(self.callbacks)} delivery callbacks wait for poll() "
                                      f"(queue_buffering_max_messages={self.queue.max_messages})")
                self.poll(0.5)

    def _due(self) -> bool:
        return bool(self.callbacks) and self.callbacks[0][0] <= self.settled

    def _wait(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            self._waiting += 1
            try:
                while not ready():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cv.wait(left)
                return True
            finally:
                self._waiting -= 1

    def poll(self, timeout: float | None = 0) -> int:
        """Run the delivery callbacks that are due (waiting up to ``timeout`` s for one when
        callbacks are pending and none is due; None waits for ever); returns how many ran."""
        if timeout and not self._due() and self.callbacks:
            self._wait(self._due, timeout)
        callbacks, ran = self.callbacks, 0
        to_user = self.to_user
        while callbacks and callbacks[0][0] <= self.settled:
            eid, cb = callbacks.popleft()
            error = None if self.failed_from is None else self.error_of(eid)
            ran += 1
            cb(error, eid if to_user is None else to_user(eid))
        return ran

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every message produced is delivered or failed, running callbacks as
        they fall due; returns how many are still in flight (0 unless ``timeout`` ran out)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        q = self.queue
        while True:
            self.poll(0)
            if q.in_flight_messages == 0:
                self.poll(0)
                return 0
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return q.in_flight_messages
            n = q.in_flight_messages
            self._wait(lambda: q.in_flight_messages < n or self._due(),
                       0.5 if left is None else min(left, 0.5))

    def __len__(self) -> int:
        """Messages in flight (confluent-kafka's len(producer))."""
        return self.queue.in_flight_messages
