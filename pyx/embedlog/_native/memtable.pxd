from libc.stdint cimport uint8_t, uint32_t, int32_t, uint64_t, int64_t

ctypedef struct mt_rec:
    uint64_t scope
    uint64_t lid
    int64_t eid
    uint64_t offset
    uint32_t size

cdef class MemTable:
    cdef uint8_t *arena
    cdef Py_ssize_t arena_capacity
    cdef Py_ssize_t arena_used
    cdef mt_rec *recs
    cdef Py_ssize_t nrecs
    cdef Py_ssize_t recs_capacity
    cdef int32_t *slots
    cdef Py_ssize_t nslots
    cdef Py_ssize_t live
    cdef readonly Py_ssize_t limit_bytes
    cdef int _grow_index(self) except -1
    cdef void _slot_set(self, Py_ssize_t idx, bint replace) noexcept nogil
    cdef _rebuild_slots(self)
    cdef int put(self, uint64_t scope, uint64_t lid, int64_t eid, const uint8_t *data,
                 Py_ssize_t n) except -2
    cdef uint8_t *reserve(self, Py_ssize_t n) noexcept nogil
    cdef int commit(self, uint64_t scope, uint64_t lid, int64_t eid, uint8_t *data,
                    Py_ssize_t n) except -1
    cdef const uint8_t *get(self, uint64_t scope, uint64_t lid, int64_t eid,
                            Py_ssize_t *n) noexcept nogil
