"""produce() / poll() / flush() on the client's WriteHandle and on Stream, over a real
LocalCluster (issue 48): ids at once and in order, a delivery only once Qa bookies hold
the entry, BufferError at the bound, append_async mixed in, and a bookie SIGKILLed while
a producer runs losing no acknowledged message (the ensemble change carries the rest).
Waits are on conditions (flush, futures), never on sleeps."""
from __future__ import annotations

import threading

import pytest

from embedlog.errors import LedgerClosedError
from embedlog.harness import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=4, base_dir=str(tmp_path_factory.mktemp("produce") / "c"),
                      proxies=False) as lc:
        yield lc


def test_produce_flush_and_read_back(cluster):
    with cluster.client() as c:
        w = c.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        got = []
        ids = [w.produce(b"m%d" % i, on_delivery=lambda e, i: got.append((e, i)))
               for i in range(3000)]
        assert ids == list(range(3000))
        assert w.flush(60) == 0
        assert got == [(None, i) for i in range(3000)]
        assert w.last_add_confirmed == 2999
        # append_async after produce: the same queue, the next id
        assert w.append_async(b"tail").result(30) == 3000
        assert w.append_many([b"a", b"b"]) == 3002
        w.close()
        r = c.open_ledger(w.ledger_id)
        assert r.read_batch(0, 2999) == [b"m%d" % i for i in range(3000)]
        assert r.read_batch(3000, 3002) == [b"tail", b"a", b"b"]


def test_buffer_error_at_the_bound_and_nothing_taken(cluster):
    with cluster.client() as c:
        w = c.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
        w.configure_producer(queue_buffering_max_messages=3)
        cluster.suspend_bookie(_index_of(cluster, w.metadata.fragments[-1][1][0]))
        try:
            for i in range(3):
                assert w.produce(b"%d" % i) == i
            with pytest.raises(BufferError):
                w.produce(b"no room")
            assert len(w) == 3
        finally:
            cluster.resume_bookie(_index_of(cluster, w.metadata.fragments[-1][1][0]))
        assert w.flush(60) == 0
        assert w.produce(b"3") == 3
        assert w.flush(60) == 0 and w.last_add_confirmed == 3


def test_close_fails_what_is_still_queued_and_refuses_more(cluster):
    with cluster.client() as c:
        w = c.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
        outcomes = []
        for i in range(2000):
            w.produce(b"%d" % i, on_delivery=lambda e, i: outcomes.append((e, i)))
        w.close()
        assert w.flush(60) == 0 and len(outcomes) == 2000
        ok = [i for e, i in outcomes if e is None]
        assert ok == list(range(len(ok)))                 # a prefix, in order
        assert all(isinstance(e, LedgerClosedError) for e, _ in outcomes[len(ok):])
        assert c.open_ledger(w.ledger_id).last_add_confirmed == len(ok) - 1
        with pytest.raises(LedgerClosedError):
            w.produce(b"late")


def _index_of(cluster, bookie_id) -> int:
    return cluster.index_of(bookie_id)


def test_a_bookie_killed_mid_produce_loses_no_acknowledged_message(cluster):
    """3/3/2 on four bookies; a producer thread runs; one of the ensemble is SIGKILLed once
    entries are being acknowledged. Every delivered id reads back with its payload; the
    ensemble change replaces the bookie and the producer goes on."""
    with cluster.client() as c:
        w = c.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        w.configure_producer(block=True, queue_buffering_max_messages=2000)
        delivered, errors = [], []
        some = threading.Event()

        def on_delivery(err, eid):
            (errors if err is not None else delivered).append(eid)
            if len(delivered) >= 500:
                some.set()

        def produce():
            for i in range(6000):
                w.produce(b"v%d" % i, on_delivery=on_delivery)
                if i % 100 == 0:
                    w.poll(0)
            w.flush(120)
        t = threading.Thread(target=produce)
        t.start()
        assert some.wait(60)
        victim = w.metadata.fragments[-1][1][0]
        cluster.kill_bookie(_index_of(cluster, victim))
        t.join(180)
        assert not t.is_alive()
        try:
            # what was sent before the kill may all be acknowledged by the other two
            # (Qa = 2) before the client hears the victim is gone: adds after it must go to
            # a replacement
            for i in range(6000, 7000):
                w.produce(b"v%d" % i, on_delivery=on_delivery)
            assert w.flush(120) == 0
            assert errors == []
            assert delivered == list(range(7000))
            w.close()
            assert len(w.metadata.fragments) >= 2                 # the ensemble changed
            assert victim not in w.metadata.fragments[-1][1]
            r = c.open_ledger(w.ledger_id)
            assert r.last_add_confirmed == 6999
            assert r.read_batch(0, 6999) == [b"v%d" % i for i in range(7000)]
        finally:
            cluster.restart_bookie(_index_of(cluster, victim))


def test_stream_produce_gives_positions(cluster):
    with cluster.client() as c:
        s = c.open_stream("produce-stream", ensemble_size=3, write_quorum=3, ack_quorum=2)
        got = []
        pos = [s.produce(b"e%d" % i, on_delivery=lambda e, p: got.append((e, p)))
               for i in range(1000)]
        assert s.flush(60) == 0
        assert got == [(None, p) for p in pos] and pos == sorted(pos)
        assert s.append(b"after") > pos[-1]
        assert [e.data for e in s.read(pos[0], pos[-1])] == [b"e%d" % i for i in range(1000)]
        s.close()


def test_append_async_waits_at_max_pending_adds_on_the_produce_queue(cluster):
    """append_async from a caller's thread goes through produce()'s queue and keeps its
    back-pressure: with max_pending_adds adds in flight (the bookie suspended) the next call
    waits, and returns once answers free the window; ids stay in call order."""
    with cluster.client(max_pending_adds=10) as c:
        w = c.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
        bookie = _index_of(cluster, w.metadata.fragments[-1][1][0])
        cluster.suspend_bookie(bookie)
        try:
            futs = [w.append_async(b"%d" % i) for i in range(10)]
            assert len(w) == 10
            late = []
            t = threading.Thread(target=lambda: late.append(w.append_async(b"10")))
            t.start()
            t.join(0.5)
            assert t.is_alive() and not late      # held by the window, not queued
        finally:
            cluster.resume_bookie(bookie)
        t.join(60)
        assert not t.is_alive()
        assert [f.result(60) for f in futs + late] == list(range(11))
        assert w.append_many_async([b"a", b"b", b"c"])[-1].result(60) == 13
        w.close()
        assert c.open_ledger(w.ledger_id).read_batch(0, 13)[10:] == [b"10", b"a", b"b", b"c"]
