"""The Arrow batch read kernels (embedlog._native.arrowread) against the per-entry decoder.

READ bodies are built with the wire protocol's own encoder and the entry encoder, then
damaged on purpose: every damaged entry must end the verified run, and the arrays built
from a run must hold exactly what ``decode_entry`` returns for each entry."""
from __future__ import annotations

import random
import struct

import numpy as np
import pyarrow as pa
import pytest

from embedlog._native import arrowread as ar
from embedlog._native.format import decode_entry, digest_code, encode_entry, mac_key
from embedlog.errors import CorruptedDataError, IllegalOpError
from embedlog.net import protocol as P

MAC_KEY = mac_key(b"pw")
LEDGERS = [(0, 7), (0x53545245414D0001, 0xFFFF_FFFF_FFFF_FFF0)]       # V1 and V2


def entries(scope, lid, digest, payloads, first=0):
    out, length = [], 0
    for i, p in enumerate(payloads):
        length += len(p)
        out.append((first + i, encode_entry(scope, lid, first + i, first + i - 1, length, digest, p,
                                            MAC_KEY if digest == "mac" else None)))
    return out


def body(items, lac=-1):
    return memoryview(P.read_response_body(lac, items))


def binary(offsets, values):
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(values)])


@pytest.mark.parametrize("scope, lid", LEDGERS)
@pytest.mark.parametrize("digest", ["crc32c", "crc32", "mac", "dummy"])
def test_run_and_arrays_match_the_per_entry_decoder(scope, lid, digest):
    rng = random.Random(f"{scope}{digest}")
    payloads = [rng.randbytes(rng.choice([0, 1, 7, 100, 1024, 5000])) for _ in range(300)]
    items = entries(scope, lid, digest, payloads, first=40)
    code = digest_code(digest)
    mk = MAC_KEY if digest == "mac" else None
    b = body(items)
    assert ar.verify_run(b, scope, lid, 40, 339, code, mk) == 300
    assert ar.verify_run(b, scope, lid, 40, 99, code, mk) == 60          # stops at ``last``
    assert ar.verify_run(b, scope, lid, 41, 339, code, mk) == 0          # not the entry asked for
    offsets, values = ar.payload_arrays([(b, 40, 300)], code)
    want = [decode_entry(raw, scope, lid, eid, code, mk) for eid, raw in items]
    assert binary(offsets, values).to_pylist() == want == payloads
    # two runs (a window finished from another replica) make one array in order
    b1, b2 = body(items[:100]), body(items[100:])
    offsets, values = ar.payload_arrays([(b1, 40, 100), (b2, 140, 200)], code)
    assert binary(offsets, values).to_pylist() == payloads


@pytest.mark.parametrize("scope, lid", LEDGERS)
def test_every_damage_ends_the_run(scope, lid):
    code = digest_code("crc32c")
    items = entries(scope, lid, "crc32c", [b"payload-%d" % i for i in range(10)])
    rng = random.Random(1)
    for k in range(10):                      # a flipped bit anywhere in entry k
        damaged = list(items)
        raw = bytearray(damaged[k][1])
        bit = rng.randrange(len(raw) * 8)
        raw[bit // 8] ^= 1 << (bit % 8)
        damaged[k] = (k, bytes(raw))
        assert ar.verify_run(body(damaged), scope, lid, 0, 9, code) == k
    gap = items[:4] + items[5:]              # a missing entry
    assert ar.verify_run(body(gap), scope, lid, 0, 9, code) == 4
    other = entries(scope, lid + 1, "crc32c", [b"x"] * 10)    # another ledger's entries
    assert ar.verify_run(body(items[:3] + other[3:]), scope, lid, 0, 9, code) == 3
    whole = bytes(body(items))
    for cut in (0, 5, 12, 20, len(whole) - 1):                # a torn frame
        n = ar.verify_run(memoryview(whole[:cut]), scope, lid, 0, 9, code)
        assert n < 10
        if n:
            offsets, values = ar.payload_arrays([(memoryview(whole[:cut]), 0, n)], code)
            assert binary(offsets, values).to_pylist() == [b"payload-%d" % i for i in range(n)]
    # a digest type that differs from the ledger's is a bad copy, never "no digest"
    assert ar.verify_run(body(items), scope, lid, 0, 9, digest_code("crc32")) == 0
    with pytest.raises(CorruptedDataError):
        ar.verify_run(body(items), scope, lid, 0, 9, 9)
    with pytest.raises(IllegalOpError):
        ar.verify_run(body(items), scope, lid, 0, 9, digest_code("mac"))       # no key


def stream_payload(kind, rest=b"", time_ms=None):
    head = bytes([kind]) + (struct.pack(">q", time_ms) if time_ms is not None else b"")
    return head + rest


def test_stream_rows_skip_noops_and_set_links_aside():
    scope, lid = LEDGERS[1]
    code = digest_code("crc32c")
    link = struct.pack(">QQqI", 0x535041524B000002, 99, 5, 1000)
    payloads = [stream_payload(0, b"old"),                        # before entries had times
                stream_payload(1),                                # no-op
                stream_payload(2, b"new", 1_700_000_000_123),
                stream_payload(3, link, 1_700_000_000_500),
                stream_payload(2, b"", 1_700_000_001_000)]        # empty data is a row
    items = entries(scope, lid, "crc32c", payloads, first=10)
    b = body(items)
    assert ar.verify_run(b, scope, lid, 10, 14, code) == 5
    positions, times, timed, offsets, values, links = ar.stream_arrays([(b, 10, 5)], code)
    assert positions.tolist() == [10, 12, 14]
    assert timed.tolist() == [False, True, True]
    assert times[timed].tolist() == [1_700_000_000_123, 1_700_000_001_000]
    assert binary(offsets, values).to_pylist() == [b"old", b"new", b""]
    assert links == [(13, 1_700_000_000_500, 0x535041524B000002, 99, 5, 1000, 1000, False)]


@pytest.mark.parametrize("payload, message", [
    (b"", "no kind byte"),
    (b"\x07abc", "unknown kind 7"),
    (b"\x02abc", "shorter than its kind byte and time"),
    (b"\x03" + b"\0" * 20, "stream link at position 0 has 21 bytes"),
    (b"\x04" + b"\0" * 36, "stream link at position 0 has 37 bytes"),
])
def test_stream_rows_refuse_what_no_writer_writes(payload, message):
    scope, lid = LEDGERS[1]
    code = digest_code("crc32c")
    b = body(entries(scope, lid, "crc32c", [payload]))
    assert ar.verify_run(b, scope, lid, 0, 0, code) == 1
    with pytest.raises(CorruptedDataError, match=message):
        ar.stream_arrays([(b, 0, 1)], code)


def test_packed_rows_round_trip():
    rng = random.Random(7)
    rows = [rng.randbytes(rng.choice([0, 1, 100, 1024, 70_000])) for _ in range(500)]
    col = pa.array(rows, pa.binary())
    _, offs_buf, vals_buf = col.buffers()
    offsets = np.frombuffer(offs_buf, np.int32)[:len(rows) + 1]
    values = np.frombuffer(vals_buf, np.uint8)
    payloads, start = [], 0
    while start < len(rows):
        payload, start = ar.pack_rows(offsets, values, start, len(rows), 256 * 1024)
        assert len(payload) <= 256 * 1024 or struct.unpack(">I", payload[:4])[0] == 1
        payloads.append(payload)
    assert len(payloads) > 10
    scope, lid = LEDGERS[1]
    items = entries(scope, lid, "crc32c", payloads)
    b = body(items)
    n = ar.verify_run(b, scope, lid, 0, len(items) - 1, digest_code("crc32c"))
    offs, vals, per_entry = ar.packed_arrays([(b, 0, n)], digest_code("crc32c"))
    assert binary(offs, vals).to_pylist() == rows
    assert per_entry.sum() == len(rows) and len(per_entry) == len(payloads)
    # sizes that do not add up to the payload are refused
    bad = entries(scope, lid, "crc32c", [payloads[0][:-1]])
    with pytest.raises(CorruptedDataError, match="packed entry 0"):
        ar.packed_arrays([(body(bad), 0, 1)], digest_code("crc32c"))
    with pytest.raises(IllegalOpError):
        ar.pack_rows(offsets, values, 10, 5, 1024)
