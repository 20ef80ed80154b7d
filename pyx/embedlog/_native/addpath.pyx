# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The client's add path, one C pass per batch: encoding a batch of adds into pending
adds (a produced batch into runs of ids, one pending add each), splitting them among their write sets' bookies and cutting them into frames,
counting a bookie's acknowledgements, finding the run of adds a write quorum has
acknowledged and completing its futures; and the future of an add and the bound on adds in
flight (embedlog.client.inflight re-exports them). In Python these were the client's
per-add bytecode, most of a replicated add's client CPU. The client's layer (tests/
test_layers.py); the ADD frame itself is the wire's (frames.pyx).

Bounds: a produce queue's packed take is checked whole before any read (its int64 ends
in order, within its data, the last at its end); each entry's framed size is checked to
fit its u32, a run's bytes are summed from those sizes before its buffer is allocated, and
every entry written into it is checked against that sum. The write sets are indexed by
``entry_id % E`` made non-negative (_write_set).
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.list cimport PyList_Append

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)

from embedlog._native.format cimport encode_into, encoded_size, el_put32
from embedlog._native.journal_kernels import packed_count    # the packed take's own check
import concurrent.futures
import threading
from concurrent.futures import _base

from embedlog.errors import EmbedlogError, IllegalOpError

cdef object FINISHED = _base.FINISHED, RUNNING = _base.RUNNING      # the states it is in


# Guards a future's first condition against its completion without one. Held only for a
# few operations, never while taking another lock.
_MADE = threading.Lock()


class AddFuture(concurrent.futures.Future):
    """The future of one add: a ``concurrent.futures.Future``, handed out running.

    An add handed in cannot be taken back, so ``cancel()`` is refused (a cancelled future
    made set_result raise where the add completed, and the journal's writer thread or
    the acknowledgement loop died on it). The condition the base class waits on is made
    only when someone blocks on it (``result()`` before completion, ``wait()``,
    ``as_completed()``); a future completed with nobody waiting, the common case under
    ``add_done_callback`` or ``asyncio.wrap_future``, never makes one.

    Why it uses CPython's private fields (this is the one place that says so): the base
    class's ``__init__`` makes a Condition and two lists per future, and those per-add
    objects cost 15-20 % of a replicating client's CPU (collector promotions) and 10 % of a
    streaming producer's samples. So this class sets the fields ``__init__`` would
    (``_state``, ``_result``, ``_exception``, ``_waiters``, ``_done_callbacks``), makes
    ``_condition`` on first use, and, like ``set_results`` and ``complete_ids`` below,
    completes a future nobody waits on by writing ``_result`` and ``_state`` (``_base``'s
    RUNNING and FINISHED) and calling ``_invoke_callbacks``. It must stay a
    ``concurrent.futures.Future`` with those fields: ``asyncio.wrap_future`` checks the
    class, and ``concurrent.futures.wait`` and ``as_completed`` read ``_condition``,
    ``_state`` and ``_waiters`` of any future handed to them. tests/client/test_inflight.py
    (test_the_cpython_future_internals_add_future_relies_on) fails on a CPython whose
    Future changes any of them.
    """

    # Neither list is made per future (``_waiters``, ``_done_callbacks``: None until
    # needed): an add lives past a young collection or two, so what it holds that the
    # collector tracks gets promoted, and promotions set off the full collections that were
    # 15-20% of a replicating client's CPU.
    def __init__(self, on_done=None):    # the base __init__ would make the condition
        self._made = None
        self._state = RUNNING
        self._result = None
        self._exception = None
        # a callback given here is in place before any thread can complete the future,
        # so it needs none of add_done_callback's locking
        self._done_callbacks = None if on_done is None else [on_done]

    @property
    def _condition(self):
        cond = self._made
        if cond is None:
            with _MADE:
                if self._made is None:
                    # the base class's ways in (waiters installed, callbacks appended and
                    # run, completion) all enter the condition first, so both lists exist
                    # from here on
                    self._waiters = []
                    if self._done_callbacks is None:
                        self._done_callbacks = []
                    self._made = threading.Condition()
                cond = self._made
        return cond

    # A finished add never changes again (cancel() refuses a running future, and nothing
    # cancels one before it runs), so asking a finished one needs no condition: Stream's
    # own done-callback asks every add for its exception, and the base class made a
    # Condition for each of them (10% of a streaming producer's samples).
    def done(self):
        return self._state == FINISHED or super().done()

    def cancelled(self):
        return False if self._state in (RUNNING, FINISHED) else super().cancelled()

    def exception(self, timeout=None):
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def result(self, timeout=None):
        if self._state == FINISHED:
            if self._exception is not None:
                raise self._exception
            return self._result
        return super().result(timeout)

    def add_done_callback(self, fn):
        with _MADE:
            if self._made is None and self._state == RUNNING:
                if self._done_callbacks is None:
                    self._done_callbacks = [fn]
                else:
                    self._done_callbacks.append(fn)
                return
        super().add_done_callback(fn)

    def set_result(self, result):
        if not self._finish(result, None):
            super().set_result(result)

    def set_exception(self, exception):
        if not self._finish(None, exception):
            super().set_exception(exception)

    def _finish(self, result, exception):
        """Complete without a condition if none was made; False to go the base class's way."""
        with _MADE:
            if self._made is not None or self._state != RUNNING:
                return False
            self._result, self._exception = result, exception
            self._state = FINISHED
        if self._done_callbacks:
            self._invoke_callbacks()     # no callback is added after FINISHED (see above)
        return True


cdef class InFlight:
    """At most ``limit`` adds in flight: callers block in ``take`` at the bound (the
    back-pressure of append_async), ``give`` hands a slot back.

    The count is a C integer, tested and changed with the GIL held and no Python call in
    between, so the common take and give need no lock of their own. A taker that must wait
    counts itself blocked in that same stretch and waits on a condition, which a giver that
    sees it blocked takes before notifying, so no wake-up is lost."""
    cdef readonly Py_ssize_t limit
    cdef Py_ssize_t free
    cdef Py_ssize_t blocked
    cdef object room

    def __init__(self, Py_ssize_t limit):
        if limit < 1:
            raise IllegalOpError(f"max_pending_adds must be at least 1, got {limit}")
        self.limit = self.free = limit
        self.blocked = 0
        self.room = threading.Condition(threading.Lock())

    def take(self, Py_ssize_t most=1, bint block=True):
        """Take between 1 and ``most`` slots, as many as are free, blocking until one is
        (without ``block``, 0 when none is free)."""
        cdef Py_ssize_t n
        if self.free <= 0:
            if not block:
                return 0
            with self.room:
                while self.free <= 0:
                    self.blocked += 1
                    try:
                        self.room.wait()
                    finally:
                        self.blocked -= 1
        n = most if most < self.free else self.free
        self.free -= n
        return n

    def give(self, Py_ssize_t n=1):
        if self.free + n > self.limit:
            raise RuntimeError("InFlight.give: more slots given back than taken")
        self.free += n
        if self.blocked:
            with self.room:
                self.room.notify(n)


cdef class PendingAdd:
    """Adds not yet acknowledged: one add, or a run of consecutive ids (a produced batch
    whose entries all go to the same bookies, E == Qw) acknowledged, sent and failed as
    one. Its first and last ids, its entries as an ADD frame carries them (``data``: each
    a u32 size, then the encoded entry, back to back), the ledger's length with its last
    entry, the bookies that acknowledged it (by id: None until the first, see AddFuture on
    what each tracked object of an add costs) and its future (completed with the last id).

    It stays tracked by the collector: its future's done-callbacks may lead back to the
    write handle that holds it (a callback that adds again), and a client closed with adds
    in flight leaves that cycle for the collector to free."""
    cdef public int64_t entry_id
    cdef public int64_t last_id
    cdef public object data
    cdef public int64_t length
    cdef public object acked      # None, the one bookie (str) or a set of bookies (acked_by)
    cdef public object future

    def __init__(self, int64_t entry_id, data, int64_t length, future, last_id=None):
        self.entry_id, self.data, self.length, self.future = entry_id, data, length, future
        self.last_id = entry_id if last_id is None else last_id
        self.acked = None

    @property
    def count(self):
        return self.last_id - self.entry_id + 1


def sized(entry):
    """``entry`` (an encoded entry) as an ADD frame carries it: its u32 size, then itself."""
    cdef const uint8_t[::1] v = entry
    cdef Py_ssize_t n = v.shape[0]
    if n > 0xFFFFFFFF:
        raise IllegalOpError(f"an entry of {n} bytes does not fit a u32 size")
    out = PyBytes_FromStringAndSize(NULL, n + 4)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    el_put32(p, <uint32_t>n)
    if n:
        memcpy(p + 4, &v[0], n)
    return out


cdef inline Py_ssize_t _entry_size(uint64_t scope, int digest, Py_ssize_t n) except -1:
    """An entry's bytes in a frame: its u32 size and the encoded entry."""
    cdef Py_ssize_t size = encoded_size(scope, digest, n)
    if size > 0xFFFFFFFF:
        raise IllegalOpError(f"an entry of {n} bytes does not fit a u32 size")
    return size + 4


def encode_adds(list batch, uint64_t scope, uint64_t lid, int64_t eid, int64_t lac,
                int64_t length, int digest, mac_key, pending, list ops):
    """Encode ``batch`` ((payload bytes, future) pairs) as entries ``eid``, ``eid`` + 1, ...,
    each carrying ``lac`` and the ledger's length with it; each becomes a PendingAdd put in
    ``pending`` (by id) and appended to ``ops``. An entry that cannot be encoded fails its
    future and takes no id. Returns (next id, length, entries failed)."""
    cdef Py_ssize_t n, size, failed = 0
    cdef const uint8_t[::1] view
    cdef const uint8_t *src
    cdef uint8_t *dst
    cdef PendingAdd op
    cdef bytes out
    for data, fut in batch:
        if PyBytes_CheckExact(data):
            src = <const uint8_t *>PyBytes_AS_STRING(data)
            n = PyBytes_GET_SIZE(data)
        else:
            view = data
            n = view.shape[0]
            src = &view[0] if n else NULL
        try:
            size = _entry_size(scope, digest, n)
            out = PyBytes_FromStringAndSize(NULL, size)
            dst = <uint8_t *>PyBytes_AS_STRING(out)
            el_put32(dst, <uint32_t>(size - 4))
            encode_into(dst + 4, scope, lid, eid, lac, length + n, digest, mac_key, src, n)
        except EmbedlogError as exc:      # the id is not used: no hole in the ledger
            fut.set_exception(exc)
            failed += 1
            continue
        length += n
        op = PendingAdd.__new__(PendingAdd)
        op.entry_id, op.last_id, op.data, op.length, op.future = eid, eid, out, length, fut
        op.acked = None         # made by the first acknowledgement (a set is tracked too)
        pending[eid] = op
        PyList_Append(ops, op)
        eid += 1
    return eid, length, failed


def encode_produced(tuple packed, last_future, uint64_t scope, uint64_t lid, int64_t eid,
                    int64_t lac, int64_t length, int digest, mac_key, pending, list ops,
                    Py_ssize_t run_bytes=0, Py_ssize_t run_count=1):
    """encode_adds for a batch taken from a produce queue (``packed``: take_packed's
    (data, ends)): its payloads become entries ``eid``, ``eid`` + 1, ... in PendingAdds put
    in ``pending`` and ``ops``, with no future but the last one's (``last_future``, which
    settles the batch as a range; adds complete in order). With ``run_count`` > 1 the
    entries go as runs (one PendingAdd each) of at most ``run_count`` entries and
    ``run_bytes`` bytes in a frame (a run of one entry whatever its size): only for a
    ledger whose entries all go to the same bookies (E == Qw), as a run is acknowledged
    whole. Nothing is made per entry. An entry that cannot be encoded stops the batch: the
    error is raised with the count of entries in ``ops`` in ``entries_encoded``. Returns
    (next id, length)."""
    cdef bytes data = <bytes?>packed[0], ends = <bytes?>packed[1]
    cdef Py_ssize_t count = packed_count(packed), i = 0, j, e, size, pos, n, s
    cdef const int64_t *end = <const int64_t *>PyBytes_AS_STRING(ends)
    cdef const uint8_t *src = <const uint8_t *>PyBytes_AS_STRING(data)
    cdef uint8_t *dst
    cdef PendingAdd op
    cdef bytes out
    try:
        while i < count:
            # the run's entries i..j-1 and their bytes in a frame
            j = i
            size = 0
            while j < count and (j == i or j - i < run_count):
                s = _entry_size(scope, digest, end[j] - (end[j - 1] if j else 0))
                if j > i and size + s > run_bytes:
                    break
                size += s
                j += 1
            out = PyBytes_FromStringAndSize(NULL, size)
            dst = <uint8_t *>PyBytes_AS_STRING(out)
            pos = 0
            for e in range(i, j):
                n = end[e] - (end[e - 1] if e else 0)
                s = _entry_size(scope, digest, n)
                if pos + s > size:          # never: the sizes are the loop's above
                    raise IllegalOpError("a produced run outgrew its frame bytes")
                el_put32(dst + pos, <uint32_t>(s - 4))
                length += n
                encode_into(dst + pos + 4, scope, lid, eid + e - i, lac, length, digest,
                            mac_key, src + (end[e - 1] if e else 0), n)
                pos += s
            op = PendingAdd.__new__(PendingAdd)
            op.entry_id, op.last_id, op.data, op.length = eid, eid + j - i - 1, out, length
            op.acked = None
            if j == count:
                op.future = last_future
            else:
                # no future, so no cycle through a done-callback: the collector need not
                # track it (20,000 of them in flight made its full collections a third of a
                # produced add's client CPU). What it will hold is bytes, a bookie id
                # or a set of bookie ids
                op.future = None
                PyObject_GC_UnTrack(<void *>op)
            pending[eid] = op
            PyList_Append(ops, op)
            eid += j - i
            i = j
    except EmbedlogError as exc:
        exc.entries_encoded = i
        raise
    return eid, length


cdef inline list _write_set(list quorums, Py_ssize_t nq, int64_t entry_id):
    """The write set of ``entry_id`` (nq == len(quorums) > 0), any id in range: indexing
    goes unchecked here (boundscheck and wraparound are off), and C's % of a negative id
    is negative."""
    cdef int64_t k = entry_id % nq
    return <list?>quorums[k + nq if k < 0 else k]


def by_bookie(list ops, list quorums, only):
    """``ops`` as each bookie of their write sets (``quorums``, the E write quorums of the
    ensemble) is to get them, in order: {bookie: [ops]}, leaving out a bookie that already
    acknowledged an op and, unless ``only`` is None, bookies not in ``only``."""
    cdef dict per = {}
    cdef Py_ssize_t nq = len(quorums)
    cdef PendingAdd op
    cdef object got
    if nq == 0:
        return per
    for o in ops:
        op = <PendingAdd?>o
        for b in _write_set(quorums, nq, op.entry_id):
            if (only is not None and b not in only) or acked_by(op, b):
                continue
            got = per.get(b)
            if got is None:
                per[b] = [op]
            else:
                PyList_Append(got, op)
    return per


def frame_cuts(list ops, Py_ssize_t limit, Py_ssize_t most):
    """Where ``ops`` are cut into ADD frames of at most ``most`` entries and ``limit`` bytes
    of sized entries (each with its u32 size), one op being a frame whatever its size (a
    produced run is made to fit): the index after each frame, the last being len(ops)."""
    cdef list cuts = []
    cdef Py_ssize_t i, n = len(ops), start = 0, size = 0, entries = 0, k, c
    cdef PendingAdd op
    for i in range(n):
        op = <PendingAdd?>ops[i]
        k = len(op.data)
        c = op.last_id - op.entry_id + 1
        size += k
        entries += c
        if (size > limit or entries > most) and i > start:
            PyList_Append(cuts, i)
            start, size, entries = i, k, c
    PyList_Append(cuts, n)
    return cuts


def ack(list ops, bookie, pending, list quorums):
    """Count ``bookie``'s acknowledgement of ``ops``: only for an add still pending as that
    op (not failed and re-added) whose write set, in ``quorums`` (the E write quorums of the
    current ensemble), still holds the bookie (a replaced bookie's late answer says nothing)."""
    cdef Py_ssize_t nq = len(quorums)
    cdef PendingAdd op
    if nq == 0:
        return
    get = pending.get
    for o in ops:
        op = <PendingAdd>o
        if get(op.entry_id) is not op:
            continue
        if bookie in _write_set(quorums, nq, op.entry_id):
            # the first acknowledgement is the bookie itself, not a set: at Qa = 1 an add
            # then makes no object the collector tracks (a set is one)
            if op.acked is None:
                op.acked = bookie
            elif type(op.acked) is set:
                (<set>op.acked).add(bookie)
            elif op.acked != bookie:
                op.acked = {op.acked, bookie}


cpdef bint acked_by(PendingAdd op, bookie):
    """True if ``bookie`` acknowledged ``op`` (``op.acked``: None, one bookie, or a set)."""
    if op.acked is None:
        return False
    if type(op.acked) is set:
        return bookie in <set>op.acked
    return op.acked == bookie


def forget_acks(PendingAdd op, gone) -> None:
    """Drop the acknowledgements of the bookies in ``gone`` (replaced by an ensemble change)."""
    if op.acked is None:
        return
    if type(op.acked) is set:
        (<set>op.acked).difference_update(gone)
        if not op.acked:
            op.acked = None
    elif op.acked in gone:
        op.acked = None


def acknowledged_run(pending, int qa, list quorums):
    """Take from the front of ``pending`` (an OrderedDict by entry id) the adds that ``qa``
    bookies of their write set acknowledged, stopping at the first that is not; returns
    them in order."""
    cdef list done = []
    cdef Py_ssize_t nq = len(quorums), count
    cdef PendingAdd op
    cdef list ws
    if nq == 0:
        return done
    for o in pending.values():
        op = <PendingAdd>o
        if op.acked is None:
            break
        ws = _write_set(quorums, nq, op.entry_id)
        count = 0
        if type(op.acked) is set:
            if len(<set>op.acked) < qa:
                break
            for b in op.acked:    # acks count only from the write set (it may have changed)
                if b in ws:
                    count += 1
        elif op.acked in ws:
            count = 1
        if count < qa:
            break
        PyList_Append(done, op)
    for _ in range(len(done)):
        pending.popitem(last=False)
    return done


def set_results(list done):
    """Complete the futures of acknowledged adds (AddFutures) with their (last) entry ids, in
    order: one hold of the lock for a run of futures nobody waits on, then their
    done-callbacks; a future waited on (its condition made) goes the base class's way."""
    cdef Py_ssize_t i = 0, n = len(done)
    cdef PendingAdd op
    cdef list called
    while i < n:
        called = []
        with _MADE:
            while i < n:
                op = <PendingAdd>done[i]
                fut = op.future
                if fut is None:             # a produced entry: its batch's last one settles it
                    i += 1
                    continue
                if fut._made is not None or fut._state != RUNNING:
                    break
                fut._result = op.last_id
                fut._state = FINISHED
                if fut._done_callbacks:
                    PyList_Append(called, fut)
                i += 1
        for fut in called:
            fut._invoke_callbacks()
        if i < n:
            op = <PendingAdd>done[i]
            op.future.set_result(op.last_id)
            i += 1


def complete_ids(futures, int64_t settled):
    """Complete with its id each (id, AddFuture) pair at the front of the deque ``futures``
    whose id is ``settled`` or below (a produce queue's append_async futures), as
    set_results does: one hold of the lock for a run nobody waits on, then their
    done-callbacks; a future waited on goes the base class's way."""
    cdef list called
    cdef int64_t eid
    while futures and futures[0][0] <= settled:
        called = []
        with _MADE:
            while futures:
                pair = futures[0]
                eid = pair[0]
                fut = pair[1]
                if eid > settled or fut._made is not None or fut._state != RUNNING:
                    break
                futures.popleft()
                fut._result = eid
                fut._state = FINISHED
                if fut._done_callbacks:
                    PyList_Append(called, fut)
        for fut in called:
            fut._invoke_callbacks()
        if futures and futures[0][0] <= settled:
            eid, fut = futures.popleft()
            fut.set_result(eid)
