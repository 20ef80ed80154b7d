"""The replication protocol on real bookie processes (seed 004), one test per rule."""
import concurrent.futures
import os
import random
import socket
import struct
import threading
import time

import pytest

from support.cliutil import wait_until
from embedlog import LedgerId
from embedlog.client.schedule import write_set
from embedlog.errors import (EmbedlogError, LedgerFencedError, NoSuchEntryError, NotEnoughBookiesError,
                             UnauthorizedAccessError)
from embedlog.harness import LocalCluster
from embedlog.meta import open_metadata_store
from embedlog.meta.api import LedgerState
from embedlog.net import protocol as P


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=4, base_dir=str(tmp_path / "cluster")) as lc:
        yield lc


def holds(client, bookie_id, lid, entry_id) -> bool:
    """Ask one bookie directly whether it stores an entry."""
    ctx = client._ctx

    async def ask():
        try:
            resp = await ctx.call(bookie_id, lambda rid: P.read_request(
                rid, lid.scope_id, lid.ledger_id, entry_id), 5)
            return bool(P.parse_read_body(resp.body)[1])
        except NoSuchEntryError:
            return False
        except Exception as exc:  # NoSuchLedger counts as "does not hold"
            from embedlog.errors import NoSuchLedgerError
            if isinstance(exc, NoSuchLedgerError):
                return False
            raise

    return ctx.run(ask())


def test_write_sets_are_striped_as_the_seed_says(cluster):
    c = cluster.client()
    w = c.create_ledger(ensemble_size=4, write_quorum=3, ack_quorum=2)
    w.append_many([b"%d" % i for i in range(8)])
    w.close()
    ens = w.metadata.fragments[0][1]
    table = {0: (0, 1, 2), 1: (1, 2, 3), 2: (2, 3, 0), 3: (3, 0, 1), 4: (0, 1, 2), 5: (1, 2, 3)}
    for eid, idxs in table.items():
        want = {ens[i] for i in idxs}
        assert set(write_set(w.metadata, eid)) == want
        # Qa=2 acknowledges before the third copy lands: it arrives, on its own time
        wait_until(lambda: all(holds(c, b, w.ledger_id, eid) for b in want), what=f"entry {eid}")
        for b in set(ens) - want:
            assert not holds(c, b, w.ledger_id, eid), (eid, b)


def test_frames_are_cut_once_under_the_limits_and_every_bookie_gets_them(cluster):
    """E == Qw: the adds are cut into frames once, and every bookie gets those frames, each
    under max_entries_per_frame and max_frame_payload_bytes (an entry over the byte limit
    goes alone), and stores every entry."""
    c = cluster.client(max_entries_per_frame=7, max_frame_payload_bytes=4000)
    w = c.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
    sent: dict = {}
    send = c._ctx.send

    def recording(bookie, build, timeout_s, on_answer):
        frame = build(0)
        sizes = [len(e) for e in P.parse_add_body(P.parse_request(frame[4:]).body)]
        sent.setdefault(bookie, []).append(sizes)
        return send(bookie, build, timeout_s, on_answer)

    c._ctx.send = recording
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.choice([0, 10, 900, 1500, 5000])) for _ in range(150)]
    futs = w.append_many_async(payloads)
    assert [f.result(30) for f in futs] == list(range(150))
    ens = w.metadata.fragments[0][1]
    assert set(sent) == set(ens)
    frames = sent[ens[0]]
    assert all(sent[b] == frames for b in ens)
    assert sum(map(len, frames)) == 150
    for sizes in frames:
        assert len(sizes) <= 7
        assert len(sizes) == 1 or sum(n + 4 for n in sizes) <= 4000
    for b in ens:
        for eid in (0, 77, 149):
            assert holds(c, b, w.ledger_id, eid)
    w.close()


def test_acks_come_in_entry_order(cluster):
    c = cluster.client()
    w = c.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    w.append(b"warm")                       # entry 0 on ens[0], ens[1]
    ens = w.metadata.fragments[0][1]
    slow = cluster.index_of(ens[1])         # entry 1 goes to ens[1], ens[2]; entry 2 to ens[2], ens[0]
    cluster.proxy(slow).delay(0.4)
    f1 = w.append_async(b"one")
    f2 = w.append_async(b"two")
    time.sleep(0.2)
    # entry 2 has both its acks (ens[2], ens[0]) but entry 1 waits for the slow bookie
    assert not f1.done() and not f2.done()
    assert w.last_add_confirmed == 0
    assert f1.result(10) == 1 and f2.result(10) == 2 and w.last_add_confirmed == 2
    cluster.proxy(slow).heal()
    w.close()


def test_killed_bookie_loses_nothing_and_makes_a_new_fragment(cluster):
    c = cluster.client()
    w = c.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    acked = {}
    for i in range(50):
        acked[w.append(b"a%d" % i)] = b"a%d" % i
    victim = cluster.index_of(w.metadata.fragments[0][1][0])
    cluster.kill_bookie(victim)
    acked[w.append(b"a50")] = b"a50"
    # the ensemble change runs beside the adds (Qa=2 still acks): let it land before adding
    # more, so where the new fragment starts depends on the protocol, not on timing
    wait_until(lambda: len(c.ledger_metadata(w.ledger_id).fragments) == 2, what="ensemble change")
    for i in range(51, 120):
        acked[w.append(b"a%d" % i)] = b"a%d" % i
    w.close()
    md = c.ledger_metadata(w.ledger_id)
    assert len(md.fragments) == 2 and cluster.bookie_id(victim) not in md.fragments[1][1]
    assert 50 <= md.fragments[1][0] <= 51
    r = c.open_ledger(w.ledger_id)
    got = r.read_batch(0, r.last_add_confirmed)
    assert {i: got[i] for i in acked} == acked


def test_fencing_makes_the_old_writer_fail(cluster):
    c1, c2 = cluster.client(), cluster.client()
    w = c1.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    last = w.append_many([b"x"] * 30)
    r = c2.open_ledger(w.ledger_id)          # recovery: fence + close
    assert r.last_add_confirmed == last and r.is_closed
    with pytest.raises(LedgerFencedError):
        w.append(b"after fence")
    md = c2.ledger_metadata(w.ledger_id)
    assert md.state == LedgerState.CLOSED and md.last_entry_id == last


def test_recovery_with_one_bookie_down(cluster):
    c1, c2 = cluster.client(), cluster.client()
    w = c1.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    acked = [w.append(b"r%d" % i) for i in range(40)]
    cluster.kill_bookie(cluster.index_of(w.metadata.fragments[-1][1][1]))
    r = c2.open_ledger(w.ledger_id)
    assert r.last_add_confirmed >= acked[-1]
    assert r.read_batch(0, acked[-1]) == [b"r%d" % i for i in acked]


def test_two_recoveries_at_once_close_at_the_same_point(cluster):
    c = cluster.client()
    w = c.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    w.append_many([b"z"] * 100)
    readers = [cluster.client() for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        handles = list(pool.map(lambda cl: cl.open_ledger(w.ledger_id), readers))
    lasts = {h.last_add_confirmed for h in handles}
    assert lasts == {99}
    assert c.ledger_metadata(w.ledger_id).last_entry_id == 99


def test_writer_racing_recovery_never_gets_a_false_ack(cluster):
    """Fencing and fenced recovery reads (#2614): whatever the old writer was told was
    acknowledged is inside the closed ledger and readable."""
    c1, c2 = cluster.client(add_timeout_s=2), cluster.client()
    w = c1.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    acked, stop = [], threading.Event()

    def write():
        i = 0
        while not stop.is_set():
            try:
                acked.append(w.append(b"w%d" % i))
            except Exception:
                return
            i += 1

    t = threading.Thread(target=write)
    t.start()
    time.sleep(0.3)
    # one bookie is slow to see anything: the fence reaches it late
    cluster.proxy(cluster.index_of(w.metadata.fragments[0][1][2])).delay(0.05)
    r = c2.open_ledger(w.ledger_id)
    stop.set()
    t.join(10)
    assert acked and max(acked) <= r.last_add_confirmed
    assert r.read_batch(0, max(acked)) == [b"w%d" % i for i in range(max(acked) + 1)]


def test_recovery_reads_the_last_fragment(cluster):
    """#2615: after an ensemble change, recovery starts from the last fragment."""
    c1, c2 = cluster.client(), cluster.client()
    w = c1.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    for i in range(20):
        w.append(b"f%d" % i)
    cluster.kill_bookie(cluster.index_of(w.metadata.fragments[0][1][0]))
    for i in range(20, 30):
        w.append(b"f%d" % i)
    # the ensemble change is asynchronous to the adds (Qa=2 acks without the dead bookie)
    wait_until(lambda: len(c1.ledger_metadata(w.ledger_id).fragments) == 2, what="ensemble change")
    r = c2.open_ledger(w.ledger_id)                 # the writer is abandoned, not closed
    assert r.last_add_confirmed == 29
    assert r.read_batch(0, 29) == [b"f%d" % i for i in range(30)]


def test_not_enough_bookies(cluster):
    c = cluster.client()
    with pytest.raises(NotEnoughBookiesError):
        c.create_ledger(ensemble_size=5, write_quorum=2, ack_quorum=2)


def test_wrong_password(cluster):
    c = cluster.client()
    w = c.create_ledger(3, 2, 2, password=b"good")
    w.append(b"1")
    with pytest.raises(UnauthorizedAccessError):
        c.open_ledger(w.ledger_id, password=b"bad")
    assert w.append(b"2") == 1


def test_read_only_bookie_is_avoided(cluster):
    cluster.set_read_only(0, True)
    c = cluster.client()
    for _ in range(5):
        w = c.create_ledger(3, 2, 2)
        assert cluster.bookie_id(0) not in w.metadata.fragments[0][1]
        w.close()
    cluster.set_read_only(0, False)
    assert cluster.bookie_id(0) in c.bookies()[0]


def test_read_only_switch_is_one_registration_change(cluster):
    """A served bookie turning read-only and back moves its registration in one call (one
    transaction): a reader polling the bookie list as fast as it can never finds it in
    neither list (unregister-then-register left such a moment at every switch)."""
    bid = cluster.bookie_id(0)
    seen, stop = [], threading.Event()
    store = open_metadata_store(cluster.metadata_uri, create=False)

    def poll():
        while not stop.is_set():
            regs = store.registration_client.get_all_bookies()
            seen.append(sum(r.bookie_id == bid for r in regs))

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        for k in range(20):
            cluster.set_read_only(0, k % 2 == 0)
    finally:
        stop.set()
        t.join()
        store.close()
    cluster.set_read_only(0, False)
    assert len(seen) > 100 and set(seen) == {1}, (len(seen), seen.count(0), seen.count(2))


def test_scope_ledgers_over_the_wire(cluster):
    c = cluster.client()
    w = c.create_ledger(3, 2, 2, scope_id=0xABCDEF, digest="mac", password=b"p")
    w.append_many([b"s%d" % i for i in range(10)])
    w.close()
    assert w.ledger_id.scope_id == 0xABCDEF
    r = c.open_ledger(LedgerId.parse(w.ledger_id.qualified_name), password=b"p")
    assert r.read_batch(0, 9)[9] == b"s9"
    assert c.list_ledgers(0xABCDEF) == [w.ledger_id]


def test_tailing_reader_sees_entries_as_the_lac_passes(cluster):
    c1, c2 = cluster.client(), cluster.client()
    w = c1.create_ledger(3, 2, 2)
    w.append(b"t0")
    r = c2.open_ledger(w.ledger_id, recovery=False)
    seen = []

    def tail():
        for e in r.tail(0, poll_timeout_ms=200):
            seen.append(e.data)
            if len(seen) == 5:
                return

    t = threading.Thread(target=tail)
    t.start()
    for i in range(1, 6):
        w.append(b"t%d" % i)
        time.sleep(0.05)
    t.join(20)
    # the LAC only passes entry 4 once entry 5 carries it: exactly t0..t4 are visible
    assert seen == [b"t%d" % i for i in range(5)]
    w.close()


def test_bad_frames_are_rejected_and_the_bookie_keeps_serving(cluster):
    c = cluster.client()
    w = c.create_ledger(3, 3, 3)
    w.append_many([b"keep%d" % i for i in range(10)])
    addr = c._ctx.address_of(w.metadata.fragments[0][1][0])
    host, port = addr.rsplit(":", 1)
    lid = w.ledger_id
    bad_frames = [
        b"\xff\xff\xff\xff",                                       # oversize length
        struct.pack(">I", 100) + os.urandom(100),                  # random body
        struct.pack(">I", 100) + b"\x01" * 20,                      # truncated
        struct.pack(">I", 64) + bytes([1, 99]) + bytes(62),         # unknown op
        P.add_request(1, 0, lid.ledger_id, b"\0" * 20, [os.urandom(60)]),   # wrong key, junk entry
        P.read_request(2, 0, lid.ledger_id, 0, flags=P.FLAG_FENCE, master_key=b"\1" * 20),  # wrong key fence
    ]
    for frame in bad_frames:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(frame)
            s.shutdown(socket.SHUT_WR)
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass
    assert w.append(b"still") == 10            # not fenced, still serving
    w.close()
    r = c.open_ledger(lid)
    assert r.read_batch(0, 10) == [b"keep%d" % i for i in range(10)] + [b"still"]


def test_autorecovery_rereplicates_a_killed_bookies_fragments(cluster):
    c = cluster.client()
    ledgers = []
    for _ in range(3):
        w = c.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        w.append_many([b"ar%d" % i for i in range(50)])
        w.close()
        ledgers.append(w.ledger_id)
    victim_id = c.ledger_metadata(ledgers[0]).fragments[0][1][0]
    cluster.kill_bookie(cluster.index_of(victim_id))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        mds = [c.ledger_metadata(l) for l in ledgers]
        if all(victim_id not in ens for md in mds for _f, ens in md.fragments):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"{victim_id} still in an ensemble: {[m.fragments for m in mds]}")
    # back to full write quorum: every live bookie of each ensemble holds every entry
    for md in mds:
        for b in md.fragments[0][1]:
            assert all(holds(c, b, md.ledger_id, e) for e in range(0, 50, 7)), b
        assert c.open_ledger(md.ledger_id).read_batch(0, 49)[49] == b"ar49"


@pytest.mark.parametrize("metadata", ["sqlite", "zk", "etcd"])
def test_cluster_on_each_metadata_store(tmp_path, metadata):
    from support.servers import ServerMissing, skip_unless_ci
    try:
        lc = LocalCluster(bookies=4, metadata=metadata, base_dir=str(tmp_path / "c"))
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    with lc:
        c = lc.client()
        w = c.create_ledger(3, 2, 2)
        w.append_many([b"m%d" % i for i in range(20)])
        lc.kill_bookie(lc.index_of(w.metadata.fragments[0][1][0]))
        r = c.open_ledger(w.ledger_id)              # recovery with a bookie gone
        assert r.last_add_confirmed == 19 and r.read_batch(0, 19)[19] == b"m19"


def test_an_add_the_client_cannot_send_fails_and_never_waits_for_ever(tmp_path, monkeypatch):
    """An error while the client frames a batch (a bug, no memory: here encode_adds raising
    MemoryError, and encode_produced, append_async's way) fails that batch's adds and every later one with EmbedlogError and closes
    the ledger at its LAC, as any unrecoverable add error does; those adds used to wait for
    ever, the loop having logged the error and gone on."""
    from embedlog._native import addpath

    def no_memory(*_args):
        raise MemoryError("injected")

    with LocalCluster(bookies=1, base_dir=str(tmp_path / "c"), proxies=False) as lc, \
            lc.client() as c:
        w = c.create_ledger(1, 1, 1)
        assert w.append(b"first") == 0
        monkeypatch.setattr(addpath, "encode_adds", no_memory)
        monkeypatch.setattr(addpath, "encode_produced", no_memory)   # append_async's way
        # the loop may fail the first batch while this thread still appends: a later
        # append_async then raises the handle's error itself, which is failing too. Even
        # the first may: the loop can take and fail its message between produce()'s queue
        # add and its look at the handle's error (seen at load 10)
        futs, refused = [], None
        for _ in range(50):
            try:
                futs.append(w.append_async(b"x"))
            except EmbedlogError as e:
                refused = e
                break
        assert futs or refused is not None, "every add fails, by its future or at once"
        for f in futs:
            with pytest.raises(EmbedlogError, match="could not be sent") as got:
                f.result(timeout=60)
            assert isinstance(got.value.__cause__, MemoryError)
        if refused is not None:
            assert "could not be sent" in str(refused)
            assert isinstance(refused.__cause__, MemoryError)
        with pytest.raises(EmbedlogError):
            w.append(b"later")
        monkeypatch.undo()
        wait_until(lambda: c.ledger_metadata(w.ledger_id).state == LedgerState.CLOSED,
                   timeout_s=60, what="the ledger closed at its LAC")
        assert c.open_ledger(w.ledger_id).last_add_confirmed == 0


def test_the_auditor_says_when_a_lost_bookies_grace_period_begins(tmp_path, caplog):
    """Issue 52, beyond its list: a bookie gone from the registrations was re-replicated
    lost_bookie_grace_s later (10 s from `bookie serve`, BookKeeper's lostBookieRecoveryDelay
    is often hours) with nothing logged meanwhile. The auditor says which bookie, a ledger it
    was found in, and when its ledgers will be marked, once, when the wait begins; and when
    it comes back. An operator's audit (no grace) marks at once and says nothing of a wait."""
    import logging
    from embedlog.client.autorecovery import AutoRecovery
    from embedlog.client.context import ClientConfig, ClientContext
    from embedlog.meta.api import LedgerMetadata
    caplog.set_level(logging.INFO, logger="embedlog")
    gone = "127.0.0.1:3999"
    store = open_metadata_store(f"sqlite://{tmp_path}/meta.db")
    store.ledger_manager.create_ledger_metadata(
        LedgerMetadata(LedgerId(0, 7), 1, 1, 1, fragments=((0, (gone,)),)))
    ctx = ClientContext(store, ClientConfig())
    try:
        auditor = AutoRecovery(ctx, "auditor", lost_bookie_grace_s=3600.0)
        assert auditor.audit() == [] and auditor.audit() == []
        said = [r for r in caplog.records if gone in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in said]
        assert "ledger 7" in said[0].getMessage() and "3600.0 s" in said[0].getMessage()
        store.register_bookie(gone, False)
        auditor.audit()
        assert "registered again" in caplog.records[-1].getMessage()
        store.unregister_bookie(gone, False)
        caplog.clear()
        assert AutoRecovery(ctx, "cli", lost_bookie_grace_s=0.0).audit() == [LedgerId(0, 7)]
        assert not [r for r in caplog.records if "lost_bookie_grace_s" in r.getMessage()]
    finally:
        ctx.close()
        store.close()
