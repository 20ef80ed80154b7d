# The protobuf primitives of bkwire.pyx (BookKeeper's v3 frames), shared with bkencode.pyx
# (the encoder) and bkserve.pyx (the bookie's side of v3 and v2): one varint codec for all.
from libc.stdint cimport uint8_t, uint64_t

cdef enum:
    WT_VARINT = 0        # protobuf wire types
    WT_I64 = 1
    WT_LEN = 2
    WT_I32 = 5
    VERSION_THREE_C = 3
    RECOVERY_ADD_C = 1


cdef inline int vsize(uint64_t v) noexcept nogil:
    cdef int n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline uint8_t *put_varint(uint8_t *p, uint64_t v) noexcept nogil:
    while v >= 0x80:
        p[0] = <uint8_t>(v | 0x80)
        p += 1
        v >>= 7
    p[0] = <uint8_t>v
    return p + 1


cdef inline const uint8_t *get_varint(const uint8_t *p, const uint8_t *end, uint64_t *out) noexcept nogil:
    """The varint at p, or NULL when it runs past end or over 10 bytes / 64 bits."""
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef uint8_t b
    while p < end:
        b = p[0]
        p += 1
        if shift == 63 and b > 1:
            return NULL
        v |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = v
            return p
        shift += 7
        if shift > 63:
            return NULL
    return NULL
