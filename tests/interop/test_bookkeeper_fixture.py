"""The BookKeeper peer itself (issue 28 item 1): Java bookies from the jars, BookieShell as
an oracle and our BkDriver agree with each other, on 4.17.2 and 4.16.6.

One cluster of 3 bookies per version for the whole module (start-up is most of the cost).
Under CI=true a missing java, jar or ZooKeeper fails instead of skipping.
"""
from __future__ import annotations

import logging
import threading
import time

import pytest

from embedlog.harness import jars
from embedlog.harness.bookkeeper import BookKeeperCluster, DriverResult
from servers import ServerMissing, in_ci, skip_unless_ci

log = logging.getLogger(__name__)
PASSWORD = "fixture-pw"


@pytest.fixture(scope="module", params=jars.BOOKKEEPER_VERSIONS)
def bk(request):
    name = f"bookkeeper-{request.param}"
    if not jars.is_fetched(name) and not in_ci():
        pytest.skip(f"{name}'s jars are not in {jars.cache_dir()} (make peers)")
    started = time.monotonic()
    try:
        cluster = BookKeeperCluster(request.param, bookies=3)
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    log.warning("BookKeeper %s: ZooKeeper, format and 3 bookies ready in %.2fs",
                request.param, time.monotonic() - started)
    yield cluster
    cluster.stop()


def test_simpletest(bk):
    assert "10 entries written" in bk.simpletest(ensemble=3, write_quorum=3, ack_quorum=2)


def test_listbookies(bk):
    assert sorted(bk.list_bookies()) == sorted(bk.bookie_ids)
    assert bk.list_bookies(readonly=True) == []


def test_driver_writes_shell_and_driver_read_back(bk):
    made = bk.java_client("create", ensemble=3, write_quorum=2, ack_quorum=2,
                          digest="CRC32C", password=PASSWORD, count=100)
    assert made.acked == list(range(100)) and made.lac == 99 and made.closed
    expected = [(i, b"entry-%d" % i) for i in range(100)]

    assert bk.read_ledger(made.ledger_id) == expected
    meta = bk.ledger_metadata(made.ledger_id)
    for part in ("ensembleSize=3", "writeQuorumSize=2", "ackQuorumSize=2", "state=CLOSED",
                 "lastEntryId=99", "digestType=CRC32C"):
        assert part in meta, meta
    assert made.ledger_id in bk.list_ledgers()

    read = bk.java_client("read", made.ledger_id, password=PASSWORD)
    assert read.lac == 99 and read.closed and read.entries == expected
    wrong = bk.java_client("read", made.ledger_id, password="wrong", check=False)
    assert wrong.returncode == 2 and wrong.error_code == -102, wrong.lines   # unauthorized

    # one bookie holds the entries whose write set names it: 2 of every 3, each stored
    # whole (BookKeeper's header: ledger id, entry id, LAC, length; then a 4-byte CRC32C)
    bookie = made.ensembles[0][0]
    stored = bk.read_ledger(made.ledger_id, bookie=bookie, raw=True)
    assert 60 <= len(stored) <= 70
    for eid, raw in stored:
        assert int.from_bytes(raw[0:8], "big") == made.ledger_id
        assert int.from_bytes(raw[8:16], "big") == eid
        assert raw[36:] == b"entry-%d" % eid


def test_bookie_killed_mid_write_changes_ensemble(bk):
    """A 2/2/2 ledger on 3 bookies: SIGKILL one of its two bookies after 20 acks; the
    writer replaces it with the third and acknowledges every entry."""
    proc = bk.java_client_popen("create", ensemble=2, write_quorum=2, ack_quorum=2,
                                digest="CRC32C", password=PASSWORD, stdin=True)
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    result = DriverResult()
    victim = None
    try:
        def send(first, n):
            proc.stdin.write("".join((b"entry-%d" % i).hex() + "\n"
                                     for i in range(first, first + n)))
            proc.stdin.flush()

        def until_acked(eid):
            while eid not in result.acked:
                line = proc.stdout.readline()
                assert line, f"driver ended early: {result.lines} {proc.stderr.read()[-2000:]}"
                result.feed(line)

        send(0, 20)
        until_acked(19)
        victim = bk.bookie_ids.index(result.ensembles[0][0])
        bk.kill(victim)
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
    dead = bk.bookie_ids[victim]
    assert len(result.ensembles) == 2, result.ensembles
    first, later = sorted(result.ensembles)
    assert 20 <= later <= 21
    assert dead in result.ensembles[first] and dead not in result.ensembles[later]

    read = bk.java_client("read", result.ledger_id, password=PASSWORD)
    assert read.entries == [(i, b"entry-%d" % i) for i in range(40)]
    bk.start(victim)                # the same dirs and port, for whatever runs next
    assert sorted(bk.list_bookies()) == sorted(bk.bookie_ids)
