# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Apache BookKeeper's v3 wire protocol: protobuf messages in length-prefixed frames.

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

import hmac
import hashlib

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.list cimport PyList_Append

from embedlog._native.format cimport el_put64, el_get64, el_get32, el_crc32, el_crc32c, el_crc_init
from embedlog._native.format cimport DIGEST_CRC32, DIGEST_MAC, DIGEST_CRC32C, DIGEST_DUMMY

from embedlog.errors import CorruptedDataError, EntryTooLargeError, IllegalOpError

el_crc_init()

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
EOK, ENOLEDGER, ENOENTRY, EBADREQ = 0, 402, 403, 404
EIO, EUA, EBADVERSION, EFENCED, EREADONLY, ETOOMANYREQUESTS, EUNKNOWNLEDGERSTATE = (
    501, 502, 503, 504, 505, 506, 507)
STATUS_NAMES = {EOK: "EOK", ENOLEDGER: "ENOLEDGER", ENOENTRY: "ENOENTRY", EBADREQ: "EBADREQ",
                EIO: "EIO", EUA: "EUA", EBADVERSION: "EBADVERSION", EFENCED: "EFENCED",
                EREADONLY: "EREADONLY", ETOOMANYREQUESTS: "ETOOMANYREQUESTS",
                EUNKNOWNLEDGERSTATE: "EUNKNOWNLEDGERSTATE"}
LAST_ADD_CONFIRMED = -1                          # the entry id of a read of the last entry
MASTER_KEY_BYTES = 20
MAX_FRAME_BYTES = 5 * 1024 * 1024                # BookKeeper's nettyMaxFrameSizeBytes
V1_HEADER_BYTES = 32
LAC_HEADER_BYTES = 16

cdef Py_ssize_t C_MAX_FRAME = 5 * 1024 * 1024
cdef int64_t I32_MAX = 0x7FFFFFFF

# -- varints and fields ---------------------------------------------------------------------------

cdef enum:
    WT_VARINT = 0
    WT_I64 = 1
    WT_LEN = 2
    WT_I32 = 5
    SLOTS = 8            # field numbers 1..7 keep their number as slot; field 100 (flag) is slot 0
    NSUB = 9             # sub-messages 100..108
    VERSION_THREE_C = 3
    RECOVERY_ADD_C = 1


# vsize, put_varint and get_varint are in bkwire.pxd (shared with bkserve.pyx)


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
