"""The journal: group commit, file rolling and preallocation (its LastLogMark is in
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
and for the time-based trigger.

Positions: every byte ever appended gets a sequence number (``appended_seq``);
``synced_seq`` says how far the journal is durable. ``position_of(seq)`` turns
a sequence number into the (journal id, offset) a LastLogMark stores.
"""
from __future__ import annotations

import collections
import errno
import logging
import os
import threading
import time

from embedlog._native import (journal_format as jformat, journal_buffer as jbuffer,
                              journal_waiters as jwaiters)
from embedlog import failpoints, fileio
from embedlog.fileio import fsync_dir, no_space as _no_space, private_dir
from embedlog.errors import EmbedlogError, TimeoutError

log = logging.getLogger("embedlog.bookie")
TRIGGERS = ("queue_empty", "time", "bytes", "entries", "interval")
ALIGN = jbuffer.DIRECT_ALIGN_BYTES      # O_DIRECT's unit: address, length and offset


def journal_ids(directory: str, suffix: str = ".txn") -> list[int]:
    """The ids of the journal files in ``directory`` (``.free``: those kept for reuse)."""
    ids = []
    for name in os.listdir(directory):
        if name.endswith(suffix):
            try:
                ids.append(int(name[:-len(suffix)], 16))
            except ValueError:
                pass
    return sorted(ids)


FREE = ".free"                    # a trimmed journal kept for reuse (replay never reads it)
# sync_if_idle syncs in its caller's thread (a server's loop, which serves nothing else
# meanwhile) only while fdatasync takes less than this
SYNC_HERE_MAX_S = 0.0005
MAX_FREE = 8                      # journals kept for reuse, or as many as one trim frees ...
MAX_FREE_BURST = 16               # ... up to this: a lagging checkpoint lets the journal roll
                                  # more files than MAX_FREE, and a pool of eight ran dry then
# Zeros are written ahead of the tail only while the recent groups (a moving mean over about
# eight) are smaller than this, and groups go out with O_DIRECT: a small group's fdatasync
# costs half as much again when it must also commit the file's new size and blocks (4 KiB:
# 49 vs 73 us on this VM), and its zeros cost a disk with bandwidth to spare nothing it was
# doing; a large group extends the file instead, because its zeros would double the bytes
# it writes (1 MiB of zeros: 1.8 ms at the 570 MB/s zeros go at) where committing the new
# size and blocks costs a few metadata blocks and 0.2 ms (docs/FORMATS.md, "Preallocation")
PREALLOC_GROUP_BYTES_MAX = 64 << 10



def prealloc_floor(prealloc_bytes: int) -> int:
    """The size a journal file has from its creation: its header block and the zeros
    written ahead at once (its header records it, see jformat.file_min_size)."""
    return ALIGN + min(prealloc_bytes, 4 << 20)

class Journal:
    def __init__(self, directory: str, config, cv: threading.Condition, lock):
        self.directory = directory
        self.config = config
        self.cv = cv                                   # sync waiters: a group is durable
        self.durable = jwaiters.DurableSeq()                 # the same, for waiters outside the lock
        # the writer and the preallocator wait on conditions of their own (same lock), so a
        # finished group wakes only those who need it
        self._writer_cv = threading.Condition(lock)
        self._prealloc_cv = threading.Condition(lock)
        private_dir(directory)
        self.buffer = jbuffer.JournalBuffer()
        self._spare = jbuffer.JournalBuffer()
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
        self._fsync_recent_s = 0.0        # moving mean of the last ~8 fdatasyncs (sync_if_idle)
        self.stats = {t: 0 for t in TRIGGERS}
        self.stats.update(fsyncs=0, groups=0, group_entries_max=0, bytes_written=0,
                          records_written=0, fsync_time_s=0.0, memory_throttled=0,
                          zeros_written=0, files_reused=0, groups_extending=0)
        # called after each group (lock held; must be quick): (trigger, records, bytes,
        # fsync seconds or None) -- the admin server's histograms
        self.group_observer = None
        self.files: list[tuple[int, int, int]] = []   # (start seq, journal id, start offset)
        self._fd = -1
        self._path: str | None = None     # the file _fd is open on
        self._dfd = -1                    # the same file opened O_DIRECT (journal_direct_writes)
        self._direct = config.journal_direct_writes
        self._tail = b""                  # the file's bytes in the block the next group starts in
        self._file_id = 0
        self._offset = 0
        self._zero_end = 0
        self._salt = 0                    # xored into the record crcs of this file's life
        self._claim = None                # (file id, start) being zero-filled
        self._group_bytes_mean = None     # moving mean of group sizes (None: no group yet)
        self._rolling = False
        self._reserved_end = 0            # file offset the write in progress will reach
        self._max_bytes = config.journal_max_size_mb * 1024 * 1024
        self._max_memory = config.journal_max_memory_size_mb * 1024 * 1024
        self._prealloc = config.journal_pre_alloc_size_mb * 1024 * 1024
        self._threads: list[threading.Thread] = []
        # files kept for reuse: a roll reusing one, a trim keeping one and the disks giving
        # them back take turns (a file given back under a roll that opened it failed the roll)
        self._spares_lock = threading.Lock()

    # -- files ------------------------------------------------------------------

    def start(self, mark=None) -> None:
        """Open a new journal file (a restarted bookie never appends to an old one);
        ``mark`` records each new file as the journal head. On a full disk the bookie still
        starts: the file is opened by the first group once there is room."""
        self._mark = mark
        # the first group lands right after the header (later ones: _lead says where; it
        # alone may move an empty buffer, under the lock, as appenders fill it under it)
        self.buffer.set_lead(jformat.HEADER_SIZE)
        self._sync_newest()
        try:
            self._open_file()
        except OSError as exc:
            if not _no_space(exc):
                raise
            self._needs_roll = True
            self.stats["no_space"] = self.stats.get("no_space", 0) + 1
        for target, name in ((self._writer_loop, "embedlog-journal"),
                             (self._prealloc_loop, "embedlog-journal-prealloc")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _sync_newest(self) -> None:
        """Sync the last run's newest journal before a later one is begun (with
        journal_sync_data=False its tail may still be only in the page cache): replay takes
        a bad last record in a journal that a later one follows as damage, never as a torn
        write, since every roll syncs the old journal first too."""
        existing = journal_ids(self.directory)
        if not existing:
            return
        path = os.path.join(self.directory, "%x.txn" % existing[-1])
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fileio.sync(fd, path, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def _open_file(self) -> None:
        existing = journal_ids(self.directory)
        new_id = max([int(time.time() * 1000)] + [i + 1 for i in existing])
        path = os.path.join(self.directory, "%x.txn" % new_id)
        prev = max(existing, default=0)
        reused = self._reuse_file(new_id, prev, path) if self.config.journal_reuse_files else None
        if reused is not None:
            fd, header, zero_end, salt = reused
            dfd = -1
            try:
                dfd = self._open_direct(path)
                if getattr(self, "_mark", None) is not None:
                    self._mark.write_head(new_id)
            except BaseException:
                os.close(fd)
                raise
        else:
            fd, dfd, header, zero_end = self._new_file(new_id, prev, path)
            salt = 0
        for old in (self._fd, self._dfd):
            if old >= 0:
                os.close(old)
        self._fd, self._dfd, self._file_id, self._offset = fd, dfd, new_id, jformat.HEADER_SIZE
        self._tail = header
        self._salt = salt
        self._dropped_to = 0                 # pages below this were dropped from the cache
        self._path = path
        self._zero_end = zero_end
        self.files.append((self.written_seq, new_id, jformat.HEADER_SIZE))
        del self.files[:-64]

    def _new_file(self, new_id: int, prev: int, path: str):
        """A new journal file, its header and zeros written ahead: (fd, O_DIRECT fd or -1,
        header, end of the zeros)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        dfd = -1
        header = jformat.file_header(new_id, prev)
        try:
            # the header's whole block, so O_DIRECT writes start on block boundaries after it
            if os.pwrite(fd, header + bytes(ALIGN - len(header)), 0) != ALIGN:
                raise OSError(errno.ENOSPC, "short write of a journal header")
            dfd = self._open_direct(path)
            zero_end = prealloc_floor(self._prealloc)
            try:
                jbuffer.write_zeros(fd if dfd < 0 else dfd, ALIGN, zero_end - ALIGN)
            except OSError as exc:
                if not _no_space(exc):
                    raise               # zeros ahead are a speed-up: without room, none
            else:
                # the header says how long the zeros made the file: replay takes a file found
                # shorter as cut (records after the cut would be lost without a word)
                header = jformat.file_header(new_id, prev, zero_end)
                os.pwrite(fd, header, 0)
                self.stats["zeros_written"] += zero_end - ALIGN
            fileio.sync(fd, path, jformat.HEADER_SIZE, size=os.fstat(fd).st_size, data_only=False,
                        dirs_up_to=self.directory)
            if getattr(self, "_mark", None) is not None:
                self._mark.write_head(new_id)
        except BaseException:
            os.close(fd)                # no half-made journal file is left for replay
            if dfd >= 0:
                os.close(dfd)
            os.unlink(path)
            raise
        return fd, dfd, header, zero_end

    def _reuse_file(self, new_id: int, prev: int, path: str):
        """A trimmed journal made journal ``new_id``, or None if none is kept: its new header
        (a salt its previous life's records do not check with) is synced under its old name,
        then it is renamed, so a crash leaves either a kept file or a whole new journal.
        Returns (fd, header, its size, salt)."""
        with self._spares_lock:
            return self._reuse_spare(new_id, prev, path)

    def _reuse_spare(self, new_id: int, prev: int, path: str):
        for old_id in journal_ids(self.directory, FREE):
            free = os.path.join(self.directory, "%x%s" % (old_id, FREE))
            try:
                fd = os.open(free, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                old_header = os.pread(fd, jformat.HEADER_SIZE, 0)
                try:
                    jformat.check_file_header(old_header)
                    old_salt = jformat.file_salt(old_header)[1]
                except ValueError:
                    old_salt = 0
                salt = jformat.new_salt(new_id, old_salt)
                header = jformat.file_header(new_id, prev, size, old_id, salt)
                failpoints.hit("journal.reuse_before_header")
                if os.pwrite(fd, header + bytes(ALIGN - len(header)), 0) != ALIGN:
                    raise OSError(errno.ENOSPC, "short write of a journal header")
                fileio.sync(fd, free, ALIGN, data_only=False)
                failpoints.hit("journal.reuse_before_rename")
                fileio.reuse(free, path)
            except BaseException:
                os.close(fd)
                raise
            self.stats["files_reused"] += 1
            return fd, header, size, salt
        return None

    def _open_direct(self, path: str) -> int:
        """The journal file opened O_DIRECT, or -1 where that is off or refused (tmpfs)."""
        if not self._direct:
            return -1
        try:
            return os.open(path, os.O_RDWR | os.O_DIRECT)
        except OSError as exc:
            log.info("journal %s: O_DIRECT refused (%s); buffered writes", path, exc)
            self._direct = False
            return -1

    @property
    def started(self) -> bool:
        """Whether ``start`` ran: its threads need ``close``."""
        return bool(self._threads)

    @property
    def direct_writes(self) -> bool:
        """Whether groups are written with O_DIRECT (journal_direct_writes, if allowed)."""
        return self._dfd >= 0

    @property
    def current_file_id(self) -> int:
        return self._file_id

    def position_of(self, seq: int) -> tuple[int, int]:
        """The (journal id, offset) of sequence number ``seq`` (written or not)."""
        for start_seq, file_id, start_off in reversed(self.files):
            if seq >= start_seq:
                return file_id, start_off + (seq - start_seq)
        if not self.files:
            # a start on a full disk found no room for a journal file: nothing was journalled
            # since the mark, which stays where it is
            mark = getattr(self, "_mark", None)
            if mark is None or mark.persisted is None:
                raise EmbedlogError(f"journal {self.directory}: no journal file is open yet "
                                    "(no room for one)")
            return tuple(mark.persisted)
        start_seq, file_id, start_off = self.files[0]
        return file_id, start_off

    # -- appending (callers hold cv) ---------------------------------------------

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
        buf = self.buffer
        self.buffer, self._spare = self._spare, buf
        start_seq, end_seq = self.written_seq, self.written_seq + buf.nbytes
        self._taken_seq = end_seq
        nrecords = buf.nrecords
        self._syncing = True
        self._oldest_pending = None
        rolled = self._needs_roll
        if self._offset + buf.nbytes > self._max_bytes and self._offset > jformat.HEADER_SIZE:
            rolled = True
        # never write where the preallocator is writing zeros, nor roll under it
        while self._claim is not None and self._claim[0] == self._file_id and (
                rolled or self._offset + buf.nbytes > self._claim[1]):
            self.cv.wait()
        self._rolling = rolled
        # the preallocator must stay beyond what this write covers (it runs meanwhile)
        self._reserved_end = (jformat.HEADER_SIZE if rolled else self._offset) + buf.nbytes
        self.buffer.set_lead(self._reserved_end)         # where the next group will start
        self.stats[trigger] += 1
        self.cv.release()
        attempted = None                  # (file, offset) the group's bytes went to
        try:
            failpoints.hit("journal.before_write")
            if rolled:
                self._open_file_locked_out(start_seq, sync_old=not self._needs_roll)
            attempted = (self._path, self._offset, buf.nbytes)
            buf.salt(self._salt)
            self._write(buf)
            self._offset += buf.nbytes
            sync = self.config.journal_sync_data
            if sync:
                failpoints.hit("journal.before_sync")
                t0 = time.perf_counter()
                fileio.sync(self._fd, self._path, self._offset)
                fsync_s = time.perf_counter() - t0
                self.stats["fsync_time_s"] += fsync_s
                self._fsync_recent_s += (fsync_s - self._fsync_recent_s) / 8
                failpoints.hit("journal.after_sync")
                self._drop_synced_pages()
        except BaseException as exc:
            if _no_space(exc) and attempted is not None:
                exc = self._cut_off(attempted, exc)
            self.cv.acquire()
            lost = []
            if _no_space(exc):
                # this group fails (none of it is acknowledged); the journal goes on in a
                # new file as soon as there is room for one
                self._note_failed(start_seq, end_seq, exc)
                self._needs_roll = True
                lost = buf.entry_ids()
                buf.clear()
                self.written_seq = self.synced_seq = end_seq
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
            if isinstance(exc, EmbedlogError) or not isinstance(exc, Exception):
                raise
            raise EmbedlogError(f"journal write failed{' (disk full)' if _no_space(exc) else ''}: "
                                f"{exc}") from exc
        self.cv.acquire()
        self._needs_roll = False
        self._rolling = False
        buf.clear()
        self.written_seq = end_seq
        if sync:
            self.synced_seq = end_seq
            self.stats["fsyncs"] += 1
        else:
            self.synced_seq = end_seq        # acknowledged after write(2): the user's choice
        self.stats["groups"] += 1
        self.stats["bytes_written"] += end_seq - start_seq
        self.stats["records_written"] += nrecords
        self.stats["group_entries_max"] = max(self.stats["group_entries_max"], nrecords)
        if self._offset > self._zero_end:
            self.stats["groups_extending"] += 1      # written past the zeros: the file grew
        mean = self._group_bytes_mean
        nbytes = end_seq - start_seq
        self._group_bytes_mean = nbytes if mean is None else mean + (nbytes - mean) / 8
        if self.group_observer is not None:
            try:
                self.group_observer(trigger, nrecords, end_seq - start_seq, fsync_s if sync else None)
            except Exception:           # metrics must never stop the journal
                pass
        self._syncing = False
        self.cv.notify_all()
        self.durable.publish(self.synced_seq)
        if self._async:
            self._writer_cv.notify()
        if self._zero_end - self._offset < self._prealloc and self._zeros_wanted():
            self._prealloc_cv.notify()

    def _zeros_wanted(self) -> bool:
        """Whether the preallocator should write zeros ahead now (cv held): always for
        buffered writes (a torn buffered write past the end of a file can leave it ending
        inside a record, which replay must take as damage; zeros make it read as torn),
        with O_DIRECT only while the recent groups are small (PREALLOC_GROUP_BYTES_MAX) and
        once a group has shown how large they are."""
        if self._dfd < 0:
            return True
        mean = self._group_bytes_mean
        return mean is not None and mean < PREALLOC_GROUP_BYTES_MAX

    def _cut_off(self, attempted, exc):
        """A group failed for lack of space after its bytes may have reached the file (a
        failed sync, a partial write): cut them off, or a crash would replay an add that
        was failed. Returns the error the group fails with; if the cut fails too, one that
        fails the journal (When in doubt, fail)."""
        path, offset, nbytes = attempted
        try:
            # zeros over the group, keeping the file's size: a newest journal that ends
            # short of its preallocation reads as cut at the next start. Past the
            # preallocated space the zeros may find no room either: then the file is cut
            try:
                os.pwrite(self._fd, bytes(nbytes), offset)
            except OSError as err:
                if not _no_space(err):
                    raise
                os.ftruncate(self._fd, offset)
            fileio.sync(self._fd, path, offset, data_only=False)
        except OSError as err:
            log.error("journal %s: cannot cut off a failed group at %d (%s)", path, offset, err)
            return EmbedlogError(f"journal {path}: a failed group could not be cut off at "
                                 f"{offset} ({err}) after {exc}")
        self._offset = offset
        return exc

    def _write(self, buf) -> None:
        """The group at the tail (the leader, outside the lock)."""
        if self._dfd >= 0:
            try:
                self._tail = buf.write_direct(self._dfd, self._offset, self._tail)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.warning("journal %s: O_DIRECT write refused (%s); buffered writes from now on",
                            self._path, exc)
                self._direct = False
                os.close(self._dfd)
                self._dfd = -1
        buf.write_to(self._fd, self._offset)

    def _drop_synced_pages(self) -> None:
        """Give the whole synced pages back to the kernel (the leader, outside the lock);
        O_DIRECT writes left none there."""
        end = self._offset & ~4095
        if self._dfd < 0 and self.config.journal_remove_pages_from_page_cache and end > self._dropped_to:
            os.posix_fadvise(self._fd, self._dropped_to, end - self._dropped_to,
                             os.POSIX_FADV_DONTNEED)
            self._dropped_to = end

    def _open_file_locked_out(self, start_seq: int, sync_old: bool = True) -> None:
        if sync_old and self._fd >= 0:
            fileio.sync(self._fd, self._path, self._offset)
        self._open_file()
        self.files[-1] = (start_seq, self._file_id, jformat.HEADER_SIZE)

    def wait_durable(self, seq: int, timeout: float | None = None) -> None:
        """Block until the journal is durable up to ``seq``; the caller holds no lock.
        While a group is being synced the waiter sleeps in ``durable`` outside the bookie
        lock, and returns without taking it again once the sync covers it; a waiter the sync
        does not cover sleeps on, unless it is the one picked to lead the next group."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._wait_durable(seq, deadline)
        except BaseException:
            # a publish may have picked this waiter to lead the next group: pick another
            self.durable.publish(0)
            raise

    def _wait_durable(self, seq: int, deadline) -> None:
        while True:
            if self.durable.synced >= seq and not self._failed_at(seq):
                return
            epoch = self.durable.epoch
            if not self._syncing or self._closed or self._error is not None:
                # no sync under way (as far as a look without the lock tells): lead one, or
                # find that one started (or why none will); a sync that ends after the epoch
                # was read moves it, so the wait below cannot miss it
                with self.cv:
                    epoch = self.durable.epoch
                    if self._step(seq, deadline):
                        return
            elif deadline is not None and time.monotonic() >= deadline:
                with self.cv:
                    if self._step(seq, deadline):     # raises TimeoutError unless durable
                        return
            left = 1.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
            self.durable.wait(seq, epoch, min(left, 1.0))

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
                or self._claim is not None or self._needs_roll
                or self._offset + self.buffer.nbytes > self._max_bytes
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
                        time.monotonic() - last_interval_sync >= interval_s and self._fd >= 0:
                    fileio.sync(self._fd, self._path, self._offset)
                    self.stats["interval"] += 1
                    last_interval_sync = time.monotonic()
            for cb, failed in done:
                try:
                    cb(failed)
                except Exception:         # one caller's callback must not end the journal thread
                    log.exception("journal: a durability callback failed")

    def _prealloc_loop(self) -> None:
        """Keep zeros written ahead of the tail so the common fdatasync only flushes data,
        while groups are small (_zeros_wanted); large ones extend the file."""
        chunk = self._prealloc
        while True:
            with self.cv:
                while not self._closed and (self._rolling or self._zero_end - self._offset >= chunk
                                            or not self._zeros_wanted()):
                    self._prealloc_cv.wait(0.5)
                if self._closed:
                    return
                fd, file_id = (self._dfd if self._dfd >= 0 else self._fd), self._file_id
                path = self._path
                # contiguous with the zeros already written, but never under the write in
                # progress (reserved_end) nor right at the head where the next group lands;
                # whole blocks, as O_DIRECT needs
                head = max(self._offset, self._reserved_end) + self.buffer.nbytes + (1 << 20)
                start = -(-max(self._zero_end, head) // ALIGN) * ALIGN
                if start + chunk > self._max_bytes + chunk:
                    self._prealloc_cv.wait(0.5)
                    continue
                self._claim = (file_id, start)
            failpoints.hit("journal.prealloc_before_zero")
            try:
                jbuffer.write_zeros(fd, start, chunk)
                fileio.sync(fd, path, None, size=start + chunk)
                wrote = True
            except OSError:
                wrote = False             # closed under us by a roll, or no room: retry later
            with self.cv:
                self._claim = None
                if wrote:
                    self.stats["zeros_written"] += chunk
                if wrote and self._file_id == file_id:
                    self._zero_end = start + chunk
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
        for fd in (self._fd, self._dfd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._dfd = -1

    # -- retention ---------------------------------------------------------------------

    def trim(self, mark_file_id: int) -> list[int]:
        """Delete journals older than the mark, keeping journal_max_backups of them; with
        journal_reuse_files, whole ones (of journal_max_size_mb) are kept for reuse instead:
        at most MAX_FREE, or as many as this trim frees up to MAX_FREE_BURST (the journal held
        those files already; the next stretch between checkpoints may need them again)."""
        with self._spares_lock:
            return self._trim(mark_file_id)

    def _trim(self, mark_file_id: int) -> list[int]:
        old = [i for i in journal_ids(self.directory) if i < mark_file_id]
        keep = self.config.journal_max_backups
        victims = old[:-keep] if keep else old
        kept = journal_ids(self.directory, FREE)
        reuse = self.config.journal_reuse_files and self._room_for_spares()
        free = len(kept) if reuse else 0
        most = max(MAX_FREE, min(len(victims), MAX_FREE_BURST)) if reuse else 0
        if not self.config.journal_reuse_files:
            for i in kept:                  # kept while reuse was on: nothing reads them now
                os.unlink(os.path.join(self.directory, "%x%s" % (i, FREE)))
        for i in victims:
            path = os.path.join(self.directory, "%x.txn" % i)
            try:
                if free < most and self._filled(os.path.getsize(path)):
                    fileio.reuse(path, os.path.join(self.directory, "%x%s" % (i, FREE)))
                    free += 1
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass                # already trimmed: deleting is idempotent
        if victims or (kept and not self.config.journal_reuse_files):
            fsync_dir(self.directory)
        return victims

    def _filled(self, size: int) -> bool:
        """Whether a journal of ``size`` bytes was rolled because it was full (worth keeping
        for reuse), not cut short by a restart: a preallocated file reaches
        journal_max_size_mb, one that large groups extended stops short of it by less than
        the group that did not fit, taken here as an eighth of it."""
        return size >= self._max_bytes - self._max_bytes // 8

    def _room_for_spares(self) -> bool:
        """Whether trimmed journals may be kept for reuse: they only spare the zeros of a
        new file, so they never take what the journal needs. Its file system must stay
        below disk_usage_warn_threshold with room for a whole journal and its zeros
        besides; a small journal file system filled by eight kept files stayed read-only."""
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return False
        total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        return (total > 0 and 1.0 - usable / total < self.config.disk_usage_warn_threshold
                and usable >= self._max_bytes + self._prealloc)

    def give_back_spares(self) -> int:
        """Delete the journal files kept for reuse: the first thing given back when the
        journal's file system runs short of room (the disk monitor calls this). Returns the
        bytes freed."""
        freed = n = 0
        with self._spares_lock:
            for i in journal_ids(self.directory, FREE):
                path = os.path.join(self.directory, "%x%s" % (i, FREE))
                try:
                    size = os.stat(path).st_blocks * 512
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                freed += size
                n += 1
            if n:
                fsync_dir(self.directory)
        if n:
            self.stats["spares_given_back"] = self.stats.get("spares_given_back", 0) + n
            log.warning("journal %s: short of room, %d journal files kept for reuse deleted "
                        "(%.1f MiB given back)", self.directory, n, freed / (1 << 20))
        return freed
