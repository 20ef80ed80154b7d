from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t

cdef enum:
    DIRECT_ALIGN = 4096         # O_DIRECT writes: address, length and file offset

cdef class JournalBuffer:
    cdef uint8_t *base          # DIRECT_ALIGN-aligned; data = base + lead
    cdef Py_ssize_t lead        # file offset % DIRECT_ALIGN the records are expected at
    cdef uint8_t *data
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity
    cdef Py_ssize_t records
    cdef public uint64_t seq0   # journal sequence number of data[0] (the journal sets it)
    cdef public bint groups     # begin each group with a GROUP record (the journal sets it)
    cdef uint8_t *reserve(self, Py_ssize_t n) except NULL
    cdef void seal(self, uint8_t *rec, Py_ssize_t body_len, int rtype) noexcept nogil
    cdef int direct_blocks(self, long long offset, bytes tail, Py_ssize_t *end,
                           Py_ssize_t *padded) except -1
    cdef bytes tail_after(self, Py_ssize_t end)

cdef int pwrite_all(int fd, const uint8_t *p, Py_ssize_t n, long long offset) noexcept nogil
cdef int fdatasync_all(int fd) noexcept nogil
cdef int write_and_sync(int fd, const uint8_t *p, Py_ssize_t n, long long offset,
                        long long *sync_ns) noexcept nogil


cdef enum:
    RUNS_COMPACT_AT = 4096      # LedgerRuns merges its runs per ledger when this many fill it

cdef struct ledger_run:
    uint64_t scope
    uint64_t lid
    uint64_t nbytes

cdef class LedgerRuns:
    cdef ledger_run *runs
    cdef Py_ssize_t count
    cdef Py_ssize_t cap
    cdef int add(self, uint64_t scope, uint64_t lid, uint64_t nbytes) except -1
    cdef void _merge(self) noexcept
