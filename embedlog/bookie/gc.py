"""Garbage collection: ledgers deleted from the metadata store, dead entry logs, compaction.

Each cycle (every ``gc_wait_time_ms``, or ``run_once()``), as BookKeeper's
GarbageCollectorThread:

1. **Ledgers** (ScanAndCompareGarbageCollector, seed 003): snapshot the ledgers the
   bookie holds (a sorted map of (scope, ledger) -> index), then walk the metadata store
   one partition at a time (one (level1, level2) leaf on ZooKeeper's hierarchical
   layout; the whole listing on flat, SQLite and etcd) in ascending order. The bookie's
   ledgers between the previous partition's last id and this one's last id that the
   partition does not list are candidates; so are those above the last partition.
   GC deletes nothing it cannot prove dead:

   | case                                              | what happens                      |
   | ------------------------------------------------- | --------------------------------- |
   | a metadata error, or a listing that cannot finish | the cycle deletes nothing         |
   | (drivers raise MetadataError) or is out of order  |                                   |
   | a candidate's metadata reads back (created or     | the cycle deletes nothing         |
   | re-created during the scan)                       |                                   |
   | a candidate re-created on this bookie since the   | that ledger is kept               |
   | snapshot (another index object)                   |                                   |
   | a candidate with no deletion record (missing: a   | kept, and reported (stats         |
   | lost metadata row, a restored older backup, a     | ``missing_ledgers``, the log, the |
   | wrong ZooKeeper root)                             | metric, `bookie missing`, the     |
   |                                                   | shell and the admin API)          |
   | a candidate whose deletion record the store keeps | deleted, journalled (DELETE_LEDGER)|
   | any sign the store went back (an older backup     | the cycle deletes nothing, and    |
   | restored): bookie/rollback.py                     | no later one until an operator    |
   |                                                   | resumes                           |

   Deletion is positive (docs/METADATA.md): a ledger's data goes only when the metadata
   store says that ledger was deleted (``LedgerManager.ledger_deleted_at``), or when an
   operator confirms a missing ledger (``delete_missing``), or, on a ZooKeeper root in
   BookKeeper's format, where Java clients delete ledgers without a record, when the
   absence of its znode is confirmed (embedlog/bookie/absence.py: two direct reads at
   least ``gc_missing_ledger_wait_time_ms`` apart, after a sync, INSTANCEID and the id
   generator's high-water mark checked). Every candidate is confirmed
   by point reads (at ``gc_metadata_op_rate_limit`` per second) after the whole listing
   succeeded; deletions start only then. Deletion records older than
   ``deleted_ledger_retention_ms`` are purged from the store (at most hourly).
2. **Entry logs**: each sealed log's ledgers map (read once, kept in memory) against the
   ledgers still held; a log holding none of them is deleted. Layout 2's journal segments
   (``<id>.seg``, below the LastLogMark): one no index location names is deleted.
3. **Compaction** (embedlog/bookie/compaction.py): major when due and no disk is in
   warning, else minor when due and no disk is full (unless
   ``is_force_gc_allow_when_no_space``). A segment is a candidate as a sealed entry log
   is: its usage from its ``.seg.map`` (bytes per ledger) against the ledgers held; its
   live entries go into a compaction target entry log and the segment is deleted.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from sortedcontainers import SortedDict

from embedlog._native import entrylog as nel
from embedlog._native.format import LedgerId
from embedlog import failpoints
from embedlog.bookie import journal_files
from embedlog.bookie.absence import AbsentLedgers
from embedlog.bookie.compaction import (SEGMENT_LOG, Compactor, EntryLogMeta, RateLimiter,
                                        is_segment, live_mask)
from embedlog.fileio import fsync_dir
from embedlog.bookie.rollback import DeletionHalt
from embedlog.errors import (ConfigError, CorruptedDataError, EmbedlogError, MetadataError,
                             NoSuchLedgerError, TimeoutError)

log = logging.getLogger("embedlog.bookie.gc")

_DELETE_CHUNK = 64           # ledgers deleted per hold of the bookie's lock
_PURGE_INTERVAL_S = 3600.0   # deletion records past their retention are purged this often
_MIN_MISSING_WAIT_MS = 1000  # the two reads confirming a deletion without a record: this apart


def check_config(cfg) -> None:
    """BookKeeper's start-up rules for the GC keys."""
    if 0 < cfg.minor_compaction_threshold and 0 < cfg.major_compaction_threshold and \
            cfg.minor_compaction_threshold > cfg.major_compaction_threshold:
        raise ConfigError("minor_compaction_threshold must not exceed major_compaction_threshold")
    if cfg.minor_compaction_interval_s and cfg.major_compaction_interval_s and \
            cfg.minor_compaction_interval_s > cfg.major_compaction_interval_s:
        raise ConfigError("minor_compaction_interval_s must not exceed major_compaction_interval_s")
    wait_s = cfg.gc_wait_time_ms / 1000.0
    for key in ("minor_compaction_interval_s", "major_compaction_interval_s"):
        value = getattr(cfg, key)
        if value and wait_s and value < wait_s:
            raise ConfigError(f"{key}={value} is shorter than gc_wait_time_ms={cfg.gc_wait_time_ms}: "
                              "compaction runs within GC cycles")
    if cfg.disk_usage_warn_threshold > cfg.disk_usage_threshold:
        raise ConfigError("disk_usage_warn_threshold must not exceed disk_usage_threshold")
    if cfg.disk_usage_lwm_threshold > cfg.disk_usage_threshold:
        raise ConfigError("disk_usage_lwm_threshold must not exceed disk_usage_threshold")
    if 0 < cfg.gc_missing_ledger_wait_time_ms < _MIN_MISSING_WAIT_MS:
        raise ConfigError(f"gc_missing_ledger_wait_time_ms={cfg.gc_missing_ledger_wait_time_ms} "
                          f"is under {_MIN_MISSING_WAIT_MS}: 0 turns deletion without a record "
                          f"off, else the two reads must be a second apart at least")


class GarbageCollector:
    def __init__(self, bookie, metadata=None, disks=None):
        self.bookie = bookie
        self.metadata = metadata
        self.config = bookie.config
        self.storage = bookie.storage
        self.disks = disks
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._cycle_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.log_meta: dict[int, EntryLogMeta] = {}
        self.segment_meta: dict[int, EntryLogMeta] = {}    # layout 2: by log id (bit 31 set)
        self._segment_of: dict[int, int] = {}              # .seg file id -> its log id
        self.stats = {
            "cycles": 0, "cycle_errors": 0, "aborted_scans": 0, "ledgers_deleted": 0,
            "entry_logs_deleted": 0, "entry_log_bytes_deleted": 0, "recounts": 0,
            "compactions": 0, "compacted_logs": 0, "compacted_entries": 0, "compacted_bytes": 0,
            "reclaimed_bytes": 0, "major_compactions": 0, "minor_compactions": 0,
            "compactions_skipped_for_disk": 0, "compaction_errors": 0,
        }
        self.last_scan: dict = {}
        self.missing: dict = {}            # (scope, lid) -> ms first seen missing, never deleted
        self.damaged_logs: set = set()     # entry logs that cannot be read: never collected
        self.absence = self._absence_rule(metadata)
        self.halt = DeletionHalt(bookie.ledger_currents[0])
        self.reissued: dict = {}           # key -> (held ctime, deleted ctime): another ledger's record
        self._accepted: set = set()        # keys an operator's resume took as rightly gone
        self.stats["deletion_halted"] = int(self.halt.halted)
        self._last_purge = float("-inf")    # the first GC pass purges, whatever the uptime
        self.compaction_enabled = True     # an operator's (or a benchmark's) switch
        now = time.monotonic()
        self.last_minor = now
        self.last_major = now
        self.compactor = Compactor(self.storage, bookie.ledgers, self.config, disks, self._stop,
                                   self.stats, self._retire_segment)

    def _absence_rule(self, metadata) -> AbsentLedgers | None:
        """Deletion without a record: on a root in BookKeeper's format only."""
        if getattr(metadata, "metadata_format", None) != "bookkeeper" or \
                self.config.gc_missing_ledger_wait_time_ms <= 0:
            return None
        self.stats.update(ledgers_deleted_without_record=0, absent_ledgers=0)
        cookie = getattr(self.bookie, "cookie", None)
        return AbsentLedgers(self.config.gc_missing_ledger_wait_time_ms,
                             getattr(cookie, "instance_id", None))

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._look_at_start()
        if self.config.gc_wait_time_ms <= 0:
            return
        t = threading.Thread(target=self._loop, name="embedlog-gc", daemon=True)
        t.start()
        self._thread = t                    # once started: stop() joins only a started thread

    def _loop(self) -> None:
        wait_s = self.config.gc_wait_time_ms / 1000.0
        while not self._stop.is_set():
            self._wake.wait(wait_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:
                self.stats["cycle_errors"] += 1
                log.exception("garbage collection cycle failed")

    def trigger(self) -> None:
        """Run a cycle in the GC thread now (BookKeeper's forceGC)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        # wait for a cycle run by another thread (run_once) to notice the stop
        with self._cycle_lock:
            pass

    # -- one cycle ---------------------------------------------------------------------------

    def run_once(self, force_major: bool = False, force_minor: bool = False) -> dict:
        """One GC cycle in the calling thread; returns what it did."""
        with self._cycle_lock:
            if self._stop.is_set():
                return {"stopped": True}
            report = {"ledgers": self.gc_ledgers()}
            if self.compactor.unfinished:
                report["rolled_forward"] = self.compactor.finish_pending()
            report["entry_logs"] = self.gc_entry_logs()
            if self.storage.segments:
                report["segments"] = self.gc_segments()
            report["compaction"] = self.maybe_compact(force_major, force_minor)
            self.stats["cycles"] += 1
            gone, logs = report["ledgers"].get("deleted", 0), report["entry_logs"].get("deleted", [])
            (log.info if gone or logs else log.debug)(
                "garbage collection: %d deleted ledgers' data dropped, %d entry logs deleted",
                gone, len(logs))
            return report

    # -- 1. ledgers ------------------------------------------------------------------------------

    def gc_ledgers(self) -> dict:
        report = {"candidates": 0, "deleted": 0, "missing": 0, "aborted": None}
        self.last_scan = report
        if self.metadata is None:
            report["aborted"] = "no metadata store"
            return report
        b = self.bookie
        with b.cv:
            # iterating a SortedDict is in key order, so this builds without sorting
            snapshot = SortedDict(b.ledgers.items())
        self._maybe_purge()
        if not snapshot:
            self._note_missing([])
            if self.absence is not None:
                self.absence.first_absent = {}
            return report
        try:
            candidates = self._scan(snapshot)
            report["candidates"] = len(candidates)
            session = self._metadata_call(self.absence.start, self.metadata.ledger_manager) \
                if self.absence is not None and candidates else None
            candidates, missing = self._confirm(snapshot, candidates)
            gone = self._without_record(session, missing) if self.absence is not None else []
        except _Abort as exc:
            report["aborted"] = str(exc)
            self.stats["aborted_scans"] += 1
            log.warning("garbage collection of ledgers skipped this cycle: %s", exc)
            return report
        try:
            halted = self._deletion_halted(missing)
        except _Abort as exc:
            report["aborted"] = str(exc)
            self.stats["aborted_scans"] += 1
            log.warning("garbage collection of ledgers skipped this cycle: %s", exc)
            return report
        if gone:
            missing = [k for k in missing if k not in set(gone)]
        self._note_missing(missing)
        report["missing"] = len(missing)
        if halted:
            report["deleted"] = 0
            report["halted"] = [r["reason"] for r in self.halt.reasons.values()]
            return report
        report["deleted"] = self._delete(snapshot, candidates)
        if self.absence is not None:
            n = self._delete(snapshot, gone)
            report["deleted"] += n
            report["deleted_without_record"] = n
            self.stats["ledgers_deleted_without_record"] += n
        return report

    def _deletion_halted(self, missing: list) -> bool:
        """Whether the store looks older than what this bookie has seen (bookie/rollback.py):
        then this cycle, and every one until an operator resumes, deletes nothing."""
        mark_of = getattr(self.metadata.ledger_manager, "ledger_id_high_water_mark", None)
        mark = None
        if mark_of is not None:
            try:
                mark = mark_of()
            except (MetadataError, TimeoutError) as exc:
                raise _Abort(f"metadata store error while reading the id generator's mark: "
                             f"{exc}") from exc
        foreign = {k: v for k, v in self.bookie.descriptors.foreign().items()
                   if k not in self._accepted}
        halted = self.halt.check(mark, missing, foreign, self.reissued)
        self.stats["deletion_halted"] = int(halted)
        return halted

    def _look_at_start(self) -> None:
        """The id generator's mark read once at start, before any cycle: a store restored
        while this bookie was down hands the lost ledgers' ids out again as soon as clients
        create ledgers, and the mark catches up with what it was."""
        if self.metadata is None:
            return
        try:
            with self._cycle_lock:
                self._deletion_halted([])
        except _Abort as exc:
            log.warning("the metadata store's id generator could not be read at start (%s); "
                        "the first GC cycle looks again", exc)

    def resume_deletion(self) -> dict:
        """An operator's confirmation that the metadata store is right: deletion goes on,
        with the id generator's mark now as the base. Returns the reasons lifted."""
        with self._cycle_lock:
            mark_of = getattr(self.metadata.ledger_manager, "ledger_id_high_water_mark", None)
            lifted = self.halt.resume(mark_of() if mark_of is not None else None)
            # the ledgers that showed the signs are taken as rightly gone: their ids' records
            # delete them, and they no longer halt deletion
            self._accepted |= set(self.reissued) | set(self.bookie.descriptors.foreign())
            self.reissued = {}
            self.stats["deletion_halted"] = 0
            return lifted

    def _without_record(self, session, missing: list) -> list:
        """The missing ledgers whose deletion the absence of their znode confirms."""
        if session is None:                   # no candidates, so nothing was read
            missing = []
        failpoints.hit("gc.before_absence_check")
        gone = self._metadata_call(self.absence.judge, self.metadata.ledger_manager, session,
                                   missing)
        self.stats["absent_ledgers"] = len(self.absence.first_absent)
        return gone

    @staticmethod
    def _metadata_call(fn, *args):
        try:
            return fn(*args)
        except (MetadataError, TimeoutError) as exc:
            raise _Abort(f"metadata store error while confirming deletions without a "
                         f"record: {exc}") from exc

    def _delete(self, snapshot, candidates: list) -> int:
        deleted = 0
        b = self.bookie
        for i in range(0, len(candidates), _DELETE_CHUNK):
            if self._stop.is_set():
                break
            chunk = [(k, snapshot[k]) for k in candidates[i:i + _DELETE_CHUNK]]
            failpoints.hit("gc.before_delete_ledger")
            n = b.delete_ledgers_if(chunk)
            failpoints.hit("gc.after_delete_ledger")
            deleted += n
            self.stats["ledgers_deleted"] += n
        return deleted

    def _note_missing(self, missing: list) -> None:
        """Ledgers this bookie holds that the store neither lists nor recorded as deleted."""
        now_ms = int(time.time() * 1000)
        new = [k for k in missing if k not in self.missing]
        self.missing = {k: self.missing.get(k, now_ms) for k in missing}
        self.stats["missing_ledgers"] = len(self.missing)
        if new:
            log.warning("%d ledger(s) held by this bookie are missing from the metadata store "
                        "with no deletion record; they are kept, not deleted (first: %s). Restore "
                        "the metadata, or confirm their deletion (`embedlog bookie missing --delete`)",
                        len(new), ", ".join(repr(LedgerId(*k)) for k in new[:5]))

    def missing_ledgers(self) -> list:
        """(LedgerId, ms since first seen missing) of each missing ledger, oldest first."""
        return [(LedgerId(*k), ms) for k, ms in sorted(self.missing.items(), key=lambda kv: kv[1])]

    def delete_missing(self, ledger_ids=None) -> int:
        """An operator's confirmation: delete ledgers GC found missing (all, or those named)
        that are still missing on a fresh point read. Returns how many were deleted."""
        with self._cycle_lock:
            wanted = set(self.missing) if ledger_ids is None else {
                (LedgerId.coerce(i).scope_id, LedgerId.coerce(i).ledger_id) for i in ledger_ids}
            keys = sorted(k for k in wanted if k in self.missing)
            lm = self.metadata.ledger_manager
            gone = []
            for key in keys:
                try:
                    lm.read_ledger_metadata(LedgerId(*key))
                except NoSuchLedgerError:
                    gone.append(key)
            with self.bookie.cv:
                snapshot = {k: self.bookie.ledgers[k] for k in gone if k in self.bookie.ledgers}
            n = self._delete(snapshot, sorted(snapshot))
            for k in gone:
                self.missing.pop(k, None)
            self.stats["missing_ledgers"] = len(self.missing)
            log.warning("deleted %d missing ledger(s) on an operator's confirmation", n)
            return n

    def _maybe_purge(self) -> None:
        if time.monotonic() - self._last_purge < _PURGE_INTERVAL_S:
            return
        self._last_purge = time.monotonic()
        horizon = int(time.time() * 1000) - self.config.deleted_ledger_retention_ms
        try:
            n = self.metadata.ledger_manager.purge_deletions(horizon)
            self.stats["deletion_records_purged"] = self.stats.get("deletion_records_purged", 0) + n
        except MetadataError as exc:
            log.info("purging old deletion records failed (next hour again): %s", exc)

    def _scan(self, snapshot: SortedDict) -> list:
        """Keys of the snapshot the metadata store does not list, partition by partition."""
        lm = self.metadata.ledger_manager
        candidates = []
        prev = None
        try:
            for _part, ids in lm.ledger_partitions(None):
                if self._stop.is_set():
                    raise _Abort("the bookie is closing")
                if not ids:
                    continue
                keys = sorted((i.scope_id, i.ledger_id) for i in ids)
                if prev is not None and keys[0] <= prev:
                    raise _Abort(f"the metadata store listed partitions out of order "
                                 f"({LedgerId(*keys[0])!r} after {LedgerId(*prev)!r})")
                hi = keys[-1]
                listed = set(keys)
                local = snapshot.irange(minimum=prev, maximum=hi, inclusive=(False, True)) \
                    if prev is not None else snapshot.irange(maximum=hi)
                candidates.extend(k for k in local if k not in listed)
                prev = hi
        except (MetadataError, TimeoutError) as exc:
            raise _Abort(f"metadata store error while listing ledgers: {exc}") from exc
        tail = snapshot.irange(minimum=prev, inclusive=(False, True)) if prev is not None \
            else iter(snapshot.keys())
        candidates.extend(tail)
        return candidates

    def _confirm(self, snapshot, candidates: list) -> tuple[list, list]:
        """(deleted, missing): every candidate must be absent on a point read too (one that
        reads back was created during the scan, and the cycle stops); of those, the ones
        with a deletion record were deleted, the others are merely missing. A record of
        another ledger of the id than the one held (its ctime) deletes nothing: it goes to
        ``self.reissued`` (a sign that the store went back: bookie/rollback.py)."""
        lm = self.metadata.ledger_manager
        limiter = RateLimiter(self.config.gc_metadata_op_rate_limit, self._stop)
        deleted, missing = [], []
        self.reissued = {}
        for key in candidates:
            if self._stop.is_set():
                raise _Abort("the bookie is closing")
            limiter.acquire(2)
            lid = LedgerId(*key)
            try:
                lm.read_ledger_metadata(lid)
            except NoSuchLedgerError:
                try:
                    record = lm.ledger_deletion(lid)
                except (MetadataError, TimeoutError) as exc:
                    raise _Abort(f"metadata store error while reading the deletion record of "
                                 f"{lid}: {exc}") from exc
                held = snapshot[key].incarnation
                if record is None:
                    missing.append(key)
                elif record.ctime_ms >= 0 and held >= 0 and record.ctime_ms != held \
                        and key not in self._accepted:
                    self.reissued[key] = (held, record.ctime_ms)
                else:
                    deleted.append(key)
                continue
            except (MetadataError, TimeoutError) as exc:
                raise _Abort(f"metadata store error while confirming {lid}: {exc}") from exc
            if self.absence is not None:
                self.absence.forget(key)
            raise _Abort(f"ledger {lid} exists in the metadata store though the "
                         f"listing missed it (created during the scan)")
        return deleted, missing

    # -- 2. entry logs ---------------------------------------------------------------------------------

    def refresh_log_meta(self) -> dict[int, EntryLogMeta]:
        """Load the ledgers map of every sealed log not seen yet; forget deleted ones."""
        el = self.storage.entry_logger
        with self.storage.lock:
            ids = el.log_ids()
            current = el.current.log_id if el.current is not None else None
            stale = [i for i in el.mapped_ids() if i not in ids]
            for i in stale:                  # mapped by a reader after GC deleted it
                el.forget(i)
        present = set(ids)
        for log_id in list(self.log_meta):
            if log_id not in present:
                del self.log_meta[log_id]
        for log_id in ids:
            if log_id == current or log_id in self.log_meta:
                continue
            try:
                m = nel.MappedLog.open_existing(el.path_of(log_id), log_id)
            except FileNotFoundError:
                continue
            except CorruptedDataError as exc:
                self._damaged_log(log_id, exc)
                continue
            try:
                # not current, so finished: sealed by its roll (with a map unless it had no room)
                ledgers = m.ledgers_map()
                recount = ledgers is None
                if recount:
                    ledgers = m.scanned_ledgers()
                self.log_meta[log_id] = EntryLogMeta(log_id, ledgers, recount, m.mapped)
                if log_id in self.damaged_logs:          # repaired since
                    self.damaged_logs.discard(log_id)
                    self.stats["damaged_logs"] = len(self.damaged_logs)
            except CorruptedDataError as exc:
                self._damaged_log(log_id, exc)
            finally:
                m.close()
        return self.log_meta

    def _damaged_log(self, log_id: int, exc) -> None:
        """A log that cannot be read is kept as it is (it may hold live entries) and left
        out of collection and compaction; the rest of the cycle goes on. Said once."""
        if log_id not in self.damaged_logs:
            self.damaged_logs.add(log_id)
            self.stats["damaged_logs"] = len(self.damaged_logs)
            log.error("garbage collection leaves entry log %x alone: %s", log_id, exc)

    def refresh_segment_meta(self) -> dict[int, EntryLogMeta]:
        """Layout 2: the ledgers map of every ``.seg`` file (below the LastLogMark: the
        journal replays none of it) not seen yet, from its ``.seg.map`` (counted from its
        records without one); forget freed ones. A ``.txn`` is never here."""
        if not self.storage.segments:
            return {}
        directory = self.bookie.journal_dir
        present = set()
        for file_id in journal_files.journal_ids(directory, journal_files.SEG):
            stem = os.path.join(directory, "%x" % file_id)
            log_id = self._segment_of.get(file_id)
            if log_id is None:
                segment = journal_files.read_segment(stem + journal_files.SEG)
                if not segment:
                    continue                 # its header is unreadable: never guess
                log_id = self._segment_of[file_id] = segment | SEGMENT_LOG
            present.add(log_id)
            if log_id in self.segment_meta:
                continue
            ledgers = journal_files.read_segment_map(stem)
            recount = ledgers is None
            try:
                if recount:
                    m = nel.MappedLog.open_segment(stem + journal_files.SEG, log_id)
                    try:
                        _locs, sizes, scopes, lids, _eids = m.entry_table()
                    finally:
                        m.close()
                    ledgers = {}
                    for sc, li, n in zip(scopes.tolist(), lids.tolist(), sizes.tolist()):
                        ledgers[(sc, li)] = ledgers.get((sc, li), 0) + n + 9
                size = os.path.getsize(stem + journal_files.SEG)
            except FileNotFoundError:
                present.discard(log_id)
                continue
            self.segment_meta[log_id] = EntryLogMeta(log_id, ledgers, recount, size,
                                                     stem + journal_files.SEG)
        for log_id in list(self.segment_meta):
            if log_id not in present:
                del self.segment_meta[log_id]
        for file_id, log_id in list(self._segment_of.items()):
            if log_id not in present:
                del self._segment_of[file_id]
        return self.segment_meta

    def _recount(self, meta: EntryLogMeta) -> None:
        """Exact live bytes per ledger: entries whose index still points at them."""
        el = self.storage.entry_logger
        try:
            if is_segment(meta.log_id):
                m = nel.MappedLog.open_segment(meta.path, meta.log_id)
            else:
                m = nel.MappedLog.open_existing(el.path_of(meta.log_id), meta.log_id)
        except FileNotFoundError:
            return
        try:
            locs, sizes, scopes, lids, eids = m.entry_table()
        finally:
            m.close()
        mask = live_mask(self.storage, self.bookie.ledgers, scopes, lids, eids, locs)
        exact = {k: 0 for k in meta.ledgers}
        extra = meta.record_bytes
        for s, l, n in zip(scopes[mask].tolist(), lids[mask].tolist(), sizes[mask].tolist()):
            exact[(s, l)] = exact.get((s, l), 0) + n + extra
        meta.exact = exact
        meta.recount = False
        self.stats["recounts"] += 1

    def usages(self) -> dict[int, float]:
        """Usage (live fraction) of every sealed entry log and (layout 2) every journal
        segment below the mark, by log id, recounting where needed."""
        metas = {**self.refresh_log_meta(), **self.refresh_segment_meta()}
        st = self.storage
        with self.bookie.cv:
            erased, st.erased = st.erased, set()
            live = set(self.bookie.ledgers.keys())
        for meta in list(metas.values()):
            if meta.recount or (erased and not erased.isdisjoint(meta.ledgers)):
                self._recount(meta)
        return {i: m.usage(live) for i, m in metas.items()}

    def gc_entry_logs(self) -> dict:
        usages = self.usages()
        deleted = []
        el = self.storage.entry_logger
        for log_id, usage in sorted(usages.items()):
            if usage > 0 or is_segment(log_id) or self._stop.is_set():
                continue                     # segments: gc_segments asks the index instead
            failpoints.hit("gc.before_delete_log")
            with self.storage.lock:
                if el.current is not None and el.current.log_id == log_id:
                    continue
                path = el.path_of(log_id)
                el.unregister(log_id)
            try:
                size = os.path.getsize(path)
                os.unlink(path)
            except FileNotFoundError:
                continue
            fsync_dir(os.path.dirname(path))
            self.log_meta.pop(log_id, None)
            deleted.append(log_id)
            self.stats["entry_logs_deleted"] += 1
            self.stats["entry_log_bytes_deleted"] += size
        return {"deleted": deleted}

    def _retire_segment(self, stem: str) -> bool:
        """A freed segment to the journal, kept for reuse or deleted; deleted while the
        journal is not made yet (a start redoing an interrupted compaction)."""
        journal = getattr(self.bookie, "journal", None)
        if journal is None:
            return journal_files.delete_segment(stem)
        return journal.files.retire_segment(stem)

    def gc_segments(self) -> dict:
        """Layout 2: delete the journal segments (``<id>.seg``, below the LastLogMark) that
        no index location names any more, or keep them for the journal to reuse
        (JournalFiles.retire_segment). Nothing can come to name one: a flush names only
        records after the mark, and the index pages naming it were synced before the mark
        passed it, so a crash after the unlink or the rename finds no location into the file."""
        directory = self.bookie.journal_dir
        ids = journal_files.journal_ids(directory, journal_files.SEG)
        if not ids:
            return {"deleted": []}
        used = self.storage.segments_in_use()
        pinned = {k for k in self.storage.pinned if k in self.bookie.ledgers}
        if pinned:                           # every segment holding an entry of theirs
            used = set(used) | {log_id & ~SEGMENT_LOG for log_id, meta in
                                self.refresh_segment_meta().items()
                                if not pinned.isdisjoint(meta.ledgers)}
        deleted = []
        for i in ids:
            path = os.path.join(directory, "%x%s" % (i, journal_files.SEG))
            segment = journal_files.read_segment(path)
            if segment in used or segment == 0 or self._stop.is_set():
                continue                    # 0: its header is unreadable; never guess
            failpoints.hit("gc.before_delete_segment")
            with self.storage.lock:
                self.storage.entry_logger.drop_segment(segment)
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                continue
            if not self._retire_segment(path[:-len(journal_files.SEG)]):
                continue
            deleted.append(i)
            self.segment_meta.pop(segment | SEGMENT_LOG, None)
            self.stats["segments_deleted"] = self.stats.get("segments_deleted", 0) + 1
            self.stats["segment_bytes_deleted"] = self.stats.get("segment_bytes_deleted", 0) + size
        if deleted:
            fsync_dir(directory)
        return {"deleted": deleted}

    # -- 3. compaction ----------------------------------------------------------------------------------

    def maybe_compact(self, force_major: bool = False, force_minor: bool = False) -> dict:
        cfg = self.config
        now = time.monotonic()
        pressure = self.disks.pressure() if self.disks is not None else "ok"
        kind = None
        if cfg.major_compaction_threshold > 0 and (
                force_major or (cfg.major_compaction_interval_s
                                and now - self.last_major >= cfg.major_compaction_interval_s)):
            if pressure == "ok" or force_major and pressure == "warn":
                kind, threshold = "major", cfg.major_compaction_threshold
            else:
                self.stats["compactions_skipped_for_disk"] += 1
        if kind is None and cfg.minor_compaction_threshold > 0 and (
                force_minor or (cfg.minor_compaction_interval_s
                                and now - self.last_minor >= cfg.minor_compaction_interval_s)):
            if pressure != "full" or cfg.is_force_gc_allow_when_no_space:
                kind, threshold = "minor", cfg.minor_compaction_threshold
            else:
                self.stats["compactions_skipped_for_disk"] += 1
        if kind is None or not self.compaction_enabled and not (force_major or force_minor):
            return {"kind": None}
        usages = self.usages()
        candidates = sorted((u, i) for i, u in usages.items() if 0 < u < threshold)
        allowed = ("ok", "warn") if kind == "minor" else ("ok",)

        def may_continue():
            if self._stop.is_set():
                return False
            if self.disks is None or cfg.is_force_gc_allow_when_no_space and kind == "minor":
                return True
            return self.disks.pressure() in allowed or (force_major and kind == "major")

        freed = self.compactor.compact([i for _u, i in candidates], may_continue)
        with self.storage.lock:
            present = set(self.storage.entry_logger.log_ids())
        for _u, i in candidates:
            if is_segment(i):
                if self.compactor.segment_path(i) is None:
                    self.segment_meta.pop(i, None)
            elif i not in present:
                self.log_meta.pop(i, None)
        if kind == "major":
            self.last_major = self.last_minor = now
            self.stats["major_compactions"] += 1
        else:
            self.last_minor = now
            self.stats["minor_compactions"] += 1
        return {"kind": kind, "candidates": len(candidates), "freed_bytes": freed}

    def recover(self) -> dict:
        return self.compactor.recover()


class _Abort(EmbedlogError):
    """This cycle cannot prove its candidates dead: delete nothing."""
