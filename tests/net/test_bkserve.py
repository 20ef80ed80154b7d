"""bkserve.pyx, the bookie's side of BookKeeper's wire: v2 requests decoded from every cut and
from malformed packets (each an error, never a crash or a read past the frame), v2 responses
byte for byte as BookieProtoEncoding writes them, and v3 add/read responses read back by
bkwire's decoder (the client side, itself checked against google.protobuf)."""
from __future__ import annotations

import random
import struct

import pytest

from embedlog._native import bkencode as E
from embedlog._native import bkserve as S
from embedlog._native import bkwire as W
from embedlog.errors import CorruptedDataError, EntryTooLargeError, IllegalOpError

KEY = bytes(range(20))


def frame(packet: bytes) -> bytes:
    return struct.pack(">I", len(packet)) + packet


def header(op: int, flags: int = 0, version: int = 2) -> bytes:
    return struct.pack(">I", version << 24 | op << 16 | flags)


def add(lid: int, eid: int, payload: bytes = b"p", flags: int = 0) -> bytes:
    entry = struct.pack(">qqqq", lid, eid, eid - 1, len(payload)) + b"\0" * 4 + payload
    return frame(header(S.ADDENTRY, flags) + KEY + entry)


def read(lid: int, eid: int, fence: bool = False) -> bytes:
    flags = S.FLAG_DO_FENCING if fence else 0
    return frame(header(S.READENTRY, flags) + struct.pack(">qq", lid, eid) + (KEY if fence else b""))


def batch(lid: int, eid: int, rid: int, count: int, size: int) -> bytes:
    return frame(header(S.BATCH_READ_ENTRY) + struct.pack(">qqqiq", lid, eid, rid, count, size))


def test_v2_requests_decode():
    buf = (add(7, 3, b"hello", S.FLAG_RECOVERY_ADD) + read(7, -1) + read(7, 2, fence=True)
           + batch(7, 0, 99, 10, 1 << 20) + frame(header(S.AUTH) + b"\x0a\x03abc"))
    got, pos, err = S.decode_v2(buf)
    assert err is None and pos == len(buf) and len(got) == 5
    op, version, flags, lid, eid, key, entry = got[0]
    assert (op, version, flags, lid, eid, key) == (S.ADDENTRY, 2, S.FLAG_RECOVERY_ADD, 7, 3, KEY)
    assert entry.endswith(b"hello") and struct.unpack_from(">qq", entry) == (7, 3)
    assert got[1] == (S.READENTRY, 2, 0, 7, -1, None, None)
    assert got[2] == (S.READENTRY, 2, S.FLAG_DO_FENCING, 7, 2, KEY, None)
    assert got[3] == (S.BATCH_READ_ENTRY, 2, 0, 7, 0, None, (99, 10, 1 << 20))
    assert got[4][0] == S.AUTH and S.auth_plugin_name(got[4][6]) == b"abc"


def test_every_cut_waits_for_the_rest():
    buf = add(1, 0) + read(1, 0) + batch(1, 0, 1, 2, 3)
    whole = S.decode_v2(buf)[0]
    for cut in range(len(buf)):
        got, pos, err = S.decode_v2(buf, 0, cut)
        assert err is None and pos <= cut
        assert got == whole[:len(got)]
        rest, end, err = S.decode_v2(buf, pos)
        assert err is None and end == len(buf) and got + rest == whole


@pytest.mark.parametrize("packet, what", [
    (b"", "no header"),
    (b"\x02\x01", "no header"),
    (header(S.ADDENTRY) + KEY + b"\0" * 15, "ADDENTRY"),
    (header(S.READENTRY) + b"\0" * 15, "read packet"),
    (header(S.READENTRY, S.FLAG_DO_FENCING) + b"\0" * 16 + KEY[:19], "master key"),
    (header(S.BATCH_READ_ENTRY) + b"\0" * 35, "read packet"),
    (header(S.BATCH_READ_ENTRY, S.FLAG_DO_FENCING) + b"\0" * 36 + KEY[:5], "master key"),
    (header(S.READ_LAC) + b"\0" * 8, "opcode 4"),
    (header(S.WRITE_LAC) + b"\0" * 40, "opcode 5"),
    (header(S.GET_BOOKIE_INFO), "opcode 6"),
    (header(0x7F), "opcode 127"),
])
def test_malformed_v2_packets_are_errors(packet, what):
    good = read(1, 1)
    got, pos, err = S.decode_v2(good + frame(packet))
    assert len(got) == 1 and pos == len(good)
    assert isinstance(err, CorruptedDataError) and what in str(err)


def test_oversize_frames_are_refused_from_their_length():
    got, pos, err = S.decode_v2(struct.pack(">I", S.MAX_FRAME_BYTES + 1) + b"\x02")
    assert got == [] and pos == 0 and isinstance(err, EntryTooLargeError)
    got, pos, err = S.decode_v2(struct.pack(">I", 0xFFFFFFFF) + b"\x02" * 8)
    assert isinstance(err, EntryTooLargeError)


def test_random_bytes_never_crash():
    rng = random.Random(29)
    for _ in range(3000):
        n = rng.randrange(0, 80)
        data = struct.pack(">I", n) + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 90)))
        if rng.random() < 0.5 and len(data) > 5:
            data = data[:4] + bytes([2]) + data[5:]
        got, pos, err = S.decode_v2(data)
        assert 0 <= pos <= len(data) and (err is None or isinstance(err, (CorruptedDataError,
                                                                          EntryTooLargeError)))


def test_v2_responses_as_bookkeeper_writes_them():
    assert S.v2_response(2, S.ADDENTRY, 104, 7, 3) == struct.pack(">iIiqq", 24, 2 << 24 | 1 << 16, 104, 7, 3)
    head = S.v2_response(2, S.READENTRY, 0, 7, -1, 100)
    assert head == struct.pack(">iIiqq", 124, 2 << 24 | 2 << 16, 0, 7, -1)
    framed = b"".join(struct.pack(">qI", e, len(b)) + b for e, b in [(0, b"a" * 5), (1, b"b" * 7)])
    out = S.v2_batch_response(2, 0, 7, 0, 42, framed, 2)
    assert out == (struct.pack(">iIiqqq", 24 + 8 + 4 + 5 + 4 + 7, 2 << 24 | 7 << 16, 0, 7, 0, 42)
                   + struct.pack(">I", 5) + b"a" * 5 + struct.pack(">I", 7) + b"b" * 7)
    assert S.v2_batch_response(2, 2, 7, 5, 42) == struct.pack(">iIiqqq", 32, 2 << 24 | 7 << 16, 2, 7, 5, 42)
    with pytest.raises(CorruptedDataError):
        S.v2_batch_response(2, 0, 7, 0, 42, framed[:-1], 2)      # a record cut short
    with pytest.raises(CorruptedDataError):
        S.v2_batch_response(2, 0, 7, 0, 42, framed, 3)           # more records than there are
    auth = S.v2_auth_response(2, b"AuthDisabledPlugin")
    (n,) = struct.unpack_from(">I", auth)
    assert n == len(auth) - 4 and S.auth_plugin_name(auth[8:]) == b"AuthDisabledPlugin"


@pytest.mark.parametrize("eid", [0, 5, -1, 2**62])
@pytest.mark.parametrize("status", [W.EOK, W.EFENCED, W.ENOENTRY])
def test_v3_responses_read_back(eid, status):
    txn = 2**40 + 3
    (r,), pos, err = W.decode_responses(E.v3_add_response(txn, status, 9, eid))
    assert err is None and (r.operation, r.txn_id, r.status, r.ledger_id, r.entry_id) == (
        W.ADD_ENTRY, txn, status, 9, eid)
    body = b"entry-bytes" * 3
    data = E.v3_read_head(txn, status, 9, eid, 41, len(body), 1234) + body
    (r,), pos, err = W.decode_responses(data)
    assert err is None and pos == len(data)
    assert (r.operation, r.status, r.ledger_id, r.entry_id, r.body, r.max_lac,
            r.lac_update_timestamp) == (W.READ_ENTRY, status, 9, eid, body, 41, 1234)
    (r,), _, err = W.decode_responses(E.v3_read_head(txn, status, 9, eid))
    assert err is None and r.body is None and r.max_lac is None
    (r,), _, err = W.decode_responses(E.v3_read_head(txn, status, 9, eid, -1, 0))
    assert err is None and r.body == b"" and r.max_lac == -1
    (r,), _, err = W.decode_responses(E.v3_status_response(txn, 11, W.EBADREQ))
    assert err is None and r.operation == 11 and r.status == W.EBADREQ


def test_a_runs_add_responses_are_the_single_ones_joined():
    """One buffer answers a run of adds (net/bkserver.py): byte for byte the responses one at
    a time would have been, in request order, and bkwire reads each back."""
    txns, eids = [1, 2**40 + 3, 127, 128], [0, 5, 2**62, 7]
    joined = E.v3_add_responses(txns, W.EFENCED, 9, eids)
    assert joined == b"".join(E.v3_add_response(t, W.EFENCED, 9, e) for t, e in zip(txns, eids))
    got, pos, err = W.decode_responses(joined)
    assert err is None and pos == len(joined)
    assert [(r.txn_id, r.status, r.ledger_id, r.entry_id) for r in got] == [
        (t, W.EFENCED, 9, e) for t, e in zip(txns, eids)]
    assert S.v2_add_responses(3, 0, 7, [4, 5, -1]) == b"".join(
        S.v2_response(3, S.ADDENTRY, 0, 7, e) for e in (4, 5, -1))
    assert E.v3_add_responses([], 0, 9, []) == S.v2_add_responses(2, 0, 7, []) == b""
    with pytest.raises(IllegalOpError):
        E.v3_add_responses([1, 2], 0, 9, [0])          # a txn id for each entry, no fewer
