"""The journal's group commit (its files are in journal_files.py, its LastLogMark in
lastmark.py, its replay in replay.py).

Appenders frame records into ``buffer`` while holding the bookie's lock (the
Condition ``cv`` wraps it). Whoever then needs durability and finds no sync
under way becomes the leader of a group: it takes the buffer (swapping in an
empty one), writes it (O_DIRECT, whole blocks: journal_direct_writes) and
fdatasyncs it with the GIL released, and wakes every waiter whose records the
sync covered (they wait in ``durable``, outside the bookie's lock). Adds that arrive meanwhile form the
next group, so one fdatasync is shared by all of them. A lone writer leads its
own sync at once (``journal_flush_when_queue_empty``), so it never waits for
the group timer. A dedicated writer thread leads for ``append_async`` callers
and for the time-based trigger; a preallocator thread writes zeros ahead of the
tail while the file policy wants them.

Positions: every byte ever appended gets a sequence number (``appended_seq``);
``synced_seq`` says how far the journal is durable. ``position_of(seq)`` turns
a sequence number into the (journal id, offset) a LastLogMark stores.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

import numpy as np

from embedlog._native import (journal_format as jformat, journal_buffer as jbuffer,
                              journal_waiters as jwaiters, busy_io)
from embedlog import failpoints
from embedlog.bookie.journal_files import JournalFiles
from embedlog.fileio import no_space as _no_space
from embedlog.errors import EmbedlogError, TimeoutError

log = logging.getLogger("embedlog.bookie")
TRIGGERS = ("queue_empty", "time", "bytes", "entries", "interval")
# sync_if_idle syncs in its caller's thread (a server's loop, which serves nothing else
# meanwhile) only while fdatasync takes less than this
SYNC_HERE_MAX_S = 0.0005
# enable_busy_wait spins through groups up to this size only: a larger group's Python is
# spread over many entries, so spinning through its I/O bought nothing and cost CPU (1000 x
# 100 B batches: the same 2.7M entries/s, 556-575 ns of CPU per entry against 239-279)
BUSY_GROUP_BYTES_MAX = 64 << 10
# ... and only while the recent fdatasyncs are quicker than this: what spinning saves is the
# Python's slower run after a sleep (some 15 µs a group here), while the spinning cores
# slowed this VM's fdatasync by a quarter (100 -> 130 µs; docs/PERFORMANCE_HISTORY.md,
# "Spinning only through short syncs"): past 60-80 µs of sync, a quarter of it is more
# than spinning saves (the spin's own syncs count in the mean, so it stops near 64 µs)
BUSY_SYNC_MAX_S = 0.00008


class _Group:
    """A group a leader took out of the buffer: its records and where they went."""
    __slots__ = ("buf", "start_seq", "end_seq", "nrecords", "rolled", "attempted")

    def __init__(self, buf, start_seq: int, nrecords: int, rolled: bool):
        self.buf = buf                    # the JournalBuffer taken
        self.start_seq = start_seq
        self.end_seq = start_seq + buf.nbytes
        self.nrecords = nrecords
        self.rolled = rolled              # it opens the next file
        self.attempted = None             # (file, offset, bytes) its bytes went to


class Journal:
    """Group commit over a directory's journal files (``files``, a JournalFiles); ``cv``
    wraps the bookie's ``lock``."""

    def __init__(self, directory: str, config, cv: threading.Condition, lock):
        self.directory = directory
        self.config = config
        self.cv = cv                                   # sync waiters: a group is durable
        self._lock = lock                              # cv's lock: taken bare where none waits
        self.durable = jwaiters.DurableSeq()                 # the same, for waiters outside the lock
        # the writer and the preallocator wait on conditions of their own (same lock), so a
        # finished group wakes only those who need it
        self._writer_cv = threading.Condition(lock)
        self._prealloc_cv = threading.Condition(lock)
        self.buffer = jbuffer.JournalBuffer()
        self._spare = jbuffer.JournalBuffer()
        # each group's first record gives its length: replay tells the torn sectors of an
        # unsynced last group from damage (docs/FORMATS.md; the files' headers say so)
        self.buffer.groups = self._spare.groups = True
        self.appended_seq = 0
        self.written_seq = 0
        self._taken_seq = 0               # end of the records a leader took out of the buffer
        self.synced_seq = 0
        self._syncing = False
        self._oldest_pending = None       # monotonic time of the first record not yet taken
        self._error: BaseException | None = None      # the journal cannot go on (EIO, ...)
        # a full disk fails the groups it hits, not the journal: their seq ranges, and a new
        # file before the next group (the failed write may have left part of itself behind)
        # (from, to, error), contiguous failures merged: a waiter that framed into a failed
        # group and looks late must still find it (bounded: a disk flapping full and free)
        self._failed: collections.deque = collections.deque(maxlen=1 << 16)
        self._needs_roll = False
        # (exc, entries of the failed group) -> None, cv held: the bookie takes those entries
        # back out of its memtable (they are not durable) and checks its disks
        self.on_failure = None
        self._closed = False
        self._async: collections.deque = collections.deque()   # (seq, callback)
        self._fsync_recent_s = 0.0        # moving mean of the last ~8 fdatasyncs (sync_if_idle,
                                          # enable_busy_wait)
        self.stats = {t: 0 for t in TRIGGERS}
        self.stats.update(fsyncs=0, groups=0, group_entries_max=0, bytes_written=0,
                          records_written=0, fsync_time_s=0.0, memory_throttled=0,
                          zeros_written=0, files_reused=0, files_created=0, groups_extending=0,
                          blocks_written=0)
        # called after each group (lock held; must be quick): (trigger, records, bytes,
        # fsync seconds or None) -- the admin server's histograms
        self.group_observer = None
        self._starts: list[tuple[int, int, int]] = []   # (start seq, journal id, start offset)
        self._segment_starts: list[tuple[int, int, int]] = []   # (start seq, segment, offset)
        self.files = JournalFiles(directory, config, self.stats)
        self._rolling = False
        self._reserved_end = 0            # file offset the write in progress will reach
        self._max_memory = config.journal_max_memory_size_mb * 1024 * 1024
        self._threads: list[threading.Thread] = []
        self._busy = None                 # busy_io.BusyWriter with enable_busy_wait (start)

    # -- files ------------------------------------------------------------------

    def start(self, mark=None) -> None:
        """Open a new journal file (a restarted bookie never appends to an old one);
        ``mark`` records each new file as the journal head. On a full disk the bookie still
        starts: the file is opened by the first group once there is room."""
        self.files.mark = mark
        # the first group lands right after the header (later ones: _take_group says where;
        # it alone may move an empty buffer, under the lock, as appenders fill it under it)
        self.buffer.set_lead(jformat.HEADER_SIZE)
        self.files.sync_newest()
        try:
            self.files.open_next()
            self._note_file(self.written_seq)
        except OSError as exc:
            if not _no_space(exc):
                raise
            self._needs_roll = True
            self.stats["no_space"] = self.stats.get("no_space", 0) + 1
        if self.config.enable_busy_wait:
            self._busy = busy_io.BusyWriter()
        for target, name in ((self._writer_loop, "embedlog-journal"),
                             (self._prealloc_loop, "embedlog-journal-prealloc")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _note_file(self, start_seq: int) -> None:
        """The current file begins at ``start_seq`` (for position_of)."""
        self._starts.append((start_seq, self.files.file_id, jformat.HEADER_SIZE))
        del self._starts[:-64]
        if self.files.segment:
            self._segment_starts.append((start_seq, self.files.segment, jformat.HEADER_SIZE))
            del self._segment_starts[:-4096]

    @property
    def started(self) -> bool:
        """Whether ``start`` ran: its threads need ``close``."""
        return bool(self._threads)

    @property
    def direct_writes(self) -> bool:
        """Whether groups are written with O_DIRECT (journal_direct_writes, if allowed)."""
        return self.files.direct_writes

    @property
    def current_file_id(self) -> int:
        return self.files.file_id

    def position_of(self, seq: int) -> tuple[int, int]:
        """The (journal id, offset) of sequence number ``seq`` (written or not)."""
        for start_seq, file_id, start_off in reversed(self._starts):
            if seq >= start_seq:
                return file_id, start_off + (seq - start_seq)
        if not self._starts:
            # a start on a full disk found no room for a journal file: nothing was journalled
            # since the mark, which stays where it is
            mark = self.files.mark
            if mark is None or mark.persisted is None:
                raise EmbedlogError(f"journal {self.directory}: no journal file is open yet "
                                    "(no room for one)")
            return tuple(mark.persisted)
        start_seq, file_id, start_off = self._starts[0]
        return file_id, start_off

    # -- appending (callers hold cv) ---------------------------------------------

    def segment_starts(self):
        """Layout 2: where each segment file begins, as a (n, 3) uint64 array of (journal
        seq, segment, offset), ascending (MemTable.flush_wheres turns a record's seq into
        its location with it)."""
        return np.array(self._segment_starts, dtype=np.uint64).reshape(-1, 3)

    def wait_written(self, seq: int, locked: bool) -> None:
        """Block until the journal has written ``seq`` (cv held if ``locked``). A group a
        full disk failed counts as written: its entries left the memtable with it."""
        if not locked:
            with self.cv:
                return self.wait_written(seq, True)
        while self.written_seq < seq:
            try:
                if not self._step(seq, None):
                    self.cv.wait(1.0)
            except EmbedlogError:
                if self.written_seq < seq:
                    raise

    def sync_written(self) -> None:
        """With journal_sync_data off, fdatasync what the journal wrote (a layout 2
        checkpoint: the records below the mark are the entries' only copy). Every roll
        synced the files before the current one."""
        if self.config.journal_sync_data:
            return
        with self.cv:
            while self._syncing or self._rolling:
                self.cv.wait()
            if self.files.fd < 0:
                return
            self._syncing = True          # no leader writes or rolls under this sync
        try:
            self.files.sync()
        finally:
            with self.cv:
                self._syncing = False
                self.cv.notify_all()

    def note_appended(self) -> int:
        """Account for records framed into ``buffer``; returns the new end seq."""
        # records framed now come after those a leader may be writing this very moment
        self.appended_seq = self._taken_seq + self.buffer.nbytes
        if self._oldest_pending is None and self.buffer.nbytes:
            self._oldest_pending = time.monotonic()
        return self.appended_seq

    def make_room(self) -> None:
        """Push back on a writer faster than the disk: while journal_max_memory_size_mb of
        records wait for a group commit, the caller waits for (or leads) one."""
        if self.buffer.nbytes < self._max_memory:
            return
        self.stats["memory_throttled"] += 1
        while self.buffer.nbytes >= self._max_memory:
            if self._error is not None:
                raise EmbedlogError(f"journal failed: {self._error}") from self._error
            if self._syncing:
                self.cv.wait()
            else:
                self._lead("bytes")

    def add_record(self, rtype: int, body: bytes) -> int:
        self.buffer.add_record(rtype, body)
        return self.note_appended()

    # -- group commit ---------------------------------------------------------------

    def _trigger(self, now: float):
        """(trigger name or None, seconds to wait) for the pending group."""
        buf = self.buffer
        if not buf.nbytes:
            return None, None
        cfg = self.config
        if buf.nbytes >= cfg.journal_buffered_writes_threshold:
            return "bytes", 0
        if cfg.journal_buffered_entries_threshold and buf.nrecords >= cfg.journal_buffered_entries_threshold:
            return "entries", 0
        if cfg.journal_flush_when_queue_empty:
            # every add that has arrived is already framed (framing happens under
            # the lock before anyone waits), so the queue is empty: flush now
            return "queue_empty", 0
        waited = now - (self._oldest_pending or now)
        wait_s = cfg.journal_max_group_wait_ms / 1000.0
        if waited >= wait_s:
            return "time", 0
        return None, wait_s - waited

    def _lead(self, trigger: str) -> None:
        """Write and sync the pending group. Called with cv held; releases it for I/O."""
        group = self._take_group(trigger)
        self.cv.release()
        try:
            fsync_s = self._write_group(group)
        except BaseException as caught:
            exc = self._group_failed(group, caught)      # cv held again
            if isinstance(exc, EmbedlogError) or not isinstance(exc, Exception):
                raise                                   # the write's own error
            raise EmbedlogError(f"journal write failed{' (disk full)' if _no_space(exc) else ''}: "
                                f"{exc}") from exc
        self.cv.acquire()
        self._group_written(group, trigger, fsync_s)

    def _take_group(self, trigger: str) -> _Group:
        """(cv held) Swap the buffer for the empty spare and decide where its records go:
        the current file, or the next one when this one is full or a failed group left it."""
        buf = self.buffer
        self.buffer, self._spare = self._spare, buf
        group = _Group(buf, self.written_seq, buf.nrecords,
                       self._needs_roll or self.files.full(buf.nbytes))
        self._taken_seq = group.end_seq
        self.buffer.seq0 = self._taken_seq      # the seqs the add kernels give its records
        self._syncing = True
        self._oldest_pending = None
        # never write where the preallocator is writing zeros, nor roll under it
        while self.files.claimed(group.rolled, self.files.offset + buf.nbytes):
            self.cv.wait()
        self._rolling = group.rolled
        # the preallocator must stay beyond what this write covers (it runs meanwhile)
        self._reserved_end = (jformat.HEADER_SIZE if group.rolled else self.files.offset) + buf.nbytes
        self.buffer.set_lead(self._reserved_end)         # where the next group will start
        self.stats[trigger] += 1
        return group

    def _write_group(self, group: _Group):
        """(cv released) Roll if the group said so, write it, fdatasync it unless
        journal_sync_data is off. Returns the fdatasync's seconds, or None if none ran."""
        files = self.files
        armed = bool(failpoints.armed)
        if armed:
            failpoints.hit("journal.before_write")
        if group.rolled:
            files.roll(sync_old=not self._needs_roll)
            self._note_file(group.start_seq)
        covered = files.cover(group.buf.nbytes)
        if covered is not None:
            with self.cv:
                files.zero_end = max(files.zero_end, covered)
        group.attempted = (files.path, files.offset, group.buf.nbytes)
        if self.config.journal_sync_data and not armed:
            # one request, write and sync: the leader wakes once (and no failure point lies
            # between them: a test that arms one takes the path below); small groups go to
            # the busy writer's thread with enable_busy_wait while the disk syncs quickly
            busy = (self._busy if group.buf.nbytes <= BUSY_GROUP_BYTES_MAX
                    and self._fsync_recent_s < BUSY_SYNC_MAX_S else None)
            fsync_s = files.append_synced(group.buf, busy)    # noted written, pages dropped
        else:
            fsync_s = self._write_apart(group.buf)
            if fsync_s is None:
                return None
        self.stats["fsync_time_s"] += fsync_s
        self._fsync_recent_s += (fsync_s - self._fsync_recent_s) / 8
        return fsync_s

    def _write_apart(self, buf):
        """The group's write, then (journal_sync_data) its fdatasync, with the failure
        points between them: the fdatasync's seconds, or None if none ran."""
        files = self.files
        files.append(buf)
        if not self.config.journal_sync_data:
            files.note_written(buf)
            return None
        failpoints.hit("journal.before_sync")
        t0 = time.perf_counter()
        files.sync()
        fsync_s = time.perf_counter() - t0
        failpoints.hit("journal.after_sync")
        files.note_written(buf)
        files.drop_synced_pages()
        return fsync_s

    def _group_failed(self, group: _Group, exc: BaseException) -> BaseException:
        """(takes cv) A group failed: on a full disk only that group (none of it is
        acknowledged; the journal goes on in a new file as soon as there is room for one),
        otherwise the journal. A full disk's group is first cut off the file, if its bytes
        may have reached it. Wakes its waiters and tells on_failure. Returns the error the
        group fails with."""
        if _no_space(exc) and group.attempted is not None:
            exc = self.files.cut_off(group.attempted, exc)
        self.cv.acquire()
        lost = []
        if _no_space(exc):
            self._note_failed(group.start_seq, group.end_seq, exc)
            self._needs_roll = True
            lost = group.buf.entry_ids()
            group.buf.clear()
            self.written_seq = self.synced_seq = group.end_seq
            self.stats["no_space"] = self.stats.get("no_space", 0) + 1
        else:
            self._error = exc
        self._syncing = False
        self._rolling = False
        self.cv.notify_all()
        self.durable.wake()
        if self.on_failure is not None:
            try:
                self.on_failure(exc, lost)
            except Exception:
                log.exception("journal failure listener failed")
        return exc

    def _group_written(self, group: _Group, trigger: str, fsync_s) -> None:
        """(cv held) A group is written (and synced, unless journal_sync_data is off, when
        it is acknowledged after write(2): the user's choice): count it, wake its waiters,
        the writer thread and the preallocator."""
        nbytes = group.end_seq - group.start_seq
        self._needs_roll = False
        self._rolling = False
        group.buf.clear()
        self.written_seq = self.synced_seq = group.end_seq
        if fsync_s is not None:
            self.stats["fsyncs"] += 1
        self.stats["groups"] += 1
        self.stats["bytes_written"] += nbytes
        self.stats["records_written"] += group.nrecords
        self.stats["group_entries_max"] = max(self.stats["group_entries_max"], group.nrecords)
        self.files.note_group(nbytes)
        if self.group_observer is not None:
            try:
                self.group_observer(trigger, group.nrecords, nbytes, fsync_s)
            except Exception:           # metrics must never stop the journal
                pass
        self._syncing = False
        self.cv.notify_all()
        self.durable.publish(self.synced_seq)
        if self._async:
            self._writer_cv.notify()
        if self.files.zeros_due():
            self._prealloc_cv.notify()

    # -- waiting for durability --------------------------------------------------------

    def wait_durable(self, seq: int, timeout: float | None = None) -> None:
        """Block until the journal is durable up to ``seq``; the caller holds no lock.
        While a group is being synced the waiter sleeps in ``durable`` outside the bookie
        lock, and returns without taking it again once the sync covers it; a waiter the sync
        does not cover sleeps on, unless it is the one picked to lead the next group."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                if self.durable.synced >= seq and not (self._failed and self._failed_at(seq)):
                    return
                epoch = self.durable.epoch
                if not self._syncing or self._closed or self._error is not None:
                    # no sync under way (as far as a look without the lock tells): lead one,
                    # or find that one started (or why none will); a sync that ends after the
                    # epoch was read moves it, so the wait below cannot miss it
                    with self._lock:
                        epoch = self.durable.epoch
                        if self._step(seq, deadline):
                            return
                elif deadline is not None and time.monotonic() >= deadline:
                    with self.cv:
                        if self._step(seq, deadline):     # raises TimeoutError unless durable
                            return
                left = 1.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
                self.durable.wait(seq, epoch, min(left, 1.0))
        except BaseException:
            # a publish may have picked this waiter to lead the next group: pick another
            self.durable.publish(0)
            raise

    def wait_durable_locked(self, seq: int, timeout: float | None = None) -> None:
        """wait_durable for a caller holding cv (it is released while waiting)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._step(seq, deadline):
            self.cv.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0))

    def _step(self, seq: int, deadline) -> bool:
        """One look at ``seq`` (cv held): True once durable; leads a group when none is
        under way, or waits for the group timer; False while another leader's sync is under
        way (the caller waits for it). Raises when it failed or the deadline passed."""
        while True:
            if self._failed:
                self._raise_failed(seq)
            if self.synced_seq >= seq:
                return True
            if self._error is not None:
                raise EmbedlogError(f"journal failed: {self._error}") from self._error
            if self._closed:
                raise EmbedlogError("journal closed before the add was durable")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("journal did not become durable in time")
            if self._syncing:
                return False
            trigger, wait_s = self._trigger(time.monotonic())
            if trigger:
                self._lead(trigger)
                continue
            self.cv.wait(left if wait_s is None else wait_s if left is None else min(wait_s, left))

    def covered_by_checkpoint(self, seq: int) -> int:
        """The seq a checkpoint of memtables holding records up to ``seq`` waits for and
        marks (cv held): ``seq`` itself, or, inside a group a full disk failed, that group's
        start. The failed group's entries were taken back out of the memtable and its bytes
        cut off the file, so nothing of it needs to be durable; waiting for it instead
        failed every checkpoint until a later add moved the memtable's seq, and a bookie
        read-only for that very reason takes no add."""
        for lo, hi, _exc in reversed(self._failed):
            if lo < seq <= hi:
                return lo
            if hi < seq:
                break
        return seq

    def _failed_at(self, seq: int) -> bool:
        return bool(self._failed) and any(lo < seq <= hi for lo, hi, _exc in tuple(self._failed))

    def _note_failed(self, start_seq: int, end_seq: int, exc) -> None:
        if self._failed and self._failed[-1][1] == start_seq:
            self._failed[-1] = (self._failed[-1][0], end_seq, self._failed[-1][2])
        else:
            self._failed.append((start_seq, end_seq, exc))

    def _raise_failed(self, seq: int) -> None:
        """A seq in a group a full disk failed is never durable."""
        for lo, hi, exc in self._failed:
            if lo < seq <= hi:
                raise EmbedlogError(f"journal write failed (disk full): {exc}") from exc

    def sync_if_idle(self, seq: int) -> bool:
        """Make ``seq`` durable in the calling thread when the journal is idle and that is
        quick (cv held): no group being written, nothing waiting for the writer thread, the
        pending group due now (no group timer to wait for), no roll or preallocation in the
        way, and fdatasync recently under SYNC_HERE_MAX_S. True once durable (raises as
        wait_durable would); False, having done nothing, otherwise (the caller hands ``seq``
        to on_durable). A server's lone add then crosses no thread, as an embedded lone
        writer leads its own group: two thread wake-ups less per lone add."""
        if (self._syncing or self._async or self._closed or self._error is not None
                or self.files.claim is not None or self._needs_roll
                or self.files.offset + self.buffer.nbytes > self.files.max_bytes
                or self._fsync_recent_s > SYNC_HERE_MAX_S):
            return False
        if self.synced_seq < seq and self._trigger(time.monotonic())[0] is None:
            return False
        return self._step(seq, None)       # leads the due group; raises for a failed one

    def on_durable(self, seq: int, callback) -> None:
        """Call ``callback(error_or_None)`` from the writer thread once ``seq`` is durable."""
        self._async.append((seq, callback))
        self._writer_cv.notify()

    # -- threads ------------------------------------------------------------------------

    def _writer_loop(self) -> None:
        interval_s = self.config.journal_page_cache_flush_interval_ms / 1000.0
        last_interval_sync = time.monotonic()
        while True:
            done = []
            with self.cv:
                while not self._closed and not self._async and not (
                        self.buffer.nbytes and not self.config.journal_flush_when_queue_empty):
                    if not self.config.journal_sync_data and self.written_seq:
                        self._writer_cv.wait(interval_s)
                        break
                    self._writer_cv.wait()
                if self._closed and not self._async:
                    return
                try:
                    if self._async:
                        self.wait_durable_locked(self._async[-1][0])
                    elif self.buffer.nbytes and not self._syncing:
                        trigger, wait_s = self._trigger(time.monotonic())
                        if trigger:
                            self._lead(trigger)
                        else:
                            self.cv.wait(wait_s)
                    stuck = None
                except BaseException as exc:   # the waiters it concerns are told below
                    stuck = exc if (self._closed or self._error is not None) else None
                while self._async:
                    seq = self._async[0][0]
                    try:
                        self._raise_failed(seq)
                        if stuck is not None:
                            raise EmbedlogError(f"journal failed: {stuck}") from stuck
                    except EmbedlogError as exc:
                        done.append((self._async.popleft()[1], exc))
                        continue
                    if seq > self.synced_seq:
                        break                  # a later group makes it durable (or fails it)
                    done.append((self._async.popleft()[1], None))
                # not while a leader writes: its roll may be changing the file under us
                if not self.config.journal_sync_data and not self._syncing and \
                        time.monotonic() - last_interval_sync >= interval_s and self.files.fd >= 0:
                    self.files.sync()
                    self.stats["interval"] += 1
                    last_interval_sync = time.monotonic()
            for cb, failed in done:
                try:
                    cb(failed)
                except Exception:         # one caller's callback must not end the journal thread
                    log.exception("journal: a durability callback failed")

    def _prealloc_loop(self) -> None:
        """Keep zeros written ahead of the tail so the common fdatasync only flushes data,
        while the file policy wants them (JournalFiles.zeros_wanted)."""
        files = self.files
        while True:
            with self.cv:
                while not self._closed and (self._rolling or not files.zeros_due()):
                    self._prealloc_cv.wait(0.5)
                if self._closed:
                    return
                # never under the write in progress (reserved_end) nor right at the head
                # where the next group lands
                head = max(files.offset, self._reserved_end) + self.buffer.nbytes + (1 << 20)
                claim = files.claim_zeros(head)
                if claim is None:
                    self._prealloc_cv.wait(0.5)
                    continue
            failpoints.hit("journal.prealloc_before_zero")
            wrote = files.write_zeros(claim)   # fails if closed under us by a roll, or no room
            with self.cv:
                files.end_claim(claim, wrote)
                self.cv.notify_all()
                if not wrote and not self._closed:
                    self._prealloc_cv.wait(0.5)

    def close(self) -> None:
        with self.cv:
            if self.buffer.nbytes and self._error is None:
                self.wait_durable_locked(self.appended_seq)
            self._closed = True
            self.cv.notify_all()
            self.durable.wake()
            self._writer_cv.notify_all()
            self._prealloc_cv.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        if self._busy is not None:
            self._busy.close()
        self.files.close()

    # -- retention ---------------------------------------------------------------------

    def trim(self, mark_file_id: int) -> list[int]:
        """Delete (or keep for reuse) the journals older than the mark: JournalFiles.trim."""
        return self.files.trim(mark_file_id)

    def give_back_spares(self) -> int:
        """Delete the journal files kept for reuse (the disk monitor, short of room);
        returns the bytes freed."""
        return self.files.give_back_spares()
