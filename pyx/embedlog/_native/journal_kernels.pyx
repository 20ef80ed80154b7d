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

from cpython.bytes cimport PyBytes_Check, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE

from embedlog._native.format cimport (el_put32, el_put64, el_crc32c, el_crc32c_copy, el_crc32,
                                      el_crc_init, parse_ids, encode_into, encoded_size,
                                      put_header, DIGEST_CRC32, DIGEST_CRC32C, DIGEST_MAC)
from embedlog._native.journal_format cimport RECORD_HEADER_SIZE, REC_ENTRY, REC_ENTRY_CRC32C
from embedlog._native.journal_buffer cimport JournalBuffer
from embedlog._native.journal_scan cimport Records, jrec
from embedlog._native.memtable cimport MemTable

from embedlog._native.format import MAX_ENTRY_ID
from embedlog.errors import CorruptedDataError, EntryTooLargeError, IllegalOpError, JournalCorruptedError

el_crc_init()

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
