"""A stream heals after a bookie is lost, and autorecovery copies with ranged reads
(issue 27 items 1 and 2), on real bookie processes."""
import json
import time

import pytest

from support.cliutil import cli, wait_until
from embedlog.client.autorecovery import AutoRecovery
from embedlog.client.schedule import write_set
from embedlog.errors import NoSuchEntryError, NoSuchLedgerError
from embedlog.harness import LocalCluster
from embedlog.net import protocol as P


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=4, base_dir=str(tmp_path / "cluster"), lost_bookie_grace_s=1.0) as lc:
        yield lc


@pytest.fixture
def quiet_cluster(tmp_path):
    """No autorecovery in the bookies: the test runs its own worker."""
    with LocalCluster(bookies=4, base_dir=str(tmp_path / "cluster"), autorecovery=False) as lc:
        yield lc


def holds(client, bookie_id, lid, eid) -> bool:
    ctx = client._ctx

    async def ask():
        try:
            resp = await ctx.call(bookie_id, lambda rid: P.read_request(
                rid, lid.scope_id, lid.ledger_id, eid), 5)
            return bool(P.parse_read_body(resp.body)[1])
        except (NoSuchEntryError, NoSuchLedgerError):
            return False

    return ctx.run(ask())


def wait_healed(client, lid, victim, timeout_s=90.0, step=None):
    """Poll until no fragment names ``victim`` and the ledger is not under-replicated."""
    deadline = time.monotonic() + timeout_s
    while True:
        if step is not None:
            step()
        md = client.ledger_metadata(lid)
        ur = client.metadata.underreplication.list_underreplicated()
        if all(victim not in ens for _f, ens in md.fragments) and lid not in ur:
            return md
        if time.monotonic() > deadline:
            raise AssertionError(f"{victim} still named after {timeout_s} s: {md.fragments}, "
                                 f"under-replicated: {ur}")
        time.sleep(0.2)


def assert_fully_replicated(client, md, last, step=1):
    """Every bookie of each entry's write set holds it (back to the full write quorum)."""
    for eid in range(md.first_entry_id, last + 1, step):
        for b in write_set(md, eid):
            assert holds(client, b, md.ledger_id, eid), (eid, b, md.fragments)


def test_a_released_stream_heals_its_closed_and_current_fragments(cluster):
    c = cluster.client()
    s = c.open_stream("heal", ensemble_size=3, write_quorum=3, ack_quorum=2, rollover_entries=40)
    want = []
    for i in range(5):                            # five fragments, each on 3 of the 4 bookies
        batch = [b"%d-%d" % (i, j) for j in range(40)]
        s.append_many(batch)
        want += batch
    s.close()                                     # releases its term: nobody leads
    md = s.refresh()
    assert len(md.fragments) >= 5 and md.term >= 1
    # a bookie of the current fragment that closed fragments name too (each closed
    # fragment has 3 of 4 bookies, so it holds 2 of the current fragment's 3)
    last_ens = md.fragments[-1][1]
    victim = max(last_ens, key=lambda b: sum(b in ens for _f, ens in md.fragments[:-1]))
    cluster.kill_bookie(cluster.index_of(victim))

    md = wait_healed(c, s.ledger_id, victim)
    assert_fully_replicated(c, md, s.last_position())
    c2 = cluster.client()
    s2 = c2.open_stream("heal")
    assert [e.data for e in s2.read(0)] == want
    s2.append(b"after")                           # the released term goes on, on the new ensemble
    assert [e.data for e in s2.read(0)][-1] == b"after"


def test_a_live_idle_leader_replaces_a_lost_bookie_of_its_fragment(cluster):
    c = cluster.client()
    s = c.open_stream("live")                     # the default ensemble, E = Qw = Qa = 2
    s.append_many([b"e%d" % i for i in range(30)])
    victim = s.metadata.fragments[-1][1][0]
    cluster.kill_bookie(cluster.index_of(victim))  # while the leader is idle

    md = wait_healed(c, s.ledger_id, victim)
    assert s.is_leader                            # healed without a take-over
    assert_fully_replicated(c, md, s.last_position())
    s.append(b"more")
    assert [e.data for e in s.read(0)] == [b"e%d" % i for i in range(30)] + [b"more"]


def test_autorecovery_takes_over_a_stream_whose_leader_is_gone(quiet_cluster):
    cluster = quiet_cluster
    c = cluster.client("crashed-writer")
    s = c.open_stream("orphan", ensemble_size=3, write_quorum=3, ack_quorum=2)
    s.append_many([b"o%d" % i for i in range(25)])
    lid, term = s.ledger_id, s.term
    victim = s.metadata.fragments[-1][1][1]
    c._ctx.close()                                # the writer's process is gone: no release
    cluster.kill_bookie(cluster.index_of(victim))

    c2 = cluster.client("worker")
    ar = AutoRecovery(c2._ctx, "test-worker", lost_bookie_grace_s=0.5, open_stream_grace_s=1.0)

    def step():
        ar.audit()
        ar.replicate_some()

    md = wait_healed(c2, lid, victim, step=step)
    assert md.term > term
    s2 = c2.open_stream("orphan")
    assert [e.data for e in s2.read(0)] == [b"o%d" % i for i in range(25)]
    assert_fully_replicated(c2, md, s2.last_position())
    s2.append(b"next")                            # autorecovery released the term it took


def test_bookie_recover_heals_streams(quiet_cluster):
    """`embedlog bookie recover`: a released stream and one whose leader is gone."""
    cluster = quiet_cluster
    c = cluster.client()
    released = c.open_stream("released", ensemble_size=3, write_quorum=3, ack_quorum=2,
                             rollover_entries=20)
    released.append_many([b"r%d" % i for i in range(60)])
    released.close()
    orphan = cluster.client("crashed-writer").open_stream("orphan", ensemble_size=3,
                                                          write_quorum=3, ack_quorum=2)
    orphan.append_many([b"o%d" % i for i in range(30)])
    orphan._ctx.close()                           # its writer is gone without a release
    both = set(orphan.metadata.fragments[-1][1]) & set(released.metadata.fragments[-1][1])
    victim = sorted(both)[0]
    cluster.kill_bookie(cluster.index_of(victim))
    wait_until(lambda: victim not in sum(c.bookies(), []), 30, "the registration to expire")

    r = cli("bookie", "recover", victim, "--metadata", cluster.metadata_uri, "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert len(json.loads(r.stdout)["replicated"]) == 2
    for s, want in ((released, [b"r%d" % i for i in range(60)]),
                    (orphan, [b"o%d" % i for i in range(30)])):
        md = c.ledger_metadata(s.ledger_id)
        assert all(victim not in ens for _f, ens in md.fragments), md.fragments
        assert [e.data for e in c.open_stream(s.name).read(0)] == want


def test_autorecovery_copies_a_fragment_with_ranged_reads(quiet_cluster):
    cluster = quiet_cluster
    c = cluster.client()
    n = 3000
    full = c.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
    full.append_many([b"f%05d" % i for i in range(n)])
    full.close()
    striped = c.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    striped.append_many([b"s%05d" % i for i in range(n)])
    striped.close()
    # two ensembles of 3 of the 4 bookies share at least 2: lose one of those
    victim = sorted(set(full.metadata.fragments[0][1]) & set(striped.metadata.fragments[0][1]))[0]
    cluster.kill_bookie(cluster.index_of(victim))

    ctx = c._ctx
    reads = []
    call = ctx.call

    async def counting(bookie, build, timeout_s):
        if P.parse_request(build(0)[4:]).op == P.READ:
            reads.append(bookie)
        return await call(bookie, build, timeout_s)

    ctx.call = counting
    ar = AutoRecovery(ctx, "test-worker")
    assert ar.replicate_ledger(full.ledger_id, {victim})
    assert victim not in reads                    # the lost bookie is not asked
    # ranged: about one READ per 1024 entries, not one per entry
    assert len(reads) <= n // 100, len(reads)
    reads.clear()
    assert ar.replicate_ledger(striped.ledger_id, {victim})
    assert victim not in reads
    for lid, prefix in ((full.ledger_id, b"f"), (striped.ledger_id, b"s")):
        md = c.ledger_metadata(lid)
        assert victim not in md.fragments[0][1]
        assert_fully_replicated(c, md, n - 1, step=7)
        assert c.open_ledger(lid).read_batch(n - 5, n - 1) == [prefix + b"%05d" % i for i in range(n - 5, n)]
