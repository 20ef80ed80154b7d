"""produce() / poll() / flush() on the embedded WriteHandle (issue 48): ids given at once and
in order, delivered only once durable, callbacks in id order in the polling thread, the
bounded queue (BufferError, or waiting with block=True), a failed journal group failing
every message from the first lost one and acknowledging none past it, close and append
mixed with produce. Waits are on conditions (flush, events, futures), never on sleeps."""
from __future__ import annotations

import errno
import threading

import pytest

import embedlog
from embedlog import failpoints
from embedlog.errors import EmbedlogError, EntryTooLargeError, IllegalOpError, LedgerClosedError
from support.crashutil import abandon

CFG = dict(journal_pre_alloc_size_mb=1, flush_interval_ms=0)


def test_produce_gives_ids_at_once_and_delivers_them_in_order(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        got = []
        ids = [w.produce(b"m%d" % i, on_delivery=lambda e, i: got.append((e, i)))
               for i in range(5000)]
        assert ids == list(range(5000))
        assert w.flush(30) == 0 and len(w) == 0
        assert got == [(None, i) for i in range(5000)]
        assert w.poll(0) == 0                         # each callback runs once
        assert w.last_add_confirmed == 4999
        w.close()
        assert log.open_ledger(w.ledger_id).read_batch(0, 4999) == [b"m%d" % i for i in range(5000)]


def test_poll_runs_callbacks_in_the_calling_thread(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        threads = []
        w.produce(b"x", on_delivery=lambda e, i: threads.append(threading.current_thread()))
        ran = 0
        while not ran:
            ran = w.poll(10)
        assert threads == [threading.current_thread()]


def test_values_are_copied_and_any_bytes_like_goes(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        buf = bytearray(b"before")
        w.produce(buf)
        buf[:] = b"AFTER!"
        w.produce(memoryview(b"view"))
        w.produce(b"")
        with pytest.raises(IllegalOpError):
            w.produce("text")
        with pytest.raises(EntryTooLargeError):
            w.produce(b"x" * (log.config.max_entry_size_bytes + 1))
        w.flush(30)
        w.close()
        assert log.open_ledger(w.ledger_id).read_batch(0, 2) == [b"before", b"view", b""]


def _hold_syncs():
    """Hold every journal sync until the returned event is set (nothing is delivered)."""
    reached, release = threading.Event(), threading.Event()

    def hold():
        reached.set()
        assert release.wait(30)
    failpoints.arm("journal.before_sync", hold)
    return reached, release


def test_a_full_queue_raises_buffer_error_and_takes_nothing(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        w.configure_producer(queue_buffering_max_messages=10)
        reached, release = _hold_syncs()
        try:
            for i in range(10):
                assert w.produce(b"%d" % i) == i
            with pytest.raises(BufferError):
                w.produce(b"one too many")
            assert len(w) == 10
        finally:
            failpoints.disarm()
            release.set()
        assert w.flush(30) == 0
        assert w.produce(b"10") == 10                  # the refused one took no id
        w.flush(30)
        assert w.last_add_confirmed == 10


def test_a_full_queue_by_bytes(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        w.configure_producer(queue_buffering_max_bytes=1000)
        reached, release = _hold_syncs()
        try:
            w.produce(b"x" * 600)
            with pytest.raises(BufferError):
                w.produce(b"x" * 401)
            w.produce(b"x" * 400)
        finally:
            failpoints.disarm()
            release.set()
        assert w.flush(30) == 0
        with pytest.raises(EntryTooLargeError):         # can never fit: not BufferError
            w.produce(b"x" * 1001)


def test_block_waits_for_room_instead(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        w.configure_producer(queue_buffering_max_messages=4, block=True)
        reached, release = _hold_syncs()
        done = threading.Event()

        def fifth():
            w.produce(b"4")
            done.set()
        try:
            for i in range(4):
                w.produce(b"%d" % i)
            t = threading.Thread(target=fifth)
            t.start()
            assert reached.wait(30)
            assert not done.is_set() and len(w) == 4       # held: no room yet
        finally:
            failpoints.disarm()
            release.set()
        assert done.wait(30)
        t.join(30)
        assert w.flush(30) == 0 and w.last_add_confirmed == 4
    with pytest.raises(IllegalOpError):
        with embedlog.open(tmp_path / "b", **CFG) as log:
            w = log.create_ledger()
            w.produce(b"x")
            w.configure_producer(block=True)             # only before the first produce


def test_a_failed_group_fails_every_message_from_the_first_lost_one(tmp_path):
    """Entries 0..4 delivered; the next group's sync fails (ENOSPC): every message produced
    after fails with an error, none is acknowledged across the hole, and a reopen after a
    crash recovers the ledger at the last delivered entry."""
    log = embedlog.open(tmp_path, **CFG)
    w = log.create_ledger()
    for i in range(5):
        w.produce(b"ok-%d" % i)
    assert w.flush(30) == 0
    hits = []

    def full_once():
        hits.append(1)
        if len(hits) == 1:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
    failpoints.arm("journal.before_sync", full_once)
    outcomes = []
    try:
        for i in range(5, 50):
            try:
                w.produce(b"lost-%d" % i, on_delivery=lambda e, i: outcomes.append((e, i)))
            except LedgerClosedError:
                break                   # the failure came first: the handle takes no more
        assert w.flush(30) == 0
    finally:
        failpoints.disarm()
    assert outcomes and all(e is not None for e, _ in outcomes)
    assert isinstance(outcomes[0][0], EmbedlogError)
    assert [i for _, i in outcomes] == list(range(5, 5 + len(outcomes)))
    assert w.last_add_confirmed == 4
    with pytest.raises(LedgerClosedError):
        w.produce(b"after")
    with pytest.raises(LedgerClosedError):
        w.append_async(b"after").result(10)
    lid = w.ledger_id
    abandon(log)
    with embedlog.open(tmp_path, **CFG) as log:
        r = log.open_ledger(lid)
        assert r.last_add_confirmed == 4
        assert r.read_batch(0, 4) == [b"ok-%d" % i for i in range(5)]


def test_append_and_append_many_between_produces_keep_id_order(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        expect = []
        for round_ in range(20):
            for i in range(7):
                expect.append(b"p%d.%d" % (round_, i))
                assert w.produce(expect[-1]) == len(expect) - 1
            expect.append(b"a%d" % round_)
            assert w.append(expect[-1]) == len(expect) - 1
            expect += [b"m%d" % round_, b"n%d" % round_]
            assert w.append_many(expect[-2:]) == len(expect) - 1
            fut = w.append_async(b"f%d" % round_)
            expect.append(b"f%d" % round_)
            assert fut.result(10) == len(expect) - 1
        w.flush(30)
        w.close()
        assert log.open_ledger(w.ledger_id).read_batch(0, len(expect) - 1) == expect


def test_close_covers_what_was_produced_and_refuses_more(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        got = []
        for i in range(1000):
            w.produce(b"%d" % i, on_delivery=lambda e, i: got.append(e))
        w.close()
        assert w.last_add_confirmed == 999
        assert w.flush(30) == 0 and got == [None] * 1000
        with pytest.raises(LedgerClosedError):
            w.produce(b"late")
        assert log.open_ledger(w.ledger_id).last_add_confirmed == 999


def test_threads_sharing_a_handle_get_distinct_ids_and_futures(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        out, errors = {}, []

        def work(k):
            try:
                futs = [(b"%d-%d" % (k, i), w.append_async(b"%d-%d" % (k, i))) for i in range(500)]
                ids = [w.produce(b"%d-p%d" % (k, i)) for i in range(500)]
                for data, f in futs:
                    out[f.result(30)] = data
                out.update(zip(ids, (b"%d-p%d" % (k, i) for i in range(500))))
            except BaseException as exc:
                errors.append(exc)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        assert errors == [] and sorted(out) == list(range(4000))
        assert w.flush(30) == 0
        w.close()
        r = log.open_ledger(w.ledger_id)
        assert r.read_batch(0, 3999) == [out[i] for i in range(4000)]


def test_a_callback_that_raises_reaches_the_caller_of_poll(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()

        def bad(err, eid):
            raise RuntimeError("callback failed")
        w.produce(b"x", on_delivery=bad)
        w.produce(b"y")
        with pytest.raises(RuntimeError):
            w.flush(30)
        assert w.flush(30) == 0


def test_a_range_settled_early_waits_for_those_before_it():
    """The settling rule itself: a batch refused at once (ids 10..19) while an earlier one
    (0..9) waits for its sync must not make 0..9's callbacks due; ids given to append
    (20..24) settle nothing; a failure's error reaches only ids from its range on."""
    from embedlog.client.producer import Producer
    kicks = []
    p = Producer(0, 1000, lambda: kicks.append(1), 1 << 32)
    got = []
    for i in range(20):
        p.queue.add(b"x")
        p.callbacks.append((i, lambda e, i: got.append((e, i))))
    assert p.queue.take(1 << 20)[0] == 0
    boom = LedgerClosedError("refused")
    p.settle(10, 19, 10, 10, boom)
    assert p.poll(0) == 0 and got == []
    assert p.queue.reserve(5) == 20
    p.skip(20, 24)
    p.settle(0, 9, 10, 10, None)
    assert p.poll(0) == 20
    assert got == [(None, i) for i in range(10)] + [(boom, i) for i in range(10, 20)]
    assert p.settled == 24 and len(p) == 0


def test_a_forked_child_cannot_produce_and_the_parent_goes_on(tmp_path):
    import os
    from embedlog.errors import ForkedProcessError
    log = embedlog.open(tmp_path, **CFG)
    w = log.create_ledger()
    for i in range(100):
        w.produce(b"p%d" % i)
    assert w.flush(30) == 0
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:                                        # the child: every use refused
        try:
            os.close(rd)
            out = []
            for use in (lambda: w.produce(b"child"), lambda: w.poll(0), lambda: w.flush(1),
                        lambda: w.append_async(b"child")):
                try:
                    use()
                    out.append("accepted")
                except ForkedProcessError:
                    out.append("refused")
            w.close()
            os.write(wr, ",".join(out).encode())
        finally:
            os._exit(0)
    os.close(wr)
    with os.fdopen(rd, "rb") as f:
        got = f.read().decode()
    os.waitpid(pid, 0)
    assert got == "refused,refused,refused,refused"
    for i in range(100, 200):
        assert w.produce(b"p%d" % i) == i
    assert w.flush(30) == 0
    w.close()
    assert log.open_ledger(w.ledger_id).read_batch(0, 199) == [b"p%d" % i for i in range(200)]
    log.close()
