"""Deletion without a deletion record (embedlog/bookie/absence.py), against a real ZooKeeper.

A Java BookKeeper client deletes a ledger by removing its znode and nothing else; here the
test removes it the same way (a plain ZooKeeper delete). On a root in BookKeeper's format
GC frees such a ledger only after two direct reads at least gc_missing_ledger_wait_time_ms
apart, on one synced session, with the root's INSTANCEID the cookie's and the id below the
id generator's high-water mark; every other case keeps it. On a root in embedlog's format
the positive rule stands. Waits are on conditions: the shortest wait allowed (1 s) is the
only wall time a test pays. The Java client end to end: tests/interop/test_bookkeeper_deletion.py.
"""
from __future__ import annotations

import itertools
import logging
import os
import signal
import time
import uuid

import pytest

import embedlog
from embedlog import LedgerId, failpoints
from embedlog._native import format as F
from embedlog.bookie.files import list_files
from embedlog.errors import MetadataError, NoSuchLedgerError
from embedlog.meta import open_metadata_store
from embedlog.meta.api import LedgerMetadata
from embedlog.meta.bookkeeper import idgen

from support.cliutil import wait_until
from support.servers import ServerMissing, ZooKeeperServer, skip_unless_ci, suspend

WAIT_MS = 1000
CONFIG = dict(gc_wait_time_ms=0, flush_interval_ms=100, journal_max_size_mb=1,
              journal_pre_alloc_size_mb=1, gc_missing_ledger_wait_time_ms=WAIT_MS)
_roots = itertools.count()


@pytest.fixture(scope="module")
def zk():
    try:
        server = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    from kazoo.client import KazooClient
    raw = KazooClient(hosts=server.hosts, timeout=10.0)
    raw.start(timeout=30)
    server.raw = raw
    yield server
    raw.stop()
    raw.close()
    server.stop()


def uri(zk, fmt: str = "bookkeeper") -> str:
    return (f"zk+hierarchical://{zk.hosts}/norecord{next(_roots)}"
            f"?metadata_format={fmt}&timeout_s=2")


def written(log, n: int = 3) -> list:
    """Closed ledgers of a few entries each."""
    out = []
    for _ in range(n):
        h = log.create_ledger()
        for e in range(5):
            h.append(b"entry-%d" % e)
        h.close()
        out.append(h.ledger_id)
    return out


def java_delete(zk, log, lid) -> None:
    """What a Java client's deleteLedger does to the metadata: the znode goes, no record."""
    zk.raw.delete(log.metadata.ledger_path(lid))


def index_files(log) -> int:
    return len(list_files(log.bookie.ledger_currents, log.bookie.journal_dir, ["index"]))


def cycle(log) -> dict:
    return log.bookie.gc.run_once()["ledgers"]


def until_deleted(log, lid, timeout_s: float = 30.0) -> dict:
    """GC cycles until ``lid`` is gone; the report of the cycle that deleted it."""
    got = {}

    def deleted():
        got.update(cycle(log))
        return not log.bookie.has_ledger(lid)

    wait_until(deleted, timeout_s, f"{lid} deleted by GC")
    return got


def cycles_past_the_wait(log, since: float) -> dict:
    """GC cycles until one runs a full wait after ``since``; that cycle's report."""
    wait_until(lambda: time.monotonic() - since >= WAIT_MS / 1000 + 0.05, 10, "the wait to pass")
    return cycle(log)


def test_the_high_water_mark_follows_bookkeepers_id_generator(zk):
    assert idgen.next_sequence(0, 0) == 0 and idgen.next_sequence(5, 1) == 3
    assert idgen.next_sequence(-2, 0) == (1 << 31) - 1          # cversion shown past 2^31
    assert idgen.high_water_mark(None, False, None) == 0
    assert idgen.high_water_mark((7, 1), True, (2, 3, 1)) == (2 << 32) + 2
    with open_metadata_store(uri(zk)) as store:
        assert store.ledger_id_high_water_mark() == 0          # no id handed out yet
        ids = [store.generate_ledger_id().ledger_id for _ in range(4)]
        assert store.ledger_id_high_water_mark() == ids[-1] + 1
        # past 31 bits: HOB directories under idgen-long (LongZkLedgerIdGenerator)
        zk.raw.ensure_path(f"{store.root}/idgen-long/HOB-0000000003")
        zk.raw.ensure_path(f"{store.root}/idgen-long/HOB-0000000002")
        big = store.generate_ledger_id().ledger_id
        assert big >> 32 == 3 and store.ledger_id_high_water_mark() == big + 1
        assert ids[-1] < store.ledger_id_high_water_mark()


def test_two_absent_reads_a_wait_apart_free_the_ledger(zk, tmp_path, caplog):
    """The Java client's deletion on a BookKeeper root: kept on the first cycle, deleted on
    the first cycle a wait later; index file gone, journalled (a restart keeps it deleted),
    reported. The same deletion on an embedlog root is only ever missing."""
    caplog.set_level(logging.WARNING, logger="embedlog.bookie.gc")
    bk_uri = uri(zk)
    with embedlog.open(tmp_path / "bk", metadata_uri=bk_uri, **CONFIG) as log, \
            embedlog.open(tmp_path / "own", metadata_uri=uri(zk, "embedlog"), **CONFIG) as own:
        assert log.metadata.metadata_format == "bookkeeper" and own.metadata.metadata_format == "embedlog"
        gone, kept, *_ = written(log)
        own_gone = written(own, 1)[0]
        java_delete(zk, log, gone)
        java_delete(zk, own, own_gone)
        log.bookie.checkpoint()                     # every index file on disk
        files = index_files(log)
        first = time.monotonic()
        assert cycle(log) == {"candidates": 1, "deleted": 0, "missing": 1, "aborted": None,
                              "deleted_without_record": 0}
        assert log.bookie.gc.stats["absent_ledgers"] == 1
        assert [lid for lid, _ in log.bookie.gc.missing_ledgers()] == [gone]
        report = until_deleted(log, gone)
        assert time.monotonic() - first >= WAIT_MS / 1000
        assert report == {"candidates": 1, "deleted": 1, "missing": 0, "aborted": None,
                          "deleted_without_record": 1}
        assert log.bookie.has_ledger(kept) and log.open_ledger(kept).read_batch(0, 4)[4] == b"entry-4"
        assert index_files(log) == files - 1
        assert log.bookie.gc.missing_ledgers() == []
        st = log.statistics()["gc"]
        assert (st["ledgers_deleted_without_record"], st["absent_ledgers"]) == (1, 0)
        said = [r.getMessage() for r in caplog.records if "without a deletion record" in r.getMessage()]
        assert len(said) == 1 and repr(gone) in said[0], said
        # embedlog's own format: no deletion record, no deletion, however long
        assert cycle(own)["missing"] == 1
        assert cycles_past_the_wait(own, first)["deleted"] == 0 and own.bookie.has_ledger(own_gone)
        assert own.bookie.gc.absence is None
    with embedlog.open(tmp_path / "bk", metadata_uri=bk_uri, **CONFIG) as log:
        assert not log.bookie.has_ledger(gone) and log.bookie.was_deleted(gone)
        assert log.bookie.has_ledger(kept)


def test_absent_once_is_kept(zk, tmp_path):
    """The default wait (an hour): two cycles in a row find the znode absent, and keep it."""
    cfg = dict(CONFIG)
    del cfg["gc_missing_ledger_wait_time_ms"]
    with embedlog.open(tmp_path, metadata_uri=uri(zk), **cfg) as log:
        assert log.bookie.config.gc_missing_ledger_wait_time_ms == 3_600_000
        lid = written(log, 1)[0]
        java_delete(zk, log, lid)
        for _ in range(3):
            assert cycle(log)["missing"] == 1
        assert log.bookie.has_ledger(lid)


def metadata_of(log, lid) -> LedgerMetadata:
    return LedgerMetadata(lid, 1, 1, 1, fragments=((0, (log.bookie.bookie_id,)),))


def ledger_with_id(log, lid) -> None:
    """A ledger made with a chosen id (BookKeeper's createLedgerAdv(id)), one entry on this
    bookie."""
    b = log.bookie
    log.metadata.create_ledger_metadata(metadata_of(log, lid))
    b.add_entry(F.encode_entry(0, lid.ledger_id, 0, -1, 1, "crc32c", b"a"), F.master_key(b""))


def test_a_ledger_being_created_is_kept(zk, tmp_path):
    """A bookie takes a ledger's first entry only once it has read its znode, so it never
    holds one whose znode it has not seen; an absence seen before the znode is found again
    is forgotten, and a later deletion waits the whole wait from its own first read."""
    with embedlog.open(tmp_path, metadata_uri=uri(zk), **CONFIG) as log:
        b = log.bookie
        lid = log.metadata.generate_ledger_id()
        with pytest.raises(NoSuchLedgerError):      # no znode yet: refused
            b.add_entry(F.encode_entry(0, lid.ledger_id, 0, -1, 1, "crc32c", b"a"), F.master_key(b""))
        ledger_with_id(log, lid)
        java_delete(zk, log, lid)
        assert cycle(log)["missing"] == 1 and list(b.gc.absence.first_absent) == [(0, lid.ledger_id)]
        log.metadata.create_ledger_metadata(metadata_of(log, lid))      # found again
        report = cycle(log)
        assert report["missing"] == 0 and b.gc.absence.first_absent == {} and b.has_ledger(lid)
        java_delete(zk, log, lid)
        again = time.monotonic()
        assert cycle(log)["deleted"] == 0 and b.has_ledger(lid)
        until_deleted(log, lid)
        assert time.monotonic() - again >= WAIT_MS / 1000


def test_another_instance_id_or_an_id_above_the_mark_is_kept(zk, tmp_path):
    """The root formatted again (another INSTANCEID) confirms nothing, and forgets what was
    seen; an id the generator never handed out (as after a restore of an older ZooKeeper)
    stays missing; the mark going back confirms nothing either."""
    with embedlog.open(tmp_path, metadata_uri=uri(zk), **CONFIG) as log:
        b, store = log.bookie, log.metadata
        lid = written(log, 1)[0]
        above = LedgerId(0, store.ledger_id_high_water_mark() + 1000)
        ledger_with_id(log, above)
        java_delete(zk, log, lid)
        java_delete(zk, log, above)
        first = time.monotonic()
        assert cycle(log)["missing"] == 2
        assert list(b.gc.absence.first_absent) == [(0, lid.ledger_id)]      # not the one above
        mine = store.read_instance_id()
        assert mine == b.cookie.instance_id
        zk.raw.set(f"{store.root}/INSTANCEID", str(uuid.uuid4()).encode())
        report = cycles_past_the_wait(log, first)
        assert (report["deleted"], report["missing"]) == (0, 2) and b.gc.absence.first_absent == {}
        zk.raw.set(f"{store.root}/INSTANCEID", mine.encode())
        # the generator's znode made again (a root rebuilt by hand): the mark went back
        zk.raw.delete(f"{store.root}/idgen", recursive=True)
        zk.raw.ensure_path(f"{store.root}/idgen")
        again = time.monotonic()
        assert cycle(log)["deleted"] == 0
        assert cycles_past_the_wait(log, again)["deleted"] == 0 and b.has_ledger(lid)
        assert b.has_ledger(above)


def test_a_zookeeper_error_or_a_lost_session_is_never_absence(zk, tmp_path):
    """The session lost between the direct reads and the check (a real expiry), then
    ZooKeeper unresponsive (SIGSTOP) for a whole cycle: both cycles abort, the ledger stays."""
    from kazoo.client import KazooClient
    with embedlog.open(tmp_path, metadata_uri=uri(zk), **CONFIG) as log:
        b, store = log.bookie, log.metadata
        lid = written(log, 1)[0]
        java_delete(zk, log, lid)
        first = time.monotonic()
        assert cycle(log)["missing"] == 1

        def expire_session():
            sid, pwd = store._zk.client_id          # the test's way in: ZooKeeper's own
            twin = KazooClient(hosts=zk.hosts, client_id=(sid, pwd))
            twin.start(timeout=10)
            twin.stop()                             # closing the twin ends the session
            twin.close()

            def gone():
                try:
                    store.check_session(sid)
                    return False
                except MetadataError:
                    return True
            wait_until(gone, 20, "the bookie's session to end")

        wait_until(lambda: time.monotonic() - first >= WAIT_MS / 1000 + 0.05, 10, "the wait")
        failpoints.arm("gc.before_absence_check", expire_session)
        try:
            report = cycle(log)
        finally:
            failpoints.disarm("gc.before_absence_check")
        assert "session" in report["aborted"] and b.has_ledger(lid), report

        def reconnected():
            try:
                return store.sync_reads()
            except MetadataError:
                return False
        wait_until(reconnected, 20, "a new session")
        suspend(zk.pid)           # returns once every thread is stopped
        try:
            # the premise: the server this store talks to is the one stopped (a cycle that
            # read a live server could rightly confirm the deletion)
            assert not zk._ruok(), f"{zk.hosts} still answers with {zk.pid} stopped"
            report = cycle(log)
        finally:
            os.kill(zk.pid, signal.SIGCONT)
        assert report["aborted"] and b.has_ledger(lid), report
        assert b.gc.stats["ledgers_deleted_without_record"] == 0


def test_the_wait_is_checked():
    from embedlog.bookie.gc import check_config
    from embedlog.config import BookieConfig
    from embedlog.errors import ConfigError
    for ok in (0, 1000, 86_400_000):
        check_config(BookieConfig.from_dict({"gc_missing_ledger_wait_time_ms": ok}))
    for bad in (1, 999):
        with pytest.raises(ConfigError, match="gc_missing_ledger_wait_time_ms"):
            check_config(BookieConfig.from_dict({"gc_missing_ledger_wait_time_ms": bad}))
    for bad in (-1, 31 * 86_400_000):
        with pytest.raises(ConfigError, match="gc_missing_ledger_wait_time_ms"):
            BookieConfig.from_dict({"gc_missing_ledger_wait_time_ms": bad}).validate()
