"""The journal: group commit, file rolling, preallocation, LastLogMark and replay.

Appenders frame records into ``buffer`` while holding the bookie's lock (the
Condition ``cv`` wraps it). Whoever then needs durability and finds no sync
under way becomes the leader of a group: it takes the buffer (swapping in an
empty one), writes it and fdatasyncs it with the GIL released, and wakes every
waiter whose records the sync covered. Adds that arrive meanwhile form the
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
import struct
import threading
import time

from embedlog._native import journal as nj
from embedlog import failpoints, fileio
from embedlog.fileio import atomic_write, fsync_dir, private_dir
from embedlog.errors import EmbedlogError, JournalCorruptedError

log = logging.getLogger("embedlog.bookie")
TRIGGERS = ("queue_empty", "time", "bytes", "entries", "interval")
_MARK = struct.Struct(">QQ")


def _no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def journal_ids(directory: str) -> list[int]:
    ids = []
    for name in os.listdir(directory):
        if name.endswith(".txn"):
            try:
                ids.append(int(name[:-4], 16))
            except ValueError:
                pass
    return sorted(ids)


class LastLogMark:
    """(journal id, offset): everything before it is in ledger storage.

    Stored as ``lastMark`` in each ledger directory: id:u64 offset:u64 crc32c:u32,
    written to a temporary file, fsynced and renamed, so a crash leaves the old
    mark or the new one, never a torn one. The largest mark over all directories wins.

    A damaged lastMark (a short file, a bad checksum) is set aside as ``lastMark.damaged``
    and the others decide; when no directory holds a good one, replay starts at the
    oldest journal (a full replay: replaying what is already stored is harmless). Either
    way the fallback is logged as an error and reported in ``damaged``.

    ``journalHead`` beside it names the newest journal file (id:u64 crc32c:u32), written
    when a journal file is created, so a newest journal that went missing is noticed.
    """

    def __init__(self, directories: list[str]):
        self.directories = directories
        self.persisted = (0, 0)
        self.damaged: list[str] = []      # what read() set aside
        # checkpoints from the sync thread and from close() may meet here: one at a time,
        # so they neither share lastMark.tmp nor move the mark backwards
        self._lock = threading.Lock()

    def read(self) -> tuple[int, int]:
        best, good = (0, 0), 0
        for d in self.directories:
            path = os.path.join(d, "lastMark")
            try:
                data = open(path, "rb").read()
            except FileNotFoundError:
                continue
            if len(data) != 20 or nj_crc(data[:16]) != struct.unpack(">I", data[16:])[0]:
                self.damaged.append(f"{path} ({len(data)} bytes, offset 0: "
                                    f"{'short' if len(data) != 20 else 'bad checksum'})")
                os.replace(path, path + ".damaged")
                continue
            good += 1
            best = max(best, _MARK.unpack(data[:16]))
        if self.damaged:
            log.error("damaged LastLogMark: %s; replaying from %s", "; ".join(self.damaged),
                      f"the best good mark {best}" if good else "the oldest journal (full replay)")
        self.persisted = best
        return best

    def persist(self, mark: tuple[int, int]) -> bool:
        """Write ``mark`` unless it would move the mark backwards; True if written."""
        with self._lock:
            return self._persist(mark)

    def _persist(self, mark: tuple[int, int]) -> bool:
        if mark <= self.persisted:
            return False
        data = _MARK.pack(*mark)
        data += struct.pack(">I", nj_crc(data))
        for d in self.directories:
            atomic_write(os.path.join(d, "lastMark"), data)
        self.persisted = mark
        return True

    def write_head(self, journal_id: int) -> None:
        data = struct.pack(">Q", journal_id)
        for d in self.directories:
            atomic_write(os.path.join(d, "journalHead"), data + struct.pack(">I", nj_crc(data)))

    def read_head(self) -> int | None:
        """The newest journal file any directory recorded (None: not recorded)."""
        best = None
        for d in self.directories:
            try:
                data = open(os.path.join(d, "journalHead"), "rb").read()
            except FileNotFoundError:
                continue
            if len(data) == 12 and nj_crc(data[:8]) == struct.unpack(">I", data[8:])[0]:
                best = max(best or 0, struct.unpack(">Q", data[:8])[0])
        return best


def nj_crc(data: bytes) -> int:
    from embedlog._native.format import crc32c
    return crc32c(data)


class Journal:
    def __init__(self, directory: str, config, cv: threading.Condition, lock):
        self.directory = directory
        self.config = config
        self.cv = cv                                   # sync waiters: a group is durable
        # the writer and the preallocator wait on conditions of their own (same lock), so a
        # finished group wakes only those who need it
        self._writer_cv = threading.Condition(lock)
        self._prealloc_cv = threading.Condition(lock)
        private_dir(directory)
        self.buffer = nj.JournalBuffer()
        self._spare = nj.JournalBuffer()
        self.appended_seq = 0
        self.written_seq = 0
        self._taken_seq = 0               # end of the records a leader took out of the buffer
        self.synced_seq = 0
        self._syncing = False
        self._oldest_pending = None       # monotonic time of the first record not yet taken
        self._error: BaseException | None = None      # the journal cannot go on (EIO, ...)
        # a full disk fails the groups it hits, not the journal: their seq ranges, and a new
        # file before the next group (the failed write may have left part of itself behind)
        self._failed: collections.deque = collections.deque(maxlen=64)   # (from, to, error)
        self._needs_roll = False
        # (exc, entries of the failed group) -> None, cv held: the bookie takes those entries
        # back out of its memtable (they are not durable) and checks its disks
        self.on_failure = None
        self._closed = False
        self._async: collections.deque = collections.deque()   # (seq, callback)
        self.stats = {t: 0 for t in TRIGGERS}
        self.stats.update(fsyncs=0, groups=0, group_entries_max=0, bytes_written=0,
                          records_written=0, fsync_time_s=0.0, memory_throttled=0)
        # called after each group (lock held; must be quick): (trigger, records, bytes,
        # fsync seconds or None) -- the admin server's histograms
        self.group_observer = None
        self.files: list[tuple[int, int, int]] = []   # (start seq, journal id, start offset)
        self._fd = -1
        self._file_id = 0
        self._offset = 0
        self._zero_end = 0
        self._claim = None                # (file id, start) being zero-filled
        self._rolling = False
        self._reserved_end = 0            # file offset the write in progress will reach
        self._max_bytes = config.journal_max_size_mb * 1024 * 1024
        self._max_memory = config.journal_max_memory_size_mb * 1024 * 1024
        self._prealloc = config.journal_pre_alloc_size_mb * 1024 * 1024
        self._threads: list[threading.Thread] = []

    # -- files ------------------------------------------------------------------

    def start(self, mark: "LastLogMark | None" = None) -> None:
        """Open a new journal file (a restarted bookie never appends to an old one);
        ``mark`` records each new file as the journal head. On a full disk the bookie still
        starts: the file is opened by the first group once there is room."""
        self._mark = mark
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

    def _open_file(self) -> None:
        existing = journal_ids(self.directory)
        new_id = max([int(time.time() * 1000)] + [i + 1 for i in existing])
        path = os.path.join(self.directory, "%x.txn" % new_id)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if os.pwrite(fd, nj.file_header(new_id, max(existing, default=0)), 0) != nj.HEADER_SIZE:
                raise OSError(errno.ENOSPC, "short write of a journal header")
            try:
                nj.write_zeros(fd, nj.HEADER_SIZE, min(self._prealloc, 4 << 20), sync=False)
            except OSError as exc:
                if not _no_space(exc):
                    raise               # zeros ahead are a speed-up: without room, none
            os.fsync(fd)
            fsync_dir(self.directory)
            fileio.durable(path, nj.HEADER_SIZE)
            if getattr(self, "_mark", None) is not None:
                self._mark.write_head(new_id)
        except BaseException:
            os.close(fd)                # no half-made journal file is left for replay
            os.unlink(path)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._file_id, self._offset = fd, new_id, nj.HEADER_SIZE
        self._path = path
        self._zero_end = nj.HEADER_SIZE + min(self._prealloc, 4 << 20)
        self.files.append((self.written_seq, new_id, nj.HEADER_SIZE))
        del self.files[:-64]

    @property
    def current_file_id(self) -> int:
        return self._file_id

    def position_of(self, seq: int) -> tuple[int, int]:
        """The (journal id, offset) of sequence number ``seq`` (written or not)."""
        for start_seq, file_id, start_off in reversed(self.files):
            if seq >= start_seq:
                return file_id, start_off + (seq - start_seq)
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
        if self._offset + buf.nbytes > self._max_bytes and self._offset > nj.HEADER_SIZE:
            rolled = True
        # never write where the preallocator is writing zeros, nor roll under it
        while self._claim is not None and self._claim[0] == self._file_id and (
                rolled or self._offset + buf.nbytes > self._claim[1]):
            self.cv.wait()
        self._rolling = rolled
        # the preallocator must stay beyond what this write covers (it runs meanwhile)
        self._reserved_end = (nj.HEADER_SIZE if rolled else self._offset) + buf.nbytes
        self.stats[trigger] += 1
        self.cv.release()
        try:
            failpoints.hit("journal.before_write")
            if rolled:
                self._open_file_locked_out(start_seq, sync_old=not self._needs_roll)
            buf.write_to(self._fd, self._offset)
            self._offset += buf.nbytes
            sync = self.config.journal_sync_data
            if sync:
                failpoints.hit("journal.before_sync")
                t0 = time.perf_counter()
                nj.sync_fd(self._fd)
                fsync_s = time.perf_counter() - t0
                self.stats["fsync_time_s"] += fsync_s
                fileio.durable(self._path, self._offset)
                failpoints.hit("journal.after_sync")
        except BaseException as exc:
            self.cv.acquire()
            lost = []
            if _no_space(exc):
                # this group fails (none of it is acknowledged); the journal goes on in a
                # new file as soon as there is room for one
                self._failed.append((start_seq, end_seq, exc))
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
        if self.group_observer is not None:
            try:
                self.group_observer(trigger, nrecords, end_seq - start_seq, fsync_s if sync else None)
            except Exception:           # metrics must never stop the journal
                pass
        self._syncing = False
        self.cv.notify_all()
        if self._async:
            self._writer_cv.notify()
        if self._zero_end - self._offset < self._prealloc:
            self._prealloc_cv.notify()

    def _open_file_locked_out(self, start_seq: int, sync_old: bool = True) -> None:
        if sync_old and self._fd >= 0:
            nj.sync_fd(self._fd)
        self._open_file()
        self.files[-1] = (start_seq, self._file_id, nj.HEADER_SIZE)

    def wait_durable(self, seq: int, timeout: float | None = None) -> None:
        """Block until the journal is durable up to ``seq`` (cv held by caller)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_failed(seq)
            if self.synced_seq >= seq:
                return
            if self._error is not None:
                raise EmbedlogError(f"journal failed: {self._error}") from self._error
            if self._closed:
                raise EmbedlogError("journal closed before the add was durable")
            if not self._syncing:
                trigger, wait_s = self._trigger(time.monotonic())
                if trigger:
                    self._lead(trigger)
                    continue
            else:
                wait_s = None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    from embedlog.errors import TimeoutError
                    raise TimeoutError("journal did not become durable in time")
                wait_s = left if wait_s is None else min(wait_s, left)
            self.cv.wait(wait_s)

    def _raise_failed(self, seq: int) -> None:
        """A seq in a group a full disk failed is never durable."""
        for lo, hi, exc in self._failed:
            if lo < seq <= hi:
                raise EmbedlogError(f"journal write failed (disk full): {exc}") from exc

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
                        self.wait_durable(self._async[-1][0])
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
                if not self.config.journal_sync_data and \
                        time.monotonic() - last_interval_sync >= interval_s and self._fd >= 0:
                    nj.sync_fd(self._fd)
                    self.stats["interval"] += 1
                    last_interval_sync = time.monotonic()
            for cb, failed in done:
                cb(failed)

    def _prealloc_loop(self) -> None:
        """Keep zeros written ahead of the tail so the common fdatasync only flushes data."""
        chunk = self._prealloc
        while True:
            with self.cv:
                while not self._closed and (self._rolling or self._zero_end - self._offset >= chunk):
                    self._prealloc_cv.wait(0.5)
                if self._closed:
                    return
                fd, file_id = self._fd, self._file_id
                # contiguous with the zeros already written, but never under the write in
                # progress (reserved_end) nor right at the head where the next group lands
                head = max(self._offset, self._reserved_end) + self.buffer.nbytes + (1 << 20)
                start = max(self._zero_end, head)
                if start + chunk > self._max_bytes + chunk:
                    self._prealloc_cv.wait(0.5)
                    continue
                self._claim = (file_id, start)
            failpoints.hit("journal.prealloc_before_zero")
            try:
                nj.write_zeros(fd, start, chunk, sync=True)
                wrote = True
            except OSError:
                wrote = False             # closed under us by a roll, or no room: retry later
            with self.cv:
                self._claim = None
                if wrote and self._file_id == file_id:
                    self._zero_end = start + chunk
                self.cv.notify_all()
                if not wrote and not self._closed:
                    self._prealloc_cv.wait(0.5)

    def close(self) -> None:
        with self.cv:
            if self.buffer.nbytes and self._error is None:
                self.wait_durable(self.appended_seq)
            self._closed = True
            self.cv.notify_all()
            self._writer_cv.notify_all()
            self._prealloc_cv.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- retention ---------------------------------------------------------------------

    def trim(self, mark_file_id: int) -> list[int]:
        """Delete journals older than the mark, keeping journal_max_backups of them."""
        old = [i for i in journal_ids(self.directory) if i < mark_file_id]
        keep = self.config.journal_max_backups
        victims = old[:-keep] if keep else old
        for i in victims:
            os.unlink(os.path.join(self.directory, "%x.txn" % i))
        if victims:
            fsync_dir(self.directory)
        return victims


def check_chain(directory: str, mark_id: int, head: int | None) -> list:
    """Journal files replay needs that are missing, before anything is applied: the file
    the mark points into, a file between two that the later one's header names as its
    predecessor, and the newest file ``journalHead`` recorded. Returns descriptions."""
    ids = [i for i in journal_ids(directory) if i >= mark_id]
    missing = []
    if mark_id and mark_id not in ids:
        missing.append(f"{mark_id:x}.txn (the LastLogMark points into it)")
    prev_ids = {}
    for i in ids:
        path = os.path.join(directory, "%x.txn" % i)
        with open(path, "rb") as f:
            header = f.read(nj.HEADER_SIZE)
        if len(header) == nj.HEADER_SIZE:
            try:
                nj.check_file_header(header)
            except ValueError:
                continue                   # replay reports a bad header with its offset
            prev_ids[i] = nj.file_chain(header)
    for before, after in zip(ids, ids[1:]):
        prev = prev_ids.get(after)
        if prev is not None and prev != before:
            missing.append(f"{prev:x}.txn (written between {before:x}.txn and {after:x}.txn)"
                           if prev > before else
                           f"the chain: {after:x}.txn follows {prev:x}.txn, not {before:x}.txn")
    if head is not None and head >= mark_id and head not in ids and (not ids or head > ids[-1]):
        missing.append(f"{head:x}.txn (the newest journal, recorded in journalHead)")
    return missing


def replay(directory: str, mark: tuple[int, int], apply, *, skip_corrupt: bool,
           max_record_size: int, head: int | None = None, allow_missing: bool = False) -> dict:
    """Apply every journal record from ``mark`` on, in numeric file order.

    A journal file replay needs that is missing (check_chain) stops start-up with the file
    named, unless ``allow_missing`` (an operator accepts the loss: it is reported). A torn
    tail is cut off after a copy is kept under ``torn/``; corruption in the middle raises
    JournalCorruptedError naming file and offset, unless ``skip_corrupt``, which steps
    over it and reports what it skipped.
    """
    import mmap
    report = {"files": 0, "records": 0, "torn": [], "skipped": [], "missing_files": []}
    mark_id, mark_off = mark
    missing = check_chain(directory, mark_id, head)
    if missing and not allow_missing:
        raise JournalCorruptedError(
            f"journal {directory}: missing {'; '.join(missing)}. Acknowledged entries may be in "
            "it: restore the file, or set journal_allow_missing_files=True to start without it "
            "(the loss is reported in replay_report['missing_files']).")
    if missing:
        log.error("journal %s: starting without %s (journal_allow_missing_files)",
                  directory, "; ".join(missing))
        report["missing_files"] = missing
    for file_id in journal_ids(directory):
        if file_id < mark_id:
            continue
        path = os.path.join(directory, "%x.txn" % file_id)
        size = os.path.getsize(path)
        if size < nj.HEADER_SIZE:
            # a file created but never written before a crash: nothing was acknowledged in it
            report["torn"].append((path, 0, size))
            continue
        with open(path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                try:
                    got_id = nj.check_file_header(mm[:nj.HEADER_SIZE])
                except ValueError as exc:
                    raise JournalCorruptedError(f"journal {path} offset 0: {exc}") from None
                if got_id != file_id:
                    raise JournalCorruptedError(
                        f"journal {path} offset 0: header names journal {got_id:x}")
                start = max(nj.HEADER_SIZE, mark_off) if file_id == mark_id else nj.HEADER_SIZE
                records, end, status, skipped = nj.scan(
                    mm, start, max_record_size, skip_corrupt)
                if status == "corrupt":
                    raise JournalCorruptedError(
                        f"journal {path} is corrupt at offset {end}: a bad record is followed by "
                        "good ones, so this is not a torn tail. Set journal_skip_corrupt_records=True "
                        "to step over it (what is skipped is reported), or restore the file.")
                for off, rtype, body_start, body_len in records:
                    apply(rtype, mm[body_start:body_start + body_len], path, off)
                report["records"] += len(records)
                report["skipped"].extend((path, o, n) for o, n in skipped)
                tail = None
                if status == "torn":
                    tail = mm[end:].rstrip(b"\0")
            finally:
                mm.close()
            if status == "torn":
                torn_dir = os.path.join(directory, "torn")
                private_dir(torn_dir)
                atomic_write(os.path.join(torn_dir, "%x.txn.%d" % (file_id, end)), tail)
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
                fsync_dir(directory)
                fileio.durable(path, end)
                report["torn"].append((path, end, len(tail)))
        report["files"] += 1
    return report
