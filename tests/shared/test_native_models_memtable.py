"""Model-based tests of the native memtable and the add kernels (issue 25, item 3).

A hypothesis state machine drives ``MemTable`` and the add kernels of journal_kernels.pyx
(``add_encoded_entries``, ``add_payloads``) with arbitrary id patterns (gaps, descending,
duplicates, ids near 2^63, scope ids up to 2^64-1, many ledgers in one call), payloads from
0 bytes to the memtable's limit and small limits, so "full" happens often. A plain dict is
the model: what it holds must read back byte for byte (get_encoded, contains,
last_entry_id, count, sorted_records over arena_view), the journal buffer must have framed
exactly the entries a kernel says it took, and a refusal must be an EmbedlogError that
leaves memtable and journal buffer as they were.

EMBEDLOG_HYPOTHESIS_EXAMPLES=2000 runs longer (random, not the default fixed examples).
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from embedlog._native import format as nf
from embedlog._native import journal_buffer as jbuffer, journal_kernels as jkernels
from embedlog._native import memtable as nm
from embedlog._native.format import MAX_ENTRY_ID
from embedlog.errors import EmbedlogError, IllegalOpError

EXAMPLES = int(os.environ.get("EMBEDLOG_HYPOTHESIS_EXAMPLES", "0"))
MACHINE = settings(max_examples=EXAMPLES or 20, stateful_step_count=20, deadline=None,
                   derandomize=not EXAMPLES, report_multiple_bugs=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.filter_too_much])

MAX_EID = (1 << 63) - 1
U64 = (1 << 64) - 1
REC_HEADER = 9                      # journal record: len:u32 crc:u32 type:u8
DIGESTS = [nf.digest_code(d) for d in ("crc32c", "crc32", "dummy", "mac")]
MAC_KEY = nf.mac_key(b"pw")
# a small pool, so ledgers and ids collide: scope 0 (V1, ledger < 2^63) and scoped (V2)
LEDGERS = [(0, 1), (0, 2), (0, MAX_EID), (1, 0), (7, 3), (U64, U64), (1 << 63, 5)]

# entry ids the kernels take: 0..MAX_ENTRY_ID (what the index addresses); bad_eids are refused
eids = st.one_of(st.integers(0, 300), st.integers(MAX_ENTRY_ID - 300, MAX_ENTRY_ID),
                 st.integers(0, 1000).map(lambda k: 64 * k), st.integers(0, MAX_ENTRY_ID))
bad_eids = st.one_of(st.integers(MAX_ENTRY_ID + 1, MAX_EID), st.integers(-(1 << 63), -1),
                     st.sampled_from([MAX_ENTRY_ID + 1, MAX_EID, -1]))


@st.composite
def id_patterns(draw, max_len=120):
    """Entry ids of one call: runs with a step (gaps, descending, repeats) or anything."""
    n = draw(st.integers(1, max_len))
    kind = draw(st.sampled_from(["step", "step", "random", "dups"]))
    if kind == "random":
        return draw(st.lists(eids, min_size=n, max_size=n))
    if kind == "dups":
        pool = draw(st.lists(eids, min_size=1, max_size=5))
        return draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    step = draw(st.sampled_from([1, 1, 2, 3, 63, 64, 65, 1000, -1, -7, 0]))
    start = draw(eids)
    return [min(max(start + i * step, 0), MAX_ENTRY_ID) for i in range(n)]


class MemTableMachine(RuleBasedStateMachine):
    """A MemTable and a journal buffer against {(scope, ledger, entry): encoded bytes}."""

    @initialize(limit=st.sampled_from([600, 2048, 4096, 20000, 1 << 16, 1 << 20]),
                capacity=st.sampled_from([16, 4096, 1 << 20]))
    def setup(self, limit, capacity):
        self.mt = nm.MemTable(limit)
        self.jb = jbuffer.JournalBuffer(capacity)
        self.model = {}
        self.nrecs = 0              # records since the last clear (re-adds and drops count)
        self.version = 0            # makes each payload distinct, so a stale re-add shows
        self.journalled = []        # what the journal buffer should hold, in order
        self.fulls = 0

    # -- helpers ----------------------------------------------------------------------------

    def payload(self, size):
        self.version += 1
        stamp = self.version.to_bytes(4, "big")
        return (stamp * (size // 4 + 1))[:size]

    def entry(self, scope, lid, eid, size, digest, clamp=True):
        if clamp:               # an entry the memtable can take (add_too_large makes others)
            size = min(size, self.mt.limit_bytes - 61)
        return nf.encode_entry(scope, lid, eid, eid - 1, 0, digest, self.payload(size),
                               MAC_KEY if digest == nf.digest_code("mac") else None)

    def sizes(self):
        limit = self.mt.limit_bytes
        return st.one_of(st.integers(0, 64), st.integers(0, 600),
                         st.sampled_from([0, limit // 3, limit - 80, limit - 61, limit - 41]))

    def flush(self):
        """What the bookie does when a kernel stops short: (check and) clear, go on."""
        self.check_model()
        self.check_every_key()
        self.mt.clear()
        self.jb.clear()
        self.model.clear()
        self.journalled.clear()
        self.nrecs = 0
        self.fulls += 1

    def took(self, entries):
        for e in entries:
            _v, s, l, eid = nf.parse_entry_header(e)[:4]
            self.model[(s, l, eid)] = e
            self.journalled.append(e)
        self.nrecs += len(entries)

    def snapshot(self):
        return (self.jb.nbytes, self.jb.nrecords, self.mt.used_bytes, self.mt.count,
                bytes(self.mt.arena_view()))

    # -- rules --------------------------------------------------------------------------------

    @rule(data=st.data(), ledgers=st.lists(st.sampled_from(LEDGERS), min_size=1, max_size=4),
          digest=st.sampled_from(DIGESTS[:3]))
    def add_encoded_entries(self, data, ledgers, digest):
        ids = data.draw(id_patterns())
        which = data.draw(st.sampled_from(["one", "cycle", "each"]))
        entries = []
        for i, eid in enumerate(ids):
            if which == "one":
                scope, lid = ledgers[0]
            elif which == "cycle":
                scope, lid = ledgers[i % len(ledgers)]
            else:
                scope, lid = data.draw(st.sampled_from(LEDGERS))
            entries.append(self.entry(scope, lid, eid, data.draw(self.sizes()), digest))
        done = 0
        while done < len(entries):
            nb, nr = self.jb.nbytes, self.jb.nrecords
            n = jkernels.add_encoded_entries(self.jb, self.mt, entries, done)
            assert 0 <= n <= len(entries) - done
            taken = entries[done:done + n]
            assert self.jb.nrecords == nr + n
            assert self.jb.nbytes == nb + sum(REC_HEADER + len(e) for e in taken)
            self.took(taken)
            done += n
            if done < len(entries):
                # full: a kernel that takes nothing from an empty memtable would loop for ever
                assert n > 0 or not self.mt.is_empty(), "an empty memtable refused an entry"
                self.flush()

    @rule(data=st.data(), ledger=st.sampled_from(LEDGERS), digest=st.sampled_from(DIGESTS),
          n=st.integers(1, 150), first=eids)
    def add_payloads(self, data, ledger, digest, n, first):
        scope, lid = ledger
        first = min(first, MAX_ENTRY_ID + 1 - n)    # ids past the top: bad_ids_are_refused
        payloads = [self.payload(data.draw(self.sizes())) for _ in range(n)]
        kinds = data.draw(st.sampled_from(["bytes", "bytearray", "memoryview", "packed"]))
        given = payloads
        if kinds == "packed":       # ProduceQueue.take_packed's form: one buffer, int64 ends
            given = (b"".join(payloads),
                     np.cumsum([len(p) for p in payloads], dtype=np.int64).tobytes())
        elif kinds != "bytes":
            payloads = given = [bytearray(p) if kinds == "bytearray" else memoryview(p)
                                for p in payloads]
        mac = MAC_KEY if digest == nf.digest_code("mac") else None
        lac, length = first - 1, data.draw(st.sampled_from([0, 12345, 1 << 40]))
        max_entry = data.draw(st.sampled_from([1 << 30, 1 << 30, 100]))
        hdr = len(nf.encode_entry(scope, lid, 0, -1, 0, digest, b"", mac))
        too_big = [i for i, p in enumerate(payloads)
                   if len(p) > max_entry or hdr + len(p) > self.mt.limit_bytes]
        done = 0
        while done < n:
            before = self.snapshot()
            try:
                k, new_length = jkernels.add_payloads(self.jb, self.mt, scope, lid, first + done, lac,
                                                length, digest, mac, given, done, max_entry)
            except EmbedlogError:
                assert too_big and too_big[0] >= done, "refused a batch that fits"
                # a refusal leaves nothing half written: no record framed, nothing stored
                assert self.snapshot() == before
                return
            assert 0 <= k <= n - done
            if k < n - done:
                assert k > 0 or not self.mt.is_empty(), "an empty memtable refused an entry"
            assert not [i for i in too_big if i < done + k], "took an entry it must refuse"
            want = []
            for i in range(done, done + k):
                length += len(payloads[i])
                want.append(nf.encode_entry(scope, lid, first + i, lac, length, digest,
                                            bytes(payloads[i]), mac))
            assert new_length == length
            nb, nr = before[0], before[1]
            assert self.jb.nrecords == nr + k
            assert self.jb.nbytes == nb + sum(REC_HEADER + len(e) for e in want)
            self.took(want)
            done += k
            if done < n:
                self.flush()
        assert not too_big, f"payloads {too_big} were not refused"

    @rule(data=st.data(), ledger=st.sampled_from(LEDGERS), eid=eids,
          digest=st.sampled_from(DIGESTS[:3]))
    def add_encoded(self, data, ledger, eid, digest):
        e = self.entry(ledger[0], ledger[1], eid, data.draw(self.sizes()), digest)
        before = self.snapshot()
        if self.mt.add_encoded(e):
            self.model[(ledger[0], ledger[1], eid)] = e
            self.nrecs += 1
        else:
            assert not self.mt.is_empty(), "an empty memtable refused an entry"
            assert self.snapshot() == before

    @rule(data=st.data())
    def add_too_large(self, data):
        """Entries larger than the memtable: refused with nothing written, mid-batch too."""
        scope, lid = data.draw(st.sampled_from(LEDGERS))
        big = self.entry(scope, lid, data.draw(eids), self.mt.limit_bytes, DIGESTS[0], False)
        assert len(big) > self.mt.limit_bytes
        before = self.snapshot()
        with pytest.raises(EmbedlogError):
            self.mt.add_encoded(big)
        assert self.snapshot() == before
        ok = [self.entry(scope, lid, eid, 10, DIGESTS[0]) for eid in data.draw(id_patterns(5))]
        at = data.draw(st.integers(0, len(ok)))
        batch = ok[:at] + [big] + ok[at:]
        nb, nr = self.jb.nbytes, self.jb.nrecords
        try:
            n = jkernels.add_encoded_entries(self.jb, self.mt, batch, 0)
        except EmbedlogError:
            assert self.snapshot() == before, "a refused batch was half written"
            return
        assert n <= at, "an entry larger than the memtable was taken"
        self.took(batch[:n])
        assert self.jb.nrecords == nr + n and self.jb.nbytes == nb + sum(
            REC_HEADER + len(e) for e in batch[:n])
        self.flush()

    @rule(data=st.data(), payloads=st.booleans())
    def bad_ids_are_refused(self, data, payloads):
        """An entry id outside 0..MAX_ENTRY_ID anywhere in a call: refused, nothing written."""
        scope, lid = data.draw(st.sampled_from(LEDGERS))
        before = self.snapshot()
        if payloads:
            n = data.draw(st.integers(1, 70))
            past_top = st.integers(MAX_ENTRY_ID - n + 2, MAX_ENTRY_ID) if n > 1 else bad_eids
            first = data.draw(st.one_of(bad_eids, past_top))
            with pytest.raises(EmbedlogError):
                jkernels.add_payloads(self.jb, self.mt, scope, lid, first, -1, 0, DIGESTS[0], None,
                                [b"p"] * n, 0, 1 << 20)
        else:
            ok = [self.entry(scope, lid, eid, 10, DIGESTS[0]) for eid in data.draw(id_patterns(5))]
            bad = bytearray(self.entry(scope, lid, 0, 10, DIGESTS[0]))
            at_id = 8 if scope == 0 else 17
            bad[at_id:at_id + 8] = (data.draw(bad_eids) & U64).to_bytes(8, "big")
            at = data.draw(st.integers(0, len(ok)))
            with pytest.raises(EmbedlogError):
                jkernels.add_encoded_entries(self.jb, self.mt, ok[:at] + [bytes(bad)] + ok[at:], 0)
        assert self.snapshot() == before, "a refused batch was half written"

    @rule(ledger=st.sampled_from(LEDGERS), lo=st.one_of(st.just(0), eids),
          hi=st.one_of(st.just(MAX_EID), eids))
    def drop_ledger(self, ledger, lo, hi):
        self.mt.drop_ledger(ledger[0], ledger[1], lo, hi)
        for key in [k for k in self.model if k[:2] == ledger and lo <= k[2] <= hi]:
            del self.model[key]

    @rule()
    def clear(self):
        self.flush()

    @rule(data=st.data())
    def absent_ids_read_nothing(self, data):
        scope, lid = data.draw(st.sampled_from(LEDGERS))
        eid = data.draw(eids)
        if (scope, lid, eid) not in self.model:
            assert self.mt.get_encoded(scope, lid, eid) is None
            assert not self.mt.contains(scope, lid, eid)

    # -- what the model holds reads back --------------------------------------------------------

    def check_every_key(self):
        for (s, l, e), want in self.model.items():
            assert self.mt.get_encoded(s, l, e) == want, (s, l, e)
            assert self.mt.contains(s, l, e)

    def teardown(self):
        if hasattr(self, "mt"):
            self.check_every_key()

    @invariant()
    def check_model(self):
        if not hasattr(self, "mt"):
            return
        mt, model = self.mt, self.model
        assert mt.count == len(model)
        for s, l in LEDGERS:
            ids = [k[2] for k in model if k[:2] == (s, l)]
            assert mt.last_entry_id(s, l) == (max(ids) if ids else -1)
        recs = mt.sorted_records().tolist()
        assert [r[:3] for r in recs] == sorted(model)
        arena = bytes(mt.arena_view())
        for s, l, e, off, size, _where in recs:      # where: layout 2's location
            assert arena[off:off + size] == model[(s, l, e)]
        # the limit holds, but for one entry of any size in an empty memtable
        assert mt.used_bytes <= mt.limit_bytes or self.nrecs <= 1
        assert mt.is_empty() == (self.nrecs == 0)
        # the journal buffer framed exactly what was taken, in order
        assert self.jb.nrecords == len(self.journalled)
        assert self.jb.entry_ids() == [tuple(nf.parse_entry_header(e)[1:4])
                                       for e in self.journalled]


TestMemTableModel = MemTableMachine.TestCase
TestMemTableModel.settings = MACHINE


# -- found while writing the models: ids a kernel takes must be ids the index can hold ------------

def _in_subprocess(code):
    """Run ``code`` in a fresh interpreter: a kernel that writes out of bounds must not take the
    test session down with it."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("packed", [
    (b"abcdef", np.array([2, 1], dtype=np.int64).tobytes()),       # an end before the last
    (b"abcdef", np.array([2, 7], dtype=np.int64).tobytes()),       # an end past the data
    (b"abcdef", np.array([-1], dtype=np.int64).tobytes()),         # a negative end
    (b"abcdef", b"\0" * 7),                                         # ends not whole int64s
    (bytearray(b"abcdef"), np.array([6], dtype=np.int64).tobytes()),  # data not bytes
    (b"abcdef",)])
def test_a_packed_batch_with_bad_offsets_is_refused_before_anything_is_framed(packed):
    # the offsets come from a caller: each is checked against the data before it is read
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(1 << 20)
    with pytest.raises(IllegalOpError):
        jkernels.add_payloads(jb, mt, 0, 1, 0, -1, 0, nf.digest_code("crc32c"), None, packed, 0,
                              1 << 20)
    assert jb.nrecords == 0 and mt.is_empty()


@pytest.mark.parametrize("first", [MAX_ENTRY_ID - 1, MAX_EID - 1])
def test_add_payloads_past_the_last_entry_id_is_refused(first):
    # Regression (issue 25; found by this model, fixed by the lead while it was written): add_payloads(first_eid=2^63-2) with 4 payloads
    # takes all 4, the last two at entry ids -2^63 and -2^63+1 (int64 overflow of eid += 1 in
    # _frame_entries, undefined behaviour in C); a flush then hands the index negative entry
    # ids (see test_index_set_locations_refuses_negative_ids). Expected: an EmbedlogError
    # (IllegalOpError) and nothing framed, or at most the ids up to 2^63-1 taken.
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(1 << 20)
    crc = nf.digest_code("crc32c")
    try:
        n, _length = jkernels.add_payloads(jb, mt, 0, 1, first, -1, 0, crc, None, [b"a"] * 4, 0,
                                     1 << 20)
    except EmbedlogError:
        assert jb.nrecords == 0 and mt.is_empty()
        return
    ids = [int(r["eid"]) for r in mt.sorted_records()]
    assert all(0 <= e <= MAX_ENTRY_ID for e in ids), f"entries stored at ids {ids}"
    assert n <= 2


@pytest.mark.parametrize("bad", ["too_large", "malformed"])
def test_add_encoded_entries_refusal_leaves_nothing_half_written(bad):
    # Regression (issue 25; found by this model, fixed by the lead while it was written): add_encoded_entries checks each entry as it goes,
    # so an entry it refuses (larger than the memtable: EntryTooLargeError; a header that does
    # not parse: CorruptedDataError) after good ones raises with the good ones already framed
    # into the journal buffer and stored in the memtable, and the caller, seeing only the
    # exception, cannot know. add_payloads checks its whole batch first (check_payloads);
    # this kernel should too (or return the count taken before the bad entry).
    crc = nf.digest_code("crc32c")
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(4096)
    good = [nf.encode_entry(0, 1, eid, -1, 0, crc, b"x" * 10) for eid in range(3)]
    worse = (nf.encode_entry(0, 1, 3, -1, 0, crc, b"y" * 5000) if bad == "too_large"
             else b"\x80short")
    with pytest.raises(EmbedlogError):
        jkernels.add_encoded_entries(jb, mt, good + [worse], 0)
    assert jb.nrecords == 0 and jb.nbytes == 0, f"{jb.nrecords} records framed before the refusal"
    assert mt.is_empty(), f"{mt.count} entries stored before the refusal"


def test_add_payloads_into_an_empty_memtable_counts_its_blocks():
    # Regression (issue 25; found by this model, fixed by the lead while it was written): MemTable.fits() answers True for any n up to the
    # limit when the memtable is empty ("an empty memtable takes one entry of any size"), and
    # add_payloads asks it about the whole batch, so a batch into an empty memtable is taken
    # with its blocks uncounted: 9 empty payloads into MemTable(600) leave used_bytes 604
    # (9 x 36 bytes + one 280-byte block). The overshoot grows with the batch: blocks of
    # consecutive ids are ~12% of the arena bytes for small entries.
    crc = nf.digest_code("crc32c")
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(600)
    n, _ = jkernels.add_payloads(jb, mt, 0, 1, 0, -1, 0, crc, None, [b""] * 9, 0, 1 << 20)
    assert n >= 1
    assert mt.used_bytes <= mt.limit_bytes, (
        f"{n} entries: used_bytes {mt.used_bytes} > limit_bytes {mt.limit_bytes}")
