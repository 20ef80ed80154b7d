from libc.stdint cimport uint8_t, uint32_t, int64_t

ctypedef struct jrec:
    int64_t off
    int64_t body_start
    int64_t body_len
    int rtype

cdef class Records:
    cdef jrec *recs
    cdef Py_ssize_t n, cap
    cdef int push(self, int64_t off, int rtype, int64_t body_len) noexcept nogil

cdef Py_ssize_t valid_record(const uint8_t *p, Py_ssize_t avail, Py_ssize_t max_len,
                              uint32_t salt) noexcept nogil
