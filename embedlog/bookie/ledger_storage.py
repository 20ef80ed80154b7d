"""Ledger storage: two memtables, entry logs and ledger index files (BookKeeper's
SortedLedgerStorage).

Adds go into the active memtable (under the bookie's lock). When it is full it
becomes the snapshot and the other memtable takes its place; a flusher thread
writes the snapshot, sorted by (scope, ledger, entry), into the entry log and sets
the index locations, with only the storage lock held, so appenders go on meanwhile.
If the next memtable fills before the flush ends, appenders wait (back-pressure,
as BookKeeper throttles at twice skipListSizeLimit). Reads look in both memtables,
then the index and the entry logs.

Locks: the bookie's lock (``cv``) guards the memtables and ledger state; the storage
lock guards entry-log appends and index pages. Order: bookie lock, then storage lock;
the flusher takes the storage lock alone.
"""
from __future__ import annotations

import logging
import os
import threading

import numpy as np
from sortedcontainers import SortedDict

from embedlog._native import entrylogger as nelg
from embedlog._native import index as nix
from embedlog._native import memtable as nmt
from embedlog._native.format import LedgerId
from embedlog import failpoints
from embedlog.bookie import journal_files, scrub
from embedlog.fileio import atomic_write, private_dir
from embedlog.errors import CorruptedDataError, EmbedlogError, NoSuchEntryError, NoSuchLedgerError

log = logging.getLogger("embedlog.bookie")


class FlushFailedError(EmbedlogError):
    """A waiter finds the last memtable flush failed. The flusher measured the disks when
    it failed (on_flush_error); the failure may be older than space freed since."""


class SortedLedgerStorage:
    def __init__(self, current_dir, config, cv: threading.Condition, lock, choose_current=None,
                 rebuild_damaged: bool = True):
        """``current_dir``: the current/ directory of each ledger directory (one, or a list);
        ``choose_current``: () -> the current/ a new entry log or index file goes to;
        ``rebuild_damaged``: False raises a damaged index file's error instead (a read-only
        view: setting the file aside is the writer's)."""
        self.rebuild_damaged = rebuild_damaged
        self.current_dirs = [current_dir] if isinstance(current_dir, str) else list(current_dir)
        self.cv = cv
        self.config = config
        limit = config.skip_list_size_limit
        self.mt_a = nmt.MemTable(limit)
        self.mt_b = nmt.MemTable(limit)
        self.active = self.mt_a
        self.snapshot = None                 # the memtable being flushed
        self.snapshot_seq = 0                # journal seq the snapshot covers
        self.flushed_seq = 0                 # journal seq covered by flushed snapshots
        self.entry_logger = nelg.EntryLogger(self.current_dirs, config.entry_log_size_limit,
                                            choose_dir=choose_current)
        self.entry_logger.page_cache_bytes = config.entry_log_page_cache_bytes
        self.index_cache = nix.IndexCache(self.current_dirs[0], config.page_limit,
                                          choose_root=choose_current)
        self.erased: set = set()             # ledgers with entries erased since GC last looked
        self.damaged: dict = {}              # (scope, lid) -> what happened to its index file
        self.rebuilt: dict = {}              # (scope, lid) -> entries restore_unindexed found
        # ledgers whose index was rebuilt from the logs (a <file>.damaged beside it, kept
        # across restarts until an operator deletes it): every copy of their entries is
        # live to GC and compaction, named by the index or not (a copy left out as
        # ambiguous, or in a segment unreadable at the rebuild, is not lost for good)
        self.pinned: set = set()
        self._journal_cuts = None            # scrub.journal_cuts, read once by a start's rebuilds
        self.flush_error: BaseException | None = None   # the last memtable flush failure
        self.ledgers: SortedDict = SortedDict()          # (scope, lid) -> LedgerIndex
        self.lock = threading.Lock()                      # entry logs and index pages
        self._flush_cv = threading.Condition(lock)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.stats = {"memtable_flushes": 0, "entry_log_rolls": 0, "throttled_adds": 0,
                      "memtable_flush_errors": 0, "entry_log_bytes_written": 0,
                      "entry_log_bytes_dropped_from_cache": 0}
        self.on_flush_error = None           # (exc) -> None: e.g. a disk check
        self.on_flushed = None               # () -> None, cv held: a snapshot is in the logs
        # layout 2: a flush sets index locations into the journal's segments and copies
        # nothing; these come from the journal (bookie.py wires them)
        self.segments = False
        self.wait_journal = None             # (seq, locked) -> None: seq is written
        self.segment_starts = None           # () -> where each segment begins (journal seqs)

    # -- the flusher ---------------------------------------------------------------------

    def start(self) -> None:
        # tracked once started: a signal (KeyboardInterrupt) between the two leaves close()
        # no unstarted thread to join, and a started one stops on _stopping
        t = threading.Thread(target=self._flush_loop, name="embedlog-memtable-flush", daemon=True)
        t.start()
        self._thread = t

    def _flush_loop(self) -> None:
        while True:
            with self.cv:
                while self.snapshot is None and not self._stopping:
                    self._flush_cv.wait()
                if self.snapshot is None:
                    return
                snap, seq = self.snapshot, self.snapshot_seq
            try:
                self._flush(snap)
            except Exception as exc:        # noqa: BLE001 - a dead flusher would hang every add
                # a full disk (no room for a new entry log): the entries stay in the snapshot
                # and the journal; retry once a second while the bookie turns read-only.
                # Anything else is a bug, but adds must see it rather than wait for ever
                if not isinstance(exc, OSError):
                    log.error("memtable flush failed", exc_info=True)
                with self.cv:
                    self.flush_error = exc
                    self.stats["memtable_flush_errors"] += 1
                    self.cv.notify_all()
                if self.on_flush_error is not None:
                    self.on_flush_error(exc)
                with self.cv:
                    if self._stopping:
                        return          # closing: the journal holds what this could not write
                    if self.flush_error is exc:     # retry_flush may have woken it already
                        self._flush_cv.wait(1.0)
                continue
            with self.cv:
                self.flush_error = None
                self._finish(snap, seq)

    def _flush(self, snap, locked: bool = False) -> None:
        """Write a snapshot into the entry logs and set its index locations (layout 2: only
        set them, pointing into the journal's segments)."""
        failpoints.hit("memtable.before_flush")
        if self.segments and self._flush_to_segments(snap, locked):
            return
        with self.lock:
            before = self.entry_logger.last_log_id

            def on_location(scope, lid, eids, locs):
                idx = self.ledgers.get((scope, lid))
                if idx is not None:                   # deleted while in the memtable: drop
                    idx.set_locations(eids, locs)

            written = self.entry_logger.flush_memtable(snap, on_location)
            self.stats["memtable_flushes"] += 1
            self.stats["entry_log_bytes_written"] += written
            self.stats["entry_log_rolls"] += self.entry_logger.last_log_id - before
            self.stats["entry_log_bytes_dropped_from_cache"] = self.entry_logger.dropped_bytes

    def _flush_to_segments(self, snap, locked: bool) -> bool:
        """Layout 2's flush: each entry's journal record becomes its location. False (nothing
        done) when an entry has none (put without a journal record) or lies past what a
        32-bit offset names: the entry logs take that snapshot instead."""
        # a location must not name bytes the journal has not written yet (readers go to it
        # once the snapshot is cleared). The snapshot's highest record says how far: not its
        # seq, which make_room took before it waited for the previous flush, as more
        # records came in
        if snap.max_pending:
            self.wait_journal(int(snap.max_pending), locked)
        # drop_ledger and erase hide a snapshot's records under self.lock: the walk must not
        # run beside them (its count would not match), and the locations set come from a
        # walk in the same hold as the setting, so an entry hidden meanwhile gets none
        with self.lock:
            # each entry's journal seq becomes its location in the walk itself (nogil);
            # None: one has none (put without a journal record, past a 32-bit offset), so
            # the entry logs take the snapshot
            walked = snap.flush_wheres(self.segment_starts())
            if walked is None:
                return False
            scopes, lids, eids, wheres = walked
            if not len(wheres):
                self.stats["memtable_flushes"] += 1
                return True
            cuts = np.flatnonzero((scopes[1:] != scopes[:-1]) | (lids[1:] != lids[:-1])) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(eids)]):
                idx = self.ledgers.get((int(scopes[a]), int(lids[a])))
                if idx is not None:                   # deleted while in the memtable: drop
                    idx.set_locations(eids[a:b], wheres[a:b])
            self.stats["memtable_flushes"] += 1
        return True

    def segments_in_use(self) -> set:
        """The segment numbers some index location names (GC frees the others)."""
        with self.cv:
            indexes = list(self.ledgers.values())
        used = set()
        with self.lock:
            for idx in indexes:
                used.update(idx.segments())
        return used

    def _finish(self, snap, seq: int) -> None:
        # locations are set: readers find these entries in the index from now on
        snap.clear()
        self.snapshot = None
        self.flushed_seq = max(self.flushed_seq, seq)
        self.cv.notify_all()
        if self.on_flushed is not None:
            self.on_flushed()

    # -- called with the bookie's lock held ------------------------------------------------

    def make_room(self, seq: int) -> None:
        """The active memtable is full (or a checkpoint wants it flushed): swap it out.

        ``seq`` is the journal position after every record in it. Waits while the
        previous snapshot is still being flushed; flushes inline if the flusher is not
        running."""
        if self.active.is_empty():
            if self.snapshot is None:              # nothing unflushed: all of seq is in storage
                self.flushed_seq = max(self.flushed_seq, seq)
            return
        if self._thread is None:
            snap = self.active
            self._swap(seq)
            self._flush(snap, locked=True)
            self._finish(snap, seq)
            return
        if self.snapshot is not None:
            self.stats["throttled_adds"] += 1
        while self.snapshot is not None:
            self._raise_flush_error()
            if self._stopping:
                raise EmbedlogError("the bookie is closing: the memtable is not flushed again")
            self.cv.wait()
        self._swap(seq)
        self._flush_cv.notify()

    def _swap(self, seq: int) -> None:
        self.snapshot = self.active
        self.snapshot_seq = seq
        self.active = self.mt_b if self.active is self.mt_a else self.mt_a

    def wait_flushed(self) -> None:
        while self.snapshot is not None:
            self._raise_flush_error()
            if self._stopping:
                raise EmbedlogError("the bookie is closing: the memtable is not flushed again")
            self.cv.wait()

    def retry_flush(self) -> None:
        """Retry a failed memtable flush now (cv held), not at the flusher's next second:
        room came back. Its waiters wait for the retry's outcome instead of the old error."""
        if self.flush_error is not None:
            self.flush_error = None
            self._flush_cv.notify()

    def _raise_flush_error(self) -> None:
        if self.flush_error is not None:
            raise FlushFailedError(f"the memtable cannot be flushed to the entry logs: "
                                   f"{self.flush_error}") from self.flush_error

    def known(self, key):
        """The ledger's index, created (in memory) if new."""
        idx = self.ledgers.get(key)
        if idx is None:
            idx = self.index_cache.open(key[0], key[1], False)
            self.ledgers[key] = idx
        return idx

    def drop_ledger(self, key) -> None:
        """Forget a ledger and delete its index file."""
        # under the storage lock: a flush in progress must not set locations afterwards
        with self.lock:
            idx = self._forget(key)
            if idx is not None:
                idx.delete()

    def forget_ledger(self, key) -> None:
        """Forget a ledger in memory and leave its files (a read-only view's: they are the
        writer's)."""
        with self.lock:
            self._forget(key)

    def _forget(self, key):
        idx = self.ledgers.pop(key, None)
        self.mt_a.drop_ledger(key[0], key[1])
        self.mt_b.drop_ledger(key[0], key[1])
        return idx

    def erase(self, key, lo: int, hi: int) -> None:
        """Forget entries lo..hi of a ledger (truncation above, retention below)."""
        with self.lock:
            self.mt_a.drop_ledger(key[0], key[1], lo, hi)
            self.mt_b.drop_ledger(key[0], key[1], lo, hi)
            idx = self.ledgers.get(key)
            if idx is not None:
                idx.clear_range(lo, hi)
                self.erased.add(key)             # GC recounts the live bytes of its entry logs

    # -- reads (no lock needed: see embedlog._native.reader) ------------------------------

    def load_indexes(self):
        """(key, LedgerIndex) of every index file in every ledger directory (start-up).

        One damaged index file costs its ledger's writes on this bookie, never the bookie:
        it is set aside as ``<file>.damaged`` (logged, listed in ``damaged``) and a new index
        is rebuilt from the entry logs (BookKeeper's index rebuild). The rebuilt ledger is
        fenced (its header's fence, key and term are gone), so it serves reads, and adds
        to it are refused; entries still in the journal come back by replay as usual."""
        seen = {}
        for current in self.current_dirs:
            for scoped, root in ((False, "ledgers"), (True, "ledgers-scoped")):
                top = os.path.join(current, root)
                if not os.path.isdir(top):
                    continue
                for dirpath, _dirs, files in os.walk(top):
                    for name in files:
                        key = nix.parse_index_name(name, scoped)
                        if key is None:
                            if name.endswith(".idx.damaged"):
                                key = nix.parse_index_name(name[:-len(".damaged")], scoped)
                                if key is not None:
                                    self.pinned.add(key)
                            continue
                        if key in seen:
                            raise CorruptedDataError(
                                f"ledger {LedgerId(*key)} has index files in two ledger "
                                f"directories: {seen[key]} and {os.path.join(dirpath, name)}")
                        path = seen[key] = os.path.join(dirpath, name)
                        try:
                            idx = self.index_cache.open(key[0], key[1], True, current)
                        except (CorruptedDataError, OSError) as exc:
                            if not self.rebuild_damaged:
                                raise
                            idx = self._rebuild_index(key, path, current, exc)
                        yield key, idx

    def _rebuild_index(self, key, path, current, error):
        """A new index for ``key`` from every entry it finds in the entry logs and segments
        (scrub.ledger_entries: an id whose copies differ is left out), replacing the damaged
        file at ``path``, which is kept as ``<path>.damaged`` and pins the ledger."""
        os.replace(path, path + ".damaged")
        ambiguous: list = []
        eids, locs = scrub.ledger_entries(
            [(i, self.entry_logger.path_of(i)) for i in self.entry_logger.log_ids()]
            + self._segment_files(), key, ambiguous=ambiguous, cuts=self._cuts().get(key, []))
        idx = self.index_cache.open(key[0], key[1], False, current)
        found = len(eids)
        if found:
            idx.set_locations(eids, locs)
        idx.fenced = True                # its fence state is unknown: take no more adds
        idx.header_dirty = True
        self.pinned.add(key)
        self.damaged[key] = {"file": path, "set_aside": path + ".damaged", "error": str(error),
                             "entries_found": found, "entries_ambiguous": ambiguous}
        log.error("ledger %r: index file %s is damaged (%s); set aside as %s.damaged and "
                  "rebuilt from the entry logs and journal segments (%d entries; %d left out, "
                  "their copies differ: %s); the ledger is read-only here",
                  LedgerId(*key), path, error, path, found, len(ambiguous), ambiguous[:10])
        return idx

    def _cuts(self) -> dict:
        """scrub.journal_cuts of every journal file, read once for a start's rebuilds."""
        if self._journal_cuts is None:
            self._journal_cuts = scrub.journal_cuts(self._segment_files())
        return self._journal_cuts

    def _segment_files(self) -> list:
        """[(log id, path)] of layout 2's journal segments, oldest first (none in layout 1)."""
        out = []
        for segment, stem in sorted((self.entry_logger.segment_files or {}).items()):
            for suffix in (".txn", ".seg"):
                if os.path.exists(stem + suffix):
                    out.append((segment | scrub.SEGMENT_LOG_BIT, stem + suffix))
                    break
        return out

    def restore_unindexed(self, keep) -> None:
        """Start-up, after every entry log is sealed and before replay: a ledger the entry
        logs name whose index file is missing or cut gets the entries they hold back into its
        index (scrub.unindexed_entries; ``keep(key)``: whether a ledger without a file is
        wanted, not a deleted one), so recovery never closes it before entries it holds.
        Whether that was damage is known after replay (``settle_rebuilt``)."""
        def find_index(key):
            idx = self.ledgers.get(key)
            return idx.path if idx is not None and os.path.exists(idx.path) else None

        logs = [(i, self.entry_logger.path_of(i)) for i in self.entry_logger.log_ids()]
        segments = []                        # layout 2: each segment's map names its ledgers
        for log_id, path, held, read in scrub.segments_held(self._segment_files()):
            if held is None:
                log.error("journal segment %s: its ledgers map is missing or damaged and "
                          "the segment cannot be read: its entries are not looked for", path)
                continue
            if read:
                # its map is gone or damaged: its records said (what GC counts it from too),
                # and a new map is written from them, so the next start need not read them
                log.warning("journal segment %s: its ledgers map is missing or damaged; "
                            "its records were read instead (%d ledgers), a new map written",
                            path, len(held))
                try:
                    journal_files.write_segment_map(path, log_id & ~scrub.SEGMENT_LOG_BIT)
                except (OSError, CorruptedDataError) as exc:
                    log.warning("journal segment %s: its map could not be written: %s", path, exc)
            segments.append((log_id, path, held))
        found = scrub.unindexed_entries(
            logs, find_index, lambda key, missing: key not in self.damaged and (not missing or keep(key)),
            segments, self._cuts)     # walked only if some ledger needs a rebuild
        for key, r in found.items():
            idx = self.ledgers.get(key)
            if idx is None:
                idx = self.ledgers[key] = self.index_cache.open(key[0], key[1], False)
            idx.set_locations(r["eids"], r["locs"])
            idx.header_dirty = True
            self.rebuilt[key] = dict(r, file=idx.path, missing=r["file"] is None)

    def settle_rebuilt(self) -> None:
        """After replay: a rebuilt ledger whose entries replay wrote again (a crash between a
        memtable flush and the checkpoint writing its index) lost nothing. One with entries
        only the entry logs still held, or whose missing file took the ledger's key and fence
        state with it, was damaged: logged, listed in ``damaged``, a note ``<file>.damaged``
        left for localconsistencycheck, and fenced (adds refused, recovery and reads go on)."""
        with self.cv:
            for key, r in self.rebuilt.items():
                idx = self.ledgers.get(key)
                if idx is None:                          # deleted by replay
                    continue
                same = idx.match_locations(r["eids"], r["locs"])     # not written again
                held = [mt for mt in (self.active, self.snapshot) if mt is not None]
                only_logs = sum(1 for e in r["eids"][same].tolist()
                                if not any(mt.contains(key[0], key[1], e) for mt in held))
                ambiguous = r.get("ambiguous", [])
                if not only_logs and not ambiguous and not (r["missing"] and idx.master_key is None):
                    log.info("ledger %r: %s; its %d entries in the entry logs were replayed "
                             "from the journal too", LedgerId(*key), r["problem"], len(r["eids"]))
                    continue
                idx.fenced = True                # its fence state is unknown: take no more adds
                idx.header_dirty = True
                note = r["file"] + ".damaged"
                private_dir(os.path.dirname(note))
                atomic_write(note, f"{r['problem']}; rebuilt from the entry logs\n".encode()
                             if r["missing"] else open(r["file"], "rb").read())
                self.pinned.add(key)
                self.damaged[key] = {"file": r["file"], "set_aside": note, "error": r["problem"],
                                     "entries_found": len(r["eids"]), "entries_only_in_logs": only_logs,
                                     "entries_ambiguous": ambiguous}
                log.error("ledger %r: %s; %d entries (%d of them nowhere else) were rebuilt from "
                          "the entry logs (%d left out, their copies differ: %s); the ledger takes "
                          "no more adds here", LedgerId(*key), r["problem"], len(r["eids"]),
                          only_logs, len(ambiguous), ambiguous[:10])
            self.rebuilt.clear()
            self._journal_cuts = None

    def holds(self, key, entry_id: int) -> bool:
        """Whether the entry is stored (memtables or index), without reading it."""
        for mt in (self.active, self.snapshot):
            if mt is not None and mt.contains(key[0], key[1], entry_id):
                return True
        idx = self.ledgers.get(key)
        return idx is not None and entry_id >= 0 and bool(idx.get_location(entry_id))

    def location(self, key, entry_id: int) -> int:
        idx = self.ledgers.get(key)
        if idx is None:
            raise NoSuchLedgerError(f"bookie has no ledger {LedgerId(*key)}")
        loc = idx.get_location(entry_id) if entry_id >= 0 else 0
        if not loc:
            raise NoSuchEntryError(f"no entry {entry_id} in ledger {LedgerId(*key)}")
        return loc

    # -- checkpoints --------------------------------------------------------------------------

    def sync(self) -> None:
        """Make the flushed entry logs and every dirty index page and header durable."""
        failpoints.hit("checkpoint.before_index_flush")
        with self.cv:
            indexes = list(self.ledgers.values())
        with self.lock:
            self.entry_logger.flush()
            for idx in indexes:
                idx.flush(True)
            self.index_cache.trim()

    def close(self) -> None:
        with self.cv:
            self._stopping = True
            self._flush_cv.notify_all()
            self.cv.notify_all()            # adds waiting for room see the bookie closing
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.entry_logger.close()
