"""Model-based tests of the native ledger index (issue 25, item 3).

A hypothesis state machine drives ``IndexCache`` / ``LedgerIndex`` (set_locations,
clear_range, header state, flush, the cache's eviction, delete, reopen from disk with a new
cache) against a dict per ledger. Entry ids come in any pattern within 0..MAX_ENTRY_ID
(gaps, descending, duplicates, page boundaries, the top of the range); ids outside it must
be refused with an EmbedlogError before anything is written. A reopen keeps exactly what
the last flush of each ledger wrote.

EMBEDLOG_HYPOTHESIS_EXAMPLES=2000 runs longer (random, not the default fixed examples).
"""
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from embedlog._native import index as ni
from embedlog._native.format import MAX_ENTRY_ID, crc32c
from embedlog.errors import EmbedlogError

EXAMPLES = int(os.environ.get("EMBEDLOG_HYPOTHESIS_EXAMPLES", "0"))
MACHINE = settings(max_examples=EXAMPLES or 40, stateful_step_count=25, deadline=None,
                   derandomize=not EXAMPLES, report_multiple_bugs=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PER_PAGE = ni.ENTRIES_PER_PAGE
U64 = (1 << 64) - 1
LEDGERS = [(0, 1), (0, 2), (0, (1 << 63) - 1), (1, 0), (U64, U64)]
FAR = 1 << 20                   # ids from here on: pages far apart (scans over them are skipped)

near_ids = st.one_of(st.integers(0, 3 * PER_PAGE + 5),
                     st.sampled_from([PER_PAGE - 1, PER_PAGE, 2 * PER_PAGE - 1, 2 * PER_PAGE]))
far_ids = st.one_of(st.integers(FAR, FAR + 2 * PER_PAGE), st.integers(MAX_ENTRY_ID - 2100, MAX_ENTRY_ID))
ids = st.one_of(near_ids, near_ids, near_ids, far_ids)
bad_ids = st.one_of(st.integers(-(1 << 63), -1), st.integers(MAX_ENTRY_ID + 1, (1 << 63) - 1),
                    st.sampled_from([-1, -PER_PAGE, -PER_PAGE - 1, MAX_ENTRY_ID + 1, (1 << 63) - 1]))
locations = st.one_of(st.integers(1, U64), st.sampled_from([1, 1 << 32, U64, 0]))


@st.composite
def id_runs(draw):
    n = draw(st.integers(1, 200))
    if draw(st.booleans()):
        return draw(st.lists(ids, min_size=n, max_size=n))
    start = draw(ids)
    step = draw(st.sampled_from([1, 1, 2, 3, 1023, 1024, 1025, -1, -3, 0]))
    return [min(max(start + i * step, 0), MAX_ENTRY_ID) for i in range(n)]


class IndexMachine(RuleBasedStateMachine):
    """Ledger indexes against {ledger: {entry id: location}}; ``durable`` is what the files hold."""

    @initialize(page_limit=st.sampled_from([16, 17, 64, 8192]))
    def setup(self, page_limit):
        self.root = tempfile.mkdtemp(prefix="idxmodel-")
        self.page_limit = page_limit
        self.cache = ni.IndexCache(self.root, page_limit)
        self.idx = {}
        self.model = {k: {} for k in LEDGERS}
        self.header = {k: (None, False, 0, -1, None) for k in LEDGERS}
        self.durable = {k: ({}, (None, False, 0, -1, None)) for k in LEDGERS}
        self.on_disk = {k: False for k in LEDGERS}
        self.top = {k: -1 for k in LEDGERS}       # the highest id ever set (scans walk to it)

    def teardown(self):
        if hasattr(self, "root"):
            shutil.rmtree(self.root, ignore_errors=True)

    def index(self, key):
        if key not in self.idx:
            self.idx[key] = self.cache.open(key[0], key[1], self.on_disk[key])
            if self.on_disk[key]:
                m = self.idx[key]
                assert (m.master_key, m.fenced, m.term, m.explicit_lac,
                        m.lac_body) == self.header[key]
        return self.idx[key]

    # -- rules --------------------------------------------------------------------------------

    @rule(key=st.sampled_from(LEDGERS), data=st.data())
    def set_locations(self, key, data):
        eids = data.draw(id_runs())
        locs = data.draw(st.lists(locations, min_size=len(eids), max_size=len(eids)))
        self.index(key).set_locations(np.array(eids, dtype=np.int64), np.array(locs, dtype=np.uint64))
        m = self.model[key]
        for e, loc in zip(eids, locs):
            if loc:
                m[e] = loc
            else:
                m.pop(e, None)          # location 0: no entry
        self.top[key] = max(self.top[key], max(eids))

    @rule(key=st.sampled_from(LEDGERS), data=st.data())
    def set_bad_ids(self, key, data):
        """An id outside 0..MAX_ENTRY_ID anywhere in a call: refused, nothing written."""
        eids = data.draw(id_runs())
        at = data.draw(st.integers(0, len(eids)))
        eids.insert(at, data.draw(bad_ids))
        idx = self.index(key)
        before = ({p: v.copy() for p, v in idx.pages.items()}, set(idx.dirty_pages))
        with pytest.raises(EmbedlogError):
            idx.set_locations(np.array(eids, dtype=np.int64), np.full(len(eids), 7, dtype=np.uint64))
        after = ({p: v.copy() for p, v in idx.pages.items()}, set(idx.dirty_pages))
        assert before[1] == after[1] and before[0].keys() == after[0].keys()
        assert all(np.array_equal(before[0][p], after[0][p]) for p in before[0])

    @rule(key=st.sampled_from(LEDGERS))
    def mismatched_lengths(self, key):
        with pytest.raises(EmbedlogError):
            self.index(key).set_locations(np.arange(3, dtype=np.int64), np.ones(2, dtype=np.uint64))

    @rule(key=st.sampled_from(LEDGERS), lo=st.one_of(ids, st.integers(-5, 0)),
          hi=st.one_of(ids, st.just(0x7FFFFFFFFFFFFFFF)))
    def clear_range(self, key, lo, hi):
        if min(hi, self.top[key]) // PER_PAGE - max(lo, 0) // PER_PAGE > 4 * PER_PAGE:
            return                      # walks every page between: too slow for a test step
        self.index(key).clear_range(lo, hi)
        m = self.model[key]
        for e in [e for e in m if lo <= e <= hi]:
            del m[e]

    @rule(key=st.sampled_from(LEDGERS), mk=st.one_of(st.none(), st.binary(max_size=64)),
          fenced=st.booleans(), term=st.integers(0, U64), lac=st.integers(-1, MAX_ENTRY_ID),
          body=st.one_of(st.none(), st.binary(min_size=16, max_size=ni.MAX_LAC_BODY)))
    def set_header(self, key, mk, fenced, term, lac, body):
        idx = self.index(key)
        idx.master_key, idx.fenced, idx.term, idx.explicit_lac = mk, fenced, term, lac
        idx.lac_body = body
        idx.header_dirty = True
        self.header[key] = (mk, fenced, term, lac, body)

    @rule(key=st.sampled_from(LEDGERS), sync=st.booleans())
    def flush(self, key, sync):
        if key in self.idx:
            self.idx[key].flush(sync)
            if self.idx[key].deleted:
                return
            if os.path.exists(self.idx[key].path):
                self.on_disk[key] = True
                self.durable[key] = (dict(self.model[key]), self.header[key])

    @rule()
    def trim(self):
        self.cache.trim()
        assert self.cache.loaded <= max(self.page_limit, 16) or any(
            i.dirty_pages for i in self.idx.values())

    @rule(key=st.sampled_from(LEDGERS))
    def delete(self, key):
        self.index(key).delete()
        del self.idx[key]
        self.model[key] = {}
        self.header[key] = (None, False, 0, -1, None)
        self.durable[key] = ({}, self.header[key])
        self.on_disk[key] = False
        self.top[key] = -1

    @rule(flush_first=st.booleans(), page_limit=st.sampled_from([16, 64, 8192]))
    def reopen(self, flush_first, page_limit):
        """A new cache over the same files (a restart): what the last flushes wrote is there."""
        for key, idx in self.idx.items():
            if flush_first:
                self.flush(key, True)
        self.cache = ni.IndexCache(self.root, page_limit)
        self.page_limit = page_limit
        self.idx = {}
        for key in LEDGERS:
            self.model[key] = dict(self.durable[key][0])
            self.header[key] = self.durable[key][1]

    # -- what the model holds reads back --------------------------------------------------------

    @invariant()
    def reads_match(self):
        if not hasattr(self, "root"):
            return
        for key, m in self.model.items():
            if key not in self.idx and not self.on_disk[key]:
                continue
            idx = self.index(key)
            probe = sorted(m)[:300] + sorted(m)[-50:]
            want = [m[e] for e in probe]
            got = [idx.get_location(e) for e in probe]
            assert got == want, key
            for e in (0, 1, PER_PAGE, FAR, MAX_ENTRY_ID, -1):
                assert idx.get_location(e) == m.get(e, 0)
            if probe:
                e = np.array(probe, dtype=np.int64)
                loc = np.array(want, dtype=np.uint64)
                assert idx.match_locations(e, loc).all()
                assert not idx.match_locations(e, loc ^ np.uint64(1)).any()
            if self.top[key] < FAR and idx.max_page_on_disk < FAR // PER_PAGE:
                assert idx.entry_ids() == sorted(m)
                assert idx.last_entry_id() == (max(m) if m else -1)


TestIndexModel = IndexMachine.TestCase
TestIndexModel.settings = MACHINE


def test_flush_header_keeps_the_lac_body_and_leaves_the_pages(tmp_path):
    """flush_header makes the header (a WRITE_LAC body with it) durable alone: a reopen has
    the body and only the locations the last full flush wrote. Bodies outside 16 ..
    MAX_LAC_BODY bytes are refused before anything is written."""
    from embedlog.errors import CorruptedDataError, IllegalOpError
    idx = ni.IndexCache(str(tmp_path), 64).open(0, 7, False)
    idx.set_locations(np.array([0, 1], dtype=np.int64), np.array([11, 12], dtype=np.uint64))
    idx.flush(True)
    idx.set_locations(np.array([2], dtype=np.int64), np.array([13], dtype=np.uint64))
    body = (7).to_bytes(8, "big") + (2).to_bytes(8, "big") + b"\x01\x02\x03\x04"
    idx.explicit_lac, idx.lac_body = 2, body
    assert idx.flush_header()
    again = ni.IndexCache(str(tmp_path), 64).open(0, 7, True)
    assert (again.explicit_lac, again.lac_body) == (2, body)
    assert [again.get_location(e) for e in range(3)] == [11, 12, 0]
    for bad in (b"x" * 15, b"x" * (ni.MAX_LAC_BODY + 1)):
        idx.lac_body = bad
        with pytest.raises(IllegalOpError):
            idx.flush_header()
    assert ni.IndexCache(str(tmp_path), 64).open(0, 7, True).lac_body == body
    with open(idx.path, "r+b") as f:          # a length out of range under a good checksum
        h = bytearray(f.read(ni.HEADER_SIZE))
        h[112:116] = (ni.MAX_LAC_BODY + 1).to_bytes(4, "big")
        h[1020:1024] = crc32c(bytes(h[:1020])).to_bytes(4, "big")
        f.seek(0)
        f.write(h)
    with pytest.raises(CorruptedDataError, match="LAC body length"):
        ni.IndexCache(str(tmp_path), 64).open(0, 7, True)


def test_a_flush_writes_runs_of_adjacent_pages_as_they_lie(tmp_path):
    """Adjacent dirty pages go out in one pwritev per run (at most 512 pages each): a run
    longer than that, a hole, a lone far page and a short last page land byte for byte
    where a page at a time put them (entry e's location at byte 1024 + 8 e)."""
    cache = ni.IndexCache(str(tmp_path), 8192)
    idx = cache.open(0, 9, False)
    dense = np.arange(0, 1300 * PER_PAGE, dtype=np.int64)          # pages 0..1299
    far = np.arange(1400 * PER_PAGE + 5, 1400 * PER_PAGE + 9, dtype=np.int64)
    last = np.array([2000 * PER_PAGE + 3], dtype=np.int64)          # a short last page
    eids = np.concatenate([dense, far, last])
    locs = (eids.astype(np.uint64) * np.uint64(7919)) | np.uint64(1 << 40)
    idx.set_locations(eids, locs)
    assert idx.flush(True)
    path = idx.path
    data = np.fromfile(path, dtype="<u8", offset=1024)
    assert len(data) == int(last[0]) + 1                             # up to the last location
    want = np.zeros(len(data), dtype=np.uint64)
    want[eids] = locs
    assert np.array_equal(data, want)
    again = ni.IndexCache(str(tmp_path), 8192).open(0, 9, True)
    for e in (0, PER_PAGE * 512 - 1, PER_PAGE * 512, PER_PAGE * 1024, int(dense[-1]),
              int(far[0]), int(last[0])):
        assert again.get_location(e) == int(want[e])
    assert again.get_location(1350 * PER_PAGE) == 0                  # the hole


def test_bytes_written_counts_each_write_of_a_page_and_header(tmp_path):
    """What the index costs the disk: a flush returns, and the cache sums, the header and
    each dirty page from its start to its highest location, as often as it is written
    (a page filled over two checkpoints counts twice), not what the file's size says."""
    cache = ni.IndexCache(str(tmp_path), 64)
    idx = cache.open(0, 11, False)
    idx.set_locations(np.arange(10, dtype=np.int64), np.arange(1, 11, dtype=np.uint64))
    assert idx.flush(True) == 1024 + 10 * 8
    assert idx.flush(True) == 0                                   # nothing dirty
    idx.set_locations(np.arange(10, 15, dtype=np.int64), np.arange(11, 16, dtype=np.uint64))
    assert idx.flush(False) == 1024 + 15 * 8                      # the page again, from its start
    assert idx.flush_header()
    assert cache.bytes_written == (1024 + 80) + (1024 + 120) + 1024
    assert os.path.getsize(idx.path) == 1024 + 120                # what a file size would say
    other = cache.open(0, 12, False)
    other.set_locations(np.array([PER_PAGE + 1], dtype=np.int64), np.array([9], dtype=np.uint64))
    assert other.flush(True) == 1024 + 16                         # page 1, up to its slot 1
    assert cache.bytes_written == 1024 * 4 + 200 + 16
