# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Apache BookKeeper's v3 wire protocol, the encoder: requests (embedlog's client) and
responses (embedlog's bookie; those of the add and read paths written straight from their
fields, bkwire.pyx's grammar below) as length-prefixed protobuf frames, and the
digest-protected LAC of WRITE_LAC. The grammar, the protocol's numbers and the decoder are
bkwire.pyx's; BookKeeper's v2 (the bookie's side only) is bkserve.pyx's.

The add and read answers (``v3_add_response(s)``, ``v3_read_head``, ``v3_status_response``)::

    Response     := 0x0A len BKPacketHeader  0x10 status  sub-field len sub
    AddResponse  (field 101) := 1 status 2 ledgerId 3 entryId
    ReadResponse (field 100) := 1 status 2 ledgerId 3 entryId [5 maxLAC] [6 lacUpdateTimestamp]
                                [4 body]   # body last: its bytes follow the head unjoined

Bounds: an embedlog ADD body's count and sizes are checked against the body before an
output is sized from them, and the output is sized once, from the checked sizes, then
written (each write bounded by that size); no frame is made over max_frame_bytes.
"""

import hmac
import hashlib

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.list cimport PyList_Append

from embedlog._native.format cimport (el_put64, el_put32, el_get64, el_get32, el_crc32, el_crc32c,
                                      el_crc_init)
from embedlog._native.format cimport DIGEST_CRC32, DIGEST_MAC, DIGEST_CRC32C, DIGEST_DUMMY
from embedlog._native.bkwire cimport (vsize, put_varint, WT_VARINT, WT_LEN, VERSION_THREE_C,
                                      RECOVERY_ADD_C)

from embedlog._native.bkwire import (
    READ_ENTRY, ADD_ENTRY, AUTH, WRITE_LAC, READ_LAC, GET_BOOKIE_INFO, START_TLS, FORCE_LEDGER,
    GET_LIST_OF_ENTRIES_OF_LEDGER, FENCE_LEDGER, ENTRY_PIGGYBACK, V1_HEADER_BYTES,
    LAC_HEADER_BYTES, OPERATIONS)
from embedlog._native.wire_sizes import MASTER_KEY_BYTES, MAX_FRAME_BYTES
from embedlog.errors import CorruptedDataError, EntryTooLargeError, IllegalOpError

el_crc_init()

cdef int64_t I32_MAX = 0x7FFFFFFF


# -- encoding -----------------------------------------------------------------------------------

cdef struct Field:
    uint32_t number
    int wt                   # WT_VARINT or WT_LEN
    uint64_t value
    const uint8_t *data
    Py_ssize_t size


cdef enum:
    MAX_FIELDS = 8


cdef struct Frame:
    uint64_t txn
    uint64_t op
    int has_status
    uint64_t status
    uint32_t sub_number      # 100..108; 0: no sub-message
    Field f[MAX_FIELDS]
    int nf
    Py_ssize_t header_len, sub_len, msg_len


cdef inline Py_ssize_t field_size(const Field *f) noexcept nogil:
    cdef Py_ssize_t n = vsize((<uint64_t>f.number << 3) | <uint64_t>f.wt)
    if f.wt == WT_VARINT:
        return n + vsize(f.value)
    return n + vsize(<uint64_t>f.size) + f.size


cdef inline uint8_t *field_put(uint8_t *p, const Field *f) noexcept nogil:
    p = put_varint(p, (<uint64_t>f.number << 3) | <uint64_t>f.wt)
    if f.wt == WT_VARINT:
        return put_varint(p, f.value)
    p = put_varint(p, <uint64_t>f.size)
    if f.size:
        memcpy(p, f.data, f.size)
    return p + f.size


cdef Py_ssize_t frame_size(Frame *fr) noexcept nogil:
    """The frame's bytes, length prefix included; caches the nested lengths in fr."""
    cdef int i
    fr.header_len = 2 + 1 + vsize(fr.op) + 1 + vsize(fr.txn)
    fr.sub_len = 0
    for i in range(fr.nf):
        fr.sub_len += field_size(&fr.f[i])
    fr.msg_len = 1 + vsize(<uint64_t>fr.header_len) + fr.header_len
    if fr.has_status:
        fr.msg_len += 1 + vsize(fr.status)
    if fr.sub_number:
        fr.msg_len += vsize((<uint64_t>fr.sub_number << 3) | WT_LEN) + vsize(<uint64_t>fr.sub_len) + fr.sub_len
    return 4 + fr.msg_len


cdef uint8_t *frame_put(uint8_t *p, const Frame *fr) noexcept nogil:
    """Writes frame_size(fr) bytes (frame_size must have run on fr)."""
    cdef int i
    p[0] = <uint8_t>(fr.msg_len >> 24)
    p[1] = <uint8_t>(fr.msg_len >> 16)
    p[2] = <uint8_t>(fr.msg_len >> 8)
    p[3] = <uint8_t>fr.msg_len
    p += 4
    p[0] = 0x0A                                       # field 1, length-delimited: header
    p = put_varint(p + 1, <uint64_t>fr.header_len)
    p[0] = 0x08                                       # version
    p[1] = VERSION_THREE_C
    p[2] = 0x10                                       # operation
    p = put_varint(p + 3, fr.op)
    p[0] = 0x18                                       # txnId
    p = put_varint(p + 1, fr.txn)
    if fr.has_status:
        p[0] = 0x10                                   # Response.status
        p = put_varint(p + 1, fr.status)
    if fr.sub_number:
        p = put_varint(p, (<uint64_t>fr.sub_number << 3) | WT_LEN)
        p = put_varint(p, <uint64_t>fr.sub_len)
        for i in range(fr.nf):
            p = field_put(p, &fr.f[i])
    return p


cdef inline void add_varint(Frame *fr, uint32_t number, uint64_t value) noexcept nogil:
    fr.f[fr.nf].number = number
    fr.f[fr.nf].wt = WT_VARINT
    fr.f[fr.nf].value = value
    fr.nf += 1


cdef inline void add_bytes(Frame *fr, uint32_t number, const uint8_t *data, Py_ssize_t size) noexcept nogil:
    fr.f[fr.nf].number = number
    fr.f[fr.nf].wt = WT_LEN
    fr.f[fr.nf].data = data
    fr.f[fr.nf].size = size
    fr.nf += 1


cdef int too_large(Py_ssize_t size, Py_ssize_t max_frame_bytes, what) except -1:
    raise EntryTooLargeError(f"{what}: a v3 frame of {size} bytes exceeds "
                             f"max_frame_bytes={max_frame_bytes} (the bookie's nettyMaxFrameSizeBytes)")


cdef int check_key(const uint8_t[::1] key) except -1:
    if key.shape[0] != MASTER_KEY_BYTES:
        raise IllegalOpError(f"a master key has {MASTER_KEY_BYTES} bytes, not {key.shape[0]}")
    return 0


def encode_adds(uint64_t txn_first, int64_t ledger_id, master_key, add_body, bint recovery=False,
                Py_ssize_t max_frame_bytes=MAX_FRAME_BYTES):
    """The v3 AddRequests of an embedlog ADD body (``count:u32 (size:u32 entry[size])*count``,
    entries in V1 format of ``ledger_id``), one frame each, txn ids ``txn_first`` onwards, in
    one buffer. Returns ``(frames, count, first_entry_id)``.

    IllegalOpError for a body that is not V1 entries of this ledger (a V2 entry, another
    ledger, a negative entry id), CorruptedDataError for a truncated body,
    EntryTooLargeError for an entry whose frame would exceed max_frame_bytes."""
    cdef const uint8_t[::1] key = master_key
    cdef const uint8_t[::1] body = add_body
    cdef Py_ssize_t blen = body.shape[0]
    cdef Py_ssize_t pos, esize, total, count, i, fsize
    cdef const uint8_t *b
    cdef const uint8_t *e
    cdef int64_t eid, first_eid = -1
    cdef uint64_t lid
    cdef Frame fr
    cdef bytes out
    cdef uint8_t *w
    cdef uint8_t *wend
    check_key(key)
    if ledger_id < 0:
        raise IllegalOpError(f"ledger id {ledger_id} is negative")
    if blen < 4:
        raise CorruptedDataError("add body without an entry count")
    b = &body[0]
    count = <Py_ssize_t>el_get32(b)
    if count < 1:
        raise IllegalOpError("add body without entries")
    if count > (blen - 4) // 4:
        raise CorruptedDataError(f"add body of {blen} bytes cannot hold {count} entries")
    memset(&fr, 0, sizeof(Frame))
    fr.op = 2
    fr.sub_number = 101
    # first pass: check every entry, size every frame
    pos, total = 4, 0
    for i in range(count):
        if blen - pos < 4:
            raise CorruptedDataError("add body truncated in an entry size")
        esize = <Py_ssize_t>el_get32(b + pos)
        pos += 4
        if esize > blen - pos:
            raise CorruptedDataError("add body truncated in an entry")
        e = b + pos
        if esize < V1_HEADER_BYTES:
            raise IllegalOpError(f"an entry of {esize} bytes is shorter than a V1 header")
        lid = el_get64(e)
        eid = <int64_t>el_get64(e + 8)
        if lid >> 63:
            raise IllegalOpError("a V2 entry (128-bit ledger id) cannot be sent to a BookKeeper bookie")
        if <int64_t>lid != ledger_id:
            raise IllegalOpError(f"an entry of ledger {lid} in an add to ledger {ledger_id}")
        if eid < 0:
            raise IllegalOpError(f"entry id {eid} is negative")
        if i == 0:
            first_eid = eid
        fr.nf = 0
        fr.txn = txn_first + <uint64_t>i
        add_varint(&fr, 1, <uint64_t>ledger_id)
        add_varint(&fr, 2, <uint64_t>eid)
        add_bytes(&fr, 3, &key[0], MASTER_KEY_BYTES)
        add_bytes(&fr, 4, e, esize)
        if recovery:
            add_varint(&fr, 100, RECOVERY_ADD_C)
        fsize = frame_size(&fr)
        if fsize > max_frame_bytes:
            too_large(fsize, max_frame_bytes, f"entry {eid} of ledger {ledger_id}")
        total += fsize
        pos += esize
    if pos != blen:
        raise CorruptedDataError("add body has trailing bytes")
    out = PyBytes_FromStringAndSize(NULL, total)
    w = <uint8_t *>PyBytes_AS_STRING(out)
    wend = w + total
    # second pass: the same frames, written (the sizes were checked above)
    pos = 4
    for i in range(count):
        esize = <Py_ssize_t>el_get32(b + pos)
        pos += 4
        e = b + pos
        fr.nf = 0
        fr.txn = txn_first + <uint64_t>i
        add_varint(&fr, 1, <uint64_t>ledger_id)
        add_varint(&fr, 2, el_get64(e + 8))
        add_bytes(&fr, 3, &key[0], MASTER_KEY_BYTES)
        add_bytes(&fr, 4, e, esize)
        if recovery:
            add_varint(&fr, 100, RECOVERY_ADD_C)
        fsize = frame_size(&fr)
        if fsize > wend - w:                     # cannot happen: the same sizes as above
            raise CorruptedDataError("add body changed while it was encoded")
        w = frame_put(w, &fr)
        pos += esize
    return out, count, first_eid


def encode_reads(uint64_t txn_first, int64_t ledger_id, int64_t first_entry, Py_ssize_t count,
                 int flag=0, master_key=None):
    """``count`` ReadRequests of entries ``first_entry``.. (txn ids ``txn_first``..) in one
    buffer; ``flag`` FENCE_LEDGER needs the master key."""
    cdef const uint8_t[::1] key
    cdef const uint8_t *kp = NULL
    cdef Frame fr
    cdef Py_ssize_t i, total = 0
    cdef bytes out
    cdef uint8_t *w
    if count < 1 or count > 1 << 20:
        raise IllegalOpError(f"read of {count} entries")
    if first_entry < 0 or first_entry > (<int64_t>1 << 62):
        raise IllegalOpError(f"read from entry {first_entry}")
    if master_key is not None:
        key = master_key
        check_key(key)
        kp = &key[0]
    elif flag & FENCE_LEDGER:
        raise IllegalOpError("a fencing read needs the master key")
    memset(&fr, 0, sizeof(Frame))
    fr.op = 1
    fr.sub_number = 100
    for i in range(count):
        fr.nf = 0
        fr.txn = txn_first + <uint64_t>i
        add_varint(&fr, 1, <uint64_t>ledger_id)
        add_varint(&fr, 2, <uint64_t>(first_entry + i))
        if kp != NULL:
            add_bytes(&fr, 3, kp, MASTER_KEY_BYTES)
        if flag:
            add_varint(&fr, 100, <uint64_t>flag)
        total += frame_size(&fr)
    out = PyBytes_FromStringAndSize(NULL, total)
    w = <uint8_t *>PyBytes_AS_STRING(out)
    for i in range(count):
        fr.nf = 0
        fr.txn = txn_first + <uint64_t>i
        add_varint(&fr, 1, <uint64_t>ledger_id)
        add_varint(&fr, 2, <uint64_t>(first_entry + i))
        if kp != NULL:
            add_bytes(&fr, 3, kp, MASTER_KEY_BYTES)
        if flag:
            add_varint(&fr, 100, <uint64_t>flag)
        frame_size(&fr)
        w = frame_put(w, &fr)
    return out


cdef object encode_one(uint64_t txn, uint64_t op, object status, uint32_t sub_number, list fields,
                       Py_ssize_t max_frame_bytes):
    """One frame from (field number, value) pairs: an int is a varint (negative ints as
    int64 two's complement), bytes are length-delimited."""
    cdef Frame fr
    cdef Py_ssize_t size
    cdef const uint8_t[::1] view
    cdef list keep = []
    cdef bytes out
    cdef uint8_t *w
    if len(fields) > MAX_FIELDS:
        raise IllegalOpError(f"{len(fields)} fields in one message")
    memset(&fr, 0, sizeof(Frame))
    fr.txn = txn
    fr.op = op
    if status is not None:
        fr.has_status = 1
        fr.status = <uint64_t><int64_t>status
    fr.sub_number = sub_number
    for number, value in fields:
        if isinstance(value, int):
            if not -(1 << 63) <= value < (1 << 64):
                raise IllegalOpError(f"field {number}: {value} does not fit 64 bits")
            add_varint(&fr, number, <uint64_t>(value & 0xFFFFFFFFFFFFFFFF))
        else:
            value = bytes(value)
            keep.append(value)
            view = value
            add_bytes(&fr, number, &view[0] if view.shape[0] else NULL, view.shape[0])
    size = frame_size(&fr)
    if size > max_frame_bytes:
        too_large(size, max_frame_bytes, OPERATIONS.get(op, op))
    out = PyBytes_FromStringAndSize(NULL, size)
    w = <uint8_t *>PyBytes_AS_STRING(out)
    frame_put(w, &fr)
    return out


# which keyword of encode_request / encode_response is which field of each sub-message
_REQ_FIELDS = {
    READ_ENTRY: (100, [("ledger_id", 1), ("entry_id", 2), ("master_key", 3), ("previous_lac", 4),
                       ("timeout_ms", 5), ("flag", 100)]),
    ADD_ENTRY: (101, [("ledger_id", 1), ("entry_id", 2), ("master_key", 3), ("body", 4),
                      ("write_flags", 5), ("flag", 100)]),
    AUTH: (102, [("auth_plugin", 1), ("auth_payload", 2)]),
    WRITE_LAC: (103, [("ledger_id", 1), ("lac", 2), ("master_key", 3), ("body", 4)]),
    READ_LAC: (104, [("ledger_id", 1)]),
    GET_BOOKIE_INFO: (105, [("requested", 1)]),
    START_TLS: (106, []),
    FORCE_LEDGER: (107, [("ledger_id", 1)]),
    GET_LIST_OF_ENTRIES_OF_LEDGER: (108, [("ledger_id", 1)]),
}
_RESP_FIELDS = {
    READ_ENTRY: (100, [("status", 1), ("ledger_id", 2), ("entry_id", 3), ("body", 4), ("max_lac", 5),
                       ("lac_update_timestamp", 6)]),
    ADD_ENTRY: (101, [("status", 1), ("ledger_id", 2), ("entry_id", 3)]),
    AUTH: (102, [("auth_plugin", 1), ("auth_payload", 2)]),
    WRITE_LAC: (103, [("status", 1), ("ledger_id", 2)]),
    READ_LAC: (104, [("status", 1), ("ledger_id", 2), ("lac_body", 3), ("last_entry_body", 4)]),
    GET_BOOKIE_INFO: (105, [("status", 1), ("total_disk_capacity", 2), ("free_disk_space", 3)]),
    START_TLS: (106, []),
    FORCE_LEDGER: (107, [("status", 1), ("ledger_id", 2)]),
    GET_LIST_OF_ENTRIES_OF_LEDGER: (108, [("status", 1), ("ledger_id", 2), ("availability", 3)]),
}


def encode_request(uint64_t txn_id, int operation, Py_ssize_t max_frame_bytes=MAX_FRAME_BYTES,
                   **fields):
    """One request frame; ``fields`` are the sub-request's, by their names on Request
    (ledger_id, entry_id, master_key, body, flag, previous_lac, timeout_ms, lac, requested,
    write_flags, auth_plugin, auth_payload); None or absent means not sent."""
    if operation not in _REQ_FIELDS:
        raise IllegalOpError(f"unknown v3 operation {operation}")
    sub, names = _REQ_FIELDS[operation]
    known = {name for name, _ in names}
    extra = [k for k, v in fields.items() if v is not None and k not in known]
    if extra:
        raise IllegalOpError(f"{OPERATIONS[operation]} requests have no {', '.join(sorted(extra))}")
    if fields.get("master_key") is not None:
        check_key(fields["master_key"])
    pairs = [(num, fields[name]) for name, num in names if fields.get(name) is not None]
    return encode_one(txn_id, operation, None, sub, pairs, max_frame_bytes)


def encode_response(uint64_t txn_id, int operation, int status,
                    Py_ssize_t max_frame_bytes=MAX_FRAME_BYTES + 4096, **fields):
    """One response frame with top-level ``status``; ``fields`` are the sub-response's by
    their names on Response (``status`` there defaults to the top-level one)."""
    if operation not in _RESP_FIELDS:
        raise IllegalOpError(f"unknown v3 operation {operation}")
    sub, names = _RESP_FIELDS[operation]
    if "sub_status" in fields:
        fields["status"] = fields.pop("sub_status")
    else:
        fields["status"] = status
    known = {name for name, _ in names}
    extra = [k for k, v in fields.items() if v is not None and k not in known]
    if extra:
        raise IllegalOpError(f"{OPERATIONS[operation]} responses have no {', '.join(sorted(extra))}")
    pairs = [(num, fields[name]) for name, num in names if fields.get(name) is not None]
    return encode_one(txn_id, operation, status, sub, pairs, max_frame_bytes)


# -- responses on the bookie's hot paths (add and read answers, built without fields) -----------------------------------------------------------

cdef inline Py_ssize_t header_len(uint64_t op, uint64_t txn) noexcept nogil:
    return 2 + 1 + vsize(op) + 1 + vsize(txn)


cdef inline uint8_t *put_head(uint8_t *w, uint64_t op, uint64_t txn, uint64_t status,
                              Py_ssize_t msg_len, Py_ssize_t hlen, uint32_t sub_number,
                              Py_ssize_t sub_len) noexcept nogil:
    el_put32(w, <uint32_t>msg_len)
    w += 4
    w[0] = 0x0A
    w = put_varint(w + 1, <uint64_t>hlen)
    w[0] = 0x08
    w[1] = 3                                    # version THREE
    w[2] = 0x10
    w = put_varint(w + 3, op)
    w[0] = 0x18
    w = put_varint(w + 1, txn)
    w[0] = 0x10                                 # Response.status
    w = put_varint(w + 1, status)
    w = put_varint(w, (<uint64_t>sub_number << 3) | 2)
    return put_varint(w, <uint64_t>sub_len)


cdef inline Py_ssize_t add_response_len(uint64_t txn, uint64_t st, int64_t lid,
                                        int64_t eid) noexcept nogil:
    """An ADD_ENTRY response frame's bytes, its length prefix included."""
    cdef Py_ssize_t hlen = header_len(2, txn)
    cdef Py_ssize_t sub = 1 + vsize(st) + 1 + vsize(<uint64_t>lid) + 1 + vsize(<uint64_t>eid)
    return 4 + 1 + vsize(<uint64_t>hlen) + hlen + 1 + vsize(st) + 2 + vsize(<uint64_t>sub) + sub


cdef inline uint8_t *put_add_response(uint8_t *w, uint64_t txn, uint64_t st, int64_t lid,
                                      int64_t eid) noexcept nogil:
    cdef Py_ssize_t hlen = header_len(2, txn)
    cdef Py_ssize_t sub = 1 + vsize(st) + 1 + vsize(<uint64_t>lid) + 1 + vsize(<uint64_t>eid)
    w = put_head(w, 2, txn, st, add_response_len(txn, st, lid, eid) - 4, hlen, 101, sub)
    w[0] = 0x08
    w = put_varint(w + 1, st)
    w[0] = 0x10
    w = put_varint(w + 1, <uint64_t>lid)
    w[0] = 0x18
    return put_varint(w + 1, <uint64_t>eid)


def v3_add_response(uint64_t txn_id, int status, int64_t ledger_id, int64_t entry_id):
    """A v3 ADD_ENTRY response frame (top-level and AddResponse status alike)."""
    cdef uint64_t st = <uint64_t><int64_t>status
    cdef bytes out = PyBytes_FromStringAndSize(
        NULL, add_response_len(txn_id, st, ledger_id, entry_id))
    put_add_response(<uint8_t *>PyBytes_AS_STRING(out), txn_id, st, ledger_id, entry_id)
    return out


def v3_add_responses(txn_ids, int status, int64_t ledger_id, entry_ids):
    """The v3 ADD_ENTRY responses of a run of adds of one ledger with one status, joined in
    request order (``txn_ids[i]`` answers ``entry_ids[i]``): one write per group commit."""
    cdef uint64_t st = <uint64_t><int64_t>status
    cdef Py_ssize_t n = len(txn_ids), i, total = 0
    cdef bytes out
    cdef uint8_t *w
    cdef uint8_t *start
    if len(entry_ids) != n:
        raise IllegalOpError(f"{n} transaction ids for {len(entry_ids)} entries")
    for i in range(n):
        total += add_response_len(<uint64_t>txn_ids[i], st, ledger_id, <int64_t>entry_ids[i])
    out = PyBytes_FromStringAndSize(NULL, total)
    start = w = <uint8_t *>PyBytes_AS_STRING(out)
    for i in range(n):
        if add_response_len(<uint64_t>txn_ids[i], st, ledger_id, <int64_t>entry_ids[i]) \
                > total - (w - start):     # a list changed under us: never write past the end
            raise IllegalOpError("transaction or entry ids changed while they were encoded")
        w = put_add_response(w, <uint64_t>txn_ids[i], st, ledger_id, <int64_t>entry_ids[i])
    return out


def v3_read_head(uint64_t txn_id, int status, int64_t ledger_id, int64_t entry_id,
                 max_lac=None, Py_ssize_t body_bytes=-1, lac_update_timestamp=None):
    """The head of a v3 READ_ENTRY response frame: everything but the body's bytes, which
    follow it (``body_bytes`` of them; -1: no body). Without ``body_bytes`` it is the
    whole frame."""
    cdef uint64_t st = <uint64_t><int64_t>status
    cdef uint64_t lac = 0, ts = 0
    cdef bint has_lac = max_lac is not None, has_ts = lac_update_timestamp is not None
    cdef Py_ssize_t hlen = header_len(1, txn_id)
    cdef Py_ssize_t sub, msg, head
    cdef bytes out
    cdef uint8_t *w
    if body_bytes > MAX_FRAME_BYTES:
        raise EntryTooLargeError(f"a v3 read response body of {body_bytes} bytes")
    if has_lac:
        lac = <uint64_t><int64_t>max_lac
    if has_ts:
        ts = <uint64_t><int64_t>lac_update_timestamp
    sub = 1 + vsize(st) + 1 + vsize(<uint64_t>ledger_id) + 1 + vsize(<uint64_t>entry_id)
    if has_lac:
        sub += 1 + vsize(lac)
    if has_ts:
        sub += 1 + vsize(ts)
    if body_bytes >= 0:
        sub += 1 + vsize(<uint64_t>body_bytes) + body_bytes
    msg = 1 + vsize(<uint64_t>hlen) + hlen + 1 + vsize(st) + 2 + vsize(<uint64_t>sub) + sub
    head = 4 + msg - (body_bytes if body_bytes > 0 else 0)
    out = PyBytes_FromStringAndSize(NULL, head)
    w = <uint8_t *>PyBytes_AS_STRING(out)
    w = put_head(w, 1, txn_id, st, msg, hlen, 100, sub)
    w[0] = 0x08
    w = put_varint(w + 1, st)
    w[0] = 0x10
    w = put_varint(w + 1, <uint64_t>ledger_id)
    w[0] = 0x18
    w = put_varint(w + 1, <uint64_t>entry_id)
    if has_lac:
        w[0] = 0x28
        w = put_varint(w + 1, lac)
    if has_ts:
        w[0] = 0x30
        w = put_varint(w + 1, ts)
    if body_bytes >= 0:
        w[0] = 0x22
        put_varint(w + 1, <uint64_t>body_bytes)
    return out


def v3_status_response(uint64_t txn_id, uint64_t operation, int status):
    """``Response{header, status}`` without a sub-response: a bookie's answer to an operation
    it does not serve (the header names the operation as the request did)."""
    cdef uint64_t st = <uint64_t><int64_t>status
    cdef Py_ssize_t hlen = header_len(operation, txn_id)
    cdef Py_ssize_t msg = 1 + vsize(<uint64_t>hlen) + hlen + 1 + vsize(st)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 4 + msg)
    cdef uint8_t *w = <uint8_t *>PyBytes_AS_STRING(out)
    el_put32(w, <uint32_t>msg)
    w += 4
    w[0] = 0x0A
    w = put_varint(w + 1, <uint64_t>hlen)
    w[0] = 0x08
    w[1] = 3
    w[2] = 0x10
    w = put_varint(w + 3, operation)
    w[0] = 0x18
    w = put_varint(w + 1, txn_id)
    w[0] = 0x10
    put_varint(w + 1, st)
    return out


# -- the digest-protected LAC of WRITE_LAC --------------------------------------------------------

def lac_body(int64_t ledger_id, int64_t lac, int digest, mac_key=None):
    """``ledgerId:i64 lac:i64 digest``: what a BookKeeper client sends as WRITE_LAC's body
    (DigestManager.computeDigestAndPackageForSendingLac), the digest over the 16 bytes in the
    ledger's digest type (format.pyx's codes; MAC needs the ledger's mac key)."""
    cdef uint8_t head[16]
    cdef uint32_t crc
    cdef bytes out
    cdef uint8_t *w
    el_put64(head, <uint64_t>ledger_id)
    el_put64(head + 8, <uint64_t>lac)
    if digest == DIGEST_CRC32:
        crc = el_crc32(0, head, 16)
        out = PyBytes_FromStringAndSize(NULL, 24)
        w = <uint8_t *>PyBytes_AS_STRING(out)
        memcpy(w, head, 16)
        el_put64(w + 16, crc)
        return out
    if digest == DIGEST_CRC32C:
        crc = el_crc32c(0, head, 16)
        out = PyBytes_FromStringAndSize(NULL, 20)
        w = <uint8_t *>PyBytes_AS_STRING(out)
        memcpy(w, head, 16)
        w[16] = <uint8_t>(crc >> 24)
        w[17] = <uint8_t>(crc >> 16)
        w[18] = <uint8_t>(crc >> 8)
        w[19] = <uint8_t>crc
        return out
    if digest == DIGEST_DUMMY:
        return PyBytes_FromStringAndSize(<const char *>head, 16)
    if digest == DIGEST_MAC:
        if mac_key is None or len(mac_key) != 20:
            raise IllegalOpError("a MAC digest needs the ledger's 20-byte mac key")
        h = PyBytes_FromStringAndSize(<const char *>head, 16)
        return h + hmac.new(bytes(mac_key), h, hashlib.sha1).digest()
    raise IllegalOpError(f"unknown digest type {digest}")


def lac_of_body(body, int64_t ledger_id):
    """The LAC in a READ_LAC response's lacBody (``ledgerId lac digest``), its digest not
    checked (the bookie's own LAC is trusted as embedlog's READ_LAC trusts it)."""
    cdef const uint8_t[::1] v = body
    if v.shape[0] < LAC_HEADER_BYTES:
        raise CorruptedDataError(f"a LAC body of {v.shape[0]} bytes is shorter than its header")
    if <int64_t>el_get64(&v[0]) != ledger_id:
        raise CorruptedDataError(f"a LAC body of ledger {<int64_t>el_get64(&v[0])} "
                                 f"answers a LAC read of ledger {ledger_id}")
    return <int64_t>el_get64(&v[8])


def entry_ids(body, int64_t ledger_id):
    """``(entry_id, lac)`` from a V1 entry's header, checked to be of ``ledger_id``."""
    cdef const uint8_t[::1] v = body
    if v.shape[0] < V1_HEADER_BYTES:
        raise CorruptedDataError(f"an entry of {v.shape[0]} bytes is shorter than a V1 header")
    if <int64_t>el_get64(&v[0]) != ledger_id:
        raise CorruptedDataError(f"an entry of ledger {<int64_t>el_get64(&v[0])} "
                                 f"answers a read of ledger {ledger_id}")
    return <int64_t>el_get64(&v[8]), <int64_t>el_get64(&v[16])
