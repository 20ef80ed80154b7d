# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The floor of benchmarks/compare.py: the least work that gives the same result, as a
bare C loop (built on first use by compare.py, with embedlog's own CRC32C from native.h).

Writes: each payload framed as ``size:u32`` + a V1 entry (ledger, entry, LAC, length,
CRC32C digest over those and the payload, payload) into one buffer, one pwrite, one
fdatasync per batch (``direct``: O_DIRECT, the batch padded to whole 4 KiB blocks); no
journal, memtable, entry log or index. Reads: the same records
in one mapped file per ledger, located by an offset table, the digest checked, a bytes
object made per entry.
"""
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset
from libc.errno cimport errno, EINTR
from posix.unistd cimport pwrite, fdatasync
from posix.stdlib cimport posix_memalign
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE

cdef extern from "native.h" nogil:
    void el_put32(uint8_t *p, uint32_t v)
    void el_put64(uint8_t *p, uint64_t v)
    uint32_t el_get32(const uint8_t *p)
    uint32_t el_crc32c(uint32_t crc, const uint8_t *p, size_t n)
    void el_crc_init()

el_crc_init()

cdef enum:
    HDR = 4 + 32 + 4        # size word, V1 header, CRC32C digest
    BLOCK = 4096            # O_DIRECT's unit: the buffer's alignment and the padded size


cdef class Writer:
    """Frames batches into a reused buffer and writes them durably at the file's tail."""
    cdef uint8_t *buf
    cdef Py_ssize_t cap
    cdef const uint8_t **src
    cdef Py_ssize_t *lens
    cdef Py_ssize_t nsrc

    def __cinit__(self):
        self.buf = NULL
        self.cap = 0
        self.src = NULL
        self.lens = NULL
        self.nsrc = 0

    def __dealloc__(self):
        free(self.buf)
        free(self.src)
        free(self.lens)

    def frame(self, list payloads, uint64_t lid, int64_t first_eid, int64_t length,
              Py_ssize_t at=0):
        """Frame payloads (bytes) as entries first_eid, ... into the buffer from offset
        ``at``, without the GIL after the pointers are taken; returns (end offset, ledger
        length after)."""
        cdef Py_ssize_t i, n = PyList_GET_SIZE(payloads), total = at, pos = at, k
        cdef object item
        cdef uint8_t *p
        cdef uint32_t c
        if n > self.nsrc:
            self.src = <const uint8_t **>realloc(self.src, n * sizeof(void *))
            self.lens = <Py_ssize_t *>realloc(self.lens, n * sizeof(Py_ssize_t))
            if self.src == NULL or self.lens == NULL:
                raise MemoryError()
            self.nsrc = n
        for i in range(n):
            item = <object>PyList_GET_ITEM(payloads, i)
            self.src[i] = <const uint8_t *>PyBytes_AS_STRING(item)
            self.lens[i] = PyBytes_GET_SIZE(item)
            total += HDR + self.lens[i]
        if total + BLOCK > self.cap:
            # aligned for O_DIRECT, with room to pad the last block
            if posix_memalign(<void **>&p, BLOCK, total + BLOCK) != 0:
                raise MemoryError()
            if self.buf != NULL:
                memcpy(p, self.buf, at)
            free(self.buf)
            self.buf, self.cap = p, total + BLOCK
        with nogil:
            for i in range(n):
                k = self.lens[i]
                p = self.buf + pos
                length += k
                el_put32(p, <uint32_t>(32 + 4 + k))
                el_put64(p + 4, lid)
                el_put64(p + 12, <uint64_t>(first_eid + i))
                el_put64(p + 20, <uint64_t>(first_eid + i - 1))
                el_put64(p + 28, <uint64_t>length)
                c = el_crc32c(0, p + 4, 32)
                memcpy(p + HDR, self.src[i], k)
                el_put32(p + 36, el_crc32c(c, p + HDR, k))
                pos += HDR + k
        return pos, length

    def write(self, int fd, long long offset, Py_ssize_t nbytes, bint sync=True,
              bint direct=False):
        """pwrite the framed bytes at ``offset`` and fdatasync, without the GIL; returns the
        bytes written. ``direct`` (an O_DIRECT fd, ``offset`` block-aligned): the last block
        padded with zeros, so the next batch starts at the next block."""
        cdef Py_ssize_t done = 0
        cdef ssize_t r
        cdef int err = 0
        if direct:
            r = (nbytes + BLOCK - 1) // BLOCK * BLOCK
            if r > self.cap or offset % BLOCK:
                raise ValueError("direct write: unaligned offset or no room to pad")
            memset(self.buf + nbytes, 0, r - nbytes)
            nbytes = r
        with nogil:
            while done < nbytes:
                r = pwrite(fd, self.buf + done, nbytes - done, offset + done)
                if r < 0:
                    if errno == EINTR:
                        continue
                    err = errno
                    break
                done += r
            if not err and sync and fdatasync(fd) != 0:
                err = errno
        if err:
            raise OSError(err, "floor write failed")
        return done

    def framed(self, Py_ssize_t nbytes):
        return PyBytes_FromStringAndSize(<const char *>self.buf, nbytes)


cdef object _checked(const uint8_t *p):
    """The payload of the framed record at ``p`` after its digest is checked."""
    cdef uint32_t size = el_get32(p)
    cdef uint32_t c = el_crc32c(0, p + 4, 32)
    c = el_crc32c(c, p + HDR, size - 36)
    if c != el_get32(p + 36):
        raise ValueError("digest mismatch")
    return PyBytes_FromStringAndSize(<const char *>p + HDR, size - 36)


cdef class Reader:
    """One ledger's framed records in a mapped file (``data``: the mmap), by entry id."""
    cdef const uint8_t[::1] data
    cdef Py_ssize_t[::1] offs
    cdef Py_ssize_t count

    def __init__(self, data):
        import numpy as np
        self.data = data
        cdef Py_ssize_t pos = 0, n = 0, end = self.data.shape[0]
        while pos + HDR <= end:
            pos += 4 + el_get32(&self.data[pos])
            n += 1
        self.offs = np.empty(max(n, 1), dtype=np.intp)
        pos = 0
        for i in range(n):
            self.offs[i] = pos
            pos += 4 + el_get32(&self.data[pos])
        self.count = n

    def get(self, Py_ssize_t eid):
        if not 0 <= eid < self.count:
            raise IndexError(eid)
        return _checked(&self.data[self.offs[eid]])

    def scan(self):
        cdef Py_ssize_t i
        return [_checked(&self.data[self.offs[i]]) for i in range(self.count)]
