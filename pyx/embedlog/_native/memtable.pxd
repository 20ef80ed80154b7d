from libc.stdint cimport uint8_t, uint32_t, int32_t, uint64_t, int64_t

ctypedef struct mt_rec:
    uint64_t scope
    uint64_t lid
    int64_t eid
    uint64_t offset
    uint32_t size
    uint64_t where          # layout 2: journal seq of its record, or its location (bit 63)

ctypedef struct mt_block:
    uint64_t scope
    uint64_t lid
    int64_t hi              # entry id >> 6
    int32_t slot[64]        # record index + 1 of entry (hi << 6) + i; 0: none

cdef class MemTable:
    cdef uint8_t *arena
    cdef Py_ssize_t arena_capacity
    cdef Py_ssize_t arena_used
    cdef mt_rec *recs
    cdef Py_ssize_t nrecs
    cdef Py_ssize_t recs_capacity
    cdef mt_block *blocks
    cdef Py_ssize_t nblocks
    cdef Py_ssize_t blocks_capacity
    cdef int32_t *bslots      # open addressing: hash(scope, lid, hi) -> block index + 1
    cdef Py_ssize_t nbslots
    cdef Py_ssize_t last_block
    cdef Py_ssize_t live
    cdef readonly Py_ssize_t limit_bytes
    cdef public uint64_t next_where     # the next commit's ``where`` (then reset to 0)
    cdef readonly uint64_t max_pending  # the highest journal ``where`` committed (0: none)
    cdef Py_ssize_t _find_block(self, uint64_t scope, uint64_t lid, int64_t hi) noexcept nogil
    cdef int prepare(self, Py_ssize_t count, Py_ssize_t new_blocks) except -1
    cdef bint fits(self, Py_ssize_t n, Py_ssize_t new_blocks) noexcept nogil
    cdef bint opens_block(self, uint64_t scope, uint64_t lid, int64_t eid) noexcept nogil
    cdef Py_ssize_t _make_block(self, uint64_t scope, uint64_t lid, int64_t hi) noexcept nogil
    cdef int put(self, uint64_t scope, uint64_t lid, int64_t eid, const uint8_t *data,
                 Py_ssize_t n) except -2
    cdef uint8_t *reserve(self, Py_ssize_t n) noexcept nogil
    cdef int commit(self, uint64_t scope, uint64_t lid, int64_t eid, uint8_t *data,
                    Py_ssize_t n) noexcept nogil
    cdef const uint8_t *get(self, uint64_t scope, uint64_t lid, int64_t eid,
                            Py_ssize_t *n) noexcept nogil
    cdef Py_ssize_t flush_order(self, int32_t *out, Py_ssize_t cap) except -1
    cdef bint holds_range(self, uint64_t scope, uint64_t lid, int64_t lo, int64_t hi) noexcept nogil
