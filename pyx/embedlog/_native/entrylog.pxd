from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t

cdef enum:
    LOG_HEADER_SIZE = 1024
    CRC_BLOCK_BYTES = 65536        # bytes per checksummed block of a sealed log
    SEGMENT_GRANULE_BITS = 5       # a segment's checked-record bitmap: a bit per 32 bytes

cdef class MappedLog:
    cdef readonly uint64_t log_id
    cdef readonly object path
    cdef int fd
    cdef uint8_t *base
    cdef readonly Py_ssize_t mapped
    cdef readonly Py_ssize_t position      # end of the entries written so far
    cdef readonly bint writable
    cdef readonly bint segment              # a journal file kept as storage (layout 2)
    cdef uint32_t salt                      # its records' crcs are xored with this
    cdef Py_ssize_t synced
    cdef Py_ssize_t allocated               # blocks allocated (fallocate) up to here
    # block checksums checked on read: crcs[k] of block k < nblocks_known (from the sealed
    # table, or computed as a memtable flush completes the block of a log being written),
    # verified[] a bitmap of the blocks checked since the log was mapped
    cdef uint32_t *crcs
    cdef uint8_t *verified
    cdef Py_ssize_t nblocks_known
    cdef bint tracking                      # crcs are taken as bytes are written
    cdef uint32_t crc_run                   # the crc of the block being written, so far
    cdef Py_ssize_t crcs_persisted          # blocks whose crcs flush() wrote to the file's tail
    # a journal segment's entry records whose crcs passed since it was mapped: bit g of
    # seg_checked for the record starting in bytes [512 + 32 g, 512 + 32 g + 32) (an entry
    # record is at least 41 bytes long: at most one starts in each); seg_granules bits
    cdef uint8_t *seg_checked
    cdef Py_ssize_t seg_granules
    # the last checked_entry_at checked a CRC32C digest over the entry it returns (a segment's
    # ENTRY_CRC32C record read for the first time): the reader need not compute it again
    cdef bint crc_fresh
    cdef Py_ssize_t _tail_start(self)
    cdef int _load_tail_crcs(self) except -1
    cdef int _track(self, Py_ssize_t capacity_bytes) except -1
    cdef void _crc_feed(self, const uint8_t *data, Py_ssize_t n) noexcept nogil
    cdef bint _fits(self, uint64_t off, uint64_t n) noexcept
    cdef int _load_block_crcs(self) except -1
    cdef int _verify_block(self, Py_ssize_t k) except -1
    cdef const uint8_t *checked_entry_at(self, uint32_t offset, Py_ssize_t *n) except? NULL
    cdef const uint8_t *_segment_entry(self, uint32_t offset, Py_ssize_t *n) except? NULL
    cdef bint _segment_check(self, Py_ssize_t offset, Py_ssize_t end) except -1
    cdef int reserve(self, Py_ssize_t n) except -1
    cdef _unmap(self)
    cdef int _map(self, int prot) except -1
    cdef Py_ssize_t _scan_end(self)
    cdef _check_header(self)
    cdef _write_block_crcs(self, uint8_t *p, Py_ssize_t end, Py_ssize_t nblocks)
    cdef uint64_t append(self, const uint8_t *data, Py_ssize_t n) noexcept nogil
    cdef int write_end(self, const uint8_t *data, Py_ssize_t n) except -1
    cdef const uint8_t *entry_at(self, uint32_t offset, Py_ssize_t *n) noexcept nogil
