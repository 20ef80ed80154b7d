"""benchmarks/vs_bookkeeper.py at a tiny size (issue 28 item 5; its --compare bookies mode,
issue 29 item 5, in the second test: 10 s at load 3), so the side-by-side with
BookKeeper's Java client never rots: three Java bookies of 4.17.2, BookKeeper's client
(BkDriver bench) and embedlog's client over BookKeeper's v3 protocol on a 3/2/2 ledger, and
the report built from the rows (the 1/1/1 cells run the same code). Figures are not checked: performance is
measured in benchmarks/, never asserted by a test. Under CI=true a missing java, jar or
ZooKeeper fails instead of skipping.
"""
from __future__ import annotations

import os
import sys

import pytest

from support.servers import ServerMissing, require_peer, skip_unless_ci

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks"))

VERSION = "4.17.2"          # the benchmark's default peer


@pytest.fixture(scope="module")
def bk():
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    name = f"bookkeeper-{VERSION}"
    require_peer(name)
    try:
        cluster = BookKeeperCluster(VERSION, bookies=3, root="/vsbk")
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    yield cluster
    cluster.close()


def test_benchmark_cells_and_report(bk):
    import vs_bookkeeper
    from embedlog import Client
    outstanding = 20
    client = Client(bk.metadata_uri, max_pending_adds=outstanding, add_timeout_s=20)
    try:
        # one cell: a JVM start is most of what a cell costs here (the suite's budget is 20 s)
        rows = vs_bookkeeper.run(bk, client, rounds=1, adds=200, warmup=20, sizes=[100],
                                 quorums=[(3, 2, 2)], outstanding=outstanding)
    finally:
        client.close()
    assert [(r.client, r.quorum) for r in rows] == [("java", (3, 2, 2)), ("embedlog", (3, 2, 2))]
    for r in rows:
        assert r.adds == 200 and r.seconds > 0 and r.outstanding == outstanding, r
        assert 0 < r.p50_ms <= r.p99_ms, r
        assert r.cpu_s >= 0, r
    assert set(rows[1].thread_cpu_s) == {"caller", "loop"}
    report = vs_bookkeeper.describe(rows, command="smoke", seconds=1.0, loads=((0,) * 3,) * 2,
                                    version=VERSION, ledger_storage="sorted", adds=200,
                                    warmup=20, outstanding=outstanding, rounds=1)
    table = [line for line in report.splitlines() if line.startswith("| 3/2/2")]
    assert len(table) == 1 and table[0].count("|") == 10, report


def test_benchmark_bookies_mode_cells_and_report():
    """``--compare bookies`` (issue 29 item 5) at a tiny size: BkDriver bench on one Java
    bookie and on one embedlog bookie, each alone on its own root, and the report."""
    import vs_bookkeeper
    from embedlog.harness.servers import ZooKeeperServer
    require_peer(f"bookkeeper-{VERSION}")
    try:
        zk = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    try:
        st = vs_bookkeeper.BookieSetups(VERSION, 1, zk.hosts, tag="smoke")
        try:
            rows = vs_bookkeeper.run_bookies([st], rounds=1, adds=200, warmup=20, sizes=[100],
                                             quorums=[(1, 1, 1), (3, 2, 2)], outstanding=20)
        finally:
            st.close()
    finally:
        zk.stop()
    # 3/2/2 does not fit one bookie: skipped
    assert [(r.client, r.quorum, r.bookies) for r in rows] == [
        ("java", (1, 1, 1), 1), ("embedlog", (1, 1, 1), 1)]
    for r in rows:
        assert r.adds == 200 and r.seconds > 0 and 0 < r.p50_ms <= r.p99_ms, r
        assert r.bookie_cpu_s >= 0, r
    report = vs_bookkeeper.describe_bookies(
        rows, command="smoke", seconds=1.0, loads=((0,) * 3,) * 2, version=VERSION,
        ledger_storage="sorted", adds=200, warmup=20, outstanding=20, rounds=1,
        flush_when_queue_empty=False)
    table = [line for line in report.splitlines() if line.startswith("| 1 | 1/1/1")]
    assert len(table) == 1 and table[0].count("|") == 13, report
