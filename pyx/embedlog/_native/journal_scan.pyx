# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The journal scanner replay reads a file with: every record of journal_format.pyx's
grammar checked in one pass without the GIL, and the end of the log told from a torn tail and
from corruption in the middle (LevelDB's log reader). Replay (bookie/replay.py) applies what
it finds; the kernels (journal_kernels.pyx) put runs of entries into the memtable straight
from the ``Records`` it returns.

Bounds: a record's length is checked against what is left of the mapping and against
``max_record_size`` before its checksum is read (``valid_record``); ``Records.push`` grows
by doubling and reports failure instead of writing.
"""

from libc.stdlib cimport realloc, free

from embedlog._native.format cimport el_get32, el_crc32c, el_crc_init, V1_HEADER_SIZE, V2_HEADER_SIZE
from embedlog._native.journal_format cimport RECORD_HEADER_SIZE, REC_ENTRY_CRC32C, REC_MAX

from embedlog._native.journal_format import HEADER_SIZE, file_salt

el_crc_init()


cdef bint _all_zero(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i]:
            return False
    return True


cdef Py_ssize_t valid_record(const uint8_t *p, Py_ssize_t avail, Py_ssize_t max_len,
                              uint32_t salt) noexcept nogil:
    """Body length of a good record at p, 0 at end of log, -1 if bad or torn. ``salt``: the
    file's (journal_format: every record crc of a recycled file's life is xored with it)."""
    if avail < 4:
        return 0 if _all_zero(p, avail) else -1
    cdef uint32_t n = el_get32(p)
    if n == 0:
        return 0
    if avail < RECORD_HEADER_SIZE or n > max_len or n > avail - RECORD_HEADER_SIZE:
        return -1
    cdef uint32_t c = el_crc32c(0, p, 4)
    cdef Py_ssize_t h
    if p[8] == REC_ENTRY_CRC32C:
        h = V2_HEADER_SIZE if p[RECORD_HEADER_SIZE] & 0x80 else V1_HEADER_SIZE
        if n < h + 4:
            return -1
        c = el_crc32c(c, p + 8, 1 + h + 4)
        if c ^ salt != el_get32(p + 4):
            return -1
        c = el_crc32c(0, p + RECORD_HEADER_SIZE, h)
        c = el_crc32c(c, p + RECORD_HEADER_SIZE + h + 4, n - h - 4)
        return n if c == el_get32(p + RECORD_HEADER_SIZE + h) else -1
    c = el_crc32c(c, p + 8, n + 1)
    if c ^ salt != el_get32(p + 4):
        return -1
    return n


cdef class Records:
    """scan()'s records as C structs, so replay walks them without a Python object per
    record; ``records[i]`` is the tuple (offset, type, body_start, body_len)."""

    def __dealloc__(self):
        free(self.recs)

    cdef int push(self, int64_t off, int rtype, int64_t body_len) noexcept nogil:
        """Append a record; -1 when out of memory."""
        cdef jrec *r
        cdef Py_ssize_t cap
        if self.n == self.cap:
            cap = max(self.cap * 2, 1024)
            r = <jrec *>realloc(self.recs, cap * sizeof(jrec))
            if r == NULL:
                return -1
            self.recs, self.cap = r, cap
        r = &self.recs[self.n]
        r.off, r.rtype, r.body_start, r.body_len = off, rtype, off + RECORD_HEADER_SIZE, body_len
        self.n += 1
        return 0

    def __len__(self):
        return self.n

    def __getitem__(self, Py_ssize_t i):
        cdef jrec *r
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("record index out of range")
        r = &self.recs[i]
        return r.off, r.rtype, r.body_start, r.body_len


def scan(data, Py_ssize_t start=512, Py_ssize_t max_record_size=64 << 20, bint skip_corrupt=False,
         uint32_t salt=0, bint recycled=False):
    """Walk the records of one journal file held in ``data`` (bytes or an mmap).

    Returns (records, end, status, skipped) where records is a sequence (``Records``) of
    (offset, type, body_start, body_len), ``end`` is the offset after the last
    good record, status is "clean" (ended by zeros or at the file end), "torn" (a
    bad or partial record followed only by zeros: safe to cut at ``end``) or
    "corrupt" (a bad record at ``end`` with data after it). With skip_corrupt, a
    corrupt region is stepped over to the next good record and reported in
    ``skipped`` as (offset, length); the scan then goes on.

    ``salt`` and ``recycled`` come from the file's header (journal_format.file_salt). In a
    recycled file the previous life's records follow the tail: they never check (another
    salt), and the search for good records after a bad one, which tells corruption from the
    end, considers only records of a known type no longer than twice the longest record
    seen before it (at least 64 KiB), so megabytes of stale payload cost a pass, not a
    checksum at every byte.
    """
    cdef const uint8_t[::1] v = data
    cdef Py_ssize_t total = v.shape[0]
    cdef Py_ssize_t off = start, n = 0, probe, longest = 0, probe_len = max_record_size
    cdef const uint8_t *base = &v[0] if total else NULL
    cdef Records records = Records()
    cdef int err = 0
    skipped = []
    status = "clean"
    while off < total:
        with nogil:         # the memtable flusher and the prefetcher run meanwhile
            while off < total:
                n = valid_record(base + off, total - off, max_record_size, salt)
                if n <= 0:
                    break
                if records.push(off, base[off + 8], n) < 0:
                    err = 1
                    break
                if n > longest:
                    longest = n
                off += RECORD_HEADER_SIZE + n
        if err:
            raise MemoryError()
        if off >= total:
            break
        # a zero length ends the log, a bad record is a torn tail, if no good record
        # follows; a good record after either is corruption in the middle
        if recycled:
            probe_len = min(max_record_size, max(2 * longest, 64 << 10))
        with nogil:
            probe = _next_good(base, off + 1, total, probe_len, salt, recycled)
        if probe < 0:
            if n < 0:
                status = "torn"
            break
        if not skip_corrupt:
            status = "corrupt"
            break
        skipped.append((off, probe - off))
        off = probe
    return records, off, status, skipped


def scan_file(data, Py_ssize_t max_record_size=64 << 20, bint skip_corrupt=False):
    """scan() of a whole journal file from its first record, with its header's salt."""
    recycled_from, salt = file_salt(data[:HEADER_SIZE])
    return scan(data, HEADER_SIZE, max_record_size, skip_corrupt, salt, recycled_from != 0)


cdef Py_ssize_t _next_good(const uint8_t *base, Py_ssize_t off, Py_ssize_t total,
                           Py_ssize_t max_len, uint32_t salt, bint known_types) noexcept nogil:
    """Offset of the next good record at or after ``off``, or -1 if none: tells a
    torn tail (garbage, then only zeros) from corruption (good records after it).
    ``known_types``: only records whose type byte is one of the grammar's."""
    cdef uint8_t t
    while off < total:
        if off % 4096 == 0 and total - off >= 4096 and _all_zero(base + off, 4096):
            off += 4096
            continue
        if known_types and total - off >= RECORD_HEADER_SIZE:
            t = base[off + 8]
            if t == 0 or t > REC_MAX:
                off += 1
                continue
        if valid_record(base + off, total - off, max_len, salt) > 0:
            return off
        off += 1
    return -1
