# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""BookKeeper's v2 (binary) wire, the bookie's side (embedlog's client speaks v3 only):
requests decoded, responses encoded. v3 is bkwire.pyx's (the grammar and the decoder) and
bkencode.pyx's (the encoder, the bookie's add and read answers included).

v2 grammar (BookieProtocol.java, BookieProtoEncoding's PreV3 coders; all big-endian; a frame
is Netty's length-field frame, as for v3)::

    frame     := length:i32 (4 <= length <= max_frame_bytes) packet[length]
    packet    := header:i32 body
    header    := version:u8 (2 or 3 from current clients) opcode:u8 flags:u16
    ADDENTRY 1      masterKey[20] entry            # entry: BookKeeper's V1 entry, whose first
                                                   # 16 bytes are its ledger and entry id
    READENTRY 2     ledgerId:i64 entryId:i64 [masterKey[20] if flags & DO_FENCING]
    AUTH 3          AuthMessage (protobuf: 1 authPluginName string, 2 payload bytes)
    BATCH_READ 7    ledgerId:i64 entryId:i64 requestId:i64 maxCount:i32 maxSize:i64
                    [masterKey[20] if flags & DO_FENCING]
    flags           DO_FENCING 0x1, RECOVERY_ADD 0x2, HIGH_PRIORITY 0x4
    entryId -1      LAST_ADD_CONFIRMED: the last entry the bookie holds

    response  := length:i32 header:i32 (version opcode flags=0) rest
    ADDENTRY        errorCode:i32 ledgerId:i64 entryId:i64
    READENTRY       errorCode:i32 ledgerId:i64 entryId:i64 [entry, when errorCode is EOK]
    BATCH_READ      errorCode:i32 ledgerId:i64 entryId:i64 requestId:i64 (size:i32 entry)*
    AUTH            AuthMessage

Opcodes 4..6 (READ_LAC, WRITE_LAC, GET_BOOKIE_INFO) have no v2 form a bookie decodes: a
BookKeeper bookie closes the connection, as it does for any other opcode or a short packet;
decode_v2 reports those as an error for the same end. v2 errorCodes are embedlog's
v2 column of errors.STATUSES (EOK 0, ENOLEDGER 1, ENOENTRY 2, EBADREQ 100, EIO 101, EUA 102,
EBADVERSION 103, EFENCED 104, EREADONLY 105, ETOOMANYREQUESTS 106); v3's StatusCodes its
v3 column.

Bounds: each frame's length is checked against max_frame_bytes and against the bytes
present before anything of it is read; every fixed field against the packet's length; a
framed run (reader.pyx's ``entry_id:i64 size:u32 entry[size]`` records) against its buffer
before the output is sized from it.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t, int32_t, int64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.list cimport PyList_Append

from embedlog._native.format cimport el_put64, el_get64, el_get32
from embedlog._native.bkwire cimport vsize, put_varint, get_varint

from embedlog._native.wire_sizes cimport MASTER_KEY_BYTES as KEY_BYTES
from embedlog._native.wire_sizes import MASTER_KEY_BYTES, MAX_FRAME_BYTES
from embedlog.errors import CorruptedDataError, EntryTooLargeError, IllegalOpError

ADDENTRY, READENTRY, AUTH, READ_LAC, WRITE_LAC, GET_BOOKIE_INFO, BATCH_READ_ENTRY = 1, 2, 3, 4, 5, 6, 7
FLAG_DO_FENCING, FLAG_RECOVERY_ADD, FLAG_HIGH_PRIORITY = 0x1, 0x2, 0x4
V2_RESPONSE_HEAD_BYTES = 24

cdef int64_t I32_MAX = 0x7FFFFFFF


cdef inline void put32(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 24)
    p[1] = <uint8_t>(v >> 16)
    p[2] = <uint8_t>(v >> 8)
    p[3] = <uint8_t>v


# -- v2 requests -----------------------------------------------------------------------------

cdef object v2_error(Py_ssize_t at, str what):
    return CorruptedDataError(f"malformed v2 request frame at byte {at}: {what}")


def decode_v2(buf, Py_ssize_t pos=0, Py_ssize_t end=-1, Py_ssize_t max_frame_bytes=MAX_FRAME_BYTES):
    """Every whole v2 frame of ``buf[pos:end]``: ``(requests, pos, error)`` as
    bkwire.decode_requests returns them. A request is a tuple ``(opcode, version, flags,
    ledger_id, entry_id, master_key, rest)``: master_key is 20 bytes or None; rest is the
    entry (ADDENTRY), ``(request_id, max_count, max_size)`` (BATCH_READ_ENTRY), the
    AuthMessage bytes (AUTH), else None. Copies: the buffer may be reused at once."""
    cdef const uint8_t[::1] view = buf
    cdef Py_ssize_t size = view.shape[0]
    cdef Py_ssize_t n, start, need
    cdef const uint8_t *base
    cdef const uint8_t *p
    cdef uint32_t header
    cdef int version, op, flags
    cdef int64_t lid, eid
    cdef list out = []
    cdef object key, rest
    if end < 0 or end > size:
        end = size
    if pos < 0 or pos > end:
        raise IllegalOpError(f"position {pos} outside the buffer of {end} bytes")
    if size == 0:
        return out, pos, None
    base = &view[0]
    while end - pos >= 4:
        n = <Py_ssize_t>el_get32(base + pos)
        if n > max_frame_bytes or n > I32_MAX:
            return out, pos, EntryTooLargeError(
                f"v2 frame of {n} bytes exceeds max_frame_bytes={max_frame_bytes}")
        if n < 4:
            return out, pos, v2_error(pos, f"a packet of {n} bytes has no header")
        if end - pos - 4 < n:
            break
        start = pos + 4
        p = base + start
        header = el_get32(p)
        version = <int>(header >> 24)
        op = <int>((header >> 16) & 0xFF)
        flags = <int>(header & 0xFFFF)
        key = None
        rest = None
        lid = eid = -1
        if op == ADDENTRY:
            if n < 4 + KEY_BYTES + 16:
                return out, pos, v2_error(pos, f"an ADDENTRY packet of {n} bytes")
            key = PyBytes_FromStringAndSize(<const char *>p + 4, KEY_BYTES)
            lid = <int64_t>el_get64(p + 4 + KEY_BYTES)
            eid = <int64_t>el_get64(p + 4 + KEY_BYTES + 8)
            rest = PyBytes_FromStringAndSize(<const char *>p + 4 + KEY_BYTES,
                                             n - 4 - KEY_BYTES)
        elif op == READENTRY or op == BATCH_READ_ENTRY:
            need = 4 + 16 + (20 if op == BATCH_READ_ENTRY else 0)
            if n < need:
                return out, pos, v2_error(pos, f"a read packet of {n} bytes")
            lid = <int64_t>el_get64(p + 4)
            eid = <int64_t>el_get64(p + 12)
            if op == BATCH_READ_ENTRY:
                rest = (<int64_t>el_get64(p + 20), <int32_t>el_get32(p + 28),
                        <int64_t>el_get64(p + 32))
            if flags & FLAG_DO_FENCING and version >= 2:
                if n < need + KEY_BYTES:
                    return out, pos, v2_error(pos, "a fencing read without its master key")
                key = PyBytes_FromStringAndSize(<const char *>p + need, KEY_BYTES)
        elif op == AUTH:
            rest = PyBytes_FromStringAndSize(<const char *>p + 4, n - 4)
        else:
            return out, pos, v2_error(pos, f"opcode {op} is not one a bookie decodes in v2")
        PyList_Append(out, (op, version, flags, lid, eid, key, rest))
        pos = start + n
    return out, pos, None



# -- v2 responses ----------------------------------------------------------------------------

cdef inline void v2_head(uint8_t *w, uint32_t frame_len, int version, int op, int rc,
                         int64_t lid, int64_t eid) noexcept nogil:
    put32(w, frame_len)
    put32(w + 4, (<uint32_t>(version & 0xFF) << 24) | (<uint32_t>(op & 0xFF) << 16))
    put32(w + 8, <uint32_t>rc)
    el_put64(w + 12, <uint64_t>lid)
    el_put64(w + 20, <uint64_t>eid)


def v2_response(int version, int op, int rc, int64_t ledger_id, int64_t entry_id,
                Py_ssize_t body_bytes=0):
    """The 28 bytes of a v2 ADDENTRY or READENTRY response head; a READENTRY's entry of
    ``body_bytes`` follows it (the frame's length counts it)."""
    cdef bytes out
    if body_bytes < 0 or body_bytes > MAX_FRAME_BYTES:
        raise EntryTooLargeError(f"a v2 response body of {body_bytes} bytes")
    out = PyBytes_FromStringAndSize(NULL, 28)
    v2_head(<uint8_t *>PyBytes_AS_STRING(out), <uint32_t>(V2_RESPONSE_HEAD_BYTES + body_bytes),
            version, op, rc, ledger_id, entry_id)
    return out


def v2_add_responses(int version, int rc, int64_t ledger_id, entry_ids):
    """The v2 ADDENTRY responses of a run of adds of one ledger with one errorCode, joined
    in request order: a group commit's answers to one connection go out in one write."""
    cdef Py_ssize_t n = len(entry_ids), i
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 28 * n)
    cdef uint8_t *w = <uint8_t *>PyBytes_AS_STRING(out)
    for i in range(n):
        v2_head(w + 28 * i, V2_RESPONSE_HEAD_BYTES, version, ADDENTRY, rc, ledger_id,
                <int64_t>entry_ids[i])
    return out


def v2_batch_response(int version, int rc, int64_t ledger_id, int64_t entry_id,
                      int64_t request_id, framed=None, Py_ssize_t count=0):
    """A v2 BATCH_READ_ENTRY response: its head and ``count`` entries of ``framed``
    (reader.pyx's ``entry_id:i64 size:u32 entry`` records) as ``size:i32 entry``."""
    cdef const uint8_t[::1] f
    cdef Py_ssize_t flen = 0, pos = 0, i, esize, total
    cdef const uint8_t *fp = NULL
    cdef bytes out
    cdef uint8_t *w
    cdef uint8_t *wend
    if count < 0:
        raise IllegalOpError(f"a batch of {count} entries")
    if count:
        f = framed
        flen = f.shape[0]
        if flen:
            fp = &f[0]
    # the records are checked against the buffer before the output is sized from them
    total = 0
    for i in range(count):
        if flen - pos < 12:
            raise CorruptedDataError("framed entries truncated in a record head")
        esize = <Py_ssize_t>el_get32(fp + pos + 8)
        if esize > flen - pos - 12:
            raise CorruptedDataError("framed entries truncated in an entry")
        total += 4 + esize
        pos += 12 + esize
    if total > MAX_FRAME_BYTES:
        raise EntryTooLargeError(f"a v2 batch response of {total} bytes")
    out = PyBytes_FromStringAndSize(NULL, 36 + total)
    w = <uint8_t *>PyBytes_AS_STRING(out)
    wend = w + 36 + total
    v2_head(w, <uint32_t>(V2_RESPONSE_HEAD_BYTES + 8 + total), version, BATCH_READ_ENTRY, rc,
            ledger_id, entry_id)
    el_put64(w + 28, <uint64_t>request_id)
    w += 36
    pos = 0
    for i in range(count):
        esize = <Py_ssize_t>el_get32(fp + pos + 8)
        if 4 + esize > wend - w:           # cannot happen: sized from the same records
            raise CorruptedDataError("framed entries changed while they were encoded")
        put32(w, <uint32_t>esize)
        memcpy(w + 4, fp + pos + 12, esize)
        w += 4 + esize
        pos += 12 + esize
    return out


def v2_auth_response(int version, bytes plugin_name, bytes payload=b""):
    """A v2 AUTH response: the header and an AuthMessage naming ``plugin_name``."""
    cdef Py_ssize_t a = len(plugin_name), b = len(payload), msg
    cdef bytes out
    cdef uint8_t *w
    if a > 1 << 16 or b > 1 << 16:
        raise IllegalOpError("an AuthMessage field over 64 KiB")
    msg = 1 + vsize(<uint64_t>a) + a + 1 + vsize(<uint64_t>b) + b
    out = PyBytes_FromStringAndSize(NULL, 8 + msg)
    w = <uint8_t *>PyBytes_AS_STRING(out)
    put32(w, <uint32_t>(4 + msg))
    put32(w + 4, (<uint32_t>(version & 0xFF) << 24) | (<uint32_t>AUTH << 16))
    w += 8
    w[0] = 0x0A
    w = put_varint(w + 1, <uint64_t>a)
    if a:
        memcpy(w, <const char *>plugin_name, a)
    w += a
    w[0] = 0x12
    w = put_varint(w + 1, <uint64_t>b)
    if b:
        memcpy(w, <const char *>payload, b)
    return out


def auth_plugin_name(message) -> bytes:
    """authPluginName of an AuthMessage (protobuf), or None when it does not parse."""
    cdef const uint8_t[::1] v = message
    cdef const uint8_t *p
    cdef const uint8_t *end
    cdef const uint8_t *q
    cdef uint64_t tag, val
    cdef object name = None
    if v.shape[0] == 0:
        return None
    p = &v[0]
    end = p + v.shape[0]
    while p < end:
        q = get_varint(p, end, &tag)
        if q == NULL:
            return None
        p = q
        if (tag & 7) == 0:
            q = get_varint(p, end, &val)
            if q == NULL:
                return None
            p = q
        elif (tag & 7) == 2:
            q = get_varint(p, end, &val)
            if q == NULL or val > <uint64_t>(end - q):
                return None
            if (tag >> 3) == 1:
                name = PyBytes_FromStringAndSize(<const char *>q, <Py_ssize_t>val)
            p = q + <Py_ssize_t>val
        elif (tag & 7) == 1 and end - p >= 8:
            p += 8
        elif (tag & 7) == 5 and end - p >= 4:
            p += 4
        else:
            return None
    return name
