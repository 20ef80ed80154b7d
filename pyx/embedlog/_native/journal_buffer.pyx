# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The journal buffer and its file I/O: appenders frame records into a ``JournalBuffer``
under the bookie's lock; the group-commit leader writes it (``write_to``, or ``write_direct``
through O_DIRECT in whole blocks) without the GIL, and ``write_zeros`` preallocates the file
ahead of the tail (bookie/journal.py drives them; embedlog.fileio does the syncs and records
what each made durable).

Bounds: ``JournalBuffer.reserve`` grows to fit before anything is written into it (the add
kernels reserve a whole pass at once); ``write_direct`` writes only the blocks that hold the
records, with the DIRECT_ALIGN spare kept at each end of the allocation.
"""

import os

from libc.stdlib cimport free, realloc, qsort
from libc.string cimport memcpy, memmove, memset
from libc.errno cimport errno, EINTR, ENOSPC
from posix.unistd cimport pwrite, fdatasync
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

from embedlog._native.format cimport (el_put32, el_get32, el_crc32c, el_crc_init, parse_ids,
                                      cmp_ledgers)
from embedlog._native.journal_format cimport (RECORD_HEADER_SIZE, REC_ENTRY, REC_ENTRY_CRC32C,
                                              REC_GROUP, GROUP_RECORD_SIZE)

el_crc_init()

DIRECT_ALIGN_BYTES = DIRECT_ALIGN


cdef extern from "stdlib.h" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)


cdef uint8_t *_aligned_alloc(Py_ssize_t n) noexcept nogil:
    cdef void *p = NULL
    if posix_memalign(&p, DIRECT_ALIGN, n) != 0:
        return NULL
    return <uint8_t *>p


cdef int pwrite_all(int fd, const uint8_t *p, Py_ssize_t n, long long offset) noexcept nogil:
    """pwrite all n bytes (through short writes and EINTR); 0 or the errno."""
    cdef ssize_t r
    cdef Py_ssize_t done = 0
    while done < n:
        r = pwrite(fd, p + done, n - done, offset + done)
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        if r == 0:
            return ENOSPC           # no progress: the device took nothing
        done += r
    return 0


cdef int fdatasync_all(int fd) noexcept nogil:
    """fdatasync, again after EINTR (as Python's os.fdatasync does); 0 or the errno."""
    while fdatasync(fd) != 0:
        if errno != EINTR:
            return errno
    return 0


cdef int write_and_sync(int fd, const uint8_t *p, Py_ssize_t n, long long offset,
                        long long *sync_ns) noexcept nogil:
    """pwrite_all, then fdatasync_all unless the write failed; the fdatasync's
    nanoseconds in ``sync_ns`` (the journal's stats). 0 or the errno."""
    cdef timespec t0, t1
    cdef int err = pwrite_all(fd, p, n, offset)
    if err:
        return err
    clock_gettime(CLOCK_MONOTONIC, &t0)
    err = fdatasync_all(fd)
    clock_gettime(CLOCK_MONOTONIC, &t1)
    sync_ns[0] = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec)
    return err


cdef class JournalBuffer:
    """Framed records waiting to be written; appenders fill it under the bookie lock.

    The records start ``lead`` bytes into a DIRECT_ALIGN-aligned block, ``lead`` being the
    file offset % DIRECT_ALIGN they are expected at (set_lead), so write_direct can put the
    file's partial block in front of them and write whole aligned blocks without a copy.
    The allocation keeps DIRECT_ALIGN spare at each end for that block and the zero padding.
    """

    def __cinit__(self, Py_ssize_t capacity=1 << 20):
        self.base = _aligned_alloc(capacity + 2 * DIRECT_ALIGN)
        if self.base == NULL:
            raise MemoryError()
        self.lead = 0
        self.data = self.base
        self.capacity = capacity
        self.size = 0
        self.records = 0

    def __dealloc__(self):
        free(self.base)

    cdef uint8_t *reserve(self, Py_ssize_t n) except NULL:
        """Room for n more bytes at the end (grows by doubling). The first reservation of a
        group (``groups``) puts its GROUP record in front, sealed by ``salt`` once the
        group's length is known: replay tells a group's torn sectors from damage by it."""
        cdef Py_ssize_t cap = self.capacity
        cdef uint8_t *p
        if self.size == 0 and self.groups:
            n += GROUP_RECORD_SIZE
        if self.size + n > cap:
            while self.size + n > cap:
                cap *= 2
            p = _aligned_alloc(cap + 2 * DIRECT_ALIGN)
            if p == NULL:
                raise MemoryError()
            memcpy(p + self.lead, self.data, self.size)
            free(self.base)
            self.base = p
            self.data = p + self.lead
            self.capacity = cap
        if self.size == 0 and self.groups:
            el_put32(self.data, 4)          # a record walkers step over until it is sealed
            self.data[8] = REC_GROUP
            self.size = GROUP_RECORD_SIZE
        return self.data + self.size

    def set_lead(self, Py_ssize_t file_offset):
        """The file offset the next records will be written at (an empty buffer only)."""
        if self.size == 0:
            self.lead = file_offset % DIRECT_ALIGN
            self.data = self.base + self.lead

    cdef void seal(self, uint8_t *rec, Py_ssize_t body_len, int rtype) noexcept nogil:
        """Finish the record whose body was written at rec + RECORD_HEADER_SIZE."""
        el_put32(rec, <uint32_t>body_len)
        rec[8] = <uint8_t>rtype
        cdef uint32_t c = el_crc32c(0, rec, 4)
        c = el_crc32c(c, rec + 8, body_len + 1)
        el_put32(rec + 4, c)
        self.size += RECORD_HEADER_SIZE + body_len
        self.records += 1

    def add_record(self, int rtype, body):
        """Frame one record (meta records and entries that arrive encoded)."""
        cdef const uint8_t[::1] b = body
        cdef Py_ssize_t n = b.shape[0]
        if n == 0:
            raise ValueError("journal records have a body")
        cdef uint8_t *rec = self.reserve(RECORD_HEADER_SIZE + n)
        memcpy(rec + RECORD_HEADER_SIZE, &b[0], n)
        self.seal(rec, n, rtype)
        return self.size

    @property
    def nbytes(self):
        return self.size

    @property
    def nrecords(self):
        return self.records

    def clear(self):
        self.size = 0
        self.records = 0

    def entry_ids(self):
        """(scope, ledger, entry id) of every ENTRY record framed in the buffer (a group the
        disk refused: those entries are taken back out of the memtable)."""
        cdef Py_ssize_t off = 0, n
        cdef uint64_t s, l
        cdef int64_t e
        out = []
        while off + RECORD_HEADER_SIZE <= self.size:
            n = el_get32(self.data + off)
            if self.data[off + 8] == REC_ENTRY or self.data[off + 8] == REC_ENTRY_CRC32C:
                parse_ids(self.data + off + RECORD_HEADER_SIZE, n, &s, &l, &e)
                out.append((s, l, e))
            off += RECORD_HEADER_SIZE + n
        return out

    def salt(self, uint32_t salt, LedgerRuns runs=None):
        """Seal the group's GROUP record (its length is now known), then xor every
        record's crc with ``salt``, the life of the file the group goes to (journal_format: a
        recycled file's stale records then never check as current ones). The leader calls
        it once, just before the write; 0 leaves the crcs as they are.

        ``runs``: also count the entry records into it (runs of one ledger, with their
        record heads), what a walk of the file would count (MappedLog.ledger_runs), in
        the same walk while the records are still in the cache (after the write and its
        sync this VM's caches are cold: a walk then took twice as long). The caller adds
        them to the file's runs once the group is written. The add kernels framed the
        records, in bounds; a length that runs past the end is refused all the same."""
        cdef Py_ssize_t off = 0, n
        cdef uint32_t c
        cdef uint64_t s, l
        cdef int64_t e
        cdef uint8_t t
        if self.size >= GROUP_RECORD_SIZE and self.data[8] == REC_GROUP:
            el_put32(self.data + RECORD_HEADER_SIZE, <uint32_t>self.size)
            c = el_crc32c(0, self.data, 4)
            el_put32(self.data + 4, el_crc32c(c, self.data + 8, 5))
        if runs is None:
            if salt == 0:
                return
            with nogil:
                while off + RECORD_HEADER_SIZE <= self.size:
                    el_put32(self.data + off + 4, el_get32(self.data + off + 4) ^ salt)
                    off += RECORD_HEADER_SIZE + el_get32(self.data + off)
            return
        while off + RECORD_HEADER_SIZE <= self.size:
            n = el_get32(self.data + off)
            if off + RECORD_HEADER_SIZE + n > self.size:
                raise ValueError(f"journal buffer: a record at {off} runs past its end")
            el_put32(self.data + off + 4, el_get32(self.data + off + 4) ^ salt)
            t = self.data[off + 8]
            if t == REC_ENTRY or t == REC_ENTRY_CRC32C:
                parse_ids(self.data + off + RECORD_HEADER_SIZE, n, &s, &l, &e)
                runs.add(s, l, RECORD_HEADER_SIZE + n)
            off += RECORD_HEADER_SIZE + n

    def swap(self, JournalBuffer other):
        """Exchange contents with ``other`` (an emptied spare), so writing needs no lock."""
        self.base, other.base = other.base, self.base
        self.lead, other.lead = other.lead, self.lead
        self.data, other.data = other.data, self.data
        self.size, other.size = other.size, self.size
        self.capacity, other.capacity = other.capacity, self.capacity
        self.records, other.records = other.records, self.records

    def write_to(self, int fd, long long offset):
        """pwrite the whole buffer at ``offset`` without the GIL, and a zero length after
        it (the end of the log, where a reused file holds its previous life's bytes; the next
        group writes over it); returns the records' bytes written."""
        cdef int err
        memset(self.data + self.size, 0, 4)        # in the DIRECT_ALIGN spare at the end
        with nogil:
            err = pwrite_all(fd, self.data, self.size + 4, offset)
        if err:
            raise OSError(err, "journal write failed")
        return self.size

    def write_direct(self, int fd, long long offset, bytes tail):
        """Write the records at ``offset`` through ``fd`` opened with O_DIRECT: whole
        DIRECT_ALIGN blocks from ``offset - len(tail)``, ``tail`` being the file's bytes in
        front of ``offset`` in its block (written again, unchanged, so a torn block write
        leaves either version of them), the last block padded with zeros (the end of the
        log). Returns the new tail: the bytes of the last partial block written."""
        cdef Py_ssize_t end, padded
        cdef int err
        self.direct_blocks(offset, tail, &end, &padded)
        with nogil:
            err = pwrite_all(fd, self.base, padded, offset - (end - self.size))
        if err:
            raise OSError(err, "journal write failed")
        return self.tail_after(end)

    def write_direct_synced(self, int fd, long long offset, bytes tail):
        """write_direct, then fdatasync ``fd``, in one release of the GIL: a lone
        group's leader wakes once, not between its write and its sync. Returns (the new
        tail, the fdatasync's seconds); raises OSError as the write or the sync failed."""
        cdef Py_ssize_t end, padded
        cdef int err
        cdef long long sync_ns = 0
        self.direct_blocks(offset, tail, &end, &padded)
        with nogil:
            err = write_and_sync(fd, self.base, padded, offset - (end - self.size), &sync_ns)
        if err:
            raise OSError(err, "journal write or sync failed")
        return self.tail_after(end), sync_ns / 1e9

    cdef bytes tail_after(self, Py_ssize_t end):
        """The new tail after an O_DIRECT write whose records end at ``end`` (direct_blocks):
        the bytes of its last partial block."""
        return self.base[end & ~(<Py_ssize_t>DIRECT_ALIGN - 1):end]

    cdef int direct_blocks(self, long long offset, bytes tail, Py_ssize_t *end,
                           Py_ssize_t *padded) except -1:
        """Lay the records out for an O_DIRECT write at ``offset`` (write_direct): ``tail``
        in front of them, zeros after them, from ``base``; sets where the records end and
        the whole blocks' length."""
        cdef Py_ssize_t lag = offset % DIRECT_ALIGN
        if PyBytes_GET_SIZE(tail) != lag:
            raise ValueError(f"tail of {PyBytes_GET_SIZE(tail)} bytes for offset {offset}")
        if lag != self.lead:                  # written elsewhere than expected (a new file)
            memmove(self.base + lag, self.data, self.size)
            self.lead = lag
            self.data = self.base + lag
        memcpy(self.base, PyBytes_AS_STRING(tail), lag)
        end[0] = lag + self.size
        padded[0] = (end[0] + DIRECT_ALIGN - 1) & ~(<Py_ssize_t>DIRECT_ALIGN - 1)
        memset(self.base + end[0], 0, padded[0] - end[0])
        return 0


cdef extern from "sys/vfs.h" nogil:
    cdef struct statfs:
        long f_type
    int c_statfs "statfs"(const char *path, statfs *buf)


def fs_type(path) -> int:
    """The magic number of the file system holding ``path`` (statfs's f_type), or 0 if
    it cannot be told."""
    cdef statfs st
    cdef bytes p = os.fsencode(path)
    if c_statfs(p, &st) != 0:
        return 0
    return <unsigned long>st.f_type & 0xFFFFFFFF


def write_zeros(int fd, long long offset, long long length):
    """Preallocate [offset, offset+length) with real zeros (so later fdatasyncs are cheap;
    the caller syncs them through embedlog.fileio). The buffer is aligned, so ``fd`` may be
    an O_DIRECT one (with offset and length aligned)."""
    cdef Py_ssize_t chunk = 1 << 20
    cdef uint8_t *z = _aligned_alloc(chunk)
    cdef long long done = 0
    cdef int err = 0
    if z == NULL:
        raise MemoryError()
    memset(z, 0, chunk)
    with nogil:
        while done < length and not err:
            err = pwrite_all(fd, z, min(chunk, length - done), offset + done)
            done += chunk
    free(z)
    if err:
        raise OSError(err, "journal preallocation failed")


cdef int _cmp_runs(const void *a, const void *b) noexcept nogil:
    cdef const ledger_run *x = <const ledger_run *>a
    cdef const ledger_run *y = <const ledger_run *>b
    return cmp_ledgers(x.scope, x.lid, y.scope, y.lid)


cdef class LedgerRuns:
    """Entry records of one journal file counted per ledger: runs of one ledger (scope,
    ledger, bytes with record heads), a new run per change of ledger, merged per ledger
    whenever they fill RUNS_COMPACT_AT (so they take memory per ledger, not per change of
    ledger). The leader adds each group it wrote and synced; the trim that makes the file a
    segment writes its ledgers map from them instead of reading the file back
    (journal_files.write_segment_map)."""

    def __cinit__(self):
        self.runs = NULL
        self.count = 0
        self.cap = 0

    def __dealloc__(self):
        free(self.runs)

    cdef int add(self, uint64_t scope, uint64_t lid, uint64_t nbytes) except -1:
        cdef ledger_run *grown
        cdef Py_ssize_t cap
        if self.count and self.runs[self.count - 1].scope == scope and \
                self.runs[self.count - 1].lid == lid:
            self.runs[self.count - 1].nbytes += nbytes
            return 0
        if self.count == self.cap and self.count >= RUNS_COMPACT_AT:
            qsort(self.runs, self.count, sizeof(ledger_run), _cmp_runs)
            self._merge()
        if self.count == self.cap:
            cap = max(16, 2 * self.cap)
            grown = <ledger_run *>realloc(self.runs, cap * sizeof(ledger_run))
            if grown == NULL:
                raise MemoryError()
            self.runs, self.cap = grown, cap
        self.runs[self.count].scope = scope
        self.runs[self.count].lid = lid
        self.runs[self.count].nbytes = nbytes
        self.count += 1
        return 0

    cdef void _merge(self) noexcept:
        """Merge neighbouring runs of one ledger (after a sort: one run per ledger)."""
        cdef Py_ssize_t i, k = 0
        for i in range(1, self.count):
            if self.runs[i].scope == self.runs[k].scope and self.runs[i].lid == self.runs[k].lid:
                self.runs[k].nbytes += self.runs[i].nbytes
            else:
                k += 1
                self.runs[k] = self.runs[i]
        if self.count:
            self.count = k + 1

    def __len__(self):
        return self.count

    def clear(self):
        self.count = 0

    def extend(self, LedgerRuns other):
        """Add ``other``'s runs after these (a written group's, counted by salt)."""
        cdef Py_ssize_t i
        for i in range(other.count):
            self.add(other.runs[i].scope, other.runs[i].lid, other.runs[i].nbytes)

    def totals(self):
        """{(scope, ledger): bytes}."""
        cdef Py_ssize_t i
        out = {}
        for i in range(self.count):
            key = (self.runs[i].scope, self.runs[i].lid)
            out[key] = out.get(key, 0) + self.runs[i].nbytes
        return out
