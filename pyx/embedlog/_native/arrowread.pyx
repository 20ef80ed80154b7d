# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Batch reads for Arrow: READ responses checked, then turned into BinaryArray buffers.

A ranged read answers with one frame holding up to 1024 encoded entries. These functions
work on that frame's body as it came off the socket: ``verify_run`` checks the ids and the
digest of each entry in place (no Python object per entry); ``payload_arrays`` and
``stream_arrays`` then copy the payloads of the checked runs, once, into one values buffer
with int32 offsets: the two buffers of a ``pyarrow.BinaryArray`` (the caller wraps them
with ``pyarrow.Array.from_buffers``; nothing here needs pyarrow).

Input grammar (big-endian; docs/PROTOCOL.md and docs/FORMATS.md)::

    body   := lac:i64 count:u32 (entry_id:i64 size:u32 entry[size])*count
    entry  := header digest payload       # header: 32 bytes (V1) or 41 (V2: top bit set)
    run    := (body, first entry id, entry count)   # a prefix verify_run accepted

Stream payloads (docs/STREAMS.md)::

    payload := kind:u8 rest
      kind 0  data, written before entries had times      rest := data
      kind 1  no-op (a take-over's truncation mark)        rest := (ignored)
      kind 2  data                                         rest := append_time_ms:i64 data
      kind 3  link: entries of a closed ledger             rest := append_time_ms:i64 scope:u64
                                                                   ledger:u64 first:i64 count:u32
      kind 4  link: entries packing rows (below)           rest := append_time_ms:i64 scope:u64
                                                                   ledger:u64 first:i64 count:u32
                                                                   rows:u64

Packed rows (the entries of the ledgers embedlog.spark writes: many rows per entry, so
the per-entry costs of the add and read paths are paid once per ~256 KiB)::

    packed := count:u32 size:u32[count] row_bytes[sum(size)]

The runs handed to the array builders must be what ``verify_run`` accepted. Their first
pass still bounds every entry by its body (``_entry_size``: the entry head, the size, the
header and digest inside the body, else CorruptedDataError), so a run that was not
verified is refused before anything is allocated or copied; the second pass walks the
same bytes and copies into buffers sized by the first.
"""

import hashlib
import hmac

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize

from embedlog._native.format cimport (el_get32, el_get64, el_put32, el_crc32, el_crc32c, el_crc_init,
                                      DIGEST_CRC32, DIGEST_CRC32C, DIGEST_DUMMY, DIGEST_MAC,
                                      V1_HEADER_SIZE, V2_HEADER_SIZE, digest_size)

from embedlog.errors import CorruptedDataError, IllegalOpError

cnp.import_array()
el_crc_init()

cdef enum:
    READ_HEAD = 12          # lac:i64 count:u32
    ENTRY_HEAD = 12         # entry_id:i64 size:u32
    TIME_SIZE = 8
    LINK_SIZE = 28          # scope:u64 ledger:u64 first:i64 count:u32
    PACKED_LINK_SIZE = 36   # ... rows:u64
MAX_VALUES_BYTES = (1 << 31) - 1       # int32 offsets

cdef enum:
    K_DATA_UNTIMED = 0
    K_NOOP = 1
    K_DATA = 2
    K_LINK = 3
    K_PACKED_LINK = 4

KIND_DATA_UNTIMED, KIND_NOOP, KIND_DATA, KIND_LINK, KIND_PACKED_LINK = (
    K_DATA_UNTIMED, K_NOOP, K_DATA, K_LINK, K_PACKED_LINK)


cdef inline Py_ssize_t _header_size(const uint8_t *e, Py_ssize_t n) noexcept nogil:
    if n >= 1 and e[0] & 0x80:
        return V2_HEADER_SIZE
    return V1_HEADER_SIZE


cdef bint _intact(const uint8_t *e, Py_ssize_t n, uint64_t scope, uint64_t ledger, int64_t eid,
                  int digest, object mac_key) except -1:
    """True when ``e`` is entry ``eid`` of ledger (scope, ledger) with a matching digest."""
    cdef Py_ssize_t h
    cdef int ds = digest_size(digest)
    cdef uint32_t c
    if n >= 1 and e[0] & 0x80:
        if scope == 0 or n < V2_HEADER_SIZE or (e[0] >> 4) & 7 != 2 or e[0] & 0x0F != digest:
            return False
        if el_get64(e + 1) != scope or el_get64(e + 9) != ledger or <int64_t>el_get64(e + 17) != eid:
            return False
        h = V2_HEADER_SIZE
    else:
        if scope != 0 or n < V1_HEADER_SIZE:
            return False
        if el_get64(e) != ledger or <int64_t>el_get64(e + 8) != eid:
            return False
        h = V1_HEADER_SIZE
    if n < h + ds:
        return False
    if digest == DIGEST_CRC32C:
        c = el_crc32c(0, e, h)
        c = el_crc32c(c, e + h + 4, n - h - 4)
        return c == el_get32(e + h)
    if digest == DIGEST_CRC32:
        c = el_crc32(0, e, h)
        c = el_crc32(c, e + h + 8, n - h - 8)
        return <uint64_t>c == el_get64(e + h)
    if digest == DIGEST_MAC:
        whole = PyBytes_FromStringAndSize(<char *>e, n)
        m = hmac.new(mac_key, whole[:h], hashlib.sha1)
        m.update(whole[h + 20:])
        return hmac.compare_digest(m.digest(), whole[h:h + 20])
    return digest == DIGEST_DUMMY


def verify_run(body, uint64_t scope, uint64_t ledger, int64_t first, int64_t last, int digest,
               mac_key=None):
    """How many entries at the start of READ response ``body`` are entries first, first + 1,
    ... (at most up to ``last``) of ledger (scope, ledger), each whole and with a matching
    digest. Stops at the first that is not, so a short answer, a bad copy or a torn
    frame gives a shorter run, never an error: the caller reads the rest elsewhere."""
    cdef const uint8_t[::1] v = body
    cdef Py_ssize_t n = v.shape[0]
    cdef Py_ssize_t pos = READ_HEAD
    cdef uint32_t count, i, size
    cdef int64_t eid
    cdef Py_ssize_t good = 0
    if digest == DIGEST_MAC and mac_key is None:
        raise IllegalOpError("a MAC digest needs the ledger's mac key")
    digest_size(digest)                    # an unknown code is an error, never "no digest"
    if n < READ_HEAD or last < first:
        return 0
    count = el_get32(&v[8])
    for i in range(count):
        if pos + ENTRY_HEAD > n:
            break
        eid = <int64_t>el_get64(&v[pos])
        size = el_get32(&v[pos + 8])
        pos += ENTRY_HEAD
        if eid != first + good or eid > last or pos + <Py_ssize_t>size > n:
            break
        if not _intact(&v[pos], size, scope, ledger, eid, digest, mac_key):
            break
        pos += size
        good += 1
    return good


cdef Py_ssize_t _entry_size(const uint8_t[::1] v, Py_ssize_t pos, Py_ssize_t ds) except -1:
    """The size of the entry whose head is at ``pos``, checked to lie within the body and
    to hold its header and digest."""
    cdef Py_ssize_t n = v.shape[0], size
    if pos + ENTRY_HEAD > n:
        raise CorruptedDataError(f"a READ body of {n} bytes ends inside an entry head at {pos}")
    size = el_get32(&v[pos + 8])
    if pos + ENTRY_HEAD + size > n or size < _header_size(&v[pos + ENTRY_HEAD], size) + ds:
        raise CorruptedDataError(f"entry of {size} bytes at {pos} does not fit its READ body of "
                                 f"{n} bytes or its header (an unverified run)")
    return size


cdef Py_ssize_t _skip_to_entries(const uint8_t[::1] v) except -1:
    if v.shape[0] < READ_HEAD:
        raise CorruptedDataError("a run's READ body is shorter than its header")
    return READ_HEAD


def payload_arrays(runs, int digest):
    """(offsets: int32[n + 1], values: uint8[m]) of the payloads of ``runs`` in order, the
    two buffers of a pyarrow.BinaryArray of n entries."""
    cdef Py_ssize_t ds = digest_size(digest)
    cdef Py_ssize_t total = 0, rows = 0, pos, h
    cdef Py_ssize_t k, count
    cdef uint32_t size
    cdef const uint8_t[::1] v
    for body, _first, count in runs:          # pass 1: sizes
        v = body
        pos = _skip_to_entries(v)
        for k in range(count):
            size = _entry_size(v, pos, ds)
            pos += ENTRY_HEAD
            total += size - _header_size(&v[pos], size) - ds
            pos += size
        rows += count
    if total > MAX_VALUES_BYTES:
        raise IllegalOpError(f"{total} bytes of payloads do not fit one BinaryArray (int32 offsets); "
                             "read a shorter range")
    offsets = np.empty(rows + 1, dtype=np.int32)
    values = np.empty(total, dtype=np.uint8)
    cdef int32_t[::1] off = offsets
    cdef uint8_t *out = <uint8_t *>cnp.PyArray_DATA(values)
    cdef Py_ssize_t r = 0, at = 0, plen
    off[0] = 0
    for body, _first, count in runs:          # pass 2: one copy of each payload
        v = body
        pos = READ_HEAD
        with nogil:
            for k in range(count):
                size = el_get32(&v[pos + 8])
                pos += ENTRY_HEAD
                h = _header_size(&v[pos], size) + ds
                plen = size - h
                if plen:
                    memcpy(out + at, &v[pos + h], plen)
                at += plen
                r += 1
                off[r] = <int32_t>at
                pos += size
    return offsets, values


def stream_arrays(runs, int digest):
    """The rows of stream entries in ``runs``: no-ops are skipped, links set aside.

    Returns (positions: int64[n], times_ms: int64[n], timed: bool[n], offsets: int32[n + 1],
    values: uint8[m], links) where row i is the data of the entry at positions[i] without
    its kind byte and time, times_ms[i] its append time where timed[i] (kind 2) and
    ``links`` is a list of (position, append_time_ms, scope, ledger, first, count, rows,
    packed) (kinds 3 and 4; a kind 3 link has one row per entry)."""
    cdef Py_ssize_t ds = digest_size(digest)
    cdef Py_ssize_t total = 0, rows = 0, pos, h, plen
    cdef Py_ssize_t k, count
    cdef int64_t first
    cdef uint32_t size
    cdef uint8_t kind
    cdef const uint8_t[::1] v
    links = []
    for body, first, count in runs:           # pass 1: kinds and sizes
        v = body
        pos = _skip_to_entries(v)
        for k in range(count):
            size = _entry_size(v, pos, ds)
            pos += ENTRY_HEAD
            h = _header_size(&v[pos], size) + ds
            plen = size - h
            if plen < 1:
                raise CorruptedDataError(f"stream entry at position {first + k} has no kind byte")
            kind = v[pos + h]
            if kind == K_DATA_UNTIMED:
                total += plen - 1
                rows += 1
            elif kind == K_DATA:
                if plen < 1 + TIME_SIZE:
                    raise CorruptedDataError(f"stream entry at position {first + k} is shorter "
                                             "than its kind byte and time")
                total += plen - 1 - TIME_SIZE
                rows += 1
            elif kind == K_LINK:
                if plen != 1 + TIME_SIZE + LINK_SIZE:
                    raise CorruptedDataError(f"stream link at position {first + k} has {plen} bytes, "
                                             f"not {1 + TIME_SIZE + LINK_SIZE}")
                links.append((first + k, <int64_t>el_get64(&v[pos + h + 1]),
                              el_get64(&v[pos + h + 9]), el_get64(&v[pos + h + 17]),
                              <int64_t>el_get64(&v[pos + h + 25]), el_get32(&v[pos + h + 33]),
                              el_get32(&v[pos + h + 33]), False))
            elif kind == K_PACKED_LINK:
                if plen != 1 + TIME_SIZE + PACKED_LINK_SIZE:
                    raise CorruptedDataError(f"stream link at position {first + k} has {plen} bytes, "
                                             f"not {1 + TIME_SIZE + PACKED_LINK_SIZE}")
                links.append((first + k, <int64_t>el_get64(&v[pos + h + 1]),
                              el_get64(&v[pos + h + 9]), el_get64(&v[pos + h + 17]),
                              <int64_t>el_get64(&v[pos + h + 25]), el_get32(&v[pos + h + 33]),
                              el_get64(&v[pos + h + 37]), True))
            elif kind != K_NOOP:
                raise CorruptedDataError(f"stream entry at position {first + k} has unknown kind {kind}")
            pos += size
    if total > MAX_VALUES_BYTES:
        raise IllegalOpError(f"{total} bytes of payloads do not fit one BinaryArray (int32 offsets); "
                             "read a shorter range")
    positions = np.empty(rows, dtype=np.int64)
    times = np.zeros(rows, dtype=np.int64)
    timed = np.zeros(rows, dtype=np.bool_)
    offsets = np.empty(rows + 1, dtype=np.int32)
    values = np.empty(total, dtype=np.uint8)
    cdef int64_t[::1] pos_out = positions
    cdef int64_t[::1] time_out = times
    cdef cnp.npy_bool[::1] timed_out = timed
    cdef int32_t[::1] off = offsets
    cdef uint8_t *out = <uint8_t *>cnp.PyArray_DATA(values)
    cdef Py_ssize_t r = 0, at = 0, skip
    off[0] = 0
    for body, first, count in runs:           # pass 2: one copy of each row's data
        v = body
        pos = READ_HEAD
        with nogil:
            for k in range(count):
                size = el_get32(&v[pos + 8])
                pos += ENTRY_HEAD
                h = _header_size(&v[pos], size) + ds
                kind = v[pos + h]
                if kind == K_DATA_UNTIMED or kind == K_DATA:
                    skip = 1
                    if kind == K_DATA:
                        time_out[r] = <int64_t>el_get64(&v[pos + h + 1])
                        timed_out[r] = 1
                        skip += TIME_SIZE
                    plen = size - h - skip
                    if plen:
                        memcpy(out + at, &v[pos + h + skip], plen)
                    at += plen
                    pos_out[r] = first + k
                    r += 1
                    off[r] = <int32_t>at
                pos += size
    return positions, times, timed, offsets, values, links


def packed_arrays(runs, int digest):
    """(offsets: int32[n + 1], values: uint8[m], rows: int32[entries]) of the rows packed in
    the entries of ``runs`` (format above): all rows in entry order, and how many rows each
    entry held. An entry whose sizes do not add up to its payload is CorruptedDataError."""
    cdef Py_ssize_t ds = digest_size(digest)
    cdef Py_ssize_t total = 0, nrows = 0, entries = 0, pos, h, plen, need
    cdef Py_ssize_t k, count, j
    cdef int64_t first
    cdef uint32_t size, c
    cdef const uint8_t[::1] v
    for body, first, count in runs:           # pass 1: check the framing, count rows and bytes
        v = body
        pos = _skip_to_entries(v)
        for k in range(count):
            size = _entry_size(v, pos, ds)
            pos += ENTRY_HEAD
            h = _header_size(&v[pos], size) + ds
            plen = size - h
            if plen < 4:
                raise CorruptedDataError(f"packed entry {first + k} has no row count")
            c = el_get32(&v[pos + h])
            need = 4 + 4 * <Py_ssize_t>c
            if need > plen:
                raise CorruptedDataError(f"packed entry {first + k} is shorter than its {c} row sizes")
            for j in range(c):
                need += el_get32(&v[pos + h + 4 + 4 * j])
            if need != plen:
                raise CorruptedDataError(f"packed entry {first + k}: rows of {need - 4 - 4 * c} bytes "
                                         f"in a payload of {plen}")
            total += plen - 4 - 4 * c
            nrows += c
            entries += 1
            pos += size
    if total > MAX_VALUES_BYTES:
        raise IllegalOpError(f"{total} bytes of rows do not fit one BinaryArray (int32 offsets); "
                             "read a shorter range")
    offsets = np.empty(nrows + 1, dtype=np.int32)
    values = np.empty(total, dtype=np.uint8)
    per_entry = np.empty(entries, dtype=np.int32)
    cdef int32_t[::1] off = offsets
    cdef int32_t[::1] per = per_entry
    cdef uint8_t *out = <uint8_t *>cnp.PyArray_DATA(values)
    cdef Py_ssize_t r = 0, at = 0, e = 0, data_at
    off[0] = 0
    for body, first, count in runs:           # pass 2: one copy of each entry's row bytes
        v = body
        pos = READ_HEAD
        with nogil:
            for k in range(count):
                size = el_get32(&v[pos + 8])
                pos += ENTRY_HEAD
                h = _header_size(&v[pos], size) + ds
                c = el_get32(&v[pos + h])
                per[e] = c
                e += 1
                data_at = pos + h + 4 + 4 * c
                plen = size - (data_at - pos)
                if plen:
                    memcpy(out + at, &v[data_at], plen)
                for j in range(c):
                    at += el_get32(&v[pos + h + 4 + 4 * j])
                    r += 1
                    off[r] = <int32_t>at
                pos += size
    return offsets, values, per_entry


def pack_rows(offsets, values, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t max_bytes):
    """(payload, next): rows start.. of a binary column (int32 ``offsets``, uint8 ``values``,
    the buffers of a pyarrow BinaryArray, already sliced to the array's offset) packed into
    one entry payload of at most ``max_bytes`` (but always at least one row), and the index
    of the first row it did not take (``stop`` when it took them all)."""
    cdef const int32_t[::1] off = offsets
    cdef const uint8_t[::1] val = values
    cdef Py_ssize_t n = stop, end = start, data = 0, row
    if not 0 <= start < stop <= off.shape[0] - 1:
        raise IllegalOpError(f"rows {start}..{stop} are outside the column's {off.shape[0] - 1}")
    if off[start] < 0 or off[stop] > val.shape[0]:
        raise IllegalOpError(f"offsets {off[start]}..{off[stop]} are outside the column's "
                             f"{val.shape[0]} bytes")
    while end < n:
        row = off[end + 1] - off[end]
        if row < 0:
            raise IllegalOpError(f"offsets of row {end} go backwards ({off[end]} to {off[end + 1]})")
        if end > start and 4 + 4 * (end + 1 - start) + data + row > max_bytes:
            break
        data += row
        end += 1
    cdef Py_ssize_t c = end - start
    out = PyBytes_FromStringAndSize(NULL, 4 + 4 * c + data)
    cdef uint8_t *p = <uint8_t *>(<char *>out)
    cdef Py_ssize_t j
    el_put32(p, <uint32_t>c)
    for j in range(c):
        el_put32(p + 4 + 4 * j, <uint32_t>(off[start + j + 1] - off[start + j]))
    if data:
        memcpy(p + 4 + 4 * c, &val[off[start]], data)
    return out, end
