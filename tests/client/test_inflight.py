"""The future of an add and the bound on adds in flight (embedlog.client.inflight).

AddFuture makes its condition only when someone blocks on it; every way the standard
library and asyncio wait on a concurrent future must still see it complete, whichever
side gets there first."""
from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import weakref

import pytest

from embedlog._native.addpath import PendingAdd
from embedlog.client.inflight import AddFuture, InFlight
from embedlog.errors import IllegalOpError, LedgerClosedError


def test_an_add_future_is_running_and_cannot_be_cancelled():
    f = AddFuture()
    assert f.running() and not f.done()
    assert f.cancel() is False
    f.set_result(7)
    assert f.done() and f.result(0) == 7 and f.exception(0) is None
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(8)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_exception(LedgerClosedError("late"))
    assert "finished" in repr(f)


def test_callbacks_run_once_whether_added_before_or_after_completion():
    seen = []
    f = AddFuture()
    f.add_done_callback(lambda g: seen.append(("before", g.result())))
    f.set_result(1)
    f.add_done_callback(lambda g: seen.append(("after", g.result())))
    assert seen == [("before", 1), ("after", 1)]
    e = AddFuture()
    e.add_done_callback(lambda g: seen.append(type(g.exception()).__name__))
    e.set_exception(LedgerClosedError("closed"))
    assert seen[-1] == "LedgerClosedError"
    with pytest.raises(LedgerClosedError):
        e.result(0)


def test_a_raising_callback_does_not_stop_the_others(caplog):
    seen = []
    f = AddFuture()
    f.add_done_callback(lambda g: 1 / 0)
    f.add_done_callback(lambda g: seen.append(g.result()))
    f.set_result(3)
    assert seen == [3]


def test_an_add_in_flight_gives_the_collector_two_objects():
    """An add's future holds no list until a callback or a waiter needs one, and its
    acked set is made by the first acknowledgement: what an add in flight leaves to be
    promoted is its future and its PendingAdd (each promoted object brings the next full
    collection nearer)."""
    f = AddFuture()
    assert not any(type(r) is list for r in gc.get_referents(f))
    assert PendingAdd(0, b"x", 1, f).acked is None
    before = len(gc.get_objects())
    ops = [PendingAdd(i, b"x", 1, AddFuture()) for i in range(1000)]
    assert len(gc.get_objects()) - before <= 2 * 1000 + 10      # and the list
    del ops


@pytest.mark.parametrize("how", ["callback", "wrap_future"])
def test_a_handle_in_a_cycle_through_its_adds_is_still_collected(how):
    """A done-callback that refers to the write handle holding the add (one that adds
    again), or asyncio.wrap_future's callbacks that refer back to the future: a client
    closed with such adds in flight leaves the cycle, and the collector frees it."""
    loop = asyncio.new_event_loop()
    try:
        class Handle:
            pending: dict

        h = Handle()
        f = AddFuture(lambda g, h=h: h) if how == "callback" else AddFuture()
        if how == "wrap_future":
            h.wrapped = asyncio.wrap_future(f, loop=loop)
        h.pending = {0: PendingAdd(0, b"x", 1, f)}
        gone = weakref.ref(h), weakref.ref(f)
        del h, f
        gc.collect()
        assert gone[0]() is None and gone[1]() is None
    finally:
        loop.close()


def test_result_with_a_timeout_times_out_then_completes():
    f = AddFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        f.result(0.001)
    f.set_result(5)                     # its condition exists now: the base class's way
    assert f.result(0) == 5


@pytest.mark.parametrize("how", ["result", "wait", "as_completed", "asyncio", "callback"])
def test_every_waiter_sees_a_completion_racing_with_it(how):
    """Many futures completed by one thread while another starts waiting on each, so the
    condition is made before, during and after completion."""
    n = 3000
    futures = [AddFuture() for _ in range(n)]
    go = threading.Barrier(2)

    def complete():
        go.wait()
        for i, f in enumerate(futures):
            if i % 7 == 0:
                f.set_exception(LedgerClosedError(str(i)))
            else:
                f.set_result(i)

    t = threading.Thread(target=complete)
    t.start()
    go.wait()
    outcome = {}
    if how == "result":
        for i, f in enumerate(futures):
            try:
                outcome[i] = f.result(10)
            except LedgerClosedError:
                outcome[i] = "closed"
    elif how == "wait":
        for i in range(0, n, 100):
            done, not_done = concurrent.futures.wait(futures[i:i + 100], timeout=10)
            assert not not_done
        outcome = {i: ("closed" if f.exception() else f.result()) for i, f in enumerate(futures)}
    elif how == "as_completed":
        for f in concurrent.futures.as_completed(futures, timeout=10):
            assert f.done()
        outcome = {i: ("closed" if f.exception() else f.result()) for i, f in enumerate(futures)}
    elif how == "asyncio":
        async def main():
            res = await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(f) for f in futures),
                                                        return_exceptions=True), 10)
            return {i: ("closed" if isinstance(r, LedgerClosedError) else r) for i, r in enumerate(res)}
        outcome = asyncio.run(main())
    else:
        ev = threading.Event()
        count = [0]
        lock = threading.Lock()

        def cb(f):
            with lock:
                count[0] += 1
                if count[0] == n:
                    ev.set()
        for f in futures:
            f.add_done_callback(cb)
        assert ev.wait(10)
        assert count[0] == n            # each callback ran exactly once
        outcome = {i: ("closed" if f.exception() else f.result()) for i, f in enumerate(futures)}
    t.join()
    assert outcome == {i: ("closed" if i % 7 == 0 else i) for i in range(n)}


def test_in_flight_bounds_and_blocks_until_a_slot_is_given():
    slots = InFlight(3)
    assert slots.take(2) == 2
    assert slots.take(5) == 1            # as many as are free
    got = []
    t = threading.Thread(target=lambda: got.append(slots.take(4)))
    t.start()
    t.join(0.05)
    assert t.is_alive() and not got      # blocked at the bound
    slots.give(2)
    t.join(10)
    assert got == [2]
    slots.give(3)
    with pytest.raises(RuntimeError):
        slots.give(1)                    # more back than taken: a bug, said at once
    with pytest.raises(IllegalOpError):
        InFlight(0)


def test_a_call_past_the_in_flight_bound_goes_in_whole_and_in_order(tmp_path):
    """More entries in one call than max_pending_adds: those that fit go in first, so the
    call waits for their acknowledgements instead of for itself (it held every slot)."""
    from embedlog.harness import LocalCluster
    with LocalCluster(bookies=1, base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False) as lc:
        w = lc.client(max_pending_adds=8, max_entries_per_frame=3).create_ledger(1, 1, 1)
        box = []
        t = threading.Thread(target=lambda: box.append(w.append_many_async([b"x%d" % i for i in range(100)])))
        t.start()
        t.join(60)
        assert not t.is_alive()
        assert [f.result(30) for f in box[0]] == list(range(100))
        # and while other threads append too, each call's entries still take consecutive ids
        calls = []

        def many(t):
            for k in range(5):
                items = [b"%d.%d.%d" % (t, k, i) for i in range(1 + (t * 7 + k * 5) % 23)]
                calls.append((w.append_many(items), items))
        threads = [threading.Thread(target=many, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert len(calls) == 20
        w.close()
        r = lc.client().open_ledger(w.ledger_id)
        for last, items in calls:
            assert r.read_batch(last - len(items) + 1, last) == items


def test_done_callbacks_chaining_adds_beside_a_call_past_the_bound(tmp_path):
    """A done-callback that appends runs on the client's loop, which frees the slots: it
    must not wait there, neither for a slot nor for a thread holding a call larger than the
    free slots. It goes in at once, or is refused with TooManyRequestsError when no slot is
    free, and both the chain and the large call finish."""
    from embedlog.errors import TooManyRequestsError
    from embedlog.harness import LocalCluster
    with LocalCluster(bookies=1, base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False) as lc:
        w = lc.client(max_pending_adds=4).create_ledger(1, 1, 1)
        chained, refused, finished = [], [], threading.Event()

        def link(f=None):
            if f is not None:
                chained.append(f.result())
            if len(chained) == 40:
                finished.set()
                return
            try:
                w.append_async(b"chain").add_done_callback(link)
            except TooManyRequestsError:      # no slot free: try again from the loop
                refused.append(1)
                asyncio.get_running_loop().call_later(0.001, link)

        link()
        big = []
        t = threading.Thread(target=lambda: big.extend(w.append_many_async([b"big"] * 200)))
        t.start()
        t.join(60)
        assert not t.is_alive()
        assert finished.wait(60)
        assert len([f.result(30) for f in big]) == 200
        w.close()


def test_the_cpython_future_internals_add_future_relies_on():
    """AddFuture sets and reads concurrent.futures.Future's private fields (its docstring
    says why): this fails on a CPython whose Future keeps other ones, names its states
    otherwise, or stops going through ``self._condition``, so the change is seen here
    rather than as a lost wake-up or a missing attribute in a client."""
    import inspect
    from concurrent.futures import _base
    base = concurrent.futures.Future
    fields = {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"}
    assert set(vars(base())) == fields, "Future.__init__ sets other fields than AddFuture's"
    assert (_base.RUNNING, _base.FINISHED) == ("RUNNING", "FINISHED")
    assert callable(getattr(base, "_invoke_callbacks", None))
    # every base-class method AddFuture defers to takes the condition first, which is where
    # AddFuture makes it (the waiters list and callbacks list with it)
    for name in ("set_result", "set_exception", "result", "exception", "add_done_callback",
                 "done", "cancelled", "cancel"):
        assert "with self._condition" in inspect.getsource(getattr(base, name)), name
    # wait() and as_completed() lock each future's condition and install waiters in _waiters
    assert "future._condition.acquire()" in inspect.getsource(_base._AcquireFutures)
    assert "f._waiters" in inspect.getsource(_base._create_and_install_waiters)
    # and AddFuture still has every field, its condition made only on first use
    f = AddFuture()
    assert fields - {"_condition", "_waiters"} <= set(vars(f))
    assert f._state == _base.RUNNING and f._made is None
    f._condition
    assert f._waiters == [] and f._done_callbacks == [] and f._made is not None
