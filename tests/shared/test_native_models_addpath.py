"""The client's produced runs (embedlog._native.addpath.encode_produced with runs, frame_cuts,
frames.add_request_sized; issue 48) against a plain-Python model: a produced batch of any
sizes under any run limits becomes runs of consecutive ids whose sized entries are, byte for
byte, the entries encoded one by one, each run within its limits (or one entry alone), and
frames cut from them are the frames of those entries; a packed take whose ends are out of
order or past its data is refused with nothing added. tools/sanitize.py runs this file under
ASan + UBSan (it takes tests/shared/test_native_models*)."""
from __future__ import annotations

import collections
import os
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from embedlog._native import addpath, frames
from embedlog._native.addpath import AddFuture
from embedlog._native.format import encode_entry
from embedlog.errors import IllegalOpError

EXAMPLES = int(os.environ.get("EMBEDLOG_HYPOTHESIS_EXAMPLES", "0"))
SETTINGS = settings(max_examples=EXAMPLES or 150, deadline=None, derandomize=not EXAMPLES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
KEY = bytes(range(20))


def packed(payloads):
    ends, end = [], 0
    for p in payloads:
        end += len(p)
        ends.append(end)
    return b"".join(payloads), struct.pack(f"={len(ends)}q", *ends)


def sized(entry: bytes) -> bytes:
    return struct.pack(">I", len(entry)) + entry


@SETTINGS
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=120),
       run_count=st.integers(1, 60), run_bytes=st.integers(0, 20_000),
       scope=st.sampled_from([0, 7]), digest=st.sampled_from([1, 3, 4]),
       first=st.integers(0, 2**40), lac=st.integers(-1, 2**40), length=st.integers(0, 2**40),
       frame_limit=st.integers(1, 30_000), frame_most=st.integers(1, 200))
def test_runs_match_entries_encoded_one_by_one(sizes, run_count, run_bytes, scope, digest, first,
                                               lac, length, frame_limit, frame_most):
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    pending: collections.OrderedDict = collections.OrderedDict()
    ops: list = []
    last = AddFuture()
    eid, end_length = addpath.encode_produced(packed(payloads), last, scope, 42, first, lac,
                                              length, digest, None, pending, ops, run_bytes,
                                              run_count)
    # the model: each entry encoded alone, with the ledger's length after it
    entries, running = [], length
    for i, p in enumerate(payloads):
        running += len(p)
        entries.append(encode_entry(scope, 42, first + i, lac, running, digest, p))
    assert (eid, end_length) == (first + len(payloads), running)
    assert list(pending) == [op.entry_id for op in ops] and ops[0].entry_id == first
    assert all(a.last_id + 1 == b.entry_id for a, b in zip(ops, ops[1:]))
    assert ops[-1].last_id == eid - 1 and ops[-1].future is last
    assert all(op.future is None for op in ops[:-1])
    for op in ops:
        mine = entries[op.entry_id - first:op.last_id - first + 1]
        assert op.data == b"".join(map(sized, mine))
        assert op.count == len(mine) <= max(run_count, 1)
        assert op.count == 1 or len(op.data) <= run_bytes
        assert op.length == length + sum(map(len, payloads[:op.last_id - first + 1]))
    # frames cut from the runs are the frames of their entries
    cuts = addpath.frame_cuts(ops, frame_limit, frame_most)
    assert cuts[-1] == len(ops) and cuts == sorted(set(cuts))
    for a, b in zip([0] + cuts, cuts):
        got = frames.add_request_sized(9, scope, 42, KEY, [op.data for op in ops[a:b]], 0, 0)
        want = frames.add_request(9, scope, 42, KEY,
                                  entries[ops[a].entry_id - first:ops[b - 1].last_id - first + 1])
        assert got == want


@SETTINGS
@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=20), data=st.data())
def test_a_bad_packed_take_is_refused_with_nothing_added(sizes, data):
    payloads = [b"x" * n for n in sizes]
    blob, ends = packed(payloads)
    values = list(struct.unpack(f"={len(sizes)}q", ends))
    k = data.draw(st.integers(0, len(values) - 1))
    values[k] = data.draw(st.one_of(st.integers(-2**63, -1), st.integers(len(blob) + 1, 2**63 - 1),
                                    st.integers(0, len(blob))))
    ok = all(0 <= v <= len(blob) for v in values) and values == sorted(values) \
        and values[-1] == len(blob)
    pending: collections.OrderedDict = collections.OrderedDict()
    ops: list = []
    args = ((blob, struct.pack(f"={len(values)}q", *values)), AddFuture(), 0, 1, 0, -1, 0, 3,
            None, pending, ops, 1000, 10)
    if ok:
        assert addpath.encode_produced(*args)[0] == len(values)
    else:
        with pytest.raises(IllegalOpError):
            addpath.encode_produced(*args)
        assert not pending and not ops


@SETTINGS
@given(parts=st.lists(st.binary(max_size=40), min_size=1, max_size=6))
def test_sized_parts_are_walked_before_any_copy(parts):
    """add_request_sized takes any bytes: it builds the frame only when every part is whole
    sized entries, and then the frame is the frame of those entries."""
    def split(part):
        out, pos = [], 0
        while pos < len(part):
            if pos + 4 > len(part):
                return None
            n = struct.unpack_from(">I", part, pos)[0]
            if pos + 4 + n > len(part):
                return None
            out.append(part[pos + 4:pos + 4 + n])
            pos += 4 + n
        return out
    entries = [split(p) for p in parts]
    if any(e is None for e in entries):
        with pytest.raises(IllegalOpError):
            frames.add_request_sized(1, 0, 1, KEY, parts)
    else:
        assert frames.add_request_sized(1, 0, 1, KEY, parts) == \
            frames.add_request(1, 0, 1, KEY, [e for es in entries for e in es])
