"""Regression tests for the protocol-safety defects acceptance testing found (issue 12),
each on real bookie processes, each made to happen with the harness's fault hooks."""
import asyncio
import threading

import pytest

import embedlog
from support.cliutil import wait_until
from embedlog.client.schedule import write_set
from embedlog.errors import (LedgerClosedError, LedgerFencedError,
                             LedgerRecoveryError, NoSuchLedgerError, NotEnoughBookiesError)
from embedlog.harness import LocalCluster
from embedlog.meta.api import LedgerState
from embedlog.net import protocol as P

QUIET = {"explicit_lac_interval_ms": 10 ** 9}     # no WRITE_LAC: the LAC travels with adds only


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=4, base_dir=str(tmp_path / "c"), autorecovery=False) as lc:
        yield lc


def holds(client, bookie_id, lid, entry_id) -> bool:
    async def ask():
        try:
            resp = await client._ctx.call(bookie_id, lambda rid: P.read_request(
                rid, lid.scope_id, lid.ledger_id, entry_id), 5)
            return bool(P.parse_read_body(resp.body)[1])
        except (NoSuchLedgerError, embedlog.errors.NoSuchEntryError):
            return False
    return client._ctx.run(ask())


def spare_of(cluster, ensemble) -> int:
    return next(i for i in range(len(cluster)) if cluster.bookie_id(i) not in ensemble)


# -- 1. a failed recovery leaves the metadata as it found it ---------------------------------

def test_failed_recovery_does_not_poison_the_next(cluster):
    w = cluster.client("writer", **QUIET).create_ledger(3, 2, 2)
    for i in range(10):
        w.append(b"e%d" % i)
    ens = w.metadata.fragments[0][1]
    b1, b2 = write_set(w.metadata, 9)            # entry 9 is on b1 and b2 only
    spare = spare_of(cluster, ens)
    cluster.kill_bookie(cluster.index_of(b1))
    unreachable = cluster.faults.fail("EIO", bookie=spare)
    r1 = cluster.client("recovery-1")
    with pytest.raises((NotEnoughBookiesError, LedgerRecoveryError)):
        r1.open_ledger(w.ledger_id)
    md = r1.ledger_metadata(w.ledger_id)
    assert md.state == LedgerState.IN_RECOVERY and md.fragments == w.metadata.fragments
    cluster.restart_bookie(cluster.index_of(b1))
    cluster.kill_bookie(cluster.index_of(b2))
    unreachable.remove()
    r2 = cluster.client("recovery-2").open_ledger(w.ledger_id)
    assert r2.last_add_confirmed == 9
    assert r2.read_batch(0, 9) == [b"e%d" % i for i in range(10)]
    assert cluster.bookie_id(spare) in r2.metadata.fragments[-1][1]


def test_failed_take_over_does_not_lose_a_position(cluster):
    leader = cluster.client("leader", **QUIET).open_stream("s", ensemble_size=3, write_quorum=2,
                                                           ack_quorum=2)
    positions = [leader.append(b"p%d" % i) for i in range(10)]
    md = leader.metadata
    last = positions[-1]
    b1, b2 = write_set(md, last)
    spare = spare_of(cluster, md.fragments[-1][1])
    cluster.kill_bookie(cluster.index_of(b1))
    unreachable = cluster.faults.fail("EIO", bookie=spare)
    with pytest.raises((NotEnoughBookiesError, LedgerRecoveryError)):
        cluster.client("t1").open_stream("s").take_over()
    assert cluster.client().open_stream("s").metadata.fragments == md.fragments
    cluster.restart_bookie(cluster.index_of(b1))
    cluster.kill_bookie(cluster.index_of(b2))
    unreachable.remove()
    s = cluster.client("t2").open_stream("s")
    s.take_over()
    assert [(e.position, e.data) for e in s.read(0)] == [(p, b"p%d" % i) for i, p in enumerate(positions)]


# -- 2. close racing append: no acknowledgement past the close point -------------------------

def _race_close_and_append(w, tries_result):
    barrier = threading.Barrier(2)
    got = {}

    def add():
        barrier.wait()
        try:
            got["id"] = w.append(b"x")
        except LedgerClosedError:
            got["id"] = None

    t = threading.Thread(target=add)
    t.start()
    barrier.wait()
    w.close()
    t.join(30)
    tries_result.append(got["id"])
    return got["id"]


def test_close_racing_append_never_acknowledges_past_the_close(cluster):
    c = cluster.client("w")
    outcomes = []
    for _ in range(60):
        w = c.create_ledger(3, 2, 2)
        eid = _race_close_and_append(w, outcomes)
        md = c.ledger_metadata(w.ledger_id)
        assert md.state == LedgerState.CLOSED
        assert eid is None or md.last_entry_id >= eid, (eid, md.last_entry_id)


def test_close_racing_append_embedded(tmp_path):
    outcomes = []
    with embedlog.open(tmp_path / "d") as log:
        for _ in range(150):
            w = log.create_ledger()
            eid = _race_close_and_append(w, outcomes)
            md = log.ledger_metadata(w.ledger_id)
            assert md.state == LedgerState.CLOSED
            assert eid is None or md.last_entry_id >= eid, (eid, md.last_entry_id)


# -- 3. acknowledgements wait for an ensemble change; the replacement gets every entry ------

def test_entries_acknowledged_around_an_ensemble_change_reach_the_replacement(cluster):
    c = cluster.client("w")
    w = c.create_ledger(3, 3, 2)
    w.append_many([b"d%d" % i for i in range(10)])
    ens = w.metadata.fragments[0][1]
    victim, others = ens[0], ens[1:]
    spare = cluster.bookie_id(spare_of(cluster, ens))
    gate = cluster.faults.gate("ensemble_change", client="w")
    cluster.faults.fail("EIO", bookie=victim, op="add")
    futures = [w.append_async(b"d%d" % i) for i in range(10, 30)]
    assert gate.wait_reached()
    # both other bookies store 10..29 while the new fragment is being written; Qa=2 would
    # acknowledge them, but acknowledgements wait for the change
    wait_until(lambda: all(holds(c, b, w.ledger_id, 29) for b in others), what="entries stored")
    c._ctx.run(asyncio.sleep(0))
    assert not any(f.done() for f in futures)
    assert w.last_add_confirmed == 9
    gate.release()
    assert [f.result(30) for f in futures] == list(range(10, 30))
    md = c.ledger_metadata(w.ledger_id)
    assert md.fragments[-1][0] == 10 and spare in md.fragments[-1][1]
    # Qa=2 of the new write sets acknowledged them; the replacement's copies land too (before
    # the fix they were never sent to it)
    wait_until(lambda: all(holds(c, spare, w.ledger_id, e) for e in range(10, 30)),
               what="entries 10..29 on the replacement")
    w.close()


def test_a_replaced_bookies_late_acknowledgement_does_not_count(cluster):
    c = cluster.client("w")
    w = c.create_ledger(3, 3, 3)            # every member of the write set must answer
    w.append(b"0")
    ens = w.metadata.fragments[0][1]
    victim, spare = ens[0], cluster.bookie_id(spare_of(cluster, ens))
    late = cluster.faults.hold(bookie=victim, op="add", entries=(1, 1), direction="response")
    cluster.faults.fail("EIO", bookie=victim, op="add", entries=(2, 2))
    slow_spare = cluster.faults.hold(bookie=spare, op="add", direction="response")
    f1 = w.append_async(b"1")
    assert late.wait_hits(1)                # stored by the victim, its answer held
    f2 = w.append_async(b"2")               # refused by the victim: it is replaced
    wait_until(lambda: len(c.ledger_metadata(w.ledger_id).fragments) == 2, what="ensemble change")
    assert slow_spare.wait_hits(1)
    late.release()
    assert late.wait_passed(1)              # the victim's answer for entry 1 reached the writer
    c._ctx.run(asyncio.sleep(0))
    assert not f1.done() and w.last_add_confirmed == 0
    slow_spare.release()
    assert (f1.result(30), f2.result(30)) == (1, 2)
    w.close()


# -- 4. a fenced and deleted ledger does not come back ------------------------------------

def test_fenced_and_deleted_ledger_is_not_created_again_embedded(tmp_path):
    path = tmp_path / "d"
    with embedlog.open(path) as log:
        w = log.create_ledger()
        w.append(b"a")
        lid = w.ledger_id
        log.open_ledger(lid)                  # recovery: fenced and closed
        log.delete_ledger(lid)
        with pytest.raises(LedgerFencedError):
            w.append(b"b")
        assert not log.bookie.has_ledger(lid)
        key = w._master_key
    with embedlog.open(path) as log:          # remembered across a restart
        with pytest.raises(LedgerFencedError):
            log.bookie.add_payloads(lid, key, 1, 0, 1, 3, None, [b"c"])
        assert not log.bookie.has_ledger(lid)


def test_fenced_and_deleted_ledger_is_not_created_again_served(tmp_path):
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "c"), autorecovery=False,
                      bookie_config={"gc_wait_time_ms": 100}) as lc:
        cw, cr = lc.client("writer"), lc.client("reader")
        w = cw.create_ledger(3, 3, 2)
        w.append(b"a")
        ens = w.metadata.fragments[0][1]
        cr.open_ledger(w.ledger_id)           # fenced and closed; the writer has not noticed
        cr.delete_ledger(w.ledger_id)
        wait_until(lambda: not any(holds(cr, b, w.ledger_id, 0) for b in ens),
                   what="garbage collection on every bookie")
        with pytest.raises(LedgerFencedError):
            w.append(b"b")
        lc.restart_bookie(0)
        entry = embedlog._native.format.encode_entry(0, w.ledger_id.ledger_id, 1, 0, 2, 3, b"b", None)
        with pytest.raises(LedgerFencedError):
            cr._ctx.run(cr._ctx.call(lc.bookie_id(0), lambda rid: P.add_request(
                rid, 0, w.ledger_id.ledger_id, w._master_key, [entry]), 10))
        assert not holds(cr, lc.bookie_id(0), w.ledger_id, 1)


# -- 5. close after an unrecoverable add error closes at the LAC, at once ----------------

def test_close_after_an_unrecoverable_add_error_closes_at_the_lac(cluster):
    c = cluster.client("w")
    w = c.create_ledger(4, 4, 4)               # every bookie in the ensemble: no replacement
    w.append_many([b"u%d" % i for i in range(10)])
    cluster.faults.fail("EIO", bookie=0, op="add")
    with pytest.raises(NotEnoughBookiesError):
        w.append(b"lost")
    w.close()
    md = c.ledger_metadata(w.ledger_id)
    assert md.state == LedgerState.CLOSED and md.last_entry_id == 9
    assert c.open_ledger(w.ledger_id).read_batch(0, 9)[9] == b"u9"


def test_close_fails_pending_adds_instead_of_waiting_for_them(cluster):
    c = cluster.client("w", add_timeout_s=600)
    w = c.create_ledger(3, 3, 3)
    w.append(b"0")
    hung = cluster.faults.hold(bookie=w.metadata.fragments[0][1][0], op="add", direction="response")
    pending = w.append_async(b"1")
    assert hung.wait_hits(1)
    closer = threading.Thread(target=w.close)
    closer.start()
    closer.join(60)
    assert not closer.is_alive(), "close() waited for an add the bookie never answers"
    with pytest.raises(LedgerClosedError):
        pending.result(10)
    md = c.ledger_metadata(w.ledger_id)
    assert md.state == LedgerState.CLOSED and md.last_entry_id == 0


# -- 6. fencing goes on once every write quorum answered ----------------------------------

def test_recovery_does_not_wait_for_a_hung_bookie(cluster):
    w = cluster.client("w", **QUIET).create_ledger(3, 3, 2)
    w.append_many([b"h%d" % i for i in range(20)])
    cluster.suspend_bookie(cluster.index_of(w.metadata.fragments[0][1][2]))
    result = {}
    reader = cluster.client("r", read_timeout_s=600, add_timeout_s=600)

    def recover():
        result["handle"] = reader.open_ledger(w.ledger_id)

    t = threading.Thread(target=recover)
    t.start()
    t.join(60)
    assert not t.is_alive(), "recovery waited for the SIGSTOPped bookie"
    assert result["handle"].last_add_confirmed == 19


# -- the harness stays quiet -------------------------------------------------------------------

def test_a_cut_proxy_does_not_flood_the_log(cluster, caplog):
    c = cluster.client("w", add_timeout_s=2)
    w = c.create_ledger(3, 3, 2)
    victim = cluster.index_of(w.metadata.fragments[0][1][0])
    with caplog.at_level("WARNING"):
        cluster.proxy(victim).cut()
        for i in range(200):
            w.append(b"c%d" % i)
        cluster.proxy(victim).heal()
    assert not [r for r in caplog.records if "socket.send() raised" in r.getMessage()]
    w.close()
