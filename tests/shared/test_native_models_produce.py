"""The produce queue (embedlog._native.produce_queue, issue 48) against a plain-Python model:
random adds of any bytes-like payload and size, takes under any byte cap, reservations,
settles of taken ranges and discards, with the queue's bounds (messages, bytes, entry size,
last id) small enough to be hit. After every step the ids, payloads, in-flight counts and
kicks must be the model's, and every refusal the model's refusal, with nothing changed.
tools/sanitize.py runs this file under ASan + UBSan (it takes tests/shared/test_native_models*)."""
from __future__ import annotations

import itertools
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedlog._native import journal_kernels as jkernels
from embedlog._native.produce_queue import ProduceQueue
from embedlog.errors import EntryTooLargeError, IllegalOpError

EXAMPLES = int(os.environ.get("EMBEDLOG_HYPOTHESIS_EXAMPLES", "0"))
SETTINGS = settings(max_examples=EXAMPLES or 150, deadline=None, derandomize=not EXAMPLES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Model:
    def __init__(self, first_id, max_messages, max_bytes, entry_max, id_max):
        self.next_id = first_id
        self.staged: list[bytes] = []
        self.taken: list[tuple[int, int]] = []      # (messages, bytes) of each taken range
        self.max_messages, self.max_bytes, self.entry_max, self.id_max = \
            max_messages, max_bytes, entry_max, id_max
        self.flight_n = self.flight_b = 0
        self.armed = True
        self.kicks = 0

    @property
    def first_staged(self):
        return self.next_id - len(self.staged)

    def add(self, value, prefix=None):
        value = (prefix or b"") + bytes(value)
        n = len(value)
        if n > self.entry_max or n > self.max_bytes:
            return EntryTooLargeError
        if self.next_id > self.id_max:
            return IllegalOpError
        if self.flight_n >= self.max_messages or self.flight_b + n > self.max_bytes:
            return BufferError
        self.staged.append(bytes(value))
        self.next_id += 1
        self.flight_n += 1
        self.flight_b += n
        if self.armed:
            self.armed = False
            self.kicks += 1
        return self.next_id - 1

    def take(self, cap, arm, most=-1):
        most = len(self.staged) if most < 0 else min(most, len(self.staged))
        if not most:
            if arm and not self.staged:
                self.armed = True
            return None
        k, size = 1, len(self.staged[0])
        while k < most and size + len(self.staged[k]) <= cap:
            size += len(self.staged[k])
            k += 1
        first = self.first_staged
        out, self.staged = self.staged[:k], self.staged[k:]
        self.taken.append((k, size))
        return first, out, size

    def reserve(self, n):
        if self.first_staged > self.id_max + 1 - n:
            return IllegalOpError
        if self.staged:
            return -1
        first = self.next_id
        self.next_id += n
        return first

    def settle(self, index):
        k, size = self.taken.pop(index)
        self.flight_n -= k
        self.flight_b -= size
        return k, size

    def discard(self):
        k, size = len(self.staged), sum(map(len, self.staged))
        first = self.first_staged
        self.staged = []
        self.flight_n -= k
        self.flight_b -= size
        return first, k, size


payloads = st.one_of(
    st.binary(max_size=80),
    st.binary(max_size=80).map(bytearray),
    st.binary(max_size=80).map(memoryview),
    st.integers(0, 300).map(lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256)))
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), payloads),
    st.tuples(st.just("add_prefixed"), st.tuples(st.binary(max_size=20), payloads)),
    st.tuples(st.just("take"), st.tuples(st.integers(0, 400), st.booleans(), st.integers(-1, 4))),
    st.tuples(st.just("take_packed"),
              st.tuples(st.integers(0, 400), st.booleans(), st.integers(-1, 4))),
    st.tuples(st.just("reserve"), st.integers(0, 5)),
    st.tuples(st.just("settle"), st.integers(0, 3)),
    st.tuples(st.just("discard"), st.none())), max_size=120)


def _call(fn, *args):
    try:
        return fn(*args)
    except (EntryTooLargeError, IllegalOpError, BufferError) as exc:
        return type(exc)


def _check(q, m):
    assert q.next_id == m.next_id
    assert q.staged == len(m.staged)
    assert q.staged_bytes == sum(map(len, m.staged))
    assert (q.in_flight_messages, q.in_flight_bytes) == (m.flight_n, m.flight_b)
    assert q.armed == m.armed


@SETTINGS
@given(first=st.sampled_from([0, 1, 1 << 32, (1 << 63) - 40]),
       max_messages=st.integers(1, 12), max_bytes=st.integers(1, 600),
       entry_max=st.integers(0, 300), id_room=st.integers(0, 30), script=ops)
def test_queue_matches_model(first, max_messages, max_bytes, entry_max, id_room, script):
    id_max = min(first + id_room, (1 << 63) - 2)
    kicks = []
    q = ProduceQueue(first, max_messages, max_bytes, entry_max, id_max, lambda: kicks.append(1))
    m = Model(first, max_messages, max_bytes, entry_max, id_max)
    for op, arg in script:
        if op == "add":
            assert _call(q.add, arg) == m.add(arg)
        elif op == "add_prefixed":
            assert _call(q.add, arg[1], arg[0]) == m.add(arg[1], arg[0])
        elif op == "take":
            got = q.take(*arg)
            assert got == m.take(*arg)
        elif op == "take_packed":
            got, want = q.take_packed(*arg), m.take(*arg)
            if want is None:
                assert got is None
            else:           # the same messages, back to back, with their int64 end offsets
                first, messages, size = want
                assert got[0] == first and got[2] == size
                assert got[1] == (b"".join(messages), struct.pack(
                    f"={len(messages)}q", *itertools.accumulate(map(len, messages))))
                assert jkernels.unpack_payloads(got[1]) == messages
        elif op == "reserve":
            assert _call(q.reserve, arg) == m.reserve(arg)
        elif op == "settle":
            if m.taken:
                k, size = m.settle(arg % len(m.taken))
                q.settle(k, size)
            else:
                with pytest.raises(IllegalOpError):
                    q.settle(1, 0)
        else:
            assert q.discard() == m.discard()
        _check(q, m)
        assert len(kicks) == m.kicks


def test_bounds_refused_at_construction():
    for args in [(0, 0, 10, 10), (0, 1 << 27, 10, 10), (0, 10, 0, 10), (0, 10, 1 << 41, 10),
                 (-1, 10, 10, 10), (0, 10, 10, -1)]:
        with pytest.raises(IllegalOpError):
            ProduceQueue(*args)


def test_settle_cannot_release_more_than_was_taken():
    q = ProduceQueue(0, 10, 100, 100)
    q.add(b"abc")
    with pytest.raises(IllegalOpError):       # staged, not taken
        q.settle(1, 3)
    assert q.take(100) == (0, [b"abc"], 3)
    with pytest.raises(IllegalOpError):
        q.settle(1, 4)
    with pytest.raises(IllegalOpError):
        q.settle(-1, 0)
    q.settle(1, 3)
    assert (q.in_flight_messages, q.in_flight_bytes) == (0, 0)


def test_a_payload_changed_after_add_is_not_seen():
    q = ProduceQueue(0, 10, 100, 100)
    buf = bytearray(b"before")
    q.add(buf)
    buf[:] = b"AFTER!"
    assert q.take(100)[1] == [b"before"]


def test_one_kick_per_sleep():
    kicks = []
    q = ProduceQueue(0, 100, 1000, 100, kick=lambda: kicks.append(1))
    q.add(b"a")
    q.add(b"b")
    assert kicks == [1]
    assert q.take(1000) is not None and q.take(1000) is None      # not armed: no arm asked
    q.add(b"c")
    assert kicks == [1]
    q.take(1000, arm=True)
    assert q.take(1000, arm=True) is None
    q.add(b"d")
    assert kicks == [1, 1]


def test_large_payloads_grow_the_buffer_within_bounds():
    q = ProduceQueue(0, 1000, 8 << 20, 1 << 20)
    blobs = [bytes([i]) * (i * 4099 % (1 << 20)) for i in range(20)]
    for b in blobs:
        q.add(b)
    first, out, size = q.take(1 << 40)
    assert out == blobs and size == sum(map(len, blobs))


def test_a_prefix_is_bytes_and_counts_toward_the_entry_bound():
    q = ProduceQueue(0, 10, 100, 10)
    assert q.add(b"abcd", b"HEAD") == 0
    assert q.take(100)[1] == [b"HEADabcd"]
    with pytest.raises(EntryTooLargeError):
        q.add(b"abcdefg", b"HEAD")            # 11 > 10 together, each alone fits
    with pytest.raises(EntryTooLargeError):
        q.add(b"", b"x" * 11)
    with pytest.raises(IllegalOpError):
        q.add(b"x", bytearray(b"H"))
    assert q.next_id == 1 and q.staged == 0
