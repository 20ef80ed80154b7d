"""Garbage collection of deleted ledgers and entry-log compaction, in one process.

GC compares the bookie's ledgers with the metadata store's, partition by partition, and
deletes only what it can prove dead; compaction rewrites the live entries of mostly-dead
entry logs. Every test checks that each live entry still reads back with its bytes."""
import os

import pytest

import embedlog
from embedlog import LedgerId
from embedlog.errors import MetadataError, NoSuchLedgerError
from embedlog.meta.api import LedgerManager

from support.crash_child import payload

GC_CONFIG = dict(skip_list_size_limit=128 << 10, entry_log_size_limit=512 << 10,
                 journal_max_size_mb=1, journal_pre_alloc_size_mb=1, flush_interval_ms=100,
                 gc_wait_time_ms=0, compaction_rate_by_entries=1_000_000,
                 storage_layout=1)      # entry logs and their compaction (layout 2: test_layout2)


def log_bytes(log) -> int:
    """Bytes the entry logs take on disk."""
    total = 0
    for current in log.bookie.ledger_currents:
        for n in os.listdir(current):
            if n.endswith(".log") or ".log." in n:
                total += os.stat(os.path.join(current, n)).st_blocks * 512
    return total


def fill(log, n_ledgers=12, entries=300, scopes=(0, 0, 99)):
    """Ledgers interleaved entry by entry (so each entry log holds many of them)."""
    handles = [log.create_ledger(scope_id=scopes[i % len(scopes)]) for i in range(n_ledgers)]
    for e in range(entries):
        for h in handles:
            assert h.append(payload(h.ledger_id.qualified_name, e)) == e
    for h in handles:
        h.close()
    log.bookie.checkpoint()
    return [h.ledger_id for h in handles]


def check_live(log, ledgers, entries):
    for lid in ledgers:
        got = log.open_ledger(lid).read_batch(0, entries - 1)
        assert got == [payload(lid.qualified_name, e) for e in range(entries)], lid


def test_gc_collects_deleted_ledgers_of_every_scope_and_gives_space_back(tmp_path):
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        ledgers = fill(log)
        before = log_bytes(log)
        dead, live = ledgers[:9], ledgers[9:]
        assert any(l.scope_id for l in dead) and any(l.scope_id for l in live)
        for lid in dead:           # gone from the metadata store only: GC must find them
            log.metadata.ledger_manager.remove_ledger_metadata(lid)
        report = log.bookie.gc.run_once(force_major=True)
        assert report["ledgers"] == {"candidates": 9, "deleted": 9, "missing": 0, "aborted": None}
        assert not any(log.bookie.has_ledger(l) for l in dead)
        assert all(log.bookie.has_ledger(l) for l in live)
        assert report["compaction"]["kind"] == "major" and report["compaction"]["freed_bytes"] > 0
        after = log_bytes(log)
        live_bytes = sum(len(payload(l.qualified_name, e)) for l in live for e in range(300))
        assert after < before / 2, (before, after)
        assert after <= 2 * live_bytes + 2 * GC_CONFIG["entry_log_size_limit"], (after, live_bytes)
        check_live(log, live, 300)
        st = log.statistics()["gc"]
        assert st["compacted_logs"] >= 1 and st["reclaimed_bytes"] > 0
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        check_live(log, live, 300)
        from embedlog.cli.shell import Layout, check_ledger
        layout = Layout(str(tmp_path), log.bookie.ledger_dirs, log.bookie.journal_dir, None)
        for lid in live:
            r = check_ledger(layout, (lid.scope_id, lid.ledger_id), {})
            assert r["errors"] == [] and r["good"] == 300


def test_logs_holding_only_dead_ledgers_are_deleted_without_compaction(tmp_path):
    cfg = dict(GC_CONFIG, minor_compaction_threshold=0.0, major_compaction_threshold=0.0)
    with embedlog.open(tmp_path, **cfg) as log:
        first = fill(log, n_ledgers=4, entries=200)
        second = fill(log, n_ledgers=4, entries=200)
        logs_before = set(log.bookie.storage.entry_logger.log_ids())
        for lid in first:
            log.delete_ledger(lid)
        report = log.bookie.gc.run_once()
        assert report["compaction"] == {"kind": None}
        assert report["entry_logs"]["deleted"], "logs with only the first ledgers were not deleted"
        assert set(report["entry_logs"]["deleted"]) <= logs_before
        check_live(log, second, 200)


class Listing(LedgerManager):
    """A ledger manager over a real one whose listing is split into small partitions and
    can fail, omit ids or come out of order."""

    def __init__(self, real, size=3, fail_after=None, omit=(), reverse=False):
        self.real, self.size, self.fail_after, self.omit, self.reverse = real, size, fail_after, set(omit), reverse
        self.partitions_listed = 0

    def ledger_partitions(self, scope_id=None):
        ids = [i for i in self.real.iterate_ledgers(scope_id) if i not in self.omit]
        parts = [ids[i:i + self.size] for i in range(0, len(ids), self.size)]
        if self.reverse:
            parts.reverse()
        for n, part in enumerate(parts):
            if self.fail_after is not None and n >= self.fail_after:
                raise MetadataError("connection lost in the middle of the listing")
            self.partitions_listed += 1
            yield n, part

    def iterate_ledgers(self, scope_id=0):
        for _k, ids in self.ledger_partitions(scope_id):
            yield from ids

    def read_ledger_metadata(self, ledger_id):
        return self.real.read_ledger_metadata(ledger_id)

    def ledger_deletion(self, ledger_id):
        return self.real.ledger_deletion(ledger_id)

    def purge_deletions(self, before_ms):
        return self.real.purge_deletions(before_ms)

    create_ledger_metadata = write_ledger_metadata = remove_ledger_metadata = None


class Store:
    def __init__(self, ledger_manager):
        self.ledger_manager = ledger_manager


@pytest.mark.parametrize("case", ["error_mid_listing", "created_during_scan", "out_of_order"])
def test_gc_deletes_nothing_it_cannot_prove_dead(tmp_path, case):
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        ledgers = fill(log, n_ledgers=12, entries=5)
        for lid in ledgers[3:6]:
            log.metadata.ledger_manager.remove_ledger_metadata(lid)
        real = log.metadata.ledger_manager
        listing = {"error_mid_listing": Listing(real, fail_after=2),
                   # a listing that misses a ledger which does exist: created meanwhile
                   "created_during_scan": Listing(real, omit=[ledgers[10]]),
                   "out_of_order": Listing(real, reverse=True)}[case]
        gc = log.bookie.gc
        gc.metadata = Store(listing)
        report = gc.run_once()
        assert report["ledgers"]["deleted"] == 0 and report["ledgers"]["aborted"], report
        assert all(log.bookie.has_ledger(l) for l in ledgers)
        assert gc.stats["aborted_scans"] == 1
        # the same store listed whole and in order: the three dead ledgers go, nothing else
        gc.metadata = Store(Listing(real))
        report = gc.run_once()
        assert report["ledgers"] == {"candidates": 3, "deleted": 3, "missing": 0, "aborted": None}
        assert [log.bookie.has_ledger(l) for l in ledgers] == [i not in (3, 4, 5) for i in range(12)]
        check_live(log, ledgers[:3] + ledgers[6:], 5)


def test_partitions_cover_ledgers_between_and_after_them(tmp_path):
    """Candidates below the first partition, between partitions and above the last."""
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        ledgers = fill(log, n_ledgers=15, entries=3, scopes=(0, 5))
        keep = {1, 4, 5, 9, 13}
        for i, lid in enumerate(ledgers):
            if i not in keep:
                log.metadata.ledger_manager.remove_ledger_metadata(lid)
        listing = Listing(log.metadata.ledger_manager, size=2)
        log.bookie.gc.metadata = Store(listing)
        report = log.bookie.gc.run_once()
        assert listing.partitions_listed == 3
        assert report["ledgers"]["deleted"] == 10
        assert sorted(log.bookie.list_ledgers(), key=lambda l: (l.scope_id, l.ledger_id)) == \
            sorted((ledgers[i] for i in keep), key=lambda l: (l.scope_id, l.ledger_id))


def test_a_ledger_recreated_since_the_snapshot_is_kept(tmp_path):
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        lid = fill(log, n_ledgers=1, entries=2)[0]
        key = (lid.scope_id, lid.ledger_id)
        stale = log.bookie.ledgers[key]
        log.delete_ledger(lid)
        w = log.create_ledger()                 # a new ledger object; the old index is gone
        w.append(b"x")
        assert log.bookie.delete_ledgers_if([(key, stale)]) == 0
        fresh = (w.ledger_id.scope_id, w.ledger_id.ledger_id)
        assert log.bookie.delete_ledgers_if([(fresh, stale)]) == 0
        assert log.bookie.has_ledger(w.ledger_id)


def test_without_a_metadata_store_gc_deletes_no_ledger(tmp_path):
    from embedlog.bookie import Bookie
    from embedlog.config import BookieConfig
    b = Bookie(str(tmp_path / "b"), BookieConfig.from_dict(GC_CONFIG))
    try:
        b.add_entry(embedlog._native.format.encode_entry(0, 7, 0, -1, 1, "crc32c", b"a"), b"k" * 20)
        assert b.gc.run_once()["ledgers"]["aborted"] == "no metadata store"
        assert b.has_ledger(7)
    finally:
        b.close()


def test_truncated_entries_are_reclaimed_and_never_come_back(tmp_path):
    """Entries erased from a live ledger (stream truncation/retention) make its logs'
    bytes dead: GC recounts them against the index, compaction drops them, and a
    compaction never resurrects an erased entry."""
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        ledgers = fill(log, n_ledgers=3, entries=400)
        st = log.bookie.storage
        key = (ledgers[0].scope_id, ledgers[0].ledger_id)
        with log.bookie.cv:
            st.erase(key, 0, 349)                # as retention does: entries 0..349 gone
        assert key in st.erased
        for lid in ledgers[1:]:
            log.delete_ledger(lid)
        before = log_bytes(log)
        report = log.bookie.gc.run_once(force_major=True)
        assert log.bookie.gc.stats["recounts"] >= 1
        # logs with only erased or deleted entries go whole; the rest are compacted
        assert report["entry_logs"]["deleted"] and log_bytes(log) < before / 2
        r = log.bookie.reader(ledgers[0], 3, None, 399)
        assert r.read_batch(350, 399) == [payload(ledgers[0].qualified_name, e) for e in range(350, 400)]
        for e in (0, 100, 349):
            with pytest.raises(embedlog.errors.NoSuchEntryError):
                r.read_entry(e)
        live = 50 * len(payload(ledgers[0].qualified_name, 0)) * 2
        assert log_bytes(log) <= live + 2 * GC_CONFIG["entry_log_size_limit"]


def test_background_gc_thread_collects(tmp_path):
    cfg = dict(GC_CONFIG, gc_wait_time_ms=50, minor_compaction_interval_s=0,
               major_compaction_interval_s=0)
    with embedlog.open(tmp_path, **cfg) as log:
        ledgers = fill(log, n_ledgers=4, entries=3)
        log.metadata.ledger_manager.remove_ledger_metadata(ledgers[0])
        gc = log.bookie.gc
        cycles = gc.stats["cycles"]
        import time
        deadline = time.monotonic() + 20
        # a cycle may delete the ledger before it counts itself: wait for both
        while log.bookie.has_ledger(ledgers[0]) or gc.stats["cycles"] <= cycles:
            assert time.monotonic() < deadline, gc.stats
            gc.trigger()
            time.sleep(0.05)
        with pytest.raises(NoSuchLedgerError):
            log.bookie.read_last_entry_id(ledgers[0])


def test_gc_config_rules():
    from embedlog.bookie.gc import check_config
    from embedlog.config import BookieConfig
    from embedlog.errors import ConfigError
    check_config(BookieConfig())
    for bad in (dict(minor_compaction_threshold=0.9, major_compaction_threshold=0.8),
                dict(minor_compaction_interval_s=100_000),
                dict(gc_wait_time_ms=7_200_000),
                dict(disk_usage_lwm_threshold=0.99)):
        with pytest.raises(ConfigError):
            check_config(BookieConfig.from_dict(bad))


def test_gc_against_zookeeper_hierarchical_and_flat(tmp_path):
    """The scan against a real ZooKeeper: ids spread over several (level1, level2)
    partitions (and the long tree), scope != 0 ledgers in the scoped tree."""
    from support import servers
    from embedlog.meta.api import DigestType, LedgerMetadata
    try:
        zk = servers.ZooKeeperServer()
    except servers.ServerMissing as exc:
        servers.skip_unless_ci(str(exc))
    try:
        for n, layout in enumerate(("hierarchical", "flat")):
            uri = f"zk+{layout}://{zk.hosts}/gc{n}"
            with embedlog.open(tmp_path / layout, metadata_uri=uri, **GC_CONFIG) as log:
                lm = log.metadata.ledger_manager
                ids = [LedgerId(0, i) for i in (3, 10_007, 10_008, 250_001, 7_000_000_123, 2**40 + 5)]
                ids += [LedgerId(42, 1), LedgerId(42, 2**50)]
                if layout == "flat":
                    ids = [i for i in ids if i.scope_id == 0 and i.ledger_id < 10**10]
                b = log.bookie
                for lid in ids:
                    lm.create_ledger_metadata(LedgerMetadata(
                        ledger_id=lid, ensemble_size=1, write_quorum=1, ack_quorum=1,
                        digest_type=DigestType.CRC32C, fragments=((0, (b.bookie_id,)),)))
                    b.add_entry(embedlog._native.format.encode_entry(
                        lid.scope_id, lid.ledger_id, 0, -1, 1, "crc32c", b"a"),
                        embedlog._native.format.master_key(b""))
                dead = ids[1::2]
                for lid in dead:
                    lm.remove_ledger_metadata(lid)
                report = b.gc.run_once()
                assert report["ledgers"] == {"candidates": len(dead), "deleted": len(dead),
                                             "missing": 0, "aborted": None}, layout
                assert [b.has_ledger(l) for l in ids] == [l not in dead for l in ids], layout
    finally:
        zk.stop()


def _a_third_left(log) -> list:
    """Ten ledgers of 300 entries interleaved, all but every third deleted: the live ones."""
    ledgers = fill(log, n_ledgers=10, entries=300)
    live = ledgers[::3]
    for lid in ledgers:
        if lid not in live:
            log.delete_ledger(lid)
    return live


def test_reads_go_on_while_compaction_moves_entries(tmp_path):
    """Readers (lock-free, with index pages evicted under them) never fail while
    compaction moves entries and deletes their old logs."""
    import threading
    cfg = dict(GC_CONFIG, page_limit=16)
    with embedlog.open(tmp_path, **cfg) as log:
        live = _a_third_left(log)
        handles = {lid: log.open_ledger(lid) for lid in live}
        stop = threading.Event()
        errors, reads = [], [0]

        def reader():
            while not stop.is_set():
                for lid, h in handles.items():
                    try:
                        for e in (0, 150, 299):
                            assert h.read_entry(e) == payload(lid.qualified_name, e)
                        assert h.read_batch(100, 120)[0] == payload(lid.qualified_name, 100)
                    except BaseException as exc:
                        errors.append(exc)
                        return
                    reads[0] += 1

        threads = [threading.Thread(target=reader) for _ in range(2)]
        [t.start() for t in threads]
        try:
            report = log.bookie.gc.run_once(force_major=True)
        finally:
            stop.set()
            [t.join() for t in threads]
        assert not errors, errors[0]
        assert report["compaction"]["freed_bytes"] > 0 or report["entry_logs"]["deleted"]
        assert reads[0] > 0
        check_live(log, live, 300)


def test_a_compaction_failing_past_its_commit_point_is_finished_by_the_next_cycle(tmp_path):
    """A compaction whose steps after its manifest fail in the running process (an I/O
    error) is rolled forward by GC's next cycle before any log is collected: its target,
    even once it holds only deleted ledgers' entries, is never taken while the manifest
    names it (a restart would find the manifest and no target), and the bookie opens."""
    import errno
    from embedlog import failpoints

    def fail():
        failpoints.disarm("compaction.after_index_flush")
        raise OSError(errno.EIO, "injected I/O error")
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        live = _a_third_left(log)
        failpoints.arm("compaction.after_index_flush", fail)
        try:
            with pytest.raises(OSError, match="injected"):
                log.bookie.gc.run_once(force_major=True)
        finally:
            failpoints.disarm()
        current = log.bookie.ledger_currents[0]
        manifests = lambda: [n for n in os.listdir(current) if n.endswith(".compaction")]
        assert manifests()
        check_live(log, live, 300)
        for lid in live:
            log.delete_ledger(lid)
        report = log.bookie.gc.run_once()
        assert report["rolled_forward"] and not manifests()
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        assert log.bookie.compaction_report["rolled_forward"] == []


def _backup(src, dst):
    """A consistent copy of a live SQLite metadata store, as an operator's backup."""
    import sqlite3
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        a.backup(b)
        b.execute("PRAGMA journal_mode=DELETE")      # one self-contained file
    finally:
        a.close()
        b.close()


def _restore(backup, db):
    import shutil
    for suffix in ("-wal", "-shm"):
        if os.path.exists(str(db) + suffix):
            os.unlink(str(db) + suffix)
    shutil.copyfile(backup, db)


def test_gc_never_deletes_a_ledger_that_is_merely_missing(tmp_path):
    """A restored older metadata backup (same instance, so the cookie passes) lacks the
    rows of newer ledgers, with no deletion records: GC keeps their data and reports them;
    once the newer metadata is back, every entry reads; an operator's confirmation deletes."""
    path, db = tmp_path / "d", tmp_path / "d" / "meta.db"
    with embedlog.open(path, **GC_CONFIG) as log:
        fill(log, n_ledgers=2, entries=20)
        _backup(db, tmp_path / "old.db")
        newer = fill(log, n_ledgers=3, entries=20)
        gone = fill(log, n_ledgers=1, entries=20)
        log.delete_ledger(gone[0])
    _backup(db, tmp_path / "new.db")
    _restore(tmp_path / "old.db", db)
    with embedlog.open(path, **GC_CONFIG) as log:
        report = log.bookie.gc.run_once()["ledgers"]
        assert (report["deleted"], report["missing"]) == (0, 3), report
        assert all(log.bookie.has_ledger(lid) for lid in newer)
        assert [lid for lid, _ms in log.bookie.gc.missing_ledgers()] == sorted(newer)
        assert log.bookie.statistics()["gc"]["missing_ledgers"] == 3
    _restore(tmp_path / "new.db", db)
    with embedlog.open(path, **GC_CONFIG) as log:
        assert log.bookie.gc.run_once()["ledgers"]["missing"] == 0
        check_live(log, newer, 20)
    _restore(tmp_path / "old.db", db)
    with embedlog.open(path, **GC_CONFIG) as log:
        log.bookie.gc.run_once()
        assert log.bookie.gc.delete_missing([newer[0]]) == 1       # an operator confirms one
        assert not log.bookie.has_ledger(newer[0]) and log.bookie.has_ledger(newer[1])
        assert log.bookie.gc.delete_missing() == 2
        assert log.bookie.gc.missing_ledgers() == []


def test_gc_deletes_what_the_store_recorded_as_deleted(tmp_path):
    with embedlog.open(tmp_path, **GC_CONFIG) as log:
        ledgers = fill(log, n_ledgers=4, entries=10)
        lm = log.metadata.ledger_manager
        lm.remove_ledger_metadata(ledgers[0])              # a deletion record
        import sqlite3
        with sqlite3.connect(log.metadata.path) as c:      # a row lost, no record
            c.execute("DELETE FROM ledgers WHERE name=?", (ledgers[1].qualified_name,))
        report = log.bookie.gc.run_once()["ledgers"]
        assert (report["deleted"], report["missing"]) == (1, 1), report
        assert [log.bookie.has_ledger(l) for l in ledgers] == [False, True, True, True]
