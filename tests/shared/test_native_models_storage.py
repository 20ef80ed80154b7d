"""Model-based tests of the entry logs and the reader (issue 25, item 3).

A hypothesis state machine builds what a bookie's ledger storage is made of, from the native
parts alone: two memtables (one active, one being flushed), ``EntryLogger`` (small logs, so
they roll and seal often), an ``IndexCache`` with its ``LedgerIndex`` per ledger, and a
``LedgerReader`` per read. Entries are added with ``add_encoded_entries`` in any id pattern
(gaps, descending, re-adds, ids at the top of 0..MAX_ENTRY_ID), flushed into the entry logs
(``flush_memtable``, locations into the index), rolled, and everything reopened from disk.
A dict is the model: read_entry, read_batch, read_arrays, the entry logs' read_encoded and
the sealed logs' ledgers maps must agree with it byte for byte, wherever the entries are.

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

from embedlog._native import entrylog as nel
from embedlog._native import entrylogger as nelg
from embedlog._native import format as nf
from embedlog._native import index as ni
from embedlog._native import journal_buffer as jbuffer, journal_kernels as jkernels
from embedlog._native import memtable as nm
from embedlog._native.format import MAX_ENTRY_ID
from embedlog._native.reader import LedgerReader
from embedlog.errors import EmbedlogError, NoSuchEntryError

EXAMPLES = int(os.environ.get("EMBEDLOG_HYPOTHESIS_EXAMPLES", "0"))
MACHINE = settings(max_examples=EXAMPLES or 15, stateful_step_count=20, deadline=None,
                   derandomize=not EXAMPLES, report_multiple_bugs=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

U64 = (1 << 64) - 1
MAC_KEY = nf.mac_key(b"pw")
# (scope, ledger, digest): V1 and V2 entries, every digest
LEDGERS = [(0, 1, nf.digest_code("crc32c")), (0, 9, nf.digest_code("crc32")),
           (5, 1, nf.digest_code("dummy")), (U64, U64, nf.digest_code("mac"))]

eids = st.one_of(st.integers(0, 2100), st.integers(0, 2100),
                 st.integers(MAX_ENTRY_ID - 1100, MAX_ENTRY_ID))


@st.composite
def id_patterns(draw):
    n = draw(st.integers(1, 80))
    if draw(st.booleans()):
        return draw(st.lists(eids, min_size=n, max_size=n))
    start = draw(eids)
    step = draw(st.sampled_from([1, 1, 1, 2, 3, 64, 65, -1, -2, 0]))
    return [min(max(start + i * step, 0), MAX_ENTRY_ID) for i in range(n)]


class StorageMachine(RuleBasedStateMachine):

    @initialize(log_size=st.sampled_from([4096, 8192, 1 << 16, 1 << 20]),
                mt_limit=st.sampled_from([2048, 8192, 1 << 20]),
                page_limit=st.sampled_from([16, 8192]))
    def setup(self, log_size, mt_limit, page_limit):
        self.dir = tempfile.mkdtemp(prefix="storemodel-")
        self.logs_dir = os.path.join(self.dir, "logs")
        self.idx_dir = os.path.join(self.dir, "current")
        os.makedirs(self.logs_dir)
        os.makedirs(self.idx_dir)
        self.log_size, self.mt_limit, self.page_limit = log_size, mt_limit, page_limit
        self.active, self.other = nm.MemTable(mt_limit), nm.MemTable(mt_limit)
        self.jb = jbuffer.JournalBuffer(4096)
        self.el = nelg.EntryLogger(self.logs_dir, log_size)
        self.cache = ni.IndexCache(self.idx_dir, page_limit)
        self.idx = {}
        self.on_disk = set()
        self.model = {(s, l): {} for s, l, _d in LEDGERS}     # eid -> encoded entry
        self.durable = {(s, l): {} for s, l, _d in LEDGERS}   # what a reopen finds
        self.flushed = {(s, l): {} for s, l, _d in LEDGERS}   # in the logs, index not synced
        self.version = 0

    def teardown(self):
        if hasattr(self, "dir"):
            self.el.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def index(self, key):
        if key not in self.idx:
            self.idx[key] = self.cache.open(key[0], key[1], key in self.on_disk)
        return self.idx[key]

    def entry(self, scope, lid, digest, eid, size):
        self.version += 1
        stamp = self.version.to_bytes(4, "big")
        payload = (stamp * (size // 4 + 1))[:size]
        return nf.encode_entry(scope, lid, eid, -1, 0, digest, payload,
                               MAC_KEY if digest == nf.digest_code("mac") else None)

    def flush_memtable(self, mt):
        """Write a memtable to the entry logs and its locations to the index, then clear it."""
        def on_location(scope, lid, eids_, locs):
            self.index((scope, lid)).set_locations(eids_, locs)
        # what is in the memtable now moves to the logs: the model does not change
        for s, l, e, _off, _size, _where in mt.sorted_records().tolist():
            self.flushed[(s, l)][e] = mt.get_encoded(s, l, e)
        self.el.flush_memtable(mt, on_location)
        mt.clear()

    # -- rules --------------------------------------------------------------------------------

    @rule(data=st.data(), ledger=st.sampled_from(LEDGERS), many=st.booleans())
    def add(self, data, ledger, many):
        room = min(self.mt_limit, self.log_size - 1024 - 4 - 512) - 70
        sizes = st.one_of(st.integers(0, 100), st.integers(0, room))
        entries = []
        for eid in data.draw(id_patterns()):
            s, l, d = data.draw(st.sampled_from(LEDGERS)) if many else ledger
            entries.append(self.entry(s, l, d, eid, data.draw(sizes)))
        done = 0
        while done < len(entries):
            n = jkernels.add_encoded_entries(self.jb, self.active, entries, done)
            for e in entries[done:done + n]:
                _v, s, l, eid = nf.parse_entry_header(e)[:4]
                self.model[(s, l)][eid] = e
            done += n
            self.jb.clear()
            if done < len(entries):
                assert n or not self.active.is_empty()
                self.swap_and_flush()

    @rule()
    def swap_and_flush(self):
        """The bookie's flush: the active memtable becomes the flushing one, a new one takes adds
        (the previous flush ends first: the active memtable always holds the newest adds)."""
        self.flush_memtable(self.other)
        self.active, self.other = self.other, self.active
        self.flush_memtable(self.other)

    @rule()
    def swap_only(self):
        """Entries in the other memtable (being flushed) are read from there. The reader is
        handed (active, other), newest first; the bookie hands it (mt_a, mt_b) whichever is
        active, which differs only for an id re-added with other bytes during a flush."""
        if self.other.is_empty():
            self.active, self.other = self.other, self.active

    @rule()
    def roll(self):
        self.el.roll()

    @rule()
    def checkpoint(self):
        """Everything flushed so far made durable: logs synced, index pages written."""
        self.el.flush()
        for key, idx in self.idx.items():
            idx.flush()
            if os.path.exists(idx.path):
                self.on_disk.add(key)
        for key, m in self.flushed.items():
            self.durable[key].update(m)
            m.clear()

    @rule(flush=st.booleans())
    def reopen(self, flush):
        """A restart: the memtables are gone (their journal is not modelled here), what the
        last checkpoint made durable is read back from a new logger and a new index cache."""
        if flush:
            self.flush_memtable(self.other)
            self.flush_memtable(self.active)
            self.checkpoint()
        self.el.close()
        self.el = nelg.EntryLogger(self.logs_dir, self.log_size)
        self.cache = ni.IndexCache(self.idx_dir, self.page_limit)
        self.idx = {}
        self.active, self.other = nm.MemTable(self.mt_limit), nm.MemTable(self.mt_limit)
        for key in self.model:
            self.model[key] = dict(self.durable[key])
            self.flushed[key].clear()

    # -- what the model holds reads back --------------------------------------------------------

    def reader(self, s, l, d, lac):
        return LedgerReader(self.active, self.other, self.el, self.index((s, l)), s, l, d,
                            MAC_KEY if d == nf.digest_code("mac") else None, lac)

    @rule(ledger=st.sampled_from(LEDGERS), data=st.data())
    def read_ranges(self, ledger, data):
        s, l, d = ledger
        m = self.model[(s, l)]
        if not m:
            return
        lac = max(m)
        r = self.reader(s, l, d, lac)
        first = data.draw(st.sampled_from(sorted(m)))
        last = min(first + data.draw(st.integers(0, 300)), lac)
        present = [e in m for e in range(first, last + 1)]
        if all(present):
            want = [nf.decode_entry(m[e], s, l, e, d, r_mac(d)) for e in range(first, last + 1)]
            assert r.read_batch(first, last) == want
            offsets, values = r.read_arrays(first, last)
            assert [bytes(values[offsets[i]:offsets[i + 1]]) for i in range(len(want))] == want
        else:
            with pytest.raises(NoSuchEntryError):
                r.read_batch(first, last)
            with pytest.raises(NoSuchEntryError):
                r.read_arrays(first, last)
        with pytest.raises(EmbedlogError):
            r.read_batch(lac, lac + 1)          # past the LAC
        with pytest.raises(EmbedlogError):
            r.read_entry(-1)

    @invariant()
    def every_entry_reads_back(self):
        if not hasattr(self, "dir"):
            return
        for s, l, d in LEDGERS:
            m = self.model[(s, l)]
            if not m:
                continue
            r = self.reader(s, l, d, max(m))
            for e, enc in m.items():
                assert r.read_entry(e) == nf.decode_entry(enc, s, l, e, d, r_mac(d)), (s, l, e)
            idx = self.index((s, l))
            for e, enc in list(m.items())[:100]:
                if self.active.contains(s, l, e) or self.other.contains(s, l, e):
                    continue
                assert self.el.read_encoded(idx.get_location(e)) == enc
            for e in (0, 1, 2000, MAX_ENTRY_ID):
                if e not in m and e <= max(m):
                    with pytest.raises(NoSuchEntryError):
                        r.read_entry(e)

    @invariant()
    def sealed_logs_are_whole(self):
        if not hasattr(self, "dir"):
            return
        for log_id in self.el.log_ids():
            if self.el.current is not None and log_id == self.el.current.log_id:
                continue
            m = nel.MappedLog.open_existing(self.el.path_of(log_id), log_id)
            try:
                lm = m.ledgers_map()
                if lm is not None:
                    assert lm == m.scanned_ledgers()
                    assert m.damaged_blocks() == []
                for loc, enc in m.scan():
                    assert m.read_at(loc) == enc
            finally:
                m.close()


def r_mac(d):
    return MAC_KEY if d == nf.digest_code("mac") else None


TestStorageModel = StorageMachine.TestCase
TestStorageModel.settings = MACHINE
