# Entry format (BookKeeper V1, BP-35 V2), checksums and the 128-bit ledger id.
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t

cdef extern from "native.h":
    void el_put64(uint8_t *p, uint64_t v) nogil
    void el_put32(uint8_t *p, uint32_t v) nogil
    uint64_t el_get64(const uint8_t *p) nogil
    uint32_t el_get32(const uint8_t *p) nogil
    uint32_t el_crc32c(uint32_t crc, const uint8_t *p, size_t n) nogil
    uint32_t el_crc32c_copy(uint32_t crc, uint8_t *dst, const uint8_t *src, size_t n) nogil
    uint32_t el_crc32(uint32_t crc, const uint8_t *p, size_t n) nogil
    void el_crc_init()
    int el_crc_hw

cdef enum:
    DIGEST_CRC32 = 1
    DIGEST_MAC = 2
    DIGEST_CRC32C = 3
    DIGEST_DUMMY = 4
    V1_HEADER_SIZE = 32
    V2_HEADER_SIZE = 41
    V2_FLAGS = 0xA0        # MSB set, format version 2 in bits 4-6

cdef inline int cmp_ledgers(uint64_t scope_a, uint64_t lid_a, uint64_t scope_b,
                            uint64_t lid_b) noexcept nogil:
    """-1, 0 or 1: (scope, ledger) pairs in the order flushes and maps sort them."""
    if scope_a != scope_b:
        return -1 if scope_a < scope_b else 1
    if lid_a != lid_b:
        return -1 if lid_a < lid_b else 1
    return 0

cdef class LedgerId:
    cdef readonly uint64_t scope_id
    cdef readonly uint64_t ledger_id

cdef LedgerId as_ledger_id(object value)
cdef int digest_size(int digest) except -1
cdef Py_ssize_t encoded_size(uint64_t scope, int digest, Py_ssize_t n) except -1
cdef Py_ssize_t encode_into(uint8_t *dst, uint64_t scope, uint64_t lid, int64_t eid,
                            int64_t lac, int64_t length, int digest, object mac_key,
                            const uint8_t *payload, Py_ssize_t n) except -1
cdef Py_ssize_t put_header(uint8_t *dst, uint64_t scope, uint64_t lid, int64_t eid,
                           int64_t lac, int64_t length, int digest) noexcept nogil
cdef Py_ssize_t check_entry(const uint8_t *buf, Py_ssize_t n, uint64_t scope, uint64_t lid,
                            int64_t eid, int digest, object mac_key, bint crc_known=*) except -1
cdef object decode_payload(const uint8_t *buf, Py_ssize_t n, uint64_t scope, uint64_t lid,
                           int64_t eid, int digest, object mac_key, bint crc_known=*)
cdef int parse_ids(const uint8_t *buf, Py_ssize_t n, uint64_t *scope, uint64_t *lid,
                   int64_t *eid) except -1
