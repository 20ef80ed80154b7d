# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Journal records: the buffer appenders frame records into, the raw file I/O the
group-commit leader runs without the GIL, and the replay scanner.

Grammar (big-endian; see docs/FORMATS.md)::

    journal_file := header(512) record* zeros*
    header       := "ELJN" version:u32(=2; 1 before ENTRY_CRC32C) log_id:u64 header_crc:u32
                    prev_log_id:u64 chain_crc:u32 min_size:u64 size_crc:u32 zeros(472)
                    # header_crc = crc32c(bytes 0..15); chain_crc = crc32c(bytes 0..27): the
                    # journal written before this one (0: none), so a missing file is seen;
                    # size_crc = crc32c(bytes 0..39): min_size, the size its preallocated
                    # zeros gave the file (0: none), so a file found shorter was cut; headers
                    # written before the chain or the size existed hold zeros there
    record       := len:u32 crc:u32 type:u8 body[len]     # len > 0
    crc          := crc32c(len:u32 type:u8 body)          # all types but ENTRY_CRC32C
    type ENTRY(1)        body := encoded entry (V1 or V2), as the client sent it
    type ENTRY_CRC32C(9) body := encoded entry (V1 or V2) with a CRC32C digest; crc covers
                                 len, type and the entry's header and digest only: the digest
                                 (crc32c of header and payload) covers the payload, so the
                                 add path reads each payload once. Valid = both match.
    type LEDGER_KEY(2)   body := scope:u64 ledger:u64 master_key
    type FENCE(3)        body := scope:u64 ledger:u64
    type EXPLICIT_LAC(4) body := scope:u64 ledger:u64 lac:i64
    type TERM(5)         body := scope:u64 ledger:u64 term:u64
    type TRUNCATE(6)     body := scope:u64 ledger:u64 last_kept_entry:i64
    type DELETE_LEDGER(7)body := scope:u64 ledger:u64
    type TRIM(8)         body := scope:u64 ledger:u64 first_kept_entry:i64

A zero ``len`` is the end of the log: files are preallocated with zeros, so a
preallocated tail never parses; a zero ``len`` followed by a good record is corruption,
as a bad record followed by a good one is. Replay skips records of unknown type with a good
crc, so newer record types can be added.

Bounds: a record's length is checked against what is left of the mapping and against
``max_record_size`` before its checksum is read (``_valid_record``); ``Records.push`` grows
by doubling and reports failure instead of writing; replay checks every record's body lies
within the data; the add kernels check every entry (ids 0..MAX_ENTRY_ID, header, size within
the memtable) before framing any, and reserve the journal buffer for the whole pass before
writing into it (``JournalBuffer.reserve`` grows to fit); a header's ``min_size`` is read
only behind its own crc.
"""

from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memmove, memset
from libc.errno cimport errno, EINTR, ENOSPC
from posix.unistd cimport pwrite, fdatasync, fsync
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from posix.types cimport clockid_t

from cpython.bytes cimport PyBytes_Check, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE

from embedlog._native.format cimport (el_put32, el_put64, el_get32, el_get64, el_crc32c,
                                      el_crc32c_copy, el_crc32, el_crc_init, parse_ids,
                                      encode_into, encoded_size, put_header, DIGEST_CRC32,
                                      DIGEST_CRC32C, DIGEST_MAC, V1_HEADER_SIZE, V2_HEADER_SIZE)
from embedlog._native.memtable cimport MemTable

from embedlog._native.format import parse_entry_header, MAX_ENTRY_ID

cdef uint64_t V1_LEDGER_LIMIT = 1ULL << 63
cdef int64_t MAX_LENGTH = 0x7FFFFFFFFFFFFFFF     # a ledger's length is an i64 in every entry
from embedlog.errors import (CorruptedDataError, EntryTooLargeError, IllegalOpError,
                             JournalCorruptedError)

el_crc_init()

HEADER_SIZE = 512
cdef Py_ssize_t NOGIL_MIN_BYTES = 64 << 10   # add_payloads releases the GIL from this size
DIRECT_ALIGN_BYTES = DIRECT_ALIGN
MAX_MASTER_KEY = 64            # what an index file can hold (index.pyx MAX_KEY)
MAGIC = b"ELJN"
FORMAT_VERSION = 2            # 2: ENTRY_CRC32C records (a version 1 reader would skip them)
READABLE_VERSIONS = (1, 2)
RECORD_TYPES = {REC_ENTRY: "entry", REC_ENTRY_CRC32C: "entry", REC_LEDGER_KEY: "ledger_key", REC_FENCE: "fence",
                REC_EXPLICIT_LAC: "explicit_lac", REC_TERM: "term", REC_TRUNCATE: "truncate",
                REC_DELETE_LEDGER: "delete_ledger", REC_TRIM: "trim"}
ENTRY, LEDGER_KEY, FENCE, EXPLICIT_LAC, TERM, TRUNCATE, DELETE_LEDGER, TRIM = (
    REC_ENTRY, REC_LEDGER_KEY, REC_FENCE, REC_EXPLICIT_LAC, REC_TERM, REC_TRUNCATE,
    REC_DELETE_LEDGER, REC_TRIM)
ENTRY_CRC32C = REC_ENTRY_CRC32C
ENTRY_TYPES = (REC_ENTRY, REC_ENTRY_CRC32C)


def file_header(unsigned long long log_id, unsigned long long prev_log_id=0,
                unsigned long long min_size=0):
    """The 512-byte header of journal file ``log_id``, written after ``prev_log_id``, whose
    preallocation made it ``min_size`` bytes long."""
    cdef bytearray h = bytearray(512)
    cdef uint8_t *p = h
    memcpy(p, b"ELJN", 4)
    el_put32(p + 4, FORMAT_VERSION)
    el_put64(p + 8, log_id)
    el_put32(p + 16, el_crc32c(0, p, 16))
    el_put64(p + 20, prev_log_id)
    el_put32(p + 28, el_crc32c(0, p, 28))
    el_put64(p + 32, min_size)
    el_put32(p + 40, el_crc32c(0, p, 40))
    return bytes(h)


def file_min_size(data):
    """The size a journal file's preallocation gave it (0: none, or a header from before
    the field; call check_file_header first)."""
    cdef const uint8_t[::1] v = data
    if v.shape[0] < 44 or el_get32(&v[40]) != el_crc32c(0, &v[0], 40):
        return 0
    return el_get64(&v[32])


def file_chain(data):
    """The id of the journal written before this one (0: none), or None for a header
    written before journals were chained (call check_file_header first)."""
    cdef const uint8_t[::1] v = data
    if el_get32(&v[28]) != el_crc32c(0, &v[0], 28):
        return None
    return el_get64(&v[20])


class JournalHeaderError(JournalCorruptedError, ValueError):
    """A journal file whose header does not parse (a ValueError too, as callers expect)."""


def check_file_header(data):
    """The log id of a journal header; JournalHeaderError if it is not one."""
    cdef const uint8_t[::1] v = data
    if v.shape[0] < 512 or bytes(data[:4]) != MAGIC:
        raise JournalHeaderError("not an embedlog journal (bad magic)")
    if el_get32(&v[16]) != el_crc32c(0, &v[0], 16):
        raise JournalHeaderError("journal header checksum mismatch")
    if el_get32(&v[4]) not in READABLE_VERSIONS:
        raise JournalHeaderError(f"unknown journal format version {el_get32(&v[4])}")
    return el_get64(&v[8])


def decode_record(int rtype, body):
    """The fields of one record's body, as replay applies them: ENTRY -> the entry's header
    (format.parse_entry_header); LEDGER_KEY -> (scope, ledger, master_key); FENCE and
    DELETE_LEDGER -> (scope, ledger); EXPLICIT_LAC, TRUNCATE, TRIM -> (scope, ledger, i64);
    TERM -> (scope, ledger, u64); an unknown type -> None (skipped: newer types may be added).
    JournalCorruptedError when the body does not fit its type."""
    cdef const uint8_t[::1] v = body
    cdef Py_ssize_t n = v.shape[0]
    if rtype == REC_ENTRY or rtype == REC_ENTRY_CRC32C:
        return parse_entry_header(body)
    if rtype not in RECORD_TYPES:
        return None
    if rtype == REC_LEDGER_KEY:
        if not 16 <= n <= 16 + MAX_MASTER_KEY:
            raise JournalCorruptedError(f"ledger key record of {n} bytes (16 + a key of at most "
                                        f"{MAX_MASTER_KEY})")
        return el_get64(&v[0]), el_get64(&v[8]), bytes(body[16:])
    if rtype == REC_FENCE or rtype == REC_DELETE_LEDGER:
        if n != 16:
            raise JournalCorruptedError(f"{RECORD_TYPES[rtype]} record of {n} bytes, expected 16")
        return el_get64(&v[0]), el_get64(&v[8])
    if n != 24:
        raise JournalCorruptedError(f"{RECORD_TYPES[rtype]} record of {n} bytes, expected 24")
    if rtype == REC_TERM:
        return el_get64(&v[0]), el_get64(&v[8]), el_get64(&v[16])
    return el_get64(&v[0]), el_get64(&v[8]), <int64_t>el_get64(&v[16])


cdef extern from "stdlib.h" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)


cdef uint8_t *_aligned_alloc(Py_ssize_t n) noexcept nogil:
    cdef void *p = NULL
    if posix_memalign(&p, DIRECT_ALIGN, n) != 0:
        return NULL
    return <uint8_t *>p


cdef int _pwrite_all(int fd, const uint8_t *p, Py_ssize_t n, long long offset) noexcept nogil:
    """pwrite all n bytes (through short writes and EINTR); 0 or the errno."""
    cdef ssize_t r
    cdef Py_ssize_t done = 0
    while done < n:
        r = pwrite(fd, p + done, n - done, offset + done)
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        if r == 0:
            return ENOSPC           # no progress: the device took nothing
        done += r
    return 0


cdef class JournalBuffer:
    """Framed records waiting to be written; appenders fill it under the bookie lock.

    The records start ``lead`` bytes into a DIRECT_ALIGN-aligned block, ``lead`` being the
    file offset % DIRECT_ALIGN they are expected at (set_lead), so write_direct can put the
    file's partial block in front of them and write whole aligned blocks without a copy.
    The allocation keeps DIRECT_ALIGN spare at each end for that block and the zero padding.
    """

    def __cinit__(self, Py_ssize_t capacity=1 << 20):
        self.base = _aligned_alloc(capacity + 2 * DIRECT_ALIGN)
        if self.base == NULL:
            raise MemoryError()
        self.lead = 0
        self.data = self.base
        self.capacity = capacity
        self.size = 0
        self.records = 0

    def __dealloc__(self):
        free(self.base)

    cdef uint8_t *reserve(self, Py_ssize_t n) except NULL:
        """Room for n more bytes at the end (grows by doubling)."""
        cdef Py_ssize_t cap = self.capacity
        cdef uint8_t *p
        if self.size + n > cap:
            while self.size + n > cap:
                cap *= 2
            p = _aligned_alloc(cap + 2 * DIRECT_ALIGN)
            if p == NULL:
                raise MemoryError()
            memcpy(p + self.lead, self.data, self.size)
            free(self.base)
            self.base = p
            self.data = p + self.lead
            self.capacity = cap
        return self.data + self.size

    def set_lead(self, Py_ssize_t file_offset):
        """The file offset the next records will be written at (an empty buffer only)."""
        if self.size == 0:
            self.lead = file_offset % DIRECT_ALIGN
            self.data = self.base + self.lead

    cdef void seal(self, uint8_t *rec, Py_ssize_t body_len, int rtype) noexcept nogil:
        """Finish the record whose body was written at rec + RECORD_HEADER_SIZE."""
        el_put32(rec, <uint32_t>body_len)
        rec[8] = <uint8_t>rtype
        cdef uint32_t c = el_crc32c(0, rec, 4)
        c = el_crc32c(c, rec + 8, body_len + 1)
        el_put32(rec + 4, c)
        self.size += RECORD_HEADER_SIZE + body_len
        self.records += 1

    def add_record(self, int rtype, body):
        """Frame one record (meta records and entries that arrive encoded)."""
        cdef const uint8_t[::1] b = body
        cdef Py_ssize_t n = b.shape[0]
        if n == 0:
            raise ValueError("journal records have a body")
        cdef uint8_t *rec = self.reserve(RECORD_HEADER_SIZE + n)
        memcpy(rec + RECORD_HEADER_SIZE, &b[0], n)
        self.seal(rec, n, rtype)
        return self.size

    @property
    def nbytes(self):
        return self.size

    @property
    def nrecords(self):
        return self.records

    def clear(self):
        self.size = 0
        self.records = 0

    def entry_ids(self):
        """(scope, ledger, entry id) of every ENTRY record framed in the buffer (a group the
        disk refused: those entries are taken back out of the memtable)."""
        cdef Py_ssize_t off = 0, n
        cdef uint64_t s, l
        cdef int64_t e
        out = []
        while off + RECORD_HEADER_SIZE <= self.size:
            n = el_get32(self.data + off)
            if self.data[off + 8] == REC_ENTRY or self.data[off + 8] == REC_ENTRY_CRC32C:
                parse_ids(self.data + off + RECORD_HEADER_SIZE, n, &s, &l, &e)
                out.append((s, l, e))
            off += RECORD_HEADER_SIZE + n
        return out

    def swap(self, JournalBuffer other):
        """Exchange contents with ``other`` (an emptied spare), so writing needs no lock."""
        self.base, other.base = other.base, self.base
        self.lead, other.lead = other.lead, self.lead
        self.data, other.data = other.data, self.data
        self.size, other.size = other.size, self.size
        self.capacity, other.capacity = other.capacity, self.capacity
        self.records, other.records = other.records, self.records

    def write_to(self, int fd, long long offset):
        """pwrite the whole buffer at ``offset`` without the GIL; returns bytes written."""
        cdef int err
        with nogil:
            err = _pwrite_all(fd, self.data, self.size, offset)
        if err:
            raise OSError(err, "journal write failed")
        return self.size

    def write_direct(self, int fd, long long offset, bytes tail):
        """Write the records at ``offset`` through ``fd`` opened with O_DIRECT: whole
        DIRECT_ALIGN blocks from ``offset - len(tail)``, ``tail`` being the file's bytes in
        front of ``offset`` in its block (written again, unchanged, so a torn block write
        leaves either version of them), the last block padded with zeros (the end of the
        log). Returns the new tail: the bytes of the last partial block written."""
        cdef Py_ssize_t lag = offset % DIRECT_ALIGN, end, padded
        cdef int err
        cdef uint8_t *start
        if PyBytes_GET_SIZE(tail) != lag:
            raise ValueError(f"tail of {PyBytes_GET_SIZE(tail)} bytes for offset {offset}")
        if lag != self.lead:                  # written elsewhere than expected (a new file)
            memmove(self.base + lag, self.data, self.size)
            self.lead = lag
            self.data = self.base + lag
        start = self.base
        memcpy(start, PyBytes_AS_STRING(tail), lag)
        end = lag + self.size
        padded = (end + DIRECT_ALIGN - 1) & ~(<Py_ssize_t>DIRECT_ALIGN - 1)
        memset(start + end, 0, padded - end)
        with nogil:
            err = _pwrite_all(fd, start, padded, offset - lag)
        if err:
            raise OSError(err, "journal write failed")
        return start[end & ~(<Py_ssize_t>DIRECT_ALIGN - 1):end]


cdef extern from "native.h" nogil:
    uint64_t el_load_acquire(const uint64_t *p)
    void el_store_release(uint64_t *p, uint64_t v)


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    ctypedef struct pthread_condattr_t:
        pass
    int pthread_condattr_init(pthread_condattr_t *)
    int pthread_condattr_setclock(pthread_condattr_t *, clockid_t)
    int pthread_condattr_destroy(pthread_condattr_t *)
    int pthread_mutex_init(pthread_mutex_t *, void *)
    int pthread_mutex_destroy(pthread_mutex_t *)
    int pthread_mutex_lock(pthread_mutex_t *)
    int pthread_mutex_unlock(pthread_mutex_t *)
    int pthread_cond_init(pthread_cond_t *, pthread_condattr_t *)
    int pthread_cond_destroy(pthread_cond_t *)
    int pthread_cond_signal(pthread_cond_t *)
    int pthread_cond_timedwait(pthread_cond_t *, pthread_mutex_t *, const timespec *)


cdef struct Waiter:
    pthread_cond_t cond          # its own, so a publish wakes only those it concerns
    uint64_t seq
    bint woken
    Waiter *next                 # in the waiting list or the spare list


cdef void _free_waiters(Waiter *w) noexcept nogil:
    cdef Waiter *nxt
    while w != NULL:
        nxt = w.next
        pthread_cond_destroy(&w.cond)
        free(w)
        w = nxt


DEF MAX_SIGNALS = 64             # waiters a publish wakes after unlocking (the rest before)


cdef class DurableSeq:
    """How far the journal is durable, for waiters outside the bookie's lock: a waiter
    whose group is being synced sleeps here without the GIL. The leader's ``publish`` wakes
    the waiters its group covers and one it does not (the lowest seq: the next group
    needs a leader), not everyone: with 16 appending threads, waking those of the next group
    too sent each of them through the GIL for nothing, a context switch or two per add.
    ``epoch`` moves on every publish and ``wake``, so a waiter that looked at the journal
    before a publish and sleeps after it returns at once and looks again; ``wake`` (a
    failed group, a close) wakes everyone."""
    cdef pthread_mutex_t mu
    cdef uint64_t _synced
    cdef uint64_t _epoch
    cdef Waiter *waiting
    cdef Waiter *spare           # slots are kept: a late signal must find a live cond

    def __cinit__(self):
        pthread_mutex_init(&self.mu, NULL)
        self._synced = 0
        self._epoch = 0
        self.waiting = NULL
        self.spare = NULL

    def __dealloc__(self):
        _free_waiters(self.waiting)         # none: a waiter holds a reference to self
        _free_waiters(self.spare)
        pthread_mutex_destroy(&self.mu)

    @property
    def synced(self):
        return el_load_acquire(&self._synced)

    @property
    def epoch(self):
        return el_load_acquire(&self._epoch)

    @property
    def nwaiting(self):
        """Waiters asleep now (for tests)."""
        cdef Waiter *w
        cdef int n = 0
        with nogil:
            pthread_mutex_lock(&self.mu)
            w = self.waiting
            while w != NULL:
                n += 1
                w = w.next
            pthread_mutex_unlock(&self.mu)
        return n

    def publish(self, uint64_t synced):
        """The journal is durable up to ``synced``: wake the waiters it covers and the
        first one it does not. Keeps the GIL: the leader calls it holding the bookie's lock,
        and a GIL let go there hands it to appenders that then queue on that lock (no waiter
        takes the GIL while it holds ``mu``, so this cannot deadlock)."""
        self._publish(synced, False)

    def wake(self):
        """Something changed that waiters must look at (a failed group, a close)."""
        self._publish(0, True)

    cdef void _publish(self, uint64_t synced, bint everyone) noexcept nogil:
        cdef Waiter *signal[MAX_SIGNALS]
        cdef int n = 0, i
        cdef Waiter **link
        cdef Waiter **first_link = NULL
        cdef Waiter *w
        pthread_mutex_lock(&self.mu)
        if synced > self._synced:
            el_store_release(&self._synced, synced)
        el_store_release(&self._epoch, self._epoch + 1)
        link = &self.waiting
        while link[0] != NULL:
            w = link[0]
            if everyone or w.seq <= self._synced:
                link[0] = w.next
                self._woken(w, signal, &n)
                continue
            if first_link == NULL or w.seq < first_link[0].seq:
                first_link = link
            link = &w.next
        if first_link != NULL:
            w = first_link[0]
            first_link[0] = w.next
            self._woken(w, signal, &n)
        pthread_mutex_unlock(&self.mu)
        # outside the lock, so the woken do not queue on it behind the publisher; a slot
        # reused meanwhile gets a spurious wake-up, which its waiter sleeps through
        for i in range(n):
            pthread_cond_signal(&signal[i].cond)

    cdef inline void _woken(self, Waiter *w, Waiter **signal, int *n) noexcept nogil:
        w.woken = True
        if n[0] < MAX_SIGNALS:
            signal[n[0]] = w
            n[0] += 1
        else:
            pthread_cond_signal(&w.cond)

    def wait(self, uint64_t seq, uint64_t epoch, double timeout_s):
        """Sleep until a publish covers ``seq`` or picks this waiter to lead, a ``wake``,
        or ``timeout_s``; returns at once if the epoch moved past ``epoch``. Returns
        whether ``seq`` is durable."""
        cdef timespec ts
        cdef bint reached
        cdef Waiter *w
        cdef Waiter **link
        cdef pthread_condattr_t attr
        clock_gettime(CLOCK_MONOTONIC, &ts)
        ts.tv_sec += <long>timeout_s
        ts.tv_nsec += <long>((timeout_s - <long>timeout_s) * 1e9)
        if ts.tv_nsec >= 1000000000:
            ts.tv_sec += 1
            ts.tv_nsec -= 1000000000
        with nogil:
            pthread_mutex_lock(&self.mu)
            if self._synced < seq and self._epoch == epoch:
                w = self.spare
                if w != NULL:
                    self.spare = w.next
                else:
                    w = <Waiter *>malloc(sizeof(Waiter))
                    if w != NULL:
                        pthread_condattr_init(&attr)
                        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)   # a wall-clock step moves no wait
                        pthread_cond_init(&w.cond, &attr)
                        pthread_condattr_destroy(&attr)
                if w != NULL:
                    w.seq = seq
                    w.woken = False
                    w.next = self.waiting
                    self.waiting = w
                    while not w.woken:
                        if pthread_cond_timedwait(&w.cond, &self.mu, &ts) != 0:
                            break   # timed out (the caller looks at its deadline)
                    if not w.woken:
                        link = &self.waiting
                        while link[0] != w:
                            link = &link[0].next
                        link[0] = w.next
                    w.next = self.spare
                    self.spare = w
            reached = self._synced >= seq
            pthread_mutex_unlock(&self.mu)
        return reached


def sync_fd(int fd, bint data_only=True):
    """fdatasync (or fsync) without the GIL."""
    cdef int r, err = 0
    with nogil:
        r = fdatasync(fd) if data_only else fsync(fd)
        if r != 0:
            err = errno
    if err:
        raise OSError(err, "journal sync failed")


def write_zeros(int fd, long long offset, long long length, bint sync=True):
    """Preallocate [offset, offset+length) with real zeros (so later fdatasyncs are cheap).
    The buffer is aligned, so ``fd`` may be an O_DIRECT one (with offset and length aligned)."""
    cdef Py_ssize_t chunk = 1 << 20
    cdef uint8_t *z = _aligned_alloc(chunk)
    cdef long long done = 0
    cdef int err = 0
    if z == NULL:
        raise MemoryError()
    memset(z, 0, chunk)
    with nogil:
        while done < length and not err:
            err = _pwrite_all(fd, z, min(chunk, length - done), offset + done)
            done += chunk
        if not err and sync and fdatasync(fd) != 0:
            err = errno
    free(z)
    if err:
        raise OSError(err, "journal preallocation failed")


cdef bint _all_zero(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i]:
            return False
    return True


cdef Py_ssize_t _valid_record(const uint8_t *p, Py_ssize_t avail, Py_ssize_t max_len) noexcept nogil:
    """Body length of a good record at p, 0 at end of log, -1 if bad or torn."""
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
        if c != el_get32(p + 4):
            return -1
        c = el_crc32c(0, p + RECORD_HEADER_SIZE, h)
        c = el_crc32c(c, p + RECORD_HEADER_SIZE + h + 4, n - h - 4)
        return n if c == el_get32(p + RECORD_HEADER_SIZE + h) else -1
    c = el_crc32c(c, p + 8, n + 1)
    if c != el_get32(p + 4):
        return -1
    return n


ctypedef struct jrec:
    int64_t off
    int64_t body_start
    int64_t body_len
    int rtype


cdef class Records:
    """scan()'s records as C structs, so replay walks them without a Python object per
    record; ``records[i]`` is the tuple (offset, type, body_start, body_len)."""
    cdef jrec *recs
    cdef Py_ssize_t n, cap

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


def scan(data, Py_ssize_t start=512, Py_ssize_t max_record_size=64 << 20, bint skip_corrupt=False):
    """Walk the records of one journal file held in ``data`` (bytes or an mmap).

    Returns (records, end, status, skipped) where records is a sequence (``Records``) of
    (offset, type, body_start, body_len), ``end`` is the offset after the last
    good record, status is "clean" (ended by zeros or at the file end), "torn" (a
    bad or partial record followed only by zeros: safe to cut at ``end``) or
    "corrupt" (a bad record at ``end`` with data after it). With skip_corrupt, a
    corrupt region is stepped over to the next good record and reported in
    ``skipped`` as (offset, length); the scan then goes on.
    """
    cdef const uint8_t[::1] v = data
    cdef Py_ssize_t total = v.shape[0]
    cdef Py_ssize_t off = start, n = 0, probe
    cdef const uint8_t *base = &v[0] if total else NULL
    cdef Records records = Records()
    cdef int err = 0
    skipped = []
    status = "clean"
    while off < total:
        with nogil:         # the memtable flusher and the prefetcher run meanwhile
            while off < total:
                n = _valid_record(base + off, total - off, max_record_size)
                if n <= 0:
                    break
                if records.push(off, base[off + 8], n) < 0:
                    err = 1
                    break
                off += RECORD_HEADER_SIZE + n
        if err:
            raise MemoryError()
        if off >= total:
            break
        # a zero length ends the log, a bad record is a torn tail, if no good record
        # follows; a good record after either is corruption in the middle
        probe = _next_good(base, off + 1, total, max_record_size)
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


cdef Py_ssize_t _next_good(const uint8_t *base, Py_ssize_t off, Py_ssize_t total,
                           Py_ssize_t max_len) noexcept nogil:
    """Offset of the next good record at or after ``off``, or -1 if none: tells a
    torn tail (garbage, then only zeros) from corruption (good records after it)."""
    while off < total:
        if off % 4096 == 0 and total - off >= 4096 and _all_zero(base + off, 4096):
            off += 4096
            continue
        if _valid_record(base + off, total - off, max_len) > 0:
            return off
        off += 1
    return -1


# -- the add path: framing entries into the journal buffer, the memtable fed in the same pass --

cdef object _payload_view(object item):
    """A payload that is not bytes as a 1-D view of its bytes: any buffer (bytearray,
    memoryview, array, numpy array) taken in C order, as bytes(item) gives them; the one
    rule check_payloads and both framing paths apply. IllegalOpError for anything else."""
    try:
        m = memoryview(item)
    except TypeError:
        raise IllegalOpError(f"entries are bytes-like, got {type(item).__name__}") from None
    if not m.c_contiguous:
        return memoryview(m.tobytes())
    if m.ndim != 1 or m.format != "B":
        try:
            return m.cast("B")
        except (TypeError, ValueError):     # a format cast() does not know: copy it
            return memoryview(m.tobytes())
    return m


cdef int _check_entry_ids(int64_t lo, int64_t hi) except -1:
    """Entry ids lo..hi are within 0..MAX_ENTRY_ID (what an index addresses): the kernels
    never frame an id the bookie would refuse, nor step an id past int64."""
    cdef int64_t top = MAX_ENTRY_ID
    if lo < 0 or hi < lo or hi > top:
        raise IllegalOpError(f"entry ids {lo}..{hi} are outside 0..{top}")
    return 0


def check_payloads(list payloads, uint64_t scope, int digest, Py_ssize_t max_entry_size,
                   Py_ssize_t memtable_limit, Py_ssize_t start=0):
    """Raise what add_payloads would raise for the first payload of payloads[start:] it
    would refuse (not bytes-like, over max_entry_size, larger than an empty memtable).
    add_payloads calls it before framing a pass that leaves entries for a later one, so a
    batch spanning several passes never fails half-framed."""
    cdef Py_ssize_t i, n, total = PyList_GET_SIZE(payloads)
    cdef Py_ssize_t hdr = encoded_size(scope, digest, 0)
    cdef object item
    for i in range(start, total):
        item = <object>PyList_GET_ITEM(payloads, i)
        if PyBytes_Check(item):
            n = PyBytes_GET_SIZE(item)
        else:
            n = _payload_view(item).nbytes
        if n > max_entry_size:
            raise EntryTooLargeError(
                f"entry of {n} bytes exceeds max_entry_size_bytes={max_entry_size}")
        if hdr + n > memtable_limit:
            raise EntryTooLargeError(f"entry of {n} bytes exceeds the memtable limit")


cdef Py_ssize_t _frame_entries(uint8_t *rec, uint8_t *dst, MemTable mt, const uint8_t **src,
                               const Py_ssize_t *lens, Py_ssize_t count, uint64_t scope,
                               uint64_t lid, int64_t eid, int64_t lac, int64_t *length,
                               int digest) noexcept nogil:
    """add_payloads' pass: each entry framed as a journal record at ``rec`` and copied into
    the memtable at ``dst`` (room made beforehand); ``length`` becomes the ledger length
    after them. Returns how many were framed: fewer than count only if the memtable
    refused a commit (prepare made too little room), before that entry's record counts."""
    cdef Py_ssize_t i, k, n, enc
    cdef uint8_t *body
    cdef uint32_t c
    for i in range(count):
        n = lens[i]
        body = rec + RECORD_HEADER_SIZE
        k = put_header(body, scope, lid, eid, lac, length[0] + n, digest)
        if digest == DIGEST_CRC32C:
            c = el_crc32c(0, body, k)
            el_put32(body + k, el_crc32c_copy(c, body + k + 4, src[i], n))
            enc = k + 4 + n
            el_put32(rec, <uint32_t>enc)
            rec[8] = REC_ENTRY_CRC32C
            c = el_crc32c(el_crc32c(0, rec, 4), rec + 8, 1 + k + 4)
        else:
            if digest == DIGEST_CRC32:
                c = el_crc32(el_crc32(0, body, k), src[i], n)
                el_put64(body + k, c)
                k += 8
            if n:
                memcpy(body + k, src[i], n)
            enc = k + n
            el_put32(rec, <uint32_t>enc)
            rec[8] = REC_ENTRY
            c = el_crc32c(el_crc32c(0, rec, 4), rec + 8, 1 + enc)
        el_put32(rec + 4, c)
        memcpy(dst, body, enc)
        if mt.commit(scope, lid, eid, dst, enc) < 0:
            return i
        length[0] += n
        dst += enc
        rec += RECORD_HEADER_SIZE + enc
        eid += 1
    return count


def add_payloads(JournalBuffer jb, MemTable mt, uint64_t scope, uint64_t lid,
                 int64_t first_eid, int64_t lac, int64_t length, int digest, object mac_key,
                 list payloads, Py_ssize_t start, Py_ssize_t max_entry_size):
    """Encode payloads[start:] as entries first_eid, first_eid+1, ... into the journal
    buffer and the memtable, stopping early when the memtable is full.

    One pass per entry (_frame_entries), without the GIL for batches of NOGIL_MIN_BYTES or
    more: header, then the payload copied and checksummed together (CRC32C digests; the
    record's own checksum then covers only the header, see ENTRY_CRC32C), then the encoded
    entry copied into the memtable. The GIL is held only to take the payloads' addresses
    and sizes first. Returns (count, length): how many were taken and the ledger length
    after them.
    """
    cdef Py_ssize_t total = PyList_GET_SIZE(payloads)
    cdef Py_ssize_t hdr = encoded_size(scope, digest, 0)
    cdef Py_ssize_t i, n, enc, count = 0, mbytes = 0, framed, nbytes
    cdef object item
    cdef const uint8_t[::1] view
    cdef const uint8_t **src
    cdef Py_ssize_t *lens
    cdef uint8_t *rec
    cdef uint8_t *dst
    if start >= total:
        return 0, length
    _check_entry_ids(first_eid, first_eid + (total - start - 1))
    if scope == 0 and lid >= V1_LEDGER_LIMIT:
        raise IllegalOpError(f"scope-0 ledger ids are below 2^63, got {lid}")
    if length < 0:
        raise IllegalOpError(f"a ledger's length is not negative, got {length}")
    if digest == DIGEST_MAC:
        return _add_payloads_mac(jb, mt, scope, lid, first_eid, lac, length, mac_key, payloads,
                                 start, max_entry_size)
    src = <const uint8_t **>malloc((total - start) * sizeof(void *))
    lens = <Py_ssize_t *>malloc((total - start) * sizeof(Py_ssize_t))
    held = []                   # buffers of non-bytes items stay exported (not resizable)
    try:
        if src == NULL or lens == NULL:
            raise MemoryError()
        for i in range(start, total):
            item = <object>PyList_GET_ITEM(payloads, i)
            if PyBytes_Check(item):
                src[count] = <const uint8_t *>PyBytes_AS_STRING(item)
                n = PyBytes_GET_SIZE(item)
            else:
                item = _payload_view(item)
                view = item
                held.append(item)
                n = view.shape[0]
                src[count] = &view[0] if n else NULL
            if n > max_entry_size:
                raise EntryTooLargeError(
                    f"entry of {n} bytes exceeds max_entry_size_bytes={max_entry_size}")
            enc = hdr + n
            # consecutive ids of one ledger: entries first_eid .. first_eid + count touch the
            # blocks first_eid >> 6 .. (first_eid + count) >> 6, which count against the limit
            if not mt.fits(mbytes + enc, ((first_eid + count) >> 6) - (first_eid >> 6) + 1):
                if count == 0 and mt.nrecs == 0:       # an empty memtable takes one entry
                    if enc > mt.limit_bytes:
                        raise EntryTooLargeError(f"entry of {n} bytes exceeds the memtable limit")
                else:
                    break
            lens[count] = n
            mbytes += enc
            count += 1
        if count == 0:
            return 0, length
        if length > MAX_LENGTH - mbytes:
            raise IllegalOpError(f"the ledger's length {length} would pass 2^63 - 1")
        if start + count < total:       # the rest waits for another pass: check it now
            check_payloads(payloads, scope, digest, max_entry_size, mt.limit_bytes, start + count)
        mt.prepare(count, count // 64 + 2)
        rec = jb.reserve(mbytes + count * RECORD_HEADER_SIZE)
        dst = mt.reserve(mbytes)
        if dst == NULL:
            raise MemoryError()
        # the GIL goes only for batches worth it: another thread takes it for its whole
        # time slice, and a one-entry add then waits that long (16 threads appending)
        nbytes = length
        if mbytes >= NOGIL_MIN_BYTES:
            with nogil:
                framed = _frame_entries(rec, dst, mt, src, lens, count, scope, lid, first_eid,
                                        lac, &length, digest)
        else:
            framed = _frame_entries(rec, dst, mt, src, lens, count, scope, lid, first_eid, lac,
                                    &length, digest)
        if framed < count:          # never with the room prepare made; refuse, write nothing more
            mbytes = 0
            for i in range(framed):
                mbytes += hdr + lens[i]
            jb.size += mbytes + framed * RECORD_HEADER_SIZE
            jb.records += framed
            if framed == 0:
                raise MemoryError("memtable: no room reserved for the entries")
            return framed, length
        jb.size += mbytes + count * RECORD_HEADER_SIZE
        jb.records += count
        return count, length
    finally:
        free(src)
        free(lens)


def _add_payloads_mac(JournalBuffer jb, MemTable mt, uint64_t scope, uint64_t lid,
                      int64_t first_eid, int64_t lac, int64_t length, object mac_key,
                      list payloads, Py_ssize_t start, Py_ssize_t max_entry_size):
    """add_payloads for HMAC-SHA1 digests, an entry at a time (hmac needs the GIL)."""
    cdef Py_ssize_t i, n, enc, total = PyList_GET_SIZE(payloads)
    cdef Py_ssize_t count = 0
    cdef const uint8_t[::1] view
    cdef object item
    cdef uint8_t *rec
    cdef uint8_t *dst
    cdef int64_t eid = first_eid
    cdef Py_ssize_t hdr = encoded_size(scope, DIGEST_MAC, 0)
    # entry by entry: what is left of the batch is checked first, so a refusal frames nothing
    check_payloads(payloads, scope, DIGEST_MAC, max_entry_size, mt.limit_bytes, start)
    for i in range(start, total):
        item = <object>PyList_GET_ITEM(payloads, i)
        view = item if PyBytes_Check(item) else _payload_view(item)
        n = view.shape[0]
        if n > max_entry_size:
            raise EntryTooLargeError(
                f"entry of {n} bytes exceeds max_entry_size_bytes={max_entry_size}")
        enc = hdr + n
        if enc > mt.limit_bytes:
            raise EntryTooLargeError(f"entry of {n} bytes exceeds the memtable limit")
        if mt.nrecs and not mt.fits(enc, 1):
            break
        mt.prepare(1, 1)
        dst = mt.reserve(enc)
        if dst == NULL:
            break
        if length > MAX_LENGTH - n:
            raise IllegalOpError(f"the ledger's length {length} would pass 2^63 - 1")
        length += n
        rec = jb.reserve(RECORD_HEADER_SIZE + enc)
        encode_into(rec + RECORD_HEADER_SIZE, scope, lid, eid, lac, length, DIGEST_MAC, mac_key,
                    &view[0] if n else NULL, n)
        jb.seal(rec, enc, REC_ENTRY)
        memcpy(dst, rec + RECORD_HEADER_SIZE, enc)
        if mt.commit(scope, lid, eid, dst, enc) < 0:
            jb.size -= RECORD_HEADER_SIZE + enc     # take the sealed record back
            jb.records -= 1
            raise MemoryError("memtable: no room reserved for an entry")
        eid += 1
        count += 1
    return count, length


def add_encoded_entries(JournalBuffer jb, MemTable mt, list entries, Py_ssize_t start):
    """Journal and store already-encoded entries (the bookie server path); stops
    early when the memtable is full. Returns how many were taken."""
    cdef Py_ssize_t i, n, total = PyList_GET_SIZE(entries)
    cdef const uint8_t[::1] v
    cdef uint64_t s, l
    cdef int64_t e
    cdef uint8_t *dst
    cdef uint8_t *rec
    cdef bint opens
    if start < 0 or start > total:
        raise ValueError(f"start {start} outside 0..{total}")
    # every entry is checked before any is framed, so a refusal leaves nothing half written
    for i in range(start, total):
        v = <object>PyList_GET_ITEM(entries, i)
        n = v.shape[0]
        parse_ids(&v[0], n, &s, &l, &e)
        _check_entry_ids(e, e)
        if n > mt.limit_bytes:
            raise EntryTooLargeError(f"entry of {n} bytes exceeds the memtable limit")
    # any id pattern: each entry may open a block of its own (striped ensembles send every
    # bookie gapped ids; a frame may name many ledgers)
    mt.prepare(total - start, total - start)
    for i in range(start, total):
        v = <object>PyList_GET_ITEM(entries, i)
        n = v.shape[0]
        parse_ids(&v[0], n, &s, &l, &e)
        opens = mt.opens_block(s, l, e)
        if mt.nrecs and not mt.fits(n, 1 if opens else 0):
            return i - start
        dst = mt.reserve(n)
        if dst == NULL:
            return i - start
        rec = jb.reserve(RECORD_HEADER_SIZE + n)
        memcpy(rec + RECORD_HEADER_SIZE, &v[0], n)
        memcpy(dst, &v[0], n)
        if mt.commit(s, l, e, dst, n) < 0:
            raise MemoryError("memtable: no room reserved for an entry")
        jb.seal(rec, n, REC_ENTRY)
    return total - start


# -- replay: runs of entry records straight from the mapped journal into the memtable --------

def replay_entries(data, Records records, Py_ssize_t i, MemTable mt, dict seen,
                   list refused=None):
    """Put the entries of records[i:] (scan()'s, over ``data``) into the memtable,
    up to the first record that is not an entry or that the memtable has no room for;
    returns its index. ``seen`` gets {(scope, ledger): highest entry id} of what was put.
    An entry whose id is outside 0..MAX_ENTRY_ID (journalled before bookies bounded ids)
    is not put: ``refused`` gets (offset, scope, ledger, entry id) for it.
    JournalCorruptedError ("offset N: ...") for an entry whose header does not parse."""
    cdef const uint8_t[::1] v = data
    cdef Py_ssize_t n = records.n
    cdef uint64_t s, l, cs = 0, cl = 0
    cdef int64_t e, top = -1, max_eid = MAX_ENTRY_ID
    cdef bint have = False
    cdef jrec *rec
    if i < 0:
        raise ValueError(f"record index {i}")
    while i < n:
        rec = &records.recs[i]
        if rec.rtype != REC_ENTRY and rec.rtype != REC_ENTRY_CRC32C:
            break
        if rec.body_start < 0 or rec.body_len < 0 or rec.body_start + rec.body_len > v.shape[0]:
            raise JournalCorruptedError(f"offset {rec.off}: record outside the journal's "
                                        f"{v.shape[0]} bytes")
        try:
            parse_ids(&v[rec.body_start], rec.body_len, &s, &l, &e)
            if e < 0 or e > max_eid:
                if refused is not None:
                    refused.append((rec.off, s, l, e))
                i += 1
                continue
            if mt.put(s, l, e, &v[rec.body_start], rec.body_len) < 0:
                break
        except (CorruptedDataError, EntryTooLargeError) as exc:
            raise JournalCorruptedError(f"offset {rec.off}: {exc}") from None
        if not have or s != cs or l != cl:
            if have and top > seen.get((cs, cl), -1):
                seen[(cs, cl)] = top
            cs, cl, top, have = s, l, e, True
        elif e > top:
            top = e
        i += 1
    if have and top > seen.get((cs, cl), -1):
        seen[(cs, cl)] = top
    return i
