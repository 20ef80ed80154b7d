"""The Arrow read kernels (embedlog._native.arrowread) against a plain-Python model (issue 25,
item 3): READ bodies of any entries, ids, ledgers and digests, then any bytes of them cut,
flipped or rewritten. verify_run must accept exactly the prefix the model accepts;
payload_arrays and packed_arrays must give the model's rows for it; a run that was not
verified (sizes pointing outside the body) is refused with an embedlog error, never read
past its body; pack_rows must round-trip any column and refuse offsets outside it."""
from __future__ import annotations

import os
import struct

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedlog._native import arrowread as ar
from embedlog._native.format import decode_entry, digest_code, encode_entry, mac_key
from embedlog.errors import EmbedlogError
from embedlog.net import protocol as P

EXAMPLES = int(os.environ.get("EMBEDLOG_HYPOTHESIS_EXAMPLES", "0"))
SETTINGS = settings(max_examples=EXAMPLES or 120, deadline=None, derandomize=not EXAMPLES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAC_KEY = mac_key(b"pw")
LEDGERS = [(0, 7), (0, (1 << 63) - 1), (5, 1), ((1 << 64) - 1, (1 << 64) - 1)]
DIGESTS = ["crc32c", "crc32", "mac", "dummy"]


def _model_run(items, scope, lid, first, last, code, mk):
    """How many entries at the start are first, first + 1, ... (<= last) of the ledger,
    each decoding with its digest checked."""
    good = 0
    for eid, raw in items:
        if eid != first + good or eid > last:
            break
        try:
            decode_entry(raw, scope, lid, eid, code, mk)
        except EmbedlogError:
            break
        good += 1
    return good


@st.composite
def runs(draw):
    scope, lid = draw(st.sampled_from(LEDGERS))
    digest = draw(st.sampled_from(DIGESTS))
    first = draw(st.sampled_from([0, 1, 1023, 1 << 30, (1 << 40) - 40]))
    payloads = draw(st.lists(st.binary(max_size=300), max_size=30))
    ids = list(range(first, first + len(payloads)))
    if payloads and draw(st.booleans()):              # an id out of order somewhere
        k = draw(st.integers(0, len(ids) - 1))
        ids[k] = draw(st.sampled_from([ids[k] + 1, ids[k] - 1, -1, 0, 1 << 62]))
    code, mk = digest_code(digest), MAC_KEY if digest == "mac" else None
    items, length = [], 0
    for eid, p in zip(ids, payloads):
        length += len(p)
        e = eid if eid >= 0 else 0
        items.append((eid, encode_entry(scope, lid, e, e - 1, length, code, p, mk)))
    return scope, lid, code, mk, first, items


@SETTINGS
@given(runs(), st.data())
def test_verify_run_and_payload_arrays_follow_the_model(run, data):
    scope, lid, code, mk, first, items = run
    if data.draw(st.booleans()) and items:            # one entry's bytes damaged in place
        k = data.draw(st.integers(0, len(items) - 1))
        eid, raw = items[k]
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:pos] + bytes([raw[pos] ^ data.draw(st.integers(1, 255))]) + raw[pos + 1:]
        items[k] = (eid, raw)
    body = bytes(P.read_response_body(-1, items))
    last = first + data.draw(st.integers(0, 40))
    want = _model_run(items, scope, lid, first, last, code, mk)
    got = ar.verify_run(body, scope, lid, first, last, code, mk)
    assert got == want
    offsets, values = ar.payload_arrays([(body, first, got)], code)
    rows = [bytes(values[offsets[i]:offsets[i + 1]]) for i in range(got)]
    assert rows == [decode_entry(raw, scope, lid, eid, code, mk) for eid, raw in items[:got]]


@SETTINGS
@given(runs(), st.data())
def test_an_unverified_run_is_refused_not_read_past(run, data):
    scope, lid, code, mk, first, items = run
    body = bytearray(P.read_response_body(-1, items))
    if len(body) > 12:                                # rewrite a u32 anywhere (a size, a count)
        pos = data.draw(st.integers(8, len(body) - 4))
        struct.pack_into(">I", body, pos, data.draw(st.sampled_from(
            [0, 1, 31, 40, 1 << 20, 0xFFFFFFFF])))
    cut = data.draw(st.integers(0, len(body)))
    body = bytes(body[:cut])
    count = data.draw(st.integers(0, len(items) + 3))
    for build in (ar.payload_arrays, ar.stream_arrays, ar.packed_arrays):
        try:
            build([(body, first, count)], code)
        except EmbedlogError:
            pass                                      # refused: what the model asks


@SETTINGS
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=60), st.data())
def test_pack_rows_round_trips_and_packed_arrays_read_them(rows, data):
    sizes = np.array([len(r) for r in rows], dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    values = np.frombuffer(b"".join(rows), dtype=np.uint8) if sum(sizes) else np.zeros(0, np.uint8)
    max_bytes = data.draw(st.integers(1, 400))
    payloads, start = [], 0
    while start < len(rows):
        payload, nxt = ar.pack_rows(offsets, values, start, len(rows), max_bytes)
        assert nxt > start
        payloads.append(payload)
        start = nxt
    items, length = [], 0
    for eid, p in enumerate(payloads):
        length += len(p)
        items.append((eid, encode_entry(0, 3, eid, eid - 1, length, digest_code("crc32c"), p)))
    body = bytes(P.read_response_body(-1, items))
    assert ar.verify_run(body, 0, 3, 0, len(items) - 1, digest_code("crc32c")) == len(items)
    off, val, per = ar.packed_arrays([(body, 0, len(items))], digest_code("crc32c"))
    got = [bytes(val[off[i]:off[i + 1]]) for i in range(len(off) - 1)]
    assert got == rows and int(per.sum()) == len(rows)
    bad = offsets.copy()
    bad[-1] = len(values) + 1                         # past the column's bytes
    try:
        ar.pack_rows(bad, values, 0, len(rows), max_bytes)
    except EmbedlogError:
        pass
    else:
        raise AssertionError("pack_rows read past the column")
