# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Apache BookKeeper's v3 wire protocol: protobuf messages in length-prefixed frames; the
grammar, the protocol's numbers and the decoder (bkencode.pyx encodes).

Grammar (BookkeeperProtocol.proto, proto2; a frame is what Netty's length-field codec
carries between a BookKeeper client and bookie, the same for 4.16 and 4.17)::

    frame    := length:i32 (big-endian, >= 0) message[length]
                # 4 + length <= max_frame_bytes (nettyMaxFrameSizeBytes, 5 MiB)
    message  := field*                      # protobuf: any order, unknown fields skipped
    field    := tag:varint(number << 3 | wire_type) value
    value    := varint                      # wire type 0: <= 10 bytes, the 10th <= 1
              | u64 little-endian           # wire type 1
              | len:varint bytes[len]       # wire type 2: len <= what is left
              | u32 little-endian           # wire type 5
                # wire types 3, 4 (groups), 6, 7 and field number 0 are refused

    Request  := 1 header:BKPacketHeader  100..108 one sub-request  200 context* (skipped)
    Response := 1 header:BKPacketHeader  2 status:enum  100..108 one sub-response
    BKPacketHeader := 1 version:enum(=3) 2 operation:enum 3 txnId:u64 [4 priority:u32]

    op (operation)  sub-field  request                                   response
    READ_ENTRY 1    100        ledgerId:1 entryId:2 [masterKey:3]        status:1 ledgerId:2 entryId:3
                               [previousLAC:4 timeOut:5] [flag:100]      [body:4 maxLAC:5 lacUpdateTimestamp:6]
    ADD_ENTRY 2     101        ledgerId:1 entryId:2 masterKey:3 body:4   status:1 ledgerId:2 entryId:3
                               [writeFlags:5] [flag:100]
    AUTH 5          102        authPluginName:1 payload:2                (same)
    WRITE_LAC 6     103        ledgerId:1 lac:2 masterKey:3 body:4       status:1 ledgerId:2
    READ_LAC 7      104        ledgerId:1                                status:1 ledgerId:2 [lacBody:3 lastEntryBody:4]
    GET_BOOKIE_INFO 8  105     [requested:1]                             status:1 [totalDiskCapacity:2 freeDiskSpace:3]
    START_TLS 9     106        (empty)                                   (empty)
    FORCE_LEDGER 10 107        ledgerId:1                                status:1 ledgerId:2
    GET_LIST_OF_ENTRIES_OF_LEDGER 11  108  ledgerId:1                    status:1 ledgerId:2 [availability:3]

    ReadRequest.flag: FENCE_LEDGER 1, ENTRY_PIGGYBACK 2 (long poll: entryId -1, previousLAC,
    timeOut in ms); AddRequest.flag: RECOVERY_ADD 1. StatusCode: EOK 0, ENOLEDGER 402,
    ENOENTRY 403, EBADREQ 404, EIO 501, EUA 502, EBADVERSION 503, EFENCED 504, EREADONLY
    505, ETOOMANYREQUESTS 506, EUNKNOWNLEDGERSTATE 507. A response's status is its top-level
    status unless that is EOK, then its sub-response's (what BookKeeper's client does).

The body of an add and of a read is an entry in BookKeeper's V1 format (format.pyx): its
first 16 bytes are the ledger and entry id. A WRITE_LAC body is ``ledgerId:i64 lac:i64
digest`` with the ledger's digest over those 16 bytes (DigestManager's LAC package).

Bounds: a frame's length is checked against max_frame_bytes before anything is read from
it, and every field inside it against the bytes left in its message (a nested message
against its parent's length); a varint stops at 10 bytes; an embedlog ADD body's count and
sizes are checked against the body before an output is sized from them, and the output is
sized once, from the checked sizes, then written (each write bounded by that size).
Known fields must carry their declared wire type; required fields must be present.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.string cimport memset
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.list cimport PyList_Append

from embedlog._native.format cimport el_get32

from embedlog._native.wire_sizes import MASTER_KEY_BYTES, MAX_FRAME_BYTES
from embedlog.errors import STATUS, STATUSES, CorruptedDataError, EntryTooLargeError, IllegalOpError

# -- the protocol's numbers ---------------------------------------------------------------------

VERSION_THREE = 3
READ_ENTRY, ADD_ENTRY, AUTH, WRITE_LAC, READ_LAC, GET_BOOKIE_INFO, START_TLS, FORCE_LEDGER = (
    1, 2, 5, 6, 7, 8, 9, 10)
GET_LIST_OF_ENTRIES_OF_LEDGER = 11
OPERATIONS = {READ_ENTRY: "READ_ENTRY", ADD_ENTRY: "ADD_ENTRY", AUTH: "AUTH", WRITE_LAC: "WRITE_LAC",
              READ_LAC: "READ_LAC", GET_BOOKIE_INFO: "GET_BOOKIE_INFO", START_TLS: "START_TLS",
              FORCE_LEDGER: "FORCE_LEDGER",
              GET_LIST_OF_ENTRIES_OF_LEDGER: "GET_LIST_OF_ENTRIES_OF_LEDGER"}
FENCE_LEDGER, ENTRY_PIGGYBACK = 1, 2             # ReadRequest.Flag
RECOVERY_ADD = 1                                 # AddRequest.Flag
TOTAL_DISK_CAPACITY, FREE_DISK_SPACE = 1, 2      # GetBookieInfoRequest.Flags
# StatusCode: errors.STATUSES' v3 column
EOK, ENOLEDGER, ENOENTRY, EBADREQ, EIO, EUA, EBADVERSION, EFENCED, EREADONLY, ETOOMANYREQUESTS, \
    EUNKNOWNLEDGERSTATE = [STATUS[name].v3 for name in (
        "EOK", "ENOLEDGER", "ENOENTRY", "EBADREQ", "EIO", "EUA", "EBADVERSION", "EFENCED",
        "EREADONLY", "ETOOMANYREQUESTS", "EUNKNOWNLEDGERSTATE")]
STATUS_NAMES = {}                                # each v3 code's own name (not EINVALIDTERM's)
for _status in STATUSES:
    STATUS_NAMES.setdefault(_status.v3, _status.name)
LAST_ADD_CONFIRMED = -1                          # the entry id of a read of the last entry
V1_HEADER_BYTES = 32
LAC_HEADER_BYTES = 16

cdef int64_t I32_MAX = 0x7FFFFFFF

# -- varints and fields ---------------------------------------------------------------------------

cdef enum:
    SLOTS = 8            # field numbers 1..7 keep their number as slot; field 100 (flag) is slot 0
    NSUB = 9             # sub-messages 100..108


# vsize, put_varint, get_varint and the wire types are in bkwire.pxd (shared with
# bkencode.pyx, the encoder, and bkserve.pyx, the bookie's side of v3 and v2)


cdef struct Msg:
    # one decoded (sub-)message: its fields by slot, the last occurrence winning
    uint32_t seen            # bit s set: slot s was present
    uint64_t v[SLOTS]        # varint values
    const uint8_t *b[SLOTS]  # length-delimited values, views of the frame
    Py_ssize_t n[SLOTS]


cdef struct Schema:
    # the declared wire type of slots 0..7 (-1: no such field, skipped as unknown)
    int wt[SLOTS]
    uint32_t required


cdef struct Err:
    const char *what
    Py_ssize_t at


cdef int parse_msg(const uint8_t *p, const uint8_t *end, const Schema *s, Msg *m,
                   Err *err) noexcept nogil:
    """Fields of one flat message into m (merged into what it holds). -1 on malformed bytes."""
    cdef uint64_t tag, val, number
    cdef int wt, slot
    cdef const uint8_t *q
    while p < end:
        q = get_varint(p, end, &tag)
        if q == NULL:
            err.what = "truncated or overlong tag"
            return -1
        p = q
        number = tag >> 3
        wt = <int>(tag & 7)
        if number == 0 or number > 0x1FFFFFFF:
            err.what = "field number out of range"
            return -1
        slot = -1
        if 1 <= number < SLOTS:
            slot = <int>number
        elif number == 100:
            slot = 0
        if slot >= 0 and s.wt[slot] >= 0 and s.wt[slot] != wt:
            err.what = "a known field with the wrong wire type"
            return -1
        if wt == WT_VARINT:
            q = get_varint(p, end, &val)
            if q == NULL:
                err.what = "truncated or overlong varint"
                return -1
            p = q
            if slot >= 0 and s.wt[slot] == WT_VARINT:
                m.v[slot] = val
                m.seen |= 1u << slot
        elif wt == WT_I64:
            if end - p < 8:
                err.what = "truncated fixed64"
                return -1
            p += 8
        elif wt == WT_I32:
            if end - p < 4:
                err.what = "truncated fixed32"
                return -1
            p += 4
        elif wt == WT_LEN:
            q = get_varint(p, end, &val)
            if q == NULL:
                err.what = "truncated length"
                return -1
            p = q
            if val > <uint64_t>(end - p):
                err.what = "length-delimited field longer than its message"
                return -1
            if slot >= 0 and s.wt[slot] == WT_LEN:
                m.b[slot] = p
                m.n[slot] = <Py_ssize_t>val
                m.seen |= 1u << slot
            p += <Py_ssize_t>val
        else:
            err.what = "unsupported wire type (group or reserved)"
            return -1
    if (m.seen & s.required) != s.required:
        err.what = "a required field is missing"
        return -1
    return 0


# Schemas: slot 0 is field 100 (flag), slots 1..7 fields 1..7.
cdef Schema S_HEADER            # version:1 operation:2 txnId:3 priority:4
cdef Schema S_REQ[NSUB]
cdef Schema S_RESP[NSUB]
cdef Schema S_NONE


cdef void schema(Schema *s, int w0, int w1, int w2, int w3, int w4, int w5, int w6, int w7,
                 uint32_t required) noexcept:
    s.wt[0], s.wt[1], s.wt[2], s.wt[3] = w0, w1, w2, w3
    s.wt[4], s.wt[5], s.wt[6], s.wt[7] = w4, w5, w6, w7
    s.required = required


cdef int V = WT_VARINT
cdef int L = WT_LEN
cdef int X = -1
schema(&S_NONE, X, X, X, X, X, X, X, X, 0)
schema(&S_HEADER, X, V, V, V, V, X, X, X, 0b1110)
# requests
schema(&S_REQ[0], V, V, V, L, V, V, X, X, 0b110)            # ReadRequest
schema(&S_REQ[1], V, V, V, L, L, V, X, X, 0b11110)          # AddRequest
schema(&S_REQ[2], X, L, L, X, X, X, X, X, 0b110)            # AuthMessage
schema(&S_REQ[3], X, V, V, L, L, X, X, X, 0b11110)          # WriteLacRequest
schema(&S_REQ[4], X, V, X, X, X, X, X, X, 0b10)             # ReadLacRequest
schema(&S_REQ[5], X, V, X, X, X, X, X, X, 0)                # GetBookieInfoRequest
schema(&S_REQ[6], X, X, X, X, X, X, X, X, 0)                # StartTLSRequest
schema(&S_REQ[7], X, V, X, X, X, X, X, X, 0b10)             # ForceLedgerRequest
schema(&S_REQ[8], X, V, X, X, X, X, X, X, 0b10)             # GetListOfEntriesOfLedgerRequest
# responses
schema(&S_RESP[0], X, V, V, V, L, V, V, X, 0b1110)          # ReadResponse
schema(&S_RESP[1], X, V, V, V, X, X, X, X, 0b1110)          # AddResponse
schema(&S_RESP[2], X, L, L, X, X, X, X, X, 0b110)           # AuthMessage
schema(&S_RESP[3], X, V, V, X, X, X, X, X, 0b110)           # WriteLacResponse
schema(&S_RESP[4], X, V, V, L, L, X, X, X, 0b110)           # ReadLacResponse
schema(&S_RESP[5], X, V, V, V, X, X, X, X, 0b10)            # GetBookieInfoResponse
schema(&S_RESP[6], X, X, X, X, X, X, X, X, 0)               # StartTLSResponse
schema(&S_RESP[7], X, V, V, X, X, X, X, X, 0b110)           # ForceLedgerResponse
schema(&S_RESP[8], X, V, V, L, X, X, X, X, 0b110)           # GetListOfEntriesOfLedgerResponse


cdef inline int sub_of(uint64_t op) noexcept nogil:
    """The sub-message (0..8 for fields 100..108) an operation's request and response carry."""
    if op == 1: return 0
    if op == 2: return 1
    if op == 5: return 2
    if op == 6: return 3
    if op == 7: return 4
    if op == 8: return 5
    if op == 9: return 6
    if op == 10: return 7
    if op == 11: return 8
    return -1


cdef struct Top:
    Msg header
    int has_header
    uint64_t status
    int has_status
    Msg sub[NSUB]
    uint32_t subs              # bit k: sub-message 100 + k was present


cdef int parse_top(const uint8_t *p, const uint8_t *end, bint response, Top *t,
                   Err *err) noexcept nogil:
    """A Request or Response: the header and each sub-message parsed where they are (a
    repeated message field merges, as protobuf does). -1 on malformed bytes."""
    cdef uint64_t tag, val, number
    cdef int wt, k
    cdef const uint8_t *q
    cdef const Schema *table = S_REQ
    if response:
        table = S_RESP
    memset(t, 0, sizeof(Top))
    while p < end:
        q = get_varint(p, end, &tag)
        if q == NULL:
            err.what = "truncated or overlong tag"
            return -1
        p = q
        number = tag >> 3
        wt = <int>(tag & 7)
        if number == 0 or number > 0x1FFFFFFF:
            err.what = "field number out of range"
            return -1
        k = <int>(number - 100) if 100 <= number <= 108 else -1
        if (number == 1 or k >= 0) and wt != WT_LEN:
            err.what = "a message field with the wrong wire type"
            return -1
        if response and number == 2 and wt != WT_VARINT:
            err.what = "status with the wrong wire type"
            return -1
        if wt == WT_VARINT:
            q = get_varint(p, end, &val)
            if q == NULL:
                err.what = "truncated or overlong varint"
                return -1
            p = q
            if response and number == 2:
                t.status = val
                t.has_status = 1
        elif wt == WT_I64:
            if end - p < 8:
                err.what = "truncated fixed64"
                return -1
            p += 8
        elif wt == WT_I32:
            if end - p < 4:
                err.what = "truncated fixed32"
                return -1
            p += 4
        elif wt == WT_LEN:
            q = get_varint(p, end, &val)
            if q == NULL:
                err.what = "truncated length"
                return -1
            p = q
            if val > <uint64_t>(end - p):
                err.what = "length-delimited field longer than its message"
                return -1
            if number == 1:
                if parse_msg(p, p + <Py_ssize_t>val, &S_HEADER, &t.header, err) < 0:
                    return -1
                t.has_header = 1
            elif k >= 0:
                if parse_msg(p, p + <Py_ssize_t>val, &table[k], &t.sub[k], err) < 0:
                    return -1
                t.subs |= 1u << k
            p += <Py_ssize_t>val
        else:
            err.what = "unsupported wire type (group or reserved)"
            return -1
    if not t.has_header:
        err.what = "no header"
        return -1
    if (t.header.seen & S_HEADER.required) != S_HEADER.required:
        err.what = "a required header field is missing"
        return -1
    if response and not t.has_status:
        err.what = "no status"
        return -1
    return 0


# -- the Python view of a message ---------------------------------------------------------------

cdef inline object opt_i64(const Msg *m, int slot):
    return <int64_t>m.v[slot] if m.seen & (1u << slot) else None


cdef inline object opt_bytes(const Msg *m, int slot):
    if m.seen & (1u << slot):
        return PyBytes_FromStringAndSize(<const char *>m.b[slot], m.n[slot])
    return None


cdef class Response:
    """One v3 response; fields the bookie did not send are None. ``status`` is the one that
    counts: the top-level status unless it is EOK, then the sub-response's."""
    cdef readonly uint64_t txn_id
    cdef readonly int operation
    cdef readonly int64_t status
    cdef readonly int64_t top_status
    cdef readonly object ledger_id, entry_id, body, max_lac, lac_update_timestamp
    cdef readonly object lac_body, last_entry_body, total_disk_capacity, free_disk_space
    cdef readonly object auth_plugin, auth_payload, availability

    def __repr__(self):
        return (f"bkwire.Response({OPERATIONS.get(self.operation, self.operation)}, "
                f"txn={self.txn_id}, {STATUS_NAMES.get(self.status, self.status)}, "
                f"ledger={self.ledger_id}, entry={self.entry_id})")


cdef class Request:
    """One v3 request (what a bookie reads); fields the client did not send are None."""
    cdef readonly uint64_t txn_id
    cdef readonly int operation
    cdef readonly object priority, ledger_id, entry_id, flag, master_key, body
    cdef readonly object previous_lac, timeout_ms, write_flags, lac, requested
    cdef readonly object auth_plugin, auth_payload

    def __repr__(self):
        return (f"bkwire.Request({OPERATIONS.get(self.operation, self.operation)}, "
                f"txn={self.txn_id}, ledger={self.ledger_id}, entry={self.entry_id}, flag={self.flag})")


cdef object make_response(const Top *t, Err *err):
    cdef Response r = Response.__new__(Response)
    cdef int k
    cdef const Msg *m
    r.txn_id = t.header.v[3]
    r.operation = <int>t.header.v[2] if t.header.v[2] <= <uint64_t>I32_MAX else -1
    r.top_status = <int64_t>t.status
    r.status = r.top_status
    if t.header.v[1] != VERSION_THREE:
        err.what = "not a version 3 header"
        return None
    k = sub_of(t.header.v[2])
    if k < 0 or not (t.subs & (1u << k)):
        if k >= 0 and k != 6 and t.status == 0:
            err.what = "an EOK response without its operation's sub-response"
            return None
        return r
    m = &t.sub[k]
    if k == 2:                              # AuthMessage
        r.auth_plugin = opt_bytes(m, 1)
        r.auth_payload = opt_bytes(m, 2)
        return r
    if k == 6:
        return r
    if r.top_status == 0:
        r.status = <int64_t>m.v[1]
    if k == 5:                              # GetBookieInfoResponse
        r.total_disk_capacity = opt_i64(m, 2)
        r.free_disk_space = opt_i64(m, 3)
        return r
    r.ledger_id = opt_i64(m, 2)
    if k == 0:                              # ReadResponse
        r.entry_id = opt_i64(m, 3)
        r.body = opt_bytes(m, 4)
        r.max_lac = opt_i64(m, 5)
        r.lac_update_timestamp = opt_i64(m, 6)
    elif k == 1:                            # AddResponse
        r.entry_id = opt_i64(m, 3)
    elif k == 4:                            # ReadLacResponse
        r.lac_body = opt_bytes(m, 3)
        r.last_entry_body = opt_bytes(m, 4)
    elif k == 8:
        r.availability = opt_bytes(m, 3)
    return r


cdef object make_request(const Top *t, Err *err):
    cdef Request r = Request.__new__(Request)
    cdef int k
    cdef const Msg *m
    r.txn_id = t.header.v[3]
    r.operation = <int>t.header.v[2] if t.header.v[2] <= <uint64_t>I32_MAX else -1
    r.priority = opt_i64(&t.header, 4)
    if t.header.v[1] != VERSION_THREE:
        err.what = "not a version 3 header"
        return None
    k = sub_of(t.header.v[2])
    if k < 0:
        return r
    if not (t.subs & (1u << k)):
        if k != 6 and k != 5:               # StartTLS and GetBookieInfo may be empty
            err.what = "a request without its operation's sub-request"
            return None
        return r
    m = &t.sub[k]
    if k == 2:
        r.auth_plugin = opt_bytes(m, 1)
        r.auth_payload = opt_bytes(m, 2)
    elif k == 5:
        r.requested = opt_i64(m, 1)
    elif k != 6:
        r.ledger_id = opt_i64(m, 1)
        if k == 0:
            r.entry_id = opt_i64(m, 2)
            r.master_key = opt_bytes(m, 3)
            r.previous_lac = opt_i64(m, 4)
            r.timeout_ms = opt_i64(m, 5)
            r.flag = opt_i64(m, 0)
        elif k == 1:
            r.entry_id = opt_i64(m, 2)
            r.master_key = opt_bytes(m, 3)
            r.body = opt_bytes(m, 4)
            r.write_flags = opt_i64(m, 5)
            r.flag = opt_i64(m, 0)
        elif k == 3:
            r.lac = opt_i64(m, 2)
            r.master_key = opt_bytes(m, 3)
            r.body = opt_bytes(m, 4)
    return r


cdef tuple decode_frames(object buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_frame_bytes,
                         bint response):
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t size = view.shape[0]
    cdef Py_ssize_t n, start
    cdef const uint8_t *base
    cdef Top t
    cdef Err err
    cdef list out = []
    cdef object item
    if end < 0 or end > size:
        end = size
    if pos < 0 or pos > end:
        raise IllegalOpError(f"position {pos} outside the buffer of {end} bytes")
    if size == 0:
        return out, pos, None
    base = &view[0]
    err.what = NULL
    while end - pos >= 4:
        n = <Py_ssize_t>el_get32(base + pos)
        if n > max_frame_bytes or n > I32_MAX:
            return out, pos, EntryTooLargeError(
                f"v3 frame of {n} bytes exceeds max_frame_bytes={max_frame_bytes}")
        if end - pos - 4 < n:
            break                            # the rest of the frame has not arrived
        start = pos + 4
        if parse_top(base + start, base + start + n, response, &t, &err) < 0:
            return out, pos, CorruptedDataError(
                f"malformed v3 {'response' if response else 'request'} frame at byte {pos}: "
                f"{err.what.decode()}")
        item = make_response(&t, &err) if response else make_request(&t, &err)
        if item is None:
            return out, pos, CorruptedDataError(
                f"malformed v3 {'response' if response else 'request'} frame at byte {pos}: "
                f"{err.what.decode()}")
        PyList_Append(out, item)
        pos = start + n
    return out, pos, None


def decode_responses(buf, Py_ssize_t pos=0, Py_ssize_t end=-1,
                     Py_ssize_t max_frame_bytes=MAX_FRAME_BYTES + 4096):
    """Every whole frame of ``buf[pos:end]`` as a Response, in one pass.

    Returns ``(responses, pos, error)``: ``pos`` is where the first frame not decoded
    starts (an incomplete one waits for more bytes); ``error`` is None, or the
    CorruptedDataError / EntryTooLargeError of the frame at ``pos`` (the responses before
    it are good: deliver them, then close the connection)."""
    return decode_frames(buf, pos, end, max_frame_bytes, True)


def decode_requests(buf, Py_ssize_t pos=0, Py_ssize_t end=-1,
                    Py_ssize_t max_frame_bytes=MAX_FRAME_BYTES):
    """Every whole frame of ``buf[pos:end]`` as a Request: ``(requests, pos, error)`` as
    decode_responses returns them."""
    return decode_frames(buf, pos, end, max_frame_bytes, False)
