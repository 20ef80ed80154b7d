"""A client killed (SIGKILL) at each named client failure point: another client then
recovers, and every entry the dead client was told was acknowledged is there."""
import os
import subprocess
import sys

import pytest

from support.cliutil import ROOT, SUPPORT
from embedlog.harness import LocalCluster
from embedlog.meta.api import LedgerState

QUIET = {"explicit_lac_interval_ms": 10 ** 9}


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=4, base_dir=str(tmp_path / "c"), autorecovery=False) as lc:
        yield lc


def run_child(cluster, tmp_path, point, scenario, *args):
    acks = tmp_path / f"{scenario}.acks"
    env = dict(os.environ, EMBEDLOG_FAILPOINTS=f"{point}=crash")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, os.path.join(SUPPORT, "client_child.py"), scenario,
                           cluster.metadata_uri, str(acks), *map(str, args)],
                          env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, (proc.returncode, proc.stderr.decode()[-2000:])
    lines = [line.split() for line in acks.read_text().splitlines()]
    assert ["done"] not in lines
    return lines


@pytest.mark.parametrize("point,scenario", [("client.close.before_metadata", "close"),
                                            ("client.ensemble_change.after_metadata", "ensemble_change")])
def test_writer_killed_at_a_metadata_write(cluster, tmp_path, point, scenario):
    lines = run_child(cluster, tmp_path, point, scenario)
    lid = int(lines[0][1])
    acked = [int(x[1]) for x in lines[1:] if x[0] == "ack"]
    c = cluster.client()
    md = c.ledger_metadata(lid)
    assert md.state == LedgerState.OPEN
    if scenario == "ensemble_change":
        assert len(md.fragments) == 2           # killed after the new fragment was written
    r = c.open_ledger(lid)
    assert r.last_add_confirmed >= max(acked)
    assert r.read_batch(0, max(acked)) == [b"c%d" % i for i in range(max(acked) + 1)]


def test_recovery_killed_before_its_close(cluster, tmp_path):
    c = cluster.client("writer", **QUIET)
    w = c.create_ledger(3, 3, 2)
    acked = [w.append(b"r%d" % i) for i in range(30)]
    c.close()           # the writer goes away (ledger left OPEN): it makes no ensemble change of its own
    c = cluster.client("observer")
    before = c.ledger_metadata(w.ledger_id)
    cluster.kill_bookie(cluster.index_of(before.fragments[0][1][0]))   # write-back needs a new bookie
    run_child(cluster, tmp_path, "client.recovery.before_close", "recovery", w.ledger_id.ledger_id)
    md = c.ledger_metadata(w.ledger_id)
    assert md.state == LedgerState.IN_RECOVERY and md.fragments == before.fragments
    r = cluster.client().open_ledger(w.ledger_id)
    assert r.last_add_confirmed >= acked[-1]
    assert r.read_batch(0, acked[-1]) == [b"r%d" % i for i in acked]


def test_take_over_killed_before_its_commit(cluster, tmp_path):
    leader = cluster.client("leader", **QUIET).open_stream("s")
    positions = [leader.append(b"s%d" % i) for i in range(30)]
    before = leader.refresh()
    cluster.kill_bookie(cluster.index_of(before.fragments[-1][1][0]))  # the no-op needs a new bookie
    run_child(cluster, tmp_path, "client.take_over.before_commit", "take_over", "s")
    s = cluster.client().open_stream("s")
    assert s.metadata.fragments == before.fragments and s.metadata.term == before.term + 1
    s.take_over()
    assert [(e.position, e.data) for e in s.read(0)] == [(p, b"s%d" % i) for i, p in enumerate(positions)]
