"""BookKeeper's v3 wire codec (embedlog/_native/bkwire.pyx) without a bookie: round trips,
protobuf's own runtime as the oracle of every field, and malformed frames.

The oracle builds BookkeeperProtocol.proto's messages with google.protobuf's descriptor
API (the numbers and types written below from the .proto of 4.16/4.17; no protoc). The
live half, against Java bookies, is tests/interop/test_bookkeeper_wire.py.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import hmac
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from embedlog._native import bkwire as W
from embedlog._native import bkencode as E
from embedlog._native import format as F
from embedlog.errors import CorruptedDataError, EmbedlogError, EntryTooLargeError, IllegalOpError
from embedlog.net import protocol as P
from support.servers import skip_unless_ci

KEY = F.master_key(b"pw")
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
U64 = st.integers(0, (1 << 64) - 1)
NONNEG = st.integers(0, (1 << 63) - 1)
BLOB = st.binary(max_size=300)
STATUS = st.sampled_from(sorted(W.STATUS_NAMES))

# -- the oracle: BookkeeperProtocol.proto through google.protobuf --------------------------------

_ENUMS = {
    "ProtocolVersion": {"VERSION_ONE": 1, "VERSION_TWO": 2, "VERSION_THREE": 3},
    "StatusCode": {n: v for v, n in W.STATUS_NAMES.items()},
    "OperationType": {"READ_ENTRY": 1, "ADD_ENTRY": 2, "RANGE_READ_ENTRY": 3, "RANGE_ADD_ENTRY": 4,
                      "AUTH": 5, "WRITE_LAC": 6, "READ_LAC": 7, "GET_BOOKIE_INFO": 8,
                      "START_TLS": 9, "FORCE_LEDGER": 10, "GET_LIST_OF_ENTRIES_OF_LEDGER": 11},
    "ReadFlag": {"FENCE_LEDGER": 1, "ENTRY_PIGGYBACK": 2},
    "AddFlag": {"RECOVERY_ADD": 1},
}
R, O = "required", "optional"
_MESSAGES = {
    "BKPacketHeader": [("version", 1, R, "ProtocolVersion"), ("operation", 2, R, "OperationType"),
                       ("txnId", 3, R, "uint64"), ("priority", 4, O, "uint32")],
    "ReadRequest": [("flag", 100, O, "ReadFlag"), ("ledgerId", 1, R, "int64"), ("entryId", 2, R, "int64"),
                    ("masterKey", 3, O, "bytes"), ("previousLAC", 4, O, "int64"), ("timeOut", 5, O, "int64")],
    "AddRequest": [("flag", 100, O, "AddFlag"), ("ledgerId", 1, R, "int64"), ("entryId", 2, R, "int64"),
                   ("masterKey", 3, R, "bytes"), ("body", 4, R, "bytes"), ("writeFlags", 5, O, "int32")],
    "AuthMessage": [("authPluginName", 1, R, "string"), ("payload", 2, R, "bytes")],
    "WriteLacRequest": [("ledgerId", 1, R, "int64"), ("lac", 2, R, "int64"), ("masterKey", 3, R, "bytes"),
                        ("body", 4, R, "bytes")],
    "ReadLacRequest": [("ledgerId", 1, R, "int64")],
    "GetBookieInfoRequest": [("requested", 1, O, "int64")],
    "StartTLSRequest": [],
    "ForceLedgerRequest": [("ledgerId", 1, R, "int64")],
    "Request": [("header", 1, R, ".BKPacketHeader"), ("readRequest", 100, O, ".ReadRequest"),
                ("addRequest", 101, O, ".AddRequest"), ("authRequest", 102, O, ".AuthMessage"),
                ("writeLacRequest", 103, O, ".WriteLacRequest"), ("readLacRequest", 104, O, ".ReadLacRequest"),
                ("getBookieInfoRequest", 105, O, ".GetBookieInfoRequest"),
                ("startTLSRequest", 106, O, ".StartTLSRequest"),
                ("forceLedgerRequest", 107, O, ".ForceLedgerRequest")],
    "ReadResponse": [("status", 1, R, "StatusCode"), ("ledgerId", 2, R, "int64"), ("entryId", 3, R, "int64"),
                     ("body", 4, O, "bytes"), ("maxLAC", 5, O, "int64"), ("lacUpdateTimestamp", 6, O, "int64")],
    "AddResponse": [("status", 1, R, "StatusCode"), ("ledgerId", 2, R, "int64"), ("entryId", 3, R, "int64")],
    "WriteLacResponse": [("status", 1, R, "StatusCode"), ("ledgerId", 2, R, "int64")],
    "ReadLacResponse": [("status", 1, R, "StatusCode"), ("ledgerId", 2, R, "int64"),
                        ("lacBody", 3, O, "bytes"), ("lastEntryBody", 4, O, "bytes")],
    "GetBookieInfoResponse": [("status", 1, R, "StatusCode"), ("totalDiskCapacity", 2, O, "int64"),
                              ("freeDiskSpace", 3, O, "int64")],
    "ForceLedgerResponse": [("status", 1, R, "StatusCode"), ("ledgerId", 2, R, "int64")],
    "Response": [("header", 1, R, ".BKPacketHeader"), ("status", 2, R, "StatusCode"),
                 ("readResponse", 100, O, ".ReadResponse"), ("addResponse", 101, O, ".AddResponse"),
                 ("authResponse", 102, O, ".AuthMessage"), ("writeLacResponse", 103, O, ".WriteLacResponse"),
                 ("readLacResponse", 104, O, ".ReadLacResponse"),
                 ("getBookieInfoResponse", 105, O, ".GetBookieInfoResponse"),
                 ("forceLedgerResponse", 107, O, ".ForceLedgerResponse")],
}


@pytest.fixture(scope="module")
def pb():
    """The messages as google.protobuf classes, by name."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        skip_unless_ci("google.protobuf (the etcd extra brings it) is the oracle of these tests")
    T = descriptor_pb2.FieldDescriptorProto
    scalar = {"int64": T.TYPE_INT64, "uint64": T.TYPE_UINT64, "uint32": T.TYPE_UINT32,
              "int32": T.TYPE_INT32, "bytes": T.TYPE_BYTES, "string": T.TYPE_STRING}
    fdp = descriptor_pb2.FileDescriptorProto(name="bk_oracle.proto", syntax="proto2")
    for name, values in _ENUMS.items():
        e = fdp.enum_type.add(name=name)
        for vname, number in values.items():
            e.value.add(name=f"{name}_{vname}", number=number)
    for name, fields in _MESSAGES.items():
        m = fdp.message_type.add(name=name)
        for fname, number, label, kind in fields:
            f = m.field.add(name=fname, number=number,
                            label=T.LABEL_REQUIRED if label == R else T.LABEL_OPTIONAL)
            if kind in scalar:
                f.type = scalar[kind]
            elif kind.startswith("."):
                f.type, f.type_name = T.TYPE_MESSAGE, kind
            else:
                f.type, f.type_name = T.TYPE_ENUM, "." + kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
            for name in _MESSAGES}


def frame(message: bytes) -> bytes:
    return struct.pack(">i", len(message)) + message


def one_response(data: bytes):
    got, pos, err = W.decode_responses(data)
    assert err is None and pos == len(data) and len(got) == 1, (got, pos, err)
    return got[0]


def one_request(data: bytes):
    got, pos, err = W.decode_requests(data)
    assert err is None and pos == len(data) and len(got) == 1, (got, pos, err)
    return got[0]


# -- requests: ours parsed by protobuf, protobuf's parsed by ours ---------------------------------

REQ_CASES = {
    W.READ_ENTRY: ("readRequest", st.fixed_dictionaries(
        {"ledger_id": NONNEG, "entry_id": I64},
        optional={"master_key": st.just(KEY), "previous_lac": I64, "timeout_ms": I64,
                  "flag": st.sampled_from([1, 2])})),
    W.ADD_ENTRY: ("addRequest", st.fixed_dictionaries(
        {"ledger_id": NONNEG, "entry_id": I64, "master_key": st.just(KEY), "body": BLOB},
        optional={"flag": st.just(1), "write_flags": st.integers(-(1 << 31), (1 << 31) - 1)})),
    W.WRITE_LAC: ("writeLacRequest", st.fixed_dictionaries(
        {"ledger_id": NONNEG, "lac": I64, "master_key": st.just(KEY), "body": BLOB})),
    W.READ_LAC: ("readLacRequest", st.fixed_dictionaries({"ledger_id": NONNEG})),
    W.GET_BOOKIE_INFO: ("getBookieInfoRequest", st.fixed_dictionaries({}, optional={"requested": I64})),
    W.FORCE_LEDGER: ("forceLedgerRequest", st.fixed_dictionaries({"ledger_id": NONNEG})),
}
# our names -> the .proto's
PROTO_NAMES = {"ledger_id": "ledgerId", "entry_id": "entryId", "master_key": "masterKey",
               "previous_lac": "previousLAC", "timeout_ms": "timeOut", "write_flags": "writeFlags",
               "max_lac": "maxLAC", "lac_update_timestamp": "lacUpdateTimestamp",
               "lac_body": "lacBody", "last_entry_body": "lastEntryBody",
               "total_disk_capacity": "totalDiskCapacity", "free_disk_space": "freeDiskSpace"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), txn=U64, op=st.sampled_from(sorted(REQ_CASES)))
def test_requests_agree_with_protobuf(pb, data, txn, op):
    sub, fields_st = REQ_CASES[op]
    fields = data.draw(fields_st)
    ours = E.encode_request(txn, op, **fields)
    theirs = pb["Request"].FromString(ours[4:])          # protobuf checks required fields too
    assert struct.unpack(">i", ours[:4])[0] == len(ours) - 4
    assert (theirs.header.version, theirs.header.operation, theirs.header.txnId) == (3, op, txn)
    msg = getattr(theirs, sub)
    for name, value in fields.items():
        assert getattr(msg, PROTO_NAMES.get(name, name)) == value, name
    # and back: protobuf's serialization (its own field order) decodes to the same fields
    req = one_request(frame(theirs.SerializeToString()))
    assert (req.txn_id, req.operation) == (txn, op)
    for name, value in fields.items():
        assert getattr(req, name) == value, name


RESP_CASES = {
    W.READ_ENTRY: ("readResponse", st.fixed_dictionaries(
        {"ledger_id": I64, "entry_id": I64},
        optional={"body": BLOB, "max_lac": I64, "lac_update_timestamp": I64})),
    W.ADD_ENTRY: ("addResponse", st.fixed_dictionaries({"ledger_id": I64, "entry_id": I64})),
    W.WRITE_LAC: ("writeLacResponse", st.fixed_dictionaries({"ledger_id": I64})),
    W.READ_LAC: ("readLacResponse", st.fixed_dictionaries(
        {"ledger_id": I64}, optional={"lac_body": BLOB, "last_entry_body": BLOB})),
    W.GET_BOOKIE_INFO: ("getBookieInfoResponse", st.fixed_dictionaries(
        {}, optional={"total_disk_capacity": I64, "free_disk_space": I64})),
    W.FORCE_LEDGER: ("forceLedgerResponse", st.fixed_dictionaries({"ledger_id": I64})),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), txn=U64, op=st.sampled_from(sorted(RESP_CASES)), top=STATUS, inner=STATUS)
def test_responses_agree_with_protobuf(pb, data, txn, op, top, inner):
    sub, fields_st = RESP_CASES[op]
    fields = data.draw(fields_st)
    theirs = pb["Response"](status=top)
    theirs.header.version, theirs.header.operation, theirs.header.txnId = 3, op, txn
    msg = getattr(theirs, sub)
    msg.status = inner
    for name, value in fields.items():
        setattr(msg, PROTO_NAMES.get(name, name), value)
    r = one_response(frame(theirs.SerializeToString()))
    assert (r.txn_id, r.operation, r.top_status) == (txn, op, top)
    assert r.status == (top if top != W.EOK else inner)        # BookKeeper's client's rule
    for name, value in fields.items():
        assert getattr(r, name) == value, name
    # ours, parsed by protobuf
    ours = E.encode_response(txn, op, top, sub_status=inner, **fields)
    back = pb["Response"].FromString(ours[4:])
    assert back == theirs


def test_many_frames_in_one_buffer_and_every_cut(pb):
    """One pass over a buffer of many frames; a cut anywhere leaves the incomplete frame
    for the next read and is no error."""
    frames = [E.encode_response(i, W.ADD_ENTRY, W.EOK, ledger_id=7, entry_id=i) for i in range(20)]
    frames.append(E.encode_response(99, W.READ_ENTRY, W.EOK, ledger_id=7, entry_id=3,
                                    body=b"x" * 1000, max_lac=2))
    stream = b"".join(frames)
    got, pos, err = W.decode_responses(stream)
    assert err is None and pos == len(stream) and [r.txn_id for r in got] == list(range(20)) + [99]
    ends = [sum(map(len, frames[:k])) for k in range(len(frames) + 1)]
    for cut in range(len(stream)):
        got, pos, err = W.decode_responses(stream, 0, cut)
        assert err is None
        assert pos == max(e for e in ends if e <= cut) and len(got) == ends.index(pos)
    # from an offset, as a connection's buffer is consumed
    got, pos, err = W.decode_responses(bytearray(stream), ends[5], ends[9])
    assert [r.txn_id for r in got] == [5, 6, 7, 8] and pos == ends[9]


def test_unknown_fields_any_order_and_repeats(pb):
    """What protobuf allows: fields in any order, unknown fields of every wire type skipped,
    a repeated scalar's last value kept, a repeated message merged."""
    def v(n):
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                return out

    def fld(number, wt, payload):
        return v(number << 3 | wt) + payload

    def ln(number, data):
        return fld(number, 2, v(len(data)) + data)

    header = ln(1, fld(3, 0, v(42)) + fld(2, 0, v(W.ADD_ENTRY)) + fld(1, 0, v(3)) + fld(9, 5, b"\0" * 4))
    add_a = fld(3, 0, v(5)) + fld(1, 0, v(0)) + fld(2, 0, v(9)) + fld(77, 1, b"\1" * 8)
    add_b = fld(3, 0, v(6)) + ln(50, b"unknown")
    msg = ln(101, add_a) + fld(2, 0, v(0)) + fld(3000, 0, v(1 << 62)) + header + ln(101, add_b)
    r = one_response(frame(msg))
    assert (r.txn_id, r.operation, r.status, r.ledger_id, r.entry_id) == (42, W.ADD_ENTRY, 0, 9, 6)
    theirs = pb["Response"].FromString(msg)
    assert (theirs.addResponse.entryId, theirs.addResponse.ledgerId) == (6, 9)


def bad(data: bytes, what: str = "", error=CorruptedDataError):
    got, pos, err = W.decode_responses(data)
    assert got == [] and pos == 0 and isinstance(err, error), (got, pos, err)
    assert what in str(err), err
    return err


def test_malformed_response_frames():
    ok = E.encode_response(1, W.ADD_ENTRY, W.EOK, ledger_id=1, entry_id=2)
    body = ok[4:]
    # the frame's length against max_frame_bytes before anything is read
    bad(struct.pack(">I", W.MAX_FRAME_BYTES + 4097) + body, "exceeds", EntryTooLargeError)
    bad(b"\xff\xff\xff\xff" + body, "exceeds", EntryTooLargeError)
    got, pos, err = W.decode_responses(ok, max_frame_bytes=len(body) - 1)
    assert isinstance(err, EntryTooLargeError)
    # an empty message, no header, no status
    bad(frame(b""), "no header")
    bad(frame(body.replace(b"\x10\x00", b"", 1)), "no status")
    # wrong wire types: the header as a varint, the status as bytes, a known varint as bytes
    bad(frame(b"\x08\x01" + body), "wrong wire type")
    bad(frame(body + b"\x12\x01\x00"), "wrong wire type")
    sub = E.encode_response(1, W.ADD_ENTRY, W.EOK, ledger_id=1, entry_id=2)[4:]
    i = sub.index(b"\xaa\x06")                # addResponse: field 101, length-delimited
    n = sub[i + 2]
    inner = sub[i + 3:i + 3 + n].replace(b"\x10\x01", b"\x12\x01\x01", 1)   # ledgerId as bytes
    bad(frame(sub[:i] + b"\xaa\x06" + bytes([len(inner)]) + inner), "wrong wire type")
    # a required field missing inside the sub-response
    inner = sub[i + 3:i + 3 + n].replace(b"\x18\x02", b"", 1)               # no entryId
    bad(frame(sub[:i] + b"\xaa\x06" + bytes([len(inner)]) + inner), "required")
    # an EOK response without its sub-response
    bad(frame(sub[:i]), "sub-response")
    # lengths past their message (the outer frame, then a nested message's parent)
    bad(frame(body + b"\x22\x10abc"), "longer than its message")
    hdr_len = body[1]
    bad(frame(b"\x0a" + bytes([hdr_len + 5]) + body[2:]), "longer than its message")
    # varints: overlong (11 bytes), a 10th byte over 1, truncated
    bad(frame(body + b"\x18" + b"\x80" * 10 + b"\x00"), "varint")
    bad(frame(body + b"\x18" + b"\xff" * 9 + b"\x02"), "varint")
    bad(frame(body + b"\x18\x80"), "varint")
    # groups, reserved wire types, field number 0, a truncated fixed64
    bad(frame(body + b"\x1b"), "wire type")
    bad(frame(body + b"\x1e"), "wire type")
    bad(frame(body + b"\x00\x00"), "field number")
    bad(frame(body + b"\x19\x01"), "fixed64")
    # another protocol version
    bad(frame(body.replace(b"\x08\x03", b"\x08\x02", 1)), "version 3")
    # the good frames before a bad one are delivered, the error is the bad one's
    got, pos, err = W.decode_responses(ok + ok + frame(b"\x00"))
    assert len(got) == 2 and pos == 2 * len(ok) and isinstance(err, CorruptedDataError)


def test_malformed_request_frames():
    ok = E.encode_request(1, W.ADD_ENTRY, ledger_id=1, entry_id=2, master_key=KEY, body=b"e")
    got, pos, err = W.decode_requests(ok[:-1])
    assert got == [] and pos == 0 and err is None                  # incomplete: wait
    no_body = E.encode_request(1, W.ADD_ENTRY, ledger_id=1, entry_id=2, master_key=KEY)
    got, pos, err = W.decode_requests(no_body)
    assert isinstance(err, CorruptedDataError) and "required" in str(err)   # no body
    got, pos, err = W.decode_requests(frame(b"\x0a\x02\x08\x03"))
    assert isinstance(err, CorruptedDataError)                     # no operation, no txnId
    got, pos, err = W.decode_requests(frame(E.encode_request(1, W.READ_LAC, ledger_id=1)[4:-4]))
    assert isinstance(err, CorruptedDataError)                     # READ_LAC without its request


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=40))
def test_any_bytes_give_responses_or_embedlogs_errors(prefix, tail):
    for data in (prefix, frame(prefix), frame(prefix) + tail,
                 E.encode_response(1, W.READ_ENTRY, W.EOK, ledger_id=1, entry_id=1, body=prefix) + tail):
        for decode in (W.decode_responses, W.decode_requests):
            got, pos, err = decode(data)
            assert 0 <= pos <= len(data)
            assert err is None or isinstance(err, EmbedlogError)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=120), st.integers(0, 119), st.integers(0, 255))
def test_flipped_bytes_of_real_frames_never_crash(payload, where, value):
    frames = [E.encode_response(5, W.READ_ENTRY, W.EOK, ledger_id=3, entry_id=4, body=payload, max_lac=3),
              E.encode_response(6, W.READ_LAC, W.EOK, ledger_id=3, lac_body=payload, last_entry_body=payload),
              E.encode_request(7, W.ADD_ENTRY, ledger_id=3, entry_id=4, master_key=KEY, body=payload)]
    for f in frames:
        b = bytearray(f)
        b[where % len(b)] = value
        for decode in (W.decode_responses, W.decode_requests):
            got, pos, err = decode(bytes(b))
            assert err is None or isinstance(err, EmbedlogError)


# -- the hot paths: an embedlog ADD body as pipelined AddRequests, a run of reads ------------------

def add_body(entries) -> bytes:
    return struct.pack(">I", len(entries)) + b"".join(struct.pack(">I", len(e)) + e for e in entries)


@pytest.mark.parametrize("recovery", [False, True])
def test_encode_adds_is_one_add_request_per_entry(pb, recovery):
    entries = [F.encode_entry(0, 77, 10 + i, 9 + i, 5 * (i + 1), F.digest_code("crc32"), b"p" * i)
               for i in range(5)]
    data, count, first = E.encode_adds(1000, 77, KEY, add_body(entries), recovery)
    assert (count, first) == (5, 10)
    got, pos, err = W.decode_requests(data)
    assert err is None and pos == len(data) and len(got) == 5
    for i, req in enumerate(got):
        assert (req.txn_id, req.operation, req.ledger_id, req.entry_id) == (1000 + i, W.ADD_ENTRY, 77, 10 + i)
        assert req.master_key == KEY and req.body == entries[i]
        assert req.flag == (W.RECOVERY_ADD if recovery else None)
    # protobuf reads the same thing from each frame
    pos = 0
    for i in range(5):
        (n,) = struct.unpack_from(">i", data, pos)
        theirs = pb["Request"].FromString(data[pos + 4:pos + 4 + n])
        assert theirs.addRequest.body == entries[i] and theirs.addRequest.entryId == 10 + i
        pos += 4 + n


def test_encode_adds_refuses_what_bookkeeper_cannot_take():
    e = F.encode_entry(0, 77, 0, -1, 1, F.digest_code("crc32c"), b"x")
    with pytest.raises(IllegalOpError, match="V2"):
        E.encode_adds(1, 77, KEY, add_body([F.encode_entry(5, 77, 0, -1, 1, 3, b"x")]))
    with pytest.raises(IllegalOpError, match="ledger 77 in an add to ledger 78"):
        E.encode_adds(1, 78, KEY, add_body([e]))
    with pytest.raises(IllegalOpError, match="shorter than a V1 header"):
        E.encode_adds(1, 77, KEY, add_body([e[:31]]))
    with pytest.raises(IllegalOpError, match="master key"):
        E.encode_adds(1, 77, KEY[:19], add_body([e]))
    with pytest.raises(IllegalOpError, match="without entries"):
        E.encode_adds(1, 77, KEY, add_body([]))
    for cut in (2, 6, len(add_body([e])) - 1):
        with pytest.raises(CorruptedDataError):
            E.encode_adds(1, 77, KEY, add_body([e])[:cut])
    with pytest.raises(CorruptedDataError, match="trailing"):
        E.encode_adds(1, 77, KEY, add_body([e]) + b"\0")
    with pytest.raises(CorruptedDataError, match="cannot hold"):
        E.encode_adds(1, 77, KEY, struct.pack(">I", 0xFFFFFFFF) + b"\0" * 8)
    big = F.encode_entry(0, 77, 0, -1, 1, F.digest_code("dummy"), b"x" * W.MAX_FRAME_BYTES)
    with pytest.raises(EntryTooLargeError, match="nettyMaxFrameSizeBytes"):
        E.encode_adds(1, 77, KEY, add_body([big]))
    # the largest entry that fits one frame goes
    fits = F.encode_entry(0, 77, 0, -1, 1, F.digest_code("dummy"), b"x" * (W.MAX_FRAME_BYTES - 200))
    data, count, _ = E.encode_adds(1, 77, KEY, add_body([fits]))
    assert count == 1 and len(data) <= W.MAX_FRAME_BYTES


def test_encode_reads():
    data = E.encode_reads(50, 9, 100, 3, W.FENCE_LEDGER, KEY)
    got, pos, err = W.decode_requests(data)
    assert err is None and [(r.txn_id, r.entry_id, r.flag, r.master_key) for r in got] == [
        (50, 100, 1, KEY), (51, 101, 1, KEY), (52, 102, 1, KEY)]
    with pytest.raises(IllegalOpError, match="master key"):
        E.encode_reads(1, 9, 0, 1, W.FENCE_LEDGER)
    with pytest.raises(IllegalOpError):
        E.encode_reads(1, 9, 0, 0)
    with pytest.raises(IllegalOpError, match="no lac"):
        E.encode_request(1, W.READ_ENTRY, ledger_id=1, entry_id=1, lac=3)


# -- WRITE_LAC's digest-protected body ----------------------------------------------------------

def test_lac_body_digests_are_bookkeepers():
    """DigestManager.computeDigestAndPackageForSendingLac: ledgerId, lac, then CRC32 as a
    big-endian long, CRC32C as an int, HMAC-SHA1 keyed with SHA1("mac" + password), nothing."""
    import google_crc32c
    head = struct.pack(">qq", 123, 45)
    assert E.lac_body(123, 45, F.digest_code("crc32")) == head + struct.pack(">Q", zlib.crc32(head))
    assert E.lac_body(123, 45, F.digest_code("crc32c")) == head + struct.pack(
        ">I", google_crc32c.value(head))
    mac = F.mac_key(b"pw")
    assert E.lac_body(123, 45, F.digest_code("mac"), mac) == head + hmac.new(
        hashlib.sha1(b"mac" + b"pw").digest(), head, hashlib.sha1).digest()
    assert E.lac_body(123, 45, F.digest_code("dummy")) == head
    assert E.lac_of_body(E.lac_body(123, 45, 1), 123) == 45
    with pytest.raises(CorruptedDataError):
        E.lac_of_body(head, 124)
    with pytest.raises(CorruptedDataError):
        E.lac_of_body(head[:15], 123)
    with pytest.raises(IllegalOpError):
        E.lac_body(1, 1, F.digest_code("mac"))


def test_entry_ids():
    e = F.encode_entry(0, 5, 7, 6, 10, 1, b"x")
    assert E.entry_ids(e, 5) == (7, 6)
    with pytest.raises(CorruptedDataError):
        E.entry_ids(e, 4)
    with pytest.raises(CorruptedDataError):
        E.entry_ids(e[:31], 5)


def test_protocol_constants_match_embedlogs():
    """The statuses the connection maps cover every v3 status, onto embedlog's codes."""
    from embedlog.net.bookkeeper import STATUS_TO_WIRE
    assert set(STATUS_TO_WIRE) == set(W.STATUS_NAMES)
    assert set(STATUS_TO_WIRE.values()) <= {P.EOK, P.ENOLEDGER, P.ENOENTRY, P.EBADREQ, P.EIO, P.EUA,
                                            P.EBADVERSION, P.EFENCED, P.EREADONLY, P.ETOOMANYREQUESTS}


# -- the connection: refusals, and a hostile peer -------------------------------------------------

def test_what_bookkeeper_cannot_express_is_refused_before_anything_is_sent():
    """Nothing listens at the address: a refusal that came from trying to send would be
    BookieUnavailableError, not IllegalOpError."""
    import ssl
    from embedlog.net.bookkeeper import BookKeeperConnection
    from embedlog.net.transport import BookieUnavailableError
    from support.servers import free_port
    address = f"127.0.0.1:{free_port()}"
    e = F.encode_entry(0, 5, 0, -1, 1, F.digest_code("crc32c"), b"x")
    refused = [
        ("128-bit", lambda rid: P.add_request(rid, 7, 5, KEY, [F.encode_entry(7, 5, 0, -1, 1, 3, b"x")])),
        ("128-bit", lambda rid: P.read_request(rid, 0, 1 << 63, 0)),
        ("terms", lambda rid: P.add_request(rid, 0, 5, KEY, [e], term=3)),
        ("add flags", lambda rid: P.add_request(rid, 0, 5, KEY, [e], flags=P.FLAG_TRUNCATE)),
        ("read flags", lambda rid: P.read_request(rid, 0, 5, 0, flags=P.FLAG_RECOVERY_READ, master_key=KEY)),
        ("LAC-read flags", lambda rid: P.read_lac_request(rid, 0, 5, flags=P.FLAG_RECOVERY_READ, master_key=KEY)),
        ("trim", lambda rid: P.trim_request(rid, 0, 5, KEY, 1)),
        ("auth", lambda rid: P.auth_request(rid, b"token")),
        ("WriteLac", lambda rid: P.write_lac_request(rid, 0, 5, KEY, 0)),
        ("ledger 5 in an add to ledger 6", lambda rid: P.add_request(rid, 0, 6, KEY, [e])),
    ]

    async def run():
        c = BookKeeperConnection(address)
        for match, build in refused:
            with pytest.raises(IllegalOpError, match=match):
                await c.call(build, 5)
        for conn in (BookKeeperConnection(address, auth_token=b"t"),
                     BookKeeperConnection(address, ssl_context=ssl.create_default_context())):
            with pytest.raises(IllegalOpError, match="START_TLS"):
                await conn.call(P.bookie_info_request, 5)
        with pytest.raises(BookieUnavailableError):       # what it can express, it tries to send
            await c.call(P.bookie_info_request, 5)

    asyncio.run(run())


def test_bad_bytes_from_a_bookie_fail_its_calls_and_close_the_connection():
    """A peer answering with malformed frames: the call fails with embedlog's error, the
    connection is dropped, the next call reconnects and the process goes on."""
    from embedlog.net.bookkeeper import BookKeeperConnection
    from embedlog.net.transport import BookieUnavailableError

    def good(txn):
        return E.encode_response(txn, W.GET_BOOKIE_INFO, W.EOK, total_disk_capacity=10, free_disk_space=4)

    answers = [
        lambda txn: frame(b"\x08\x01"),                                   # the header as a varint
        lambda txn: struct.pack(">I", 64 << 20) + b"\0" * 64,            # a 64 MiB frame
        lambda txn: good(txn)[:9],                                        # cut, then the peer closes
        lambda txn: E.encode_response(txn, W.ADD_ENTRY, W.EOK, ledger_id=1, entry_id=1),  # wrong op
        lambda txn: good(txn + 1000) + good(txn)[:7] + good(txn)[7:],     # unknown txn, split frame
    ]
    seen = []

    async def handle(reader, writer):
        n = len(seen)
        seen.append(n)
        data = b""
        while True:
            got, pos, err = W.decode_requests(data)
            if got or err:
                break
            chunk = await reader.read(4096)
            if not chunk:
                return
            data += chunk
        writer.write(answers[min(n, len(answers) - 1)](got[0].txn_id))
        await writer.drain()
        if n == 2:
            writer.close()
            return
        await reader.read()                   # until the client hangs up

    async def run():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = BookKeeperConnection(f"127.0.0.1:{port}")
        try:
            for expected, match in [(CorruptedDataError, "wrong wire type"), (CorruptedDataError, "exceeds"),
                                    (BookieUnavailableError, "lost"), (CorruptedDataError, "ADD_ENTRY answer")]:
                with pytest.raises(expected, match=match):
                    await c.call(P.bookie_info_request, 5)
            info = json.loads(bytes((await c.call(P.bookie_info_request, 5)).body))
            assert (info["total_bytes"], info["free_bytes"]) == (10, 4)
            assert len(seen) == 5 and not c.closed
        finally:
            c.close()
            server.close()
            await server.wait_closed()

    asyncio.run(run())
