# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Entry logs on memory-mapped files: one log, MappedLog (the set of them, and the flush of a
memtable into them, are entrylogger.pyx's).

Grammar (big-endian; see docs/FORMATS.md)::

    entry_log  := header(1024) (size:u32 entry[size])* (ledgers_map block_crcs?)? zeros*
    header     := "ELLO" version:u32(=1) map_offset:u64 map_count:u32
                  crcs_offset:u64 zeros(996)               # 0: no block checksums (older logs)
    ledgers_map:= size:u32 (=0xFFFFFFFF marker) count:u32 (scope:u64 ledger:u64 bytes:u64)*count
                  crc32c:u32
    block_crcs := "ELBC" block_bytes:u32 count:u32 crc32c:u32*count table_crc:u32
                  # crc32c of each block_bytes of [1024, map_offset) at the seal, so a
                  # damaged record is found even in a DUMMY-digest ledger (localconsistencycheck),
                  # and a read checks the blocks it reads (once per block while mapped). An
                  # unsealed log keeps the crcs of its completed blocks in its last
                  # 16 + 4 * nblocks bytes (written at each flush; the seal cuts them away)
    location   := log_id << 32 | offset of entry[] in its file   (0: no entry)

A file is created at ``size_limit`` (sparse) and mapped once for reads. Memtable
flushes write with pwrite (a full disk fails the flush with ENOSPC); the few stores into
the map (compaction's copies, the seal) are preceded by fallocate a chunk (ALLOC_CHUNK)
ahead, so a full disk fails them with ENOSPC instead of a SIGBUS on a store into a hole of
the map. When an entry does not fit, the log is sealed (ledgers map written, file cut to
its length) and the next one begins. A size of 0 ends the
entries of an unsealed log.

Bounds: an entry is read only if its size field, its header and its end lie within the
written part of the log (``entry_at``: offset >= header + 4, offset + size <= position, 64-bit
sums); ``append`` and ``write_end`` refuse a write past the mapping; the map and checksum
table offsets read from a header are checked with ``_fits`` (within the file, no overflowing
sum) before anything is read through them. A journal segment's record is read only if its
offset is past the journal header and its length field and body lie within the mapping
(``_segment_entry``) before valid_record reads a byte, and its bit in the checked-record
bitmap is that of an offset below both the mapping and 2^32 (``seg_granules`` covers that
range, and the bit is tested against it).
"""

import errno as _errno
import os

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memcpy, memset
from libc.errno cimport errno, EINTR
from posix.unistd cimport pwrite
from posix.mman cimport (mmap, munmap, msync, madvise, MAP_SHARED, PROT_READ, PROT_WRITE,
                         MAP_FAILED, MS_SYNC, MADV_SEQUENTIAL)
from cpython.bytes cimport PyBytes_FromStringAndSize

from embedlog._native.journal_format cimport RECORD_HEADER_SIZE, REC_ENTRY, REC_ENTRY_CRC32C
from embedlog._native.journal_scan cimport valid_record
from embedlog._native.format cimport (el_put32, el_put64, el_get32, el_get64, el_crc32c,
                                      el_crc_init, parse_ids, V1_HEADER_SIZE, V2_HEADER_SIZE)

from embedlog import fileio
from embedlog.errors import CorruptedDataError, NoSuchEntryError

el_crc_init()

HEADER_SIZE = LOG_HEADER_SIZE
cdef Py_ssize_t JOURNAL_HEADER_BYTES = 512      # journal_format.HEADER_SIZE
CRC_BLOCK = CRC_BLOCK_BYTES
ALLOC_CHUNK = 8 << 20          # bytes of an entry log's blocks allocated ahead of its writes
errno_ENOSPC = _errno.ENOSPC
MAGIC = b"ELLO"
MAP_MARKER = 0xFFFFFFFF


cdef tuple _entry_arrays(Py_ssize_t count):
    """entry_table's five arrays for ``count`` entries: locations, sizes, scopes, ledgers,
    entry ids."""
    import numpy as np
    return (np.empty(count, dtype=np.uint64), np.empty(count, dtype=np.uint32),
            np.empty(count, dtype=np.uint64), np.empty(count, dtype=np.uint64),
            np.empty(count, dtype=np.int64))


cdef inline bint _record_ids(const uint8_t *buf, Py_ssize_t n, uint64_t *scope,
                              uint64_t *lid, int64_t *eid) noexcept nogil:
    """parse_ids without the GIL: False where parse_ids would refuse the entry's header."""
    if n >= 1 and buf[0] & 0x80:
        if n < V2_HEADER_SIZE or (buf[0] >> 4) & 7 != 2:
            return False
        scope[0] = el_get64(buf + 1)
        lid[0] = el_get64(buf + 9)
        eid[0] = <int64_t>el_get64(buf + 17)
        return scope[0] != 0
    if n < V1_HEADER_SIZE:
        return False
    scope[0] = 0
    lid[0] = el_get64(buf)
    eid[0] = <int64_t>el_get64(buf + 8)
    return True


cdef Py_ssize_t _next_entry(const uint8_t *base, Py_ssize_t position, uint32_t salt,
                            Py_ssize_t *pos, uint64_t *sc, uint64_t *li, int64_t *ei) noexcept nogil:
    """The next entry record of a journal segment mapped at ``base`` (``position`` bytes)
    from ``pos[0]`` on: its body size, with ``pos[0]`` at its record and its ids read; 0 at
    the first record that fails its crc (the end, a torn tail or damage). Records of other
    kinds, and entries whose header cannot be read, are passed over."""
    cdef Py_ssize_t body
    cdef int t
    while pos[0] + RECORD_HEADER_SIZE <= position:
        body = valid_record(base + pos[0], position - pos[0], position, salt)
        if body <= 0:
            return 0
        t = base[pos[0] + 8]
        if (t == REC_ENTRY or t == REC_ENTRY_CRC32C) and \
                _record_ids(base + pos[0] + RECORD_HEADER_SIZE, body, sc, li, ei):
            return body
        pos[0] += RECORD_HEADER_SIZE + body
    return 0


cdef Py_ssize_t _walk_segment(const uint8_t *base, Py_ssize_t position, uint32_t salt,
                              uint64_t log_id, uint64_t *locs, uint32_t *sizes,
                              uint64_t *scopes, uint64_t *lids, int64_t *eids,
                              Py_ssize_t cap) noexcept nogil:
    """The entry records of a journal segment (_next_entry's) in file order: how many;
    with ``locs`` given, the first ``cap`` are written out (location, body size, ids)."""
    cdef Py_ssize_t pos = JOURNAL_HEADER_BYTES, body, count = 0
    cdef uint64_t sc, li
    cdef int64_t ei
    while True:
        body = _next_entry(base, position, salt, &pos, &sc, &li, &ei)
        if body == 0 or (locs != NULL and count >= cap):
            return count
        if locs != NULL:
            locs[count] = (log_id << 32) | <uint64_t>pos
            sizes[count] = <uint32_t>body
            scopes[count] = sc
            lids[count] = li
            eids[count] = ei
        count += 1
        pos += RECORD_HEADER_SIZE + body


cdef Py_ssize_t _walk_runs(const uint8_t *base, Py_ssize_t position, uint32_t salt,
                           uint64_t *scopes, uint64_t *lids, uint64_t *nbytes,
                           Py_ssize_t cap) noexcept nogil:
    """_next_entry's records as runs of one ledger (a segment's writers append runs):
    returns how many runs; with ``scopes`` given, the first ``cap`` are written out with
    their bytes (records and record headers)."""
    cdef Py_ssize_t pos = JOURNAL_HEADER_BYTES, body, runs = 0
    cdef uint64_t sc, li, cur_sc = 0, cur_li = 0
    cdef int64_t ei
    while True:
        body = _next_entry(base, position, salt, &pos, &sc, &li, &ei)
        if body == 0:
            return runs
        if runs == 0 or sc != cur_sc or li != cur_li:
            if scopes != NULL and runs >= cap:
                return runs
            cur_sc, cur_li = sc, li
            if scopes != NULL:
                scopes[runs] = sc
                lids[runs] = li
                nbytes[runs] = 0
            runs += 1
        if scopes != NULL:
            nbytes[runs - 1] += <uint64_t>(RECORD_HEADER_SIZE + body)
        pos += RECORD_HEADER_SIZE + body


cdef class MappedLog:
    """One entry log file mapped into memory."""

    def __cinit__(self):
        self.base = NULL
        self.fd = -1
        self.crcs = NULL
        self.verified = NULL
        self.nblocks_known = 0
        self.tracking = False
        self.crc_run = 0
        self.crcs_persisted = 0
        self.seg_checked = NULL
        self.seg_granules = 0

    def __dealloc__(self):
        self._unmap()
        free(self.crcs)
        free(self.verified)

    cdef _unmap(self):
        if self.base != NULL:
            munmap(self.base, self.mapped)
            self.base = NULL
        # what a segment's reads remembered holds for this mapping only
        free(self.seg_checked)
        self.seg_checked = NULL
        self.seg_granules = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self):
        self._unmap()

    cdef int _map(self, int prot) except -1:
        cdef void *p = mmap(NULL, self.mapped, prot, MAP_SHARED, self.fd, 0)
        if p == MAP_FAILED:
            raise OSError(f"cannot map entry log {self.path}")
        self.base = <uint8_t *>p
        if prot & PROT_WRITE:
            # appends fault pages in order: without this hint the kernel's readahead zero-fills
            # far ahead of each fault, and copying into the map ran ~5x slower here
            madvise(p, self.mapped, MADV_SEQUENTIAL)
        return 0

    @staticmethod
    def create(path, uint64_t log_id, Py_ssize_t size_limit):
        cdef MappedLog m = MappedLog()
        m.log_id = log_id
        m.path = path
        m.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        m.allocated = 0
        m.position = 0
        m.mapped = size_limit
        try:
            os.ftruncate(m.fd, size_limit)
            m.reserve(HEADER_SIZE)
        except OSError:
            os.close(m.fd)
            m.fd = -1
            os.unlink(path)
            raise
        m.writable = True
        m._map(PROT_READ | PROT_WRITE)
        m._track(size_limit)
        m.tracking = True
        memcpy(m.base, b"ELLO", 4)
        el_put32(m.base + 4, 1)
        m.position = HEADER_SIZE
        m.synced = 0
        return m

    @staticmethod
    def open_existing(path, uint64_t log_id):
        """Map an existing log read-only, its sealed checksums loaded for the reads."""
        return _open_log(path, log_id, False)

    @staticmethod
    def open_writable(path, uint64_t log_id):
        """Map an existing log read-write at its end (to seal a log a crash left unsealed)."""
        return _open_log(path, log_id, True)

    cdef _check_header(self):
        cdef uint32_t version = el_get32(self.base + 4)
        if memcmp4(self.base, b"ELLO"):
            self._unmap()
            raise CorruptedDataError(f"entry log {self.path} offset 0: bad magic")
        if version != 1:
            self._unmap()
            raise CorruptedDataError(f"entry log {self.path} offset 4: unknown format version {version}")

    cdef int _track(self, Py_ssize_t capacity_bytes) except -1:
        """Room for the checksums and the verified bits of every block of the file."""
        cdef Py_ssize_t nb = (capacity_bytes - LOG_HEADER_SIZE + CRC_BLOCK_BYTES - 1) // CRC_BLOCK_BYTES
        nb = max(nb, 1)
        self.crcs = <uint32_t *>malloc(nb * sizeof(uint32_t))
        self.verified = <uint8_t *>malloc((nb + 7) // 8)
        if self.crcs == NULL or self.verified == NULL:
            raise MemoryError()
        memset(self.verified, 0, (nb + 7) // 8)
        return 0

    cdef void _crc_feed(self, const uint8_t *data, Py_ssize_t n) noexcept nogil:
        """``data[:n]`` is being written at ``position``: fold it into the crc of its block,
        and keep the crc of each block it completes (``nblocks_known`` is moved by the
        caller, with the GIL, once the bytes are in the file)."""
        cdef Py_ssize_t pos = self.position, k, take
        while n > 0:
            k = (pos - LOG_HEADER_SIZE) // CRC_BLOCK_BYTES
            take = min(n, LOG_HEADER_SIZE + (k + 1) * CRC_BLOCK_BYTES - pos)
            self.crc_run = el_crc32c(self.crc_run, data, take)
            pos += take
            data += take
            n -= take
            if (pos - LOG_HEADER_SIZE) % CRC_BLOCK_BYTES == 0:
                self.crcs[k] = self.crc_run
                self.crc_run = 0

    cdef Py_ssize_t _tail_start(self):
        """Where an unsealed log keeps the crcs of its completed blocks (its last bytes, which
        a memtable flush leaves free: see flush_memtable)."""
        return self.mapped - (16 + 4 * ((self.mapped - LOG_HEADER_SIZE + CRC_BLOCK_BYTES - 1)
                                        // CRC_BLOCK_BYTES))

    cdef int _load_tail_crcs(self) except -1:
        """A log left unsealed: the block crcs its last flush kept in its tail, for the
        start-up seal to write (so damage since is not sealed in as good); none if absent.
        Read with pread, not through the map: the tail may be a hole, and reading a hole
        through a map faults (SIGBUS) on a full tmpfs."""
        cdef Py_ssize_t at = self._tail_start(), k
        cdef const uint8_t[::1] v
        cdef uint32_t count
        if at < LOG_HEADER_SIZE or el_get64(self.base + 8) != 0:
            return 0
        raw = os.pread(self.fd, self.mapped - at, at)
        if len(raw) < 16 or raw[:4] != b"ELBC":
            return 0
        v = raw
        count = el_get32(&v[8])
        if el_get32(&v[4]) != CRC_BLOCK_BYTES or 16 + 4 * <Py_ssize_t>count > len(raw) or \
                LOG_HEADER_SIZE + <Py_ssize_t>count * CRC_BLOCK_BYTES > self.position or \
                el_crc32c(0, &v[0], 12 + 4 * count) != el_get32(&v[12 + 4 * count]):
            return 0
        self._track(self.mapped)
        for k in range(count):
            self.crcs[k] = el_get32(&v[12 + 4 * k])
        self.nblocks_known = count
        return 0

    cdef bint _fits(self, uint64_t off, uint64_t n) noexcept:
        """Whether n bytes at offset ``off`` (read from the file: any value) lie past the
        header and within the mapped file, without an overflowing sum."""
        return (LOG_HEADER_SIZE <= off <= <uint64_t>self.mapped
                and n <= <uint64_t>self.mapped - off)

    cdef int _load_block_crcs(self) except -1:
        """A sealed log's checksum table, copied for the reads to check against. A log
        without one (older, or sealed with no room) is read unchecked; a damaged table
        too (localconsistencycheck reports it; entries with a digest are still checked)."""
        cdef uint64_t off = el_get64(self.base + 20)
        cdef uint64_t map_off = el_get64(self.base + 8)
        cdef const uint8_t *t
        cdef uint32_t count, k
        if off == 0 or map_off < LOG_HEADER_SIZE or not self._fits(off, 16):
            return 0
        t = self.base + off
        count = el_get32(t + 8)
        if memcmp4(<uint8_t *>t, b"ELBC") or el_get32(t + 4) != CRC_BLOCK_BYTES or \
                not self._fits(off, 16 + 4 * <uint64_t>count) or \
                <uint64_t>count * CRC_BLOCK_BYTES < map_off - LOG_HEADER_SIZE or \
                el_crc32c(0, t, 12 + 4 * count) != el_get32(t + 12 + 4 * count):
            return 0
        self._track(LOG_HEADER_SIZE + <Py_ssize_t>count * CRC_BLOCK_BYTES)
        for k in range(count):
            self.crcs[k] = el_get32(t + 12 + 4 * k)
        self.nblocks_known = count
        return 0

    cdef int _verify_block(self, Py_ssize_t k) except -1:
        cdef Py_ssize_t start = LOG_HEADER_SIZE + k * CRC_BLOCK_BYTES
        cdef Py_ssize_t n = min(<Py_ssize_t>CRC_BLOCK_BYTES, self.position - start)
        # with the GIL held: a seal may unmap the log as soon as it is released
        cdef uint32_t c = el_crc32c(0, self.base + start, n)
        if c != self.crcs[k]:
            raise CorruptedDataError(
                f"entry log {self.path} offset {start}: bytes {start}..{start + n} do not match "
                "their block checksum (the file was damaged after they were written)")
        self.verified[k >> 3] |= <uint8_t>(1 << (k & 7))
        return 0

    cdef const uint8_t *checked_entry_at(self, uint32_t offset, Py_ssize_t *n) except? NULL:
        """entry_at, with the blocks the record spans checked against their checksums the
        first time one is read (CorruptedDataError if they do not match). Blocks without a
        checksum yet (the one being written) are read as they are."""
        if self.segment:
            return self._segment_entry(offset, n)          # sets crc_fresh
        self.crc_fresh = False
        cdef const uint8_t *p = self.entry_at(offset, n)
        cdef Py_ssize_t k, last
        if p == NULL or self.nblocks_known == 0:
            return p
        k = (<Py_ssize_t>offset - 4 - LOG_HEADER_SIZE) // CRC_BLOCK_BYTES
        last = min((<Py_ssize_t>offset + n[0] - 1 - LOG_HEADER_SIZE) // CRC_BLOCK_BYTES,
                   self.nblocks_known - 1)
        while k <= last:
            if not (self.verified[k >> 3] & (1 << (k & 7))):
                self._verify_block(k)
            k += 1
        return p

    cdef const uint8_t *_segment_entry(self, uint32_t offset, Py_ssize_t *n) except? NULL:
        """The entry of the journal record at ``offset`` of a segment, its crc checked the
        first time it is read while the segment is mapped (_segment_check); NULL past the
        mapped end (the file grew since it was mapped: map it again). A record there that
        fails its crc, or is no entry, is damage: CorruptedDataError, never its bytes."""
        cdef Py_ssize_t avail, body, g
        cdef uint8_t t
        self.crc_fresh = False
        if self.base == NULL or offset < JOURNAL_HEADER_BYTES or \
                <Py_ssize_t>offset + RECORD_HEADER_SIZE > self.position:
            return NULL
        avail = self.position - offset
        body = el_get32(self.base + offset)
        if body == 0 or body > avail - RECORD_HEADER_SIZE:
            return NULL
        t = self.base[offset + 8]
        # an entry record holds at least an entry's header (32 bytes): so no two start in
        # one 32-byte granule of the checked-record bitmap
        if (t != REC_ENTRY and t != REC_ENTRY_CRC32C) or body < V1_HEADER_SIZE:
            raise CorruptedDataError(f"journal segment {self.path} offset {offset}: the record "
                                     "fails its checksum")
        g = (<Py_ssize_t>offset - JOURNAL_HEADER_BYTES) >> SEGMENT_GRANULE_BITS
        if self.seg_checked != NULL and g < self.seg_granules and \
                self.seg_checked[g >> 3] & (1 << (g & 7)):
            pass                                # checked since the segment was mapped
        elif not self._segment_check(offset, body):
            raise CorruptedDataError(f"journal segment {self.path} offset {offset}: the record "
                                     "fails its checksum")
        else:
            self.crc_fresh = t == REC_ENTRY_CRC32C      # valid_record checked its digest
        n[0] = body
        return self.base + offset + RECORD_HEADER_SIZE

    cdef bint _segment_check(self, Py_ssize_t offset, Py_ssize_t body) except -1:
        """Whether the entry record at ``offset`` (``body`` bytes after its head, within the
        mapping: _segment_entry checked) passes its crc (valid_record: an ENTRY_CRC32C
        record's digest too); if it does, its bit is set in seg_checked, and later reads
        while the segment is mapped do not check it again (docs/FORMATS.md, "A read": a
        segment's records are not rewritten while it is mapped). The bitmap (a bit per 32
        bytes, 1/256 of the segment) is allocated at the first read; calloc's pages cost
        nothing until a bit in them is set."""
        cdef Py_ssize_t g, nbits
        if valid_record(self.base + offset, self.position - offset, self.position - offset,
                        self.salt) != body:
            return False
        if self.seg_checked == NULL:
            nbits = (min(self.position, <Py_ssize_t>1 << 32) - JOURNAL_HEADER_BYTES +
                     (1 << SEGMENT_GRANULE_BITS) - 1) >> SEGMENT_GRANULE_BITS
            self.seg_checked = <uint8_t *>calloc(max(nbits, 1) // 8 + 1, 1)
            if self.seg_checked == NULL:
                raise MemoryError()
            self.seg_granules = nbits
        g = (offset - JOURNAL_HEADER_BYTES) >> SEGMENT_GRANULE_BITS
        if 0 <= g < self.seg_granules:
            self.seg_checked[g >> 3] |= <uint8_t>(1 << (g & 7))
        return True

    def segment_checked(self):
        """File offsets of the 32-byte granules whose entry record's crc passed since this
        segment was mapped (tests, diagnostics)."""
        cdef Py_ssize_t g
        if self.seg_checked == NULL:
            return []
        return [JOURNAL_HEADER_BYTES + (g << SEGMENT_GRANULE_BITS) for g in range(self.seg_granules)
                if self.seg_checked[g >> 3] & (1 << (g & 7))]

    @staticmethod
    def open_segment(path, uint64_t log_id):
        """Map a journal file read-only as the storage of the entries it holds (layout 2),
        up to its current size."""
        from embedlog._native import journal_format as jformat
        cdef MappedLog m = MappedLog()
        m.log_id = log_id
        m.path = path
        m.segment = True
        m.fd = os.open(path, os.O_RDONLY)
        m.mapped = os.fstat(m.fd).st_size
        if m.mapped < JOURNAL_HEADER_BYTES:
            m._unmap()
            raise CorruptedDataError(f"journal segment {path} is shorter than its header")
        m._map(PROT_READ)
        header = PyBytes_FromStringAndSize(<const char *>m.base, JOURNAL_HEADER_BYTES)
        try:
            jformat.check_file_header(header)
        except ValueError as exc:
            m._unmap()
            raise CorruptedDataError(f"journal segment {path} offset 0: {exc}") from None
        m.salt = jformat.file_salt(header)[1]
        m.position = m.mapped
        return m

    @property
    def sealed(self):
        """True if the header points at a ledgers map."""
        return self.base != NULL and el_get64(self.base + 8) != 0

    def entry_table(self):
        """Every entry of the log as numpy arrays (locations, sizes, scopes, ledgers, entry ids),
        in file order; the ids are read from each entry's header without checking its digest.
        A journal segment's: its entry records up to the first that fails its crc."""
        if self.segment:
            return self._segment_table()
        cdef Py_ssize_t pos = HEADER_SIZE, count = 0, i
        cdef uint32_t n
        while pos + 4 <= self.position:
            n = el_get32(self.base + pos)
            if n == 0 or n == MAP_MARKER or pos + 4 + n > self.position:
                break
            count += 1
            pos += 4 + n
        locs_a, sizes_a, scopes_a, lids_a, eids_a = table = _entry_arrays(count)
        cdef uint64_t[::1] locs = locs_a
        cdef uint32_t[::1] sizes = sizes_a
        cdef uint64_t[::1] scopes = scopes_a
        cdef uint64_t[::1] lids = lids_a
        cdef int64_t[::1] eids = eids_a
        cdef uint64_t sc, li
        cdef int64_t ei
        pos = HEADER_SIZE
        for i in range(count):
            n = el_get32(self.base + pos)
            parse_ids(self.base + pos + 4, n, &sc, &li, &ei)
            locs[i] = (self.log_id << 32) | <uint64_t>(pos + 4)
            sizes[i] = n
            scopes[i] = sc
            lids[i] = li
            eids[i] = ei
            pos += 4 + n
        return table

    def _segment_table(self):
        # two C passes over the records (count, then fill), no Python object per record:
        # a 2 GiB segment of 1 KiB entries holds two million of them
        cdef Py_ssize_t count = 0
        if self.base != NULL:
            count = _walk_segment(self.base, self.position, self.salt, self.log_id,
                                  NULL, NULL, NULL, NULL, NULL, 0)
        table = _entry_arrays(count)
        cdef uint64_t[::1] locs = table[0]
        cdef uint32_t[::1] sizes = table[1]
        cdef uint64_t[::1] scopes = table[2]
        cdef uint64_t[::1] lids = table[3]
        cdef int64_t[::1] eids = table[4]
        if count:
            _walk_segment(self.base, self.position, self.salt, self.log_id, &locs[0],
                          &sizes[0], &scopes[0], &lids[0], &eids[0], count)
        return table

    def ledger_runs(self):
        """A journal segment's entry records as runs of one ledger each, in file order:
        numpy arrays (scopes, ledgers, bytes with their record headers). The walk runs
        without the GIL (a server's loop goes on meanwhile), so only the thread that opened
        this map may use it: no other may close it during the call."""
        import numpy as np
        cdef Py_ssize_t count = 0
        if not self.segment:
            raise CorruptedDataError(f"{self.path} is not a journal segment")
        cdef const uint8_t *base = self.base
        cdef Py_ssize_t position = self.position
        cdef uint32_t salt = self.salt
        if base != NULL:
            with nogil:
                count = _walk_runs(base, position, salt, NULL, NULL, NULL, 0)
        scopes_a = np.empty(count, dtype=np.uint64)
        lids_a = np.empty(count, dtype=np.uint64)
        bytes_a = np.empty(count, dtype=np.uint64)
        cdef uint64_t[::1] scopes = scopes_a
        cdef uint64_t[::1] lids = lids_a
        cdef uint64_t[::1] nbytes = bytes_a
        if count:
            with nogil:
                _walk_runs(base, position, salt, &scopes[0], &lids[0], &nbytes[0], count)
        return scopes_a, lids_a, bytes_a

    def scanned_ledgers(self):
        """{(scope, ledger): bytes} counted from the entries (a log without a ledgers map)."""
        locs, sizes, scopes, lids, _eids = self.entry_table()
        out = {}
        for s, l, n in zip(scopes.tolist(), lids.tolist(), sizes.tolist()):
            out[(s, l)] = out.get((s, l), 0) + n + 4
        return out

    def copy_entries(self, MappedLog src, locations, Py_ssize_t reserve=0):
        """Append the entries of ``src`` at ``locations`` (uint64 array, in order) to this log.

        Returns (count copied, their new locations): copying stops at the first entry that
        would leave fewer than ``reserve`` bytes free (room kept for the ledgers map)."""
        import numpy as np
        cdef uint64_t[::1] locs = np.ascontiguousarray(locations, dtype=np.uint64)
        cdef Py_ssize_t i, total = locs.shape[0]
        out_a = np.zeros(total, dtype=np.uint64)
        cdef uint64_t[::1] out = out_a
        cdef const uint8_t *p
        cdef Py_ssize_t n = 0
        if not self.writable or self.base == NULL:
            raise CorruptedDataError(f"entry log {self.path} is not open for writing")
        for i in range(total):
            if <uint64_t>(locs[i] >> 32) != src.log_id:
                raise CorruptedDataError(f"location {locs[i]:#x} is not in log {src.log_id:x}")
            p = src.checked_entry_at(<uint32_t>locs[i], &n)   # never copy damaged bytes
            if p == NULL:
                raise CorruptedDataError(f"no entry at {locs[i]:#x} in {src.path}")
            if self.position + 4 + n + reserve > self.mapped:
                return i, out_a[:i]
            self.reserve(4 + n)
            out[i] = self.append(p, n)
        return total, out_a

    cdef int reserve(self, Py_ssize_t n) except -1:
        """Allocate disk blocks for ``n`` more bytes at the write position (a chunk ahead):
        OSError (ENOSPC) here, rather than SIGBUS when the map is written."""
        cdef Py_ssize_t need = self.position + n
        if need <= self.allocated:
            return 0
        cdef Py_ssize_t end = min(self.mapped, max(need, self.allocated + ALLOC_CHUNK))
        try:
            os.posix_fallocate(self.fd, self.allocated, end - self.allocated)
        except OSError as exc:
            if exc.errno != errno_ENOSPC or end == need:
                raise
            # a nearly full disk: take only what these bytes need (replay after a full
            # disk needs no more room than the data it replays)
            end = need
            os.posix_fallocate(self.fd, self.allocated, end - self.allocated)
        self.allocated = end
        return 0

    cdef Py_ssize_t _scan_end(self):
        cdef uint64_t map_off = el_get64(self.base + 8)
        if map_off:
            # the seal writes the offset of a map it has written: one outside the file is damage
            if map_off < HEADER_SIZE or map_off > <uint64_t>self.mapped:
                raise CorruptedDataError(
                    f"entry log {self.path}: ledgers map offset {map_off} is outside the file")
            return <Py_ssize_t>map_off
        cdef Py_ssize_t pos = HEADER_SIZE
        cdef Py_ssize_t end = self.mapped
        cdef uint32_t n
        # an unsealed log is sparse past its entries: read no page of a hole, which on a
        # full tmpfs faults with SIGBUS even for a read (it allocates); an entry cut by the
        # hole (a flush the disk refused part of) is not one
        try:
            end = min(end, os.lseek(self.fd, HEADER_SIZE, os.SEEK_HOLE))
        except OSError:
            pass
        if end > HEADER_SIZE:
            # the walk reads every page: the pages a memtable flush dropped from the cache
            # (entry_log_page_cache_bytes) come back in large reads, not a fault at a time
            os.posix_fadvise(self.fd, HEADER_SIZE, end - HEADER_SIZE, os.POSIX_FADV_WILLNEED)
        while pos + 4 <= end:
            n = el_get32(self.base + pos)
            if n == 0 or n == MAP_MARKER or pos + 4 + n > end:
                break
            pos += 4 + n
        return pos

    cdef uint64_t append(self, const uint8_t *data, Py_ssize_t n) noexcept nogil:
        """Write one entry; its location, or 0 if it does not fit."""
        cdef Py_ssize_t pos = self.position
        if pos + 4 + n > self.mapped:
            return 0
        el_put32(self.base + pos, <uint32_t>n)
        memcpy(self.base + pos + 4, data, n)
        if self.tracking:
            self._crc_feed(self.base + pos, 4 + n)
        self.position = pos + 4 + n
        if self.tracking:
            self.nblocks_known = (self.position - LOG_HEADER_SIZE) // CRC_BLOCK_BYTES
        return (self.log_id << 32) | <uint64_t>(pos + 4)

    cdef int write_end(self, const uint8_t *data, Py_ssize_t n) except -1:
        """pwrite ``n`` framed bytes at the write position (GIL released), then move it."""
        cdef Py_ssize_t done = 0
        cdef ssize_t w
        cdef int err = 0
        if self.position + n > self.mapped:
            raise CorruptedDataError(f"entry log {self.path}: a write past its size limit")
        with nogil:
            while done < n:
                w = pwrite(self.fd, data + done, n - done, self.position + done)
                if w < 0:
                    if errno == EINTR:
                        continue
                    err = errno
                    break
                done += w
            if not err and self.tracking:
                self._crc_feed(data, n)
        if err:
            raise OSError(err, f"write to entry log {self.path} failed: {os.strerror(err)}")
        self.position += n
        if self.tracking:
            self.nblocks_known = (self.position - LOG_HEADER_SIZE) // CRC_BLOCK_BYTES
        if self.allocated < self.position:
            self.allocated = self.position
        return 0

    cdef const uint8_t *entry_at(self, uint32_t offset, Py_ssize_t *n) noexcept nogil:
        if self.base == NULL or offset < LOG_HEADER_SIZE + 4 or offset > self.position:
            return NULL
        cdef uint32_t size = el_get32(self.base + offset - 4)
        if size == 0 or <Py_ssize_t>offset + size > self.position:     # 64-bit: no wrap
            return NULL
        n[0] = size
        return self.base + offset

    def read_at(self, uint64_t location):
        """The encoded entry at ``location`` (bytes); CorruptedDataError if none is there."""
        cdef Py_ssize_t n = 0
        cdef const uint8_t *p
        if <uint64_t>(location >> 32) != self.log_id:
            raise CorruptedDataError(f"location {location:#x} is not in entry log {self.log_id:x}")
        p = (self._segment_entry(<uint32_t>location, &n) if self.segment else
             self.entry_at(<uint32_t>location, &n))
        if p == NULL:
            raise CorruptedDataError(f"no entry at offset {location & 0xFFFFFFFF} of {self.path}")
        return PyBytes_FromStringAndSize(<const char *>p, n)

    def flush(self):
        """msync what was written since the last flush, then fdatasync."""
        cdef Py_ssize_t start = (self.synced // 4096) * 4096
        cdef Py_ssize_t end = self.position
        cdef int r = 0
        cdef Py_ssize_t at = self._tail_start(), count = self.nblocks_known
        if self.writable and end > start:
            if self.tracking and count > self.crcs_persisted and end <= at:
                # the crcs of the blocks completed so far, durable with them: a start-up seal
                # after a crash writes these rather than crcs of what the file holds then
                table = bytearray(16 + 4 * count)
                table[0:4] = b"ELBC"
                table[4:12] = (<uint64_t>CRC_BLOCK_BYTES << 32 | <uint64_t>count).to_bytes(8, "big")
                for k in range(count):
                    table[12 + 4 * k:16 + 4 * k] = self.crcs[k].to_bytes(4, "big")
                table[12 + 4 * count:] = el_crc32c(0, table, 12 + 4 * count).to_bytes(4, "big")
                try:
                    os.pwrite(self.fd, table, at)
                    self.crcs_persisted = count
                except OSError as exc:
                    if exc.errno != errno_ENOSPC:     # a full disk: they are an aid, not data
                        raise
            with nogil:
                r = msync(self.base + start, end - start, MS_SYNC)
            if r != 0:
                raise OSError(f"msync of entry log {self.path} failed")
            fileio.sync(self.fd, self.path, end)
            self.synced = end

    def seal(self, ledgers):
        """Append the ledgers map ({(scope, ledger): bytes}), cut the file, sync it."""
        cdef Py_ssize_t pos = self.position
        cdef Py_ssize_t nblocks = (pos - LOG_HEADER_SIZE + CRC_BLOCK_BYTES - 1) // CRC_BLOCK_BYTES
        cdef Py_ssize_t need = 8 + 24 * len(ledgers) + 4
        cdef Py_ssize_t crcs_need = 12 + 4 * nblocks + 4
        cdef uint8_t *p
        cdef uint32_t c
        if not self.writable:
            return
        if pos + need + crcs_need <= self.mapped:
            need += crcs_need
            self.reserve(need)
            p = self.base + pos
            el_put32(p, MAP_MARKER)
            el_put32(p + 4, len(ledgers))
            p += 8
            for (scope, lid), nbytes in sorted(ledgers.items()):
                el_put64(p, scope)
                el_put64(p + 8, lid)
                el_put64(p + 16, nbytes)
                p += 24
            c = el_crc32c(0, self.base + pos, 8 + 24 * len(ledgers))
            el_put32(p, c)
            p += 4
            self._write_block_crcs(p, pos, nblocks)
            self.position = pos + need
            self.flush()
            el_put64(self.base + 8, pos)
            el_put32(self.base + 16, len(ledgers))
            el_put64(self.base + 20, <uint64_t>(p - self.base))
        end = self.position
        msync(self.base, 4096, MS_SYNC)
        self.position = pos
        self._unmap()
        os.truncate(self.path, end)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fileio.sync(fd, self.path, end, data_only=False)
        finally:
            os.close(fd)

    cdef _write_block_crcs(self, uint8_t *p, Py_ssize_t end, Py_ssize_t nblocks):
        cdef Py_ssize_t k, start, n
        cdef uint8_t *table = p
        memcpy(p, b"ELBC", 4)
        el_put32(p + 4, CRC_BLOCK_BYTES)
        el_put32(p + 8, nblocks)
        p += 12
        cdef Py_ssize_t known = self.nblocks_known if self.crcs != NULL else 0
        with nogil:
            for k in range(nblocks):
                start = LOG_HEADER_SIZE + k * CRC_BLOCK_BYTES
                n = min(<Py_ssize_t>CRC_BLOCK_BYTES, end - start)
                # the crcs taken as the blocks were written: damage since is found on read
                el_put32(p + 4 * k, self.crcs[k] if k < known and n == CRC_BLOCK_BYTES
                         else el_crc32c(0, self.base + start, n))
        el_put32(p + 4 * nblocks, el_crc32c(0, table, 12 + 4 * nblocks))

    def damaged_blocks(self):
        """(start, end) file offsets of the blocks whose bytes no longer match the checksums
        taken at the seal; None when the log has no checksums (unsealed, or older)."""
        cdef uint64_t off = el_get64(self.base + 20) if self.mapped >= 28 else 0
        cdef uint64_t map_off = el_get64(self.base + 8)
        cdef uint32_t bsize, count, k
        cdef const uint8_t *t
        cdef Py_ssize_t start, n
        if off == 0 or map_off == 0:
            return None
        if not self._fits(off, 16):
            raise CorruptedDataError(f"entry log {self.path} offset 20: block checksums at {off}, "
                                     "past the end")
        t = self.base + off
        if memcmp4(<uint8_t *>t, b"ELBC"):
            raise CorruptedDataError(f"entry log {self.path} offset {off}: bad block checksum table")
        bsize, count = el_get32(t + 4), el_get32(t + 8)
        if bsize == 0 or not self._fits(off, 16 + 4 * <uint64_t>count) or \
                el_crc32c(0, t, 12 + 4 * count) != el_get32(t + 12 + 4 * count):
            raise CorruptedDataError(f"entry log {self.path} offset {off}: block checksum table "
                                     "damaged")
        bad = []
        for k in range(count):
            start = HEADER_SIZE + k * bsize
            n = min(<Py_ssize_t>bsize, <Py_ssize_t>map_off - start)
            if n > 0 and el_crc32c(0, self.base + start, n) != el_get32(t + 12 + 4 * k):
                bad.append((start, start + n))
        return bad

    def ledgers_map(self):
        """{(scope, ledger): bytes} from a sealed log, or None if it has none."""
        cdef uint64_t off = el_get64(self.base + 8)
        cdef uint32_t count, i
        cdef const uint8_t *p
        if off == 0 or off + 12 > <uint64_t>self.mapped:
            return None
        p = self.base + off
        if el_get32(p) != MAP_MARKER:
            raise CorruptedDataError(f"entry log {self.path}: ledgers map marker missing")
        count = el_get32(p + 4)
        if off + 12 + 24 * <uint64_t>count > <uint64_t>self.mapped:
            raise CorruptedDataError(f"entry log {self.path}: ledgers map runs past the end")
        if el_crc32c(0, p, 8 + 24 * count) != el_get32(p + 8 + 24 * count):
            raise CorruptedDataError(f"entry log {self.path}: ledgers map checksum mismatch")
        out = {}
        p += 8
        for i in range(count):
            out[(el_get64(p), el_get64(p + 8))] = el_get64(p + 16)
            p += 24
        return out

    def scan(self):
        """Yield (location, encoded entry bytes) of every entry in the log."""
        cdef Py_ssize_t pos = HEADER_SIZE
        cdef uint32_t n
        while pos + 4 <= self.position:
            n = el_get32(self.base + pos)
            if n == 0 or n == MAP_MARKER or pos + 4 + n > self.position:
                break
            yield (self.log_id << 32) | <uint64_t>(pos + 4), PyBytes_FromStringAndSize(
                <const char *>self.base + pos + 4, n)
            pos += 4 + n


cdef MappedLog _open_log(path, uint64_t log_id, bint writable):
    """An existing log mapped at the end of its entries: read-only, with the checksum table
    of its seal; or ``writable``, its write position there, with the block crcs the last
    flush of an unsealed log kept in its tail."""
    cdef MappedLog m = MappedLog()
    m.log_id = log_id
    m.path = path
    m.fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    m.mapped = os.fstat(m.fd).st_size
    m.writable = writable
    if m.mapped < HEADER_SIZE:
        m._unmap()
        raise CorruptedDataError(f"entry log {path} is shorter than its header")
    m._map(PROT_READ | PROT_WRITE if writable else PROT_READ)
    m._check_header()
    m.position = m._scan_end()
    if writable:
        m.allocated = m.position
        m.synced = 0
        m._load_tail_crcs()
    else:
        m._load_block_crcs()
    return m


cdef inline int memcmp4(const uint8_t *a, const char *b) noexcept:
    cdef int i
    for i in range(4):
        if a[i] != <uint8_t>b[i]:
            return 1
    return 0
