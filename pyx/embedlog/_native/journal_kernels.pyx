# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The journal's kernels: the add path frames entries into the journal buffer and copies
them into the memtable in the same pass (``add_payloads`` for the embedded API, encoding the
payloads; ``add_encoded_entries`` for entries that arrive encoded), and replay puts runs of
entry records straight from the mapped journal into the memtable (``replay_entries``).

Bounds: the add kernels check every entry (ids 0..MAX_ENTRY_ID, header, size within the
memtable) before framing any, and reserve the journal buffer for the whole pass before
writing into it (``JournalBuffer.reserve`` grows to fit); replay checks every record's body
lies within the data.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

from cpython.bytes cimport (PyBytes_Check, PyBytes_AS_STRING, PyBytes_GET_SIZE,
                           PyBytes_FromStringAndSize)
from cpython.buffer cimport PyBuffer_Release, PyBUF_FULL_RO
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.exc cimport PyErr_Clear

from embedlog._native.format cimport (el_put32, el_put64, el_get64, el_crc32c, el_crc32c_copy,
                                      el_crc32, el_crc_init, parse_ids, encode_into,
                                      encoded_size, put_header, DIGEST_CRC32, DIGEST_CRC32C,
                                      DIGEST_MAC, V1_HEADER_SIZE, V2_HEADER_SIZE)
from embedlog._native.journal_format cimport RECORD_HEADER_SIZE, REC_ENTRY, REC_ENTRY_CRC32C, REC_GROUP
from embedlog._native.journal_buffer cimport JournalBuffer
from embedlog._native.journal_scan cimport Records, jrec
from embedlog._native.memtable cimport MemTable

from embedlog._native.format import DIGEST_SIZES, MAX_ENTRY_ID, LedgerId
from embedlog.errors import CorruptedDataError, EntryTooLargeError, IllegalOpError, JournalCorruptedError

el_crc_init()

cdef extern from "Python.h":
    # the plain C call (no exception check): _entry_buffer clears a refusal and leaves the
    # error to the typed-memoryview path, so odd buffers fail as they always did
    int PyObject_GetBuffer_nocheck "PyObject_GetBuffer" (object obj, Py_buffer *view, int flags)

cdef uint64_t V1_LEDGER_LIMIT = 1ULL << 63
cdef int64_t MAX_LENGTH = 0x7FFFFFFFFFFFFFFF     # a ledger's length is an i64 in every entry
cdef Py_ssize_t NOGIL_MIN_BYTES = 64 << 10   # add_payloads releases the GIL from this size


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


cdef inline bint _entry_buffer(object item, Py_buffer *pb):
    """True with ``pb`` holding the bytes of ``item`` (release it) when it is a 1-D
    contiguous buffer of unsigned bytes (bytes, a memoryview of them, a bytearray): the cheap
    path. False, nothing held and no error set, for anything else: the caller takes
    ``const uint8_t[::1]`` of it, which accepts or refuses it as parse_entry_header does."""
    if PyObject_GetBuffer_nocheck(item, pb, PyBUF_FULL_RO) < 0:
        PyErr_Clear()
        return False
    if (pb.ndim == 1 and pb.itemsize == 1 and (pb.strides == NULL or pb.strides[0] == 1)
            and (pb.format == NULL or (pb.format[0] == b'B' and pb.format[1] == 0))):
        return True
    PyBuffer_Release(pb)
    return False


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
                               int digest, uint64_t seq) noexcept nogil:
    """add_payloads' pass: each entry framed as a journal record at ``rec`` and copied into
    the memtable at ``dst`` (room made beforehand); ``length`` becomes the ledger length
    after them. Returns how many were framed: fewer than count only if the memtable
    refused a commit (prepare made too little room), before that entry's record counts.
    ``seq``: the journal sequence number of ``rec`` (each entry's ``where`` is its record's
    seq + 1, so 0 stays "none")."""
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
        mt.next_where = seq + 1
        if mt.commit(scope, lid, eid, dst, enc) < 0:
            return i
        seq += RECORD_HEADER_SIZE + enc
        length[0] += n
        dst += enc
        rec += RECORD_HEADER_SIZE + enc
        eid += 1
    return count


def add_payloads(JournalBuffer jb, MemTable mt, uint64_t scope, uint64_t lid,
                 int64_t first_eid, int64_t lac, int64_t length, int digest, object mac_key,
                 object payloads, Py_ssize_t start, Py_ssize_t max_entry_size):
    """Encode payloads[start:] as entries first_eid, first_eid+1, ... into the journal
    buffer and the memtable, stopping early when the memtable is full.

    ``payloads``: a list of bytes-like objects, or a packed batch ``(data, ends)`` (one
    bytes object holding the payloads back to back and a bytes object of native int64 end
    offsets into it, as ProduceQueue.take_packed gives them: no Python object per entry).
    Every payload is checked (size, and for a list its type) before any is framed, so a
    refusal frames nothing. One pass per entry (_frame_entries), without the GIL for
    batches of NOGIL_MIN_BYTES or more: header, then the payload copied and checksummed
    together (CRC32C digests; the record's own checksum then covers only the header, see
    ENTRY_CRC32C), then the encoded entry copied into the memtable. Returns (count, length):
    how many were taken and the ledger length after them.
    """
    cdef Py_ssize_t total = payload_count(payloads)
    cdef Py_ssize_t avail = total - start
    cdef const uint8_t **src
    cdef Py_ssize_t *lens
    if start < 0:
        raise ValueError(f"start {start} is negative")
    if avail <= 0:
        return 0, length
    _check_entry_ids(first_eid, first_eid + (avail - 1))
    if scope == 0 and lid >= V1_LEDGER_LIMIT:
        raise IllegalOpError(f"scope-0 ledger ids are below 2^63, got {lid}")
    if length < 0:
        raise IllegalOpError(f"a ledger's length is not negative, got {length}")
    if digest == DIGEST_MAC:
        if type(payloads) is tuple:     # hmac needs the GIL and an object per entry anyway
            payloads = unpack_payloads(payloads)
        return _add_payloads_mac(jb, mt, scope, lid, first_eid, lac, length, mac_key, payloads,
                                 start, max_entry_size)
    src = <const uint8_t **>malloc(avail * sizeof(void *))
    lens = <Py_ssize_t *>malloc(avail * sizeof(Py_ssize_t))
    held = []                   # buffers of non-bytes items stay exported (not resizable)
    try:
        if src == NULL or lens == NULL:
            raise MemoryError()
        if type(payloads) is tuple:
            _packed_sources(payloads, start, avail, src, lens)
        else:
            _list_sources(payloads, start, avail, src, lens, held)
        _check_sizes(lens, avail, encoded_size(scope, digest, 0), max_entry_size, mt.limit_bytes)
        return _add_run(jb, mt, scope, lid, first_eid, lac, length, digest, src, lens, avail)
    finally:
        free(src)
        free(lens)


def chunk_end(list payloads, Py_ssize_t start, Py_ssize_t limit) -> int:
    """Where a chunk of ``payloads`` that starts at ``start`` ends: it takes items while
    their bytes are below ``limit`` (at least one), so one append call frames a bounded
    batch before it syncs. IllegalOpError for an item that is not bytes-like."""
    cdef Py_ssize_t i = start, total = PyList_GET_SIZE(payloads), size = 0
    cdef object item
    if start < 0:
        raise ValueError(f"start {start} is negative")
    while i < total and (size < limit or i == start):
        item = <object>PyList_GET_ITEM(payloads, i)
        if PyBytes_Check(item):          # (a conditional expression would make an int object)
            size += PyBytes_GET_SIZE(item)
        else:
            size += _payload_view(item).nbytes
        i += 1
    return i


def payload_count(object payloads) -> int:
    """How many payloads a list or a packed batch ``(data, ends)`` holds."""
    if type(payloads) is tuple:
        return PyBytes_GET_SIZE(_packed_ends(payloads)) // 8
    return PyList_GET_SIZE(payloads)


def packed_count(tuple packed) -> int:
    """How many payloads a packed batch ``(data, ends)`` holds, every end offset checked
    first (ascending, within data, the last at its end): for a caller that reads the
    payloads itself (the client's addpath.encode_produced)."""
    cdef bytes ends_b = _packed_ends(packed)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(ends_b) // 8, size = PyBytes_GET_SIZE(packed[0])
    cdef const int64_t *ends = <const int64_t *>PyBytes_AS_STRING(ends_b)
    if n == 0:
        raise IllegalOpError("a packed batch without a payload")
    _check_ends(ends, 0, n, size)
    if ends[n - 1] != size:
        raise IllegalOpError(f"packed batch: payloads end at {ends[n - 1]}, their data at {size}")
    return n


def unpack_payloads(tuple packed) -> list:
    """A packed batch ``(data, ends)`` as a list of bytes, one per payload."""
    cdef Py_ssize_t n = payload_count(packed)
    cdef const uint8_t **src = <const uint8_t **>malloc((n or 1) * sizeof(void *))
    cdef Py_ssize_t *lens = <Py_ssize_t *>malloc((n or 1) * sizeof(Py_ssize_t))
    cdef Py_ssize_t i
    try:
        if src == NULL or lens == NULL:
            raise MemoryError()
        _packed_sources(packed, 0, n, src, lens)
        return [PyBytes_FromStringAndSize(<const char *>src[i], lens[i]) for i in range(n)]
    finally:
        free(src)
        free(lens)


cdef bytes _packed_ends(tuple packed):
    if len(packed) != 2 or type(packed[0]) is not bytes or type(packed[1]) is not bytes or \
            PyBytes_GET_SIZE(packed[1]) % 8:
        raise IllegalOpError("a packed batch is (data: bytes, ends: bytes of int64 offsets)")
    return packed[1]


cdef int _check_ends(const int64_t *ends, Py_ssize_t start, Py_ssize_t n,
                     Py_ssize_t size) except -1:
    """End offsets start..start+n of a packed batch: each at or after the one before it
    (the first after the end before ``start``) and within its ``size`` bytes of data."""
    cdef Py_ssize_t i
    cdef int64_t at = ends[start - 1] if start else 0
    for i in range(start, start + n):
        if ends[i] < at or ends[i] > size:
            raise IllegalOpError(f"packed batch: end offset {ends[i]} of payload {i} is "
                                 f"outside {at}..{size}")
        at = ends[i]
    return 0


cdef int _packed_sources(tuple packed, Py_ssize_t start, Py_ssize_t avail,
                         const uint8_t **src, Py_ssize_t *lens) except -1:
    """src/lens of payloads start..start+avail of a packed batch; every end offset is
    checked (ascending, within data) before it is used."""
    cdef bytes ends_b = _packed_ends(packed)
    cdef bytes data = packed[0]
    cdef const uint8_t *base = <const uint8_t *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    cdef const int64_t *ends = <const int64_t *>PyBytes_AS_STRING(ends_b)
    cdef Py_ssize_t i
    cdef int64_t at = ends[start - 1] if start else 0
    _check_ends(ends, start, avail, size)
    for i in range(avail):
        src[i] = base + at
        lens[i] = <Py_ssize_t>(ends[start + i] - at)
        at = ends[start + i]
    return 0


cdef int _list_sources(list payloads, Py_ssize_t start, Py_ssize_t avail,
                       const uint8_t **src, Py_ssize_t *lens, list held) except -1:
    cdef Py_ssize_t i
    cdef object item
    cdef const uint8_t[::1] view
    for i in range(avail):
        item = <object>PyList_GET_ITEM(payloads, start + i)
        if PyBytes_Check(item):
            src[i] = <const uint8_t *>PyBytes_AS_STRING(item)
            lens[i] = PyBytes_GET_SIZE(item)
        else:
            item = _payload_view(item)
            view = item
            held.append(item)
            lens[i] = view.shape[0]
            src[i] = &view[0] if lens[i] else NULL
    return 0


cdef int _check_sizes(const Py_ssize_t *lens, Py_ssize_t avail, Py_ssize_t hdr,
                      Py_ssize_t max_entry_size, Py_ssize_t memtable_limit) except -1:
    cdef Py_ssize_t i
    for i in range(avail):
        if lens[i] > max_entry_size:
            raise EntryTooLargeError(
                f"entry of {lens[i]} bytes exceeds max_entry_size_bytes={max_entry_size}")
        if hdr + lens[i] > memtable_limit:
            raise EntryTooLargeError(f"entry of {lens[i]} bytes exceeds the memtable limit")
    return 0


cdef tuple _add_run(JournalBuffer jb, MemTable mt, uint64_t scope, uint64_t lid,
                    int64_t first_eid, int64_t lac, int64_t length, int digest,
                    const uint8_t **src, const Py_ssize_t *lens, Py_ssize_t avail):
    """add_payloads' framing of checked payloads: as many as the memtable takes."""
    cdef Py_ssize_t hdr = encoded_size(scope, digest, 0)
    cdef Py_ssize_t i, enc, count = 0, mbytes = 0, framed
    cdef uint8_t *rec
    cdef uint8_t *dst
    cdef uint64_t seq
    for i in range(avail):
        enc = hdr + lens[i]
        # consecutive ids of one ledger: entries first_eid .. first_eid + count touch the
        # blocks first_eid >> 6 .. (first_eid + count) >> 6, which count against the limit;
        # an empty memtable takes one entry whatever its size
        if not mt.fits(mbytes + enc, ((first_eid + count) >> 6) - (first_eid >> 6) + 1) and \
                not (count == 0 and mt.nrecs == 0):
            break
        mbytes += enc
        count += 1
    if count == 0:
        return 0, length
    if length > MAX_LENGTH - mbytes:
        raise IllegalOpError(f"the ledger's length {length} would pass 2^63 - 1")
    mt.prepare(count, count // 64 + 2)
    rec = jb.reserve(mbytes + count * RECORD_HEADER_SIZE)
    seq = jb.seq0 + <uint64_t>(rec - jb.data)
    dst = mt.reserve(mbytes)
    if dst == NULL:
        raise MemoryError()
    # the GIL goes only for batches worth it: another thread takes it for its whole
    # time slice, and a one-entry add then waits that long (16 threads appending)
    if mbytes >= NOGIL_MIN_BYTES:
        with nogil:
            framed = _frame_entries(rec, dst, mt, src, lens, count, scope, lid, first_eid,
                                    lac, &length, digest, seq)
    else:
        framed = _frame_entries(rec, dst, mt, src, lens, count, scope, lid, first_eid, lac,
                                &length, digest, seq)
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
        mt.next_where = jb.seq0 + <uint64_t>(rec - jb.data) + 1
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
    cdef Py_buffer pb
    cdef uint64_t s, l
    cdef int64_t e
    cdef bint opens
    if start < 0 or start > total:
        raise ValueError(f"start {start} outside 0..{total}")
    # every entry is checked before any is framed, so a refusal leaves nothing half written
    for i in range(start, total):
        item = <object>PyList_GET_ITEM(entries, i)
        if _entry_buffer(item, &pb):
            n = pb.len
            try:
                parse_ids(<const uint8_t *>pb.buf, n, &s, &l, &e)
            finally:
                PyBuffer_Release(&pb)
        else:
            v = item
            n = v.shape[0]
            parse_ids(&v[0], n, &s, &l, &e)
        _check_entry_ids(e, e)
        if n > mt.limit_bytes:
            raise EntryTooLargeError(f"entry of {n} bytes exceeds the memtable limit")
    # any id pattern: each entry may open a block of its own (striped ensembles send every
    # bookie gapped ids; a frame may name many ledgers)
    mt.prepare(total - start, total - start)
    for i in range(start, total):
        item = <object>PyList_GET_ITEM(entries, i)
        if _entry_buffer(item, &pb):
            try:
                if not _put_encoded(jb, mt, <const uint8_t *>pb.buf, pb.len):
                    return i - start
            finally:
                PyBuffer_Release(&pb)
        else:
            v = item
            if not _put_encoded(jb, mt, &v[0], v.shape[0]):
                return i - start
    return total - start


cdef bint _put_encoded(JournalBuffer jb, MemTable mt, const uint8_t *p, Py_ssize_t n) except -1:
    """One checked entry framed into the journal buffer and copied into the memtable;
    False (nothing written) when the memtable has no room for it."""
    cdef uint64_t s, l
    cdef int64_t e
    cdef uint8_t *dst
    cdef uint8_t *rec
    parse_ids(p, n, &s, &l, &e)
    if mt.nrecs and not mt.fits(n, 1 if mt.opens_block(s, l, e) else 0):
        return False
    dst = mt.reserve(n)
    if dst == NULL:
        return False
    rec = jb.reserve(RECORD_HEADER_SIZE + n)
    memcpy(rec + RECORD_HEADER_SIZE, p, n)
    memcpy(dst, p, n)
    mt.next_where = jb.seq0 + <uint64_t>(rec - jb.data) + 1
    if mt.commit(s, l, e, dst, n) < 0:
        raise MemoryError("memtable: no room reserved for an entry")
    jb.seal(rec, n, REC_ENTRY)
    return True


# -- the wire add path's checks: one pass over a batch of encoded entries -----------------

cdef int _DIGEST_SIZE[16]          # DIGEST_SIZES by a V2 flag's 4-bit code; -1: unknown
for _i in range(16):
    _DIGEST_SIZE[_i] = DIGEST_SIZES.get(_i, -1)
cdef object _KNOWN_DIGESTS = sorted(DIGEST_SIZES)


cdef int _entry_header(const uint8_t *p, Py_ssize_t n, uint64_t *s, uint64_t *l, int64_t *e,
                       int64_t *lac) except -1:
    """parse_entry_header's fields and errors; returns the version, ``lac`` the entry's LAC."""
    cdef int version
    if n == 0:
        raise CorruptedDataError("empty entry buffer")
    version = parse_ids(p, n, s, l, e)
    lac[0] = <int64_t>el_get64(p + (25 if version == 2 else 16))
    return version


cdef int _note_run(dict runs, object key, int64_t top, int64_t top_lac) except -1:
    """runs[key] = [highest entry id, highest LAC] over the entries of key checked so far."""
    cur = runs.get(key)
    if cur is None:
        runs[key] = [top, top_lac]
    else:
        if top > cur[0]:
            cur[0] = top
        if top_lac > cur[1]:
            cur[1] = top_lac
    return 0


def check_encoded_entries(list entries, Py_ssize_t start, object ledger, object facts,
                          object checked, dict runs, object max_entry_size):
    """Bookie.add_entries' per-entry checks over entries[start:], in its order and with its
    errors: the header parses (parse_entry_header), the entry is of ``ledger`` when that is
    given ((scope, ledger id)), its id is within 0..MAX_ENTRY_ID, and
    LedgerDescriptors.check_entry's digest code and size checks (``facts``: the
    descriptors' key -> LedgerFacts cache, read once per run of one ledger's entries).

    Stops after the first entry whose ledger is not in ``checked`` (the caller checks that
    ledger's key, fence and term, as it did for such an entry, then calls again from the
    index returned). ``runs`` gets {(scope, ledger id): [highest entry id, highest LAC]}
    over the entries checked. Returns (index to go on from, the new ledger's key or None
    once every entry is checked, bytes of the entries checked).
    """
    cdef Py_ssize_t i, n, total = PyList_GET_SIZE(entries), nbytes = 0, overhead
    cdef Py_buffer pb
    cdef const uint8_t[::1] v
    cdef uint64_t s = 0, l = 0, cs = 0, cl = 0, ls = 0, ll = 0
    cdef int64_t e = 0, lac = 0, top = -1, top_lac = -1, max_eid = MAX_ENTRY_ID
    cdef int64_t max_size
    cdef int version, code
    cdef bint have = False, is_new = False, match_ledger = ledger is not None, ledger_c = False
    cdef bint has_facts = False, facts_c = False
    cdef long long facts_digest = 0
    cdef Py_ssize_t facts_size = 0
    cdef object key = None, fdigest = None, f
    if start < 0 or start > total:
        raise ValueError(f"start {start} outside 0..{total}")
    max_size = max_entry_size if max_entry_size < (1 << 62) else (1 << 62)
    if (match_ledger and type(ledger) is tuple and len(ledger) == 2
            and type(ledger[0]) is int and type(ledger[1]) is int
            and 0 <= ledger[0] < (1 << 64) and 0 <= ledger[1] < (1 << 64)):
        ls, ll, ledger_c = ledger[0], ledger[1], True
    for i in range(start, total):
        item = <object>PyList_GET_ITEM(entries, i)
        if _entry_buffer(item, &pb):
            n = pb.len
            try:
                version = _entry_header(<const uint8_t *>pb.buf, n, &s, &l, &e, &lac)
                code = (<const uint8_t *>pb.buf)[0] & 0x0F
            finally:
                PyBuffer_Release(&pb)
        else:
            v = item                     # refuses what parse_entry_header refuses
            n = v.shape[0]
            version = _entry_header(&v[0] if n else NULL, n, &s, &l, &e, &lac)
            code = v[0] & 0x0F
        if match_ledger and ((s != ls or l != ll) if ledger_c else (s, l) != ledger):
            raise IllegalOpError(f"entry of ledger {LedgerId(s, l)} in an add for "
                                 f"{LedgerId(*ledger)}")
        if e < 0:
            raise IllegalOpError(f"entry ids are not negative, got {e}")
        if e > max_eid:
            raise IllegalOpError(f"entry id {e} is over {MAX_ENTRY_ID}, the highest a bookie's "
                                 f"index addresses (2^40 - 1): roll over to a new ledger")
        if not have or s != cs or l != cl:
            if have:
                _note_run(runs, key, top, top_lac)
            key = (s, l)
            cs, cl, have, top, top_lac = s, l, True, e, lac
            is_new = key not in checked
            f = facts.get(key)
            has_facts = f is not None
            if has_facts:
                fdigest = f.digest
                facts_c = type(fdigest) is int and 0 <= fdigest < 16
                if facts_c:
                    facts_digest = fdigest
                facts_size = DIGEST_SIZES.get(fdigest, 0 if fdigest else 20)
        else:
            if e > top:
                top = e
            if lac > top_lac:
                top_lac = lac
        # LedgerDescriptors.check_entry
        if version == 2 and _DIGEST_SIZE[code] < 0:
            raise CorruptedDataError(f"entry of ledger {LedgerId(s, l)} has unknown digest "
                                     f"code {code} (known: {_KNOWN_DIGESTS})")
        if has_facts and version == 2 and ((code != facts_digest) if facts_c else (code != fdigest)):
            raise CorruptedDataError(f"entry of ledger {LedgerId(s, l)} has digest code "
                                     f"{code}, the ledger's is {fdigest}")
        if has_facts:
            overhead = facts_size
        elif version == 2:
            overhead = _DIGEST_SIZE[code]
        else:
            overhead = 20
        overhead += V2_HEADER_SIZE if version == 2 else V1_HEADER_SIZE
        if n - overhead > max_size:
            raise EntryTooLargeError(f"entry with a payload of {n - overhead} bytes is "
                                     f"over max_entry_size_bytes ({max_entry_size})")
        nbytes += n
        if is_new:
            _note_run(runs, key, top, top_lac)
            return i + 1, key, nbytes
    if have:
        _note_run(runs, key, top, top_lac)
    return total, None, nbytes


# -- replay: runs of entry records straight from the mapped journal into the memtable --------

def replay_entries(data, Records records, Py_ssize_t i, MemTable mt, dict seen,
                   list refused=None, uint64_t segment_base=0):
    """Put the entries of records[i:] (scan()'s, over ``data``) into the memtable,
    up to the first record that is not an entry (GROUP records, a group's bounds, are
    stepped over) or that the memtable has no room for;
    returns its index. ``seen`` gets {(scope, ledger): highest entry id} of what was put.
    An entry whose id is outside 0..MAX_ENTRY_ID (journalled before bookies bounded ids)
    is not put: ``refused`` gets (offset, scope, ledger, entry id) for it.
    JournalCorruptedError ("offset N: ...") for an entry whose header does not parse.
    ``segment_base``: layout 2's location of the file (bit 63 | segment << 32; 0: layout 1),
    each entry's ``where`` being that location of its record, set again idempotently."""
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
        if rec.rtype == REC_GROUP:              # a group's bounds: nothing to apply
            i += 1
            continue
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
            if segment_base and 0 <= rec.off <= 0xFFFFFFFF:
                mt.next_where = segment_base | <uint64_t>rec.off
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
