# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The entry logs of a bookie (EntryLogger): one being written, the rest mapped read-only
(each a MappedLog, entrylog.pyx), and the flush of a memtable into them.

A bookie may have several ledger directories: log ids are unique across them,
each log lives in one of them, and ``EntryLogger`` remembers which. Compaction
writes ``<hex id>.log.compacting`` files (see embedlog/bookie/compaction.py);
their ids come from the same sequence.

Bounds: a flush stages at most STAGE_BYTES or the largest entry, and leaves room for the
seal's map and table.

Page cache: a memtable flush starts the writeback of what it wrote at once
(sync_file_range, as RocksDB's bytes_per_sync does), and pages written more than
``page_cache_bytes`` ago are dropped once written back (posix_fadvise DONTNEED), so the
cache holds the newest entries and steady writing reuses the pages it frees. Growing the
cache instead took a new page for every 4 KiB written: on this VM that copy cost 3.2 us
per KiB against 0.2 for a page freed just before (docs/PERFORMANCE.md). Durability is
unchanged: the checkpoint's fdatasync still makes the logs durable; these calls only move
the writeback earlier.
"""

import collections
import os

from libc.stdint cimport uint8_t, uint32_t, int32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize

cdef extern from "<fcntl.h>" nogil:
    int sync_file_range(int fd, long long offset, long long nbytes, unsigned int flags)
    int posix_fadvise(int fd, long long offset, long long length, int advice)
    enum:
        SYNC_FILE_RANGE_WAIT_BEFORE
        SYNC_FILE_RANGE_WRITE
        SYNC_FILE_RANGE_WAIT_AFTER
        POSIX_FADV_DONTNEED

from embedlog._native.entrylog cimport MappedLog, LOG_HEADER_SIZE, CRC_BLOCK_BYTES
from embedlog._native.format cimport el_put32, decode_payload
from embedlog._native.memtable cimport MemTable, mt_rec

from embedlog import fileio
from embedlog._native import journal_format as jformat
from embedlog._native.format import ledger_name
from embedlog.errors import CorruptedDataError


# a location with bit 63 set names a journal segment: segment << 32 | record offset
cdef uint64_t SEGMENT_LOG_BIT = 0x80000000
SEGMENT_BIT = 1 << 63

cdef class EntryLogger:
    """The entry logs of one ledger directory: one being written, the rest mapped read-only."""


    def __init__(self, directories, Py_ssize_t size_limit, uint64_t last_log_id=0, choose_dir=None):
        if isinstance(directories, (str, bytes, os.PathLike)):
            directories = [directories]
        self.directories = [os.fspath(d) for d in directories]
        if not self.directories:
            raise ValueError("an entry logger needs at least one directory")
        self.directory = self.directories[0]
        self.choose_dir = choose_dir          # () -> directory for the next log, or None
        self.size_limit = size_limit
        self.logs = {}
        self.log_dirs = {}
        self.current = None
        self.current_ledgers = {}
        self.last_log_id = last_log_id
        self.page_cache_bytes = 0
        self._cached = collections.deque()
        self._cached_bytes = 0
        self.dropped_bytes = 0
        for d in self.directories:
            for name in os.listdir(d):
                log_id = _log_id_of(name)
                if log_id is None:
                    continue
                # ids of compaction files count too: they become logs, never reuse them
                self.last_log_id = max(self.last_log_id, log_id)
                if name.endswith(".log"):
                    if log_id in self.log_dirs:
                        raise CorruptedDataError(
                            f"entry log {name} is in two ledger directories: "
                            f"{self.log_dirs[log_id]} and {d}")
                    self.log_dirs[log_id] = d

    def log_ids(self):
        """Ids of the entry logs on disk (and mapped), ascending; rescans the directories."""
        found = {}
        for d in self.directories:
            for name in os.listdir(d):
                if name.endswith(".log"):
                    log_id = _log_id_of(name)
                    if log_id is not None:
                        found[log_id] = d
        self.log_dirs = found
        ids = set(found)
        ids.update(i for i in self.logs if not i & SEGMENT_LOG_BIT)   # segments are no logs
        return sorted(ids)

    def path_of(self, uint64_t log_id):
        return os.path.join(self.log_dirs.get(log_id, self.directory), "%x.log" % log_id)

    def dir_of(self, uint64_t log_id):
        return self.log_dirs.get(log_id)

    def allocate_log_id(self):
        """The next log id (for a compaction target); ids are never reused."""
        self.last_log_id += 1
        if self.last_log_id >= SEGMENT_LOG_BIT:
            raise CorruptedDataError("entry log ids exhausted (31-bit: bit 31 names segments)")
        return self.last_log_id

    def register(self, uint64_t log_id, directory):
        """A log that appeared outside roll() (a finished compaction) can be read from now on."""
        self.log_dirs[log_id] = os.fspath(directory)

    def unregister(self, uint64_t log_id):
        """Unmap a log and forget where it was (before it is deleted)."""
        self.forget(log_id)
        self.log_dirs.pop(log_id, None)

    def mapped_ids(self):
        return [i for i in self.logs if not i & SEGMENT_LOG_BIT]

    cdef MappedLog _log(self, uint64_t log_id):
        cdef MappedLog m = self.logs.get(log_id)
        if (m is None or m.base == NULL) and log_id & SEGMENT_LOG_BIT:
            m = self._segment(log_id)
            if m is not None:
                self.logs[log_id] = m
            return m
        if m is None or m.base == NULL:          # never opened, or unmapped by a seal
            try:
                m = MappedLog.open_existing(self.path_of(log_id), log_id)
            except FileNotFoundError:       # deleted by GC or compaction: its entries moved
                return None
            self.logs[log_id] = m
        return m

    def _segment(self, uint64_t log_id):
        """A journal segment mapped read-only: ``<id>.txn`` while the journal holds it,
        ``<id>.seg`` once trimmed; None if neither is there (freed: no index points at it)."""
        if self.segment_files is None:
            return None
        stem = self.segment_files.get(log_id & ~SEGMENT_LOG_BIT)
        if stem is None:
            return None
        cdef MappedLog m
        for suffix in (".txn", ".seg"):
            try:
                m = MappedLog.open_segment(stem + suffix, log_id)
            except FileNotFoundError:
                continue
            # GC may have dropped the segment and the journal reused its file while this
            # mapped it (opening releases the GIL): a file holding another segment now, or
            # a number its stem no longer holds, reads as freed
            if (jformat.file_segment(m.base[:jformat.HEADER_SIZE]) != (log_id & ~SEGMENT_LOG_BIT)
                    or self.segment_files.get(log_id & ~SEGMENT_LOG_BIT) != stem):
                m.close()
                return None
            return m
        return None

    def add_segment(self, uint32_t segment, stem):
        """Journal file ``stem`` (+ .txn or .seg) holds segment ``segment`` (layout 2)."""
        if self.segment_files is None:
            self.segment_files = {}
        self.segment_files[segment] = stem

    def drop_segment(self, uint32_t segment):
        """Forget a segment and unmap it (GC deletes its file): its number first, so a
        reader mapping it while the unmap releases the GIL finds it gone (_segment)."""
        if self.segment_files is not None:
            self.segment_files.pop(segment, None)
        self.forget(<uint64_t>segment | SEGMENT_LOG_BIT)

    def roll(self):
        """Seal the current log and start the next one (ids are never reused)."""
        if self.current is not None:
            self.current.seal(self.current_ledgers)
            del self.logs[self.current.log_id]
            self.current = None
        directory = self.choose_dir() if self.choose_dir is not None else self.directory
        log_id = self.allocate_log_id()
        path = os.path.join(directory, "%x.log" % log_id)
        self.current = MappedLog.create(path, log_id, self.size_limit)
        self.log_dirs[log_id] = directory
        self.logs[log_id] = self.current
        self.current_ledgers = {}
        fileio.fsync_dir(directory)
        return log_id

    def flush(self):
        if self.current is not None:
            self.current.flush()

    def close(self):
        if self.current is not None:
            self.current.flush()
        for m in self.logs.values():
            (<MappedLog>m).close()
        self.logs.clear()
        self.current = None

    def forget(self, uint64_t log_id):
        """Unmap a log (before it is deleted)."""
        m = self.logs.pop(log_id, None)
        if m is not None:
            m.close()

    cdef const uint8_t *locate(self, uint64_t location, Py_ssize_t *n) except? NULL:
        cdef MappedLog m = self._log(location >> 32)
        cdef const uint8_t *p
        if m is None:
            return NULL
        p = m.checked_entry_at(<uint32_t>location, n)
        if p == NULL and m.segment:         # the journal grew since it was mapped
            self.forget(location >> 32)
            m = self._log(location >> 32)
            if m is not None:
                p = m.checked_entry_at(<uint32_t>location, n)
        return p

    def read_encoded(self, uint64_t location):
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p = self.locate(location, &n)
        if p == NULL:
            raise CorruptedDataError(f"no entry at location {location:#x}")
        return PyBytes_FromStringAndSize(<const char *>p, n)

    def read_payload(self, uint64_t location, uint64_t scope, uint64_t lid, int64_t eid,
                     int digest, mac_key):
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p = self.locate(location, &n)
        if p == NULL:
            raise CorruptedDataError(
                f"index of ledger {ledger_name(scope, lid)} points entry {eid} at {location:#x}, "
                "where no entry is")
        return decode_payload(p, n, scope, lid, eid, digest, mac_key)

    def flush_memtable(self, MemTable mt, on_location):
        """Write the memtable's live entries, sorted by (scope, ledger, entry), at the end of
        the entry logs, rolling as needed.

        Entries are framed into a staging buffer and written with pwrite, the GIL released:
        stores into fresh pages of the map made the kernel zero each page first (a fifth of
        a batch-append run's CPU) and held the GIL while appenders waited. The map shares the
        page cache, so readers see the bytes once ``position`` passes them. Calls
        ``on_location(scope, lid, eids, locations)`` (numpy arrays) once per ledger run, after
        its entries are written, so the index is updated a ledger at a time. Returns the
        bytes written.
        """
        import numpy as np
        order_a = np.empty(max(mt.live, 1), dtype=np.int32)
        cdef int32_t[::1] order = order_a
        cdef Py_ssize_t total = mt.flush_order(&order[0], order.shape[0])
        eids_arr = np.empty(total, dtype=np.int64)
        locs_arr = np.zeros(total, dtype=np.uint64)
        cdef int64_t[::1] eids = eids_arr
        cdef uint64_t[::1] locs = locs_arr
        cdef Py_ssize_t i = 0, start, j, run_bytes, staged, room
        cdef uint64_t scope, lid
        cdef const mt_rec *r
        cdef MappedLog cur
        cdef _Stage st = _Stage(STAGE_BYTES)
        cdef Py_ssize_t written = 0
        while i < total:
            start = i
            scope, lid = mt.recs[order[i]].scope, mt.recs[order[i]].lid
            run_bytes = 0
            while i < total:
                if self.current is None:
                    self.roll()
                cur = self.current
                # keep room for the seal's ledgers map and block checksums: a log filled to
                # its end was sealed without them (no checksums for its reads to check)
                room = cur.mapped - cur.position - (
                    12 + 24 * (len(self.current_ledgers) + 1) + 16 +
                    4 * ((cur.mapped - LOG_HEADER_SIZE + CRC_BLOCK_BYTES - 1) // CRC_BLOCK_BYTES))
                r = &mt.recs[order[i]]
                if 4 + <Py_ssize_t>r.size > room:
                    if cur.position == LOG_HEADER_SIZE:
                        raise CorruptedDataError(
                            f"entry of {r.size} bytes is larger than entry_log_size_limit")
                    self._account(scope, lid, run_bytes)
                    run_bytes = 0
                    self.roll()
                    continue
                st.fit(4 + <Py_ssize_t>r.size)
                with nogil:
                    j = _stage_run(mt.recs, mt.arena, &order[0], i, total, st.data, st.capacity, room,
                                   cur.position, (cur.log_id << 32), &eids[0], &locs[0], &staged)
                cur.write_end(st.data, staged)
                self._written(cur, cur.position - staged, cur.position)
                run_bytes += staged
                written += staged
                i = j
                if i >= total or mt.recs[order[i]].scope != scope or mt.recs[order[i]].lid != lid:
                    break
            self._account(scope, lid, run_bytes)
            on_location(scope, lid, eids_arr[start:i], locs_arr[start:i])
        return written

    cdef _written(self, MappedLog m, Py_ssize_t start, Py_ssize_t end):
        """Start the writeback of [start, end) of ``m``, and drop what was written more than
        page_cache_bytes ago from the page cache."""
        cdef int fd = m.fd
        cdef long long s, n
        if self.page_cache_bytes <= 0 or end <= start:
            return
        with nogil:
            sync_file_range(fd, start, end - start, SYNC_FILE_RANGE_WRITE)
        last = self._cached[len(self._cached) - 1] if self._cached else None
        if last is not None and last[0] == m.log_id and last[2] == start:
            last[2] = end
        else:
            self._cached.append([m.log_id, start, end])
        self._cached_bytes += end - start
        while self._cached_bytes > self.page_cache_bytes:
            head = self._cached[0]
            n = min(<long long>(head[2] - head[1]), self._cached_bytes - self.page_cache_bytes)
            s = head[1]
            head[1] += n
            if head[1] == head[2]:
                self._cached.popleft()
            self._cached_bytes -= n
            self._drop(head[0], s, n)

    cdef _drop(self, uint64_t log_id, long long start, long long n):
        # a descriptor of its own: waiting on writeback through the log's own would take a
        # writeback error from the checkpoint's fdatasync, which must report it (errseq)
        cdef int fd, r
        try:
            fd = os.open(self.path_of(log_id), os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, KeyError):       # deleted since (GC, compaction): nothing to drop
            return
        try:
            with nogil:
                r = sync_file_range(fd, start, n, SYNC_FILE_RANGE_WAIT_BEFORE |
                                    SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER)
                if r == 0:
                    posix_fadvise(fd, start, n, POSIX_FADV_DONTNEED)
            if r == 0:
                self.dropped_bytes += n
        finally:
            os.close(fd)

    cdef _account(self, uint64_t scope, uint64_t lid, Py_ssize_t nbytes):
        if nbytes:
            key = (scope, lid)
            self.current_ledgers[key] = self.current_ledgers.get(key, 0) + nbytes


cdef enum:
    STAGE_BYTES = 4 << 20          # bytes framed before each pwrite of a memtable flush


cdef class _Stage:
    """A malloc'd staging buffer that grows to fit the largest entry."""
    cdef uint8_t *data
    cdef Py_ssize_t capacity

    def __cinit__(self, Py_ssize_t capacity):
        self.data = <uint8_t *>malloc(capacity)
        if self.data == NULL:
            raise MemoryError()
        self.capacity = capacity

    def __dealloc__(self):
        free(self.data)

    cdef int fit(self, Py_ssize_t n) except -1:
        cdef uint8_t *p
        if n > self.capacity:
            p = <uint8_t *>realloc(self.data, n)
            if p == NULL:
                raise MemoryError()
            self.data, self.capacity = p, n
        return 0


cdef Py_ssize_t _stage_run(const mt_rec *recs, const uint8_t *arena, const int32_t *order, Py_ssize_t i, Py_ssize_t total,
                           uint8_t *stage, Py_ssize_t cap, Py_ssize_t room, Py_ssize_t position,
                           uint64_t log_bits, int64_t *eids, uint64_t *locs,
                           Py_ssize_t *staged) noexcept nogil:
    """Frame (size:u32, entry) records of one ledger's run, from order[i] on, into ``stage``
    while they fit in it and in the log's ``room``; returns the index after the last one."""
    cdef const mt_rec *r = &recs[order[i]]
    cdef uint64_t scope = r.scope, lid = r.lid
    cdef Py_ssize_t used = 0, n
    while i < total:
        r = &recs[order[i]]
        n = r.size
        if r.scope != scope or r.lid != lid or used + 4 + n > cap or used + 4 + n > room:
            break
        el_put32(stage + used, <uint32_t>n)
        memcpy(stage + used + 4, arena + r.offset, n)
        eids[i] = r.eid
        locs[i] = log_bits | <uint64_t>(position + used + 4)
        used += 4 + n
        i += 1
    staged[0] = used
    return i


def _log_id_of(name):
    """The id in an entry log's or compaction file's name (<hex>.log[...], <hex>.compaction)."""
    stem, dot, rest = name.partition(".")
    if not dot or not (rest == "log" or rest.startswith("log.") or rest == "compaction"):
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None
