"""The BookKeeper peer itself (issue 28 item 1): Java bookies from the jars, BookieShell as
an oracle and our BkDriver agree with each other, on 4.17.2 and 4.16.6.

One cluster of 3 bookies per version for the whole module (start-up is most of the cost);
independent JVM runs go in parallel. Under CI=true a missing java, jar or ZooKeeper fails
instead of skipping.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from embedlog.harness.peers import jars
from embedlog.harness.peers.bookkeeper import BookKeeperCluster, DriverResult
from prestart import Prestart
from support.servers import ServerMissing, require_peer, skip_unless_ci

log = logging.getLogger(__name__)
PASSWORD = "fixture-pw"


def make_cluster(version: str, zk_hosts: str) -> BookKeeperCluster:
    started = time.monotonic()
    try:
        cluster = BookKeeperCluster(version, bookies=3, zk_hosts=zk_hosts, root=f"/bk-{version}")
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    log.warning("BookKeeper %s: format and 3 bookies ready in %.2fs",
                version, time.monotonic() - started)
    return cluster


CLUSTERS = Prestart(jars.BOOKKEEPER_VERSIONS, make_cluster, BookKeeperCluster.close)


@pytest.fixture(scope="module", params=jars.BOOKKEEPER_VERSIONS)
def bk(request, zk):
    """One version's cluster; the next version's starts meanwhile (tests/interop/prestart.py)."""
    require_peer(f"bookkeeper-{request.param}")
    cluster = CLUSTERS.take(request.param, zk.hosts,
                            ready=lambda v: jars.is_fetched(f"bookkeeper-{v}"))
    yield cluster
    cluster.close()


def parallel(*calls):
    """Run the calls (JVM starts, mostly) at once; their results in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def test_shell_simpletest_and_listbookies(cluster):
    out, listed = parallel(lambda: cluster.simpletest(ensemble=3, write_quorum=3, ack_quorum=2),
                           cluster.list_bookies)
    assert "10 entries written" in out
    assert sorted(listed) == sorted(cluster.bookie_ids)


def test_driver_writes_shell_and_driver_read_back(cluster):
    made = cluster.java_client("create", ensemble=3, write_quorum=2, ack_quorum=2,
                               digest="CRC32C", password=PASSWORD, count=100)
    assert made.acked == list(range(100)) and made.lac == 99 and made.closed
    lid, bookie = made.ledger_id, made.ensembles[0][0]
    expected = [(i, b"entry-%d" % i) for i in range(100)]

    shell_read, meta, ledgers, read, wrong, stored = parallel(
        lambda: cluster.read_ledger(lid),
        lambda: cluster.ledger_metadata(lid),
        cluster.list_ledgers,
        lambda: cluster.java_client("read", lid, password=PASSWORD),
        lambda: cluster.java_client("read", lid, password="wrong", check=False),
        lambda: cluster.read_ledger(lid, bookie=bookie, last=99, raw=True))

    assert shell_read == expected
    for part in ("ensembleSize=3", "writeQuorumSize=2", "ackQuorumSize=2", "state=CLOSED",
                 "lastEntryId=99", "digestType=CRC32C"):
        assert part in meta, meta
    assert lid in ledgers
    assert read.lac == 99 and read.closed and read.entries == expected
    assert wrong.returncode == 2 and wrong.error_code == -102, wrong.lines   # unauthorized
    # one bookie holds the entries whose write set names it (entry e goes to ensemble
    # positions e, e+1 mod 3), each stored whole: BookKeeper's header (ledger id, entry id,
    # LAC, length), a 4-byte CRC32C, the payload
    assert [eid for eid, _ in stored] == [e for e in range(100) if e % 3 != 1]
    for eid, raw in stored:
        assert int.from_bytes(raw[0:8], "big") == lid
        assert int.from_bytes(raw[8:16], "big") == eid
        assert raw[36:] == b"entry-%d" % eid


def test_bookie_killed_mid_write_changes_ensemble(cluster):
    """A 2/2/2 ledger on 3 bookies: SIGKILL one of its two bookies after 20 acks; the
    writer replaces it with the third and acknowledges every entry."""
    proc = cluster.java_client_popen("create", ensemble=2, write_quorum=2, ack_quorum=2,
                                     digest="CRC32C", password=PASSWORD, stdin=True)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    result = DriverResult()
    try:
        def send(first, n):
            proc.stdin.write("".join((b"entry-%d" % i).hex() + "\n"
                                     for i in range(first, first + n)))
            proc.stdin.flush()

        send(0, 20)
        while 19 not in result.acked:
            line = proc.stdout.readline()
            assert line, f"driver ended early: {result.lines} {proc.stderr.read()[-2000:]}"
            result.feed(line)
        victim = cluster.bookie_ids.index(result.ensembles[0][0])
        cluster.kill_bookie(victim)
        send(20, 20)
        proc.stdin.close()
        for line in proc.stdout:
            result.feed(line)
        assert proc.wait() == 0, (result.lines, proc.stderr.read()[-2000:])
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert result.acked == list(range(40)) and result.lac == 39 and result.closed
    dead = cluster.bookie_ids[victim]
    assert len(result.ensembles) == 2, result.ensembles
    first, later = sorted(result.ensembles)
    assert 20 <= later <= 21
    assert dead in result.ensembles[first] and dead not in result.ensembles[later]

    # the victim comes back on its dirs and port (waiting out its old ZooKeeper session)
    # while the driver reads the ledger through the ensemble change
    read, _ = parallel(lambda: cluster.java_client("read", result.ledger_id, password=PASSWORD),
                       lambda: cluster.start_bookie(victim))
    assert read.entries == [(i, b"entry-%d" % i) for i in range(40)]
    assert cluster.pid(victim) is not None
