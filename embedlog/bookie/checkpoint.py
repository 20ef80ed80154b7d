"""Checkpoints: what lets the LastLogMark move, and the thread that makes them.

A checkpoint flushes the memtables into the entry logs, makes the entry logs and every
dirty index page and header durable, persists the deleted-ledger memory, then the
LastLogMark at the journal position the last flushed memtable covers, and trims journals
older than it (keeping journal_max_backups). In that order: the mark never passes data
that is not durable elsewhere (tests/bookie/test_power_loss.py cuts every file back to what was
durable and checks it). Records after the mark (entries still in memory, fences, LACs)
are replayed after a crash.

Checkpoints run every flush_interval_ms and, as in BookKeeper's SortedLedgerStorage, as soon
as a full memtable has been flushed, so a crash replays at most about two memtables of
journal however fast the writes come. The one after replay runs here too, not in the open
(``request(flush_active=True)``): until it ends, the replayed records stay in the memtable
and the journal files the mark points into, as after any crash, so a second crash replays
them again.
"""
from __future__ import annotations

import logging
import threading
import time

from embedlog import failpoints
from embedlog.bookie.ledger_storage import FlushFailedError

log = logging.getLogger("embedlog.bookie")

# consecutive failed checkpoints after which the bookie goes read-only (reason "checkpoint"):
# the journal cannot be trimmed meanwhile, so it only grows
READ_ONLY_AFTER_FAILURES = 3
REPEAT_LOG_S = 30.0


class Checkpointer:
    def __init__(self, bookie):
        self.bookie = bookie
        self.last_seq = 0                 # journal seq the last checkpoint covered
        self._stop = threading.Event()
        self._wake = threading.Event()       # a memtable was flushed: checkpoint now
        self._flush_wanted = False           # a full checkpoint was requested (after replay)
        self._room_back = False              # the disks turned writable: retry at once
        self.replay_checkpointed = threading.Event()   # that one has succeeded (tests wait on it)
        self._thread: threading.Thread | None = None
        # the thread's checkpoints and those called directly (close, after replay) take turns:
        # two at once would trim the same journal files (the second found them gone)
        self._one_at_a_time = threading.Lock()
        self.failures = 0                    # consecutive failed checkpoints of the thread
        self.last_error: str | None = None
        self._logged_at = 0.0

    def checkpoint(self, flush_active: bool = True) -> tuple[int, int]:
        """Make durable what the entry logs hold and move the mark past it. With
        ``flush_active`` the active memtable is flushed first; without, only memtables
        already flushed are covered (the checkpoint after a full memtable's flush)."""
        with self._one_at_a_time:
            return self._checkpoint(flush_active)

    def _checkpoint(self, flush_active: bool) -> tuple[int, int]:
        b = self.bookie
        with b.cv:
            if flush_active:
                b.storage.make_room(b.journal.note_appended())
            b.storage.wait_flushed()
            seq = b.storage.flushed_seq
            covered = b.journal.covered_by_checkpoint(seq)
            b.journal.wait_durable_locked(covered)
            mark = b.journal.position_of(covered)
        b.storage.sync()
        if b.storage.segments:
            b.journal.sync_written()     # layout 2: the entries below the mark are stored there
        b.deleted.persist()          # deletes before the mark are replayed no more
        failpoints.hit("checkpoint.before_lastmark")
        moved = b.mark.persist(mark)
        failpoints.hit("checkpoint.after_lastmark")
        if moved:
            b.journal.trim(mark[0])
        with b.cv:
            b.stats["checkpoints"] += 1
            self.last_seq = seq
        return mark

    def start(self) -> None:
        t = threading.Thread(target=self._loop, name="embedlog-sync", daemon=True)
        t.start()
        self._thread = t                    # once started: stop() joins only a started thread

    def request(self, flush_active: bool = False) -> None:
        """Checkpoint soon: after a memtable flush (called with the bookie's lock held), or,
        with ``flush_active``, a full one that flushes the active memtable too (after replay)."""
        if flush_active:
            self._flush_wanted = True
        self._wake.set()

    def room_back(self) -> None:
        """Room came back on the disks (any thread, any lock held): the thread retries a
        failed memtable flush now and, if checkpoints have been failing, checkpoints, rather
        than a second and an interval later (until one succeeds the bookie stays read-only)."""
        self._room_back = True
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        b = self.bookie
        interval_s = b.config.flush_interval_ms / 1000.0
        periodic = interval_s > 0          # flush_interval_ms=0: only requested full checkpoints
        next_full = time.monotonic() + interval_s
        while True:
            woken = self._wake.wait(max(0.0, next_full - time.monotonic()) if periodic else None)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._room_back:
                self._room_back = False
                with b.cv:
                    b.storage.retry_flush()
                if self.failures:
                    self._flush_wanted = True
            wanted, self._flush_wanted = self._flush_wanted, False
            full = wanted or (periodic and time.monotonic() >= next_full)
            if not (periodic or full):
                continue
            with b.cv:
                if wanted:
                    due = True
                elif full:
                    due = b.journal.appended_seq != self.last_seq or not b.storage.active.is_empty()
                else:
                    due = woken and b.storage.flushed_seq > self.last_seq
            if full:
                next_full = time.monotonic() + interval_s
            if not due:
                continue
            try:
                self.checkpoint(flush_active=full)
                if wanted:
                    self.replay_checkpointed.set()
            except Exception as exc:        # noqa: BLE001 - the thread must outlive any failure
                if b.closed:
                    return
                if wanted:
                    self._flush_wanted = True       # retried at the next wake or interval
                # a full disk or a failed flush: try again next interval (the journal
                # keeps everything until a checkpoint succeeds)
                self._failed(exc)
                # a failed memtable flush was measured by the flusher when it failed; taken
                # as new here, after room came back, it would mark the disks full again
                b.disks.check(None if isinstance(exc, FlushFailedError) else exc)
            else:
                if self.failures:
                    log.warning("bookie %s: checkpoint succeeded after %d failures",
                                b.bookie_id, self.failures)
                    self.failures, self.last_error = 0, None
                    b.set_read_only("checkpoint", False)

    def _failed(self, exc: BaseException) -> None:
        """Count a failed checkpoint, say why (with the traceback the first time), and go
        read-only once it keeps failing: a bookie whose checkpoints fail looks healthy and
        takes adds while its journal only grows, and each restart replays more of it."""
        b = self.bookie
        self.failures += 1
        error = f"{type(exc).__name__}: {exc}"
        b.stats["checkpoint_errors"] = b.stats.get("checkpoint_errors", 0) + 1
        # a full disk fails every interval's checkpoint alike: say so again only when the
        # error changes or every REPEAT_LOG_S, not several ERROR lines a second
        now = time.monotonic()
        if (self.failures <= READ_ONLY_AFTER_FAILURES or error != self.last_error
                or now - self._logged_at >= REPEAT_LOG_S):
            self._logged_at = now
            log.error("bookie %s: checkpoint failed (%d in a row): %s", b.bookie_id,
                      self.failures, error, exc_info=self.failures == 1)
        self.last_error = error
        if self.failures == READ_ONLY_AFTER_FAILURES:
            log.error("bookie %s: read-only until a checkpoint succeeds", b.bookie_id)
            b.set_read_only("checkpoint", True)
