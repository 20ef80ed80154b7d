"""A journal segment read in C: its entry table (GC, compaction, scrub and the shell read it)
and the runs of one ledger a trim sums into the segment's ledgers map (without the GIL:
benchmarks/produce_threads.py's served rows stalled for seconds at each trim before). Both
must agree record for record, stop at the first damaged record, and the map a trim writes
must count every byte of every entry record."""
import os

import numpy as np

import embedlog
from embedlog._native import entrylog as nel
from embedlog.bookie import journal_files as jf

from support.crash_child import payload

CONFIG = dict(storage_layout=2, skip_list_size_limit=128 << 10, journal_max_size_mb=1,
              journal_pre_alloc_size_mb=1, flush_interval_ms=100, gc_wait_time_ms=0)


def segment_of(tmp_path):
    """A journal of interleaved ledgers (runs of 1 to 7 entries each), closed: its path and
    segment number, and what was written per ledger."""
    written = {}
    with embedlog.open(tmp_path, **dict(CONFIG, journal_max_size_mb=64)) as log:
        handles = [log.create_ledger() for _ in range(3)]
        for i in range(400):
            h = handles[i % 3]
            run = [payload(h.ledger_id.qualified_name, i * 8 + k) for k in range(1 + i % 7)]
            h.append_many(run)
            written[h.ledger_id] = written.get(h.ledger_id, 0) + len(run)
        for h in handles:
            h.close()
    journal = os.path.join(tmp_path, "journal")
    (name,) = [n for n in os.listdir(journal) if n.endswith(".txn")]
    path = os.path.join(journal, name)
    return path, jf.read_segment(path), written


def table_and_runs(path, segment):
    m = nel.MappedLog.open_segment(path, (1 << 31) | segment)
    try:
        return m.entry_table(), m.ledger_runs()
    finally:
        m.close()


def per_ledger_from_table(table):
    _locs, sizes, scopes, lids, _eids = table
    out = {}
    for s, l, n in zip(scopes.tolist(), lids.tolist(), sizes.tolist()):
        out[(s, l)] = out.get((s, l), 0) + n + 9        # the record's header is 9 bytes
    return out


def per_ledger_from_runs(runs):
    out = {}
    for s, l, n in zip(*(a.tolist() for a in runs)):
        out[(s, l)] = out.get((s, l), 0) + n
    return out


def test_table_and_runs_agree_and_the_map_counts_every_record(tmp_path):
    path, segment, written = segment_of(tmp_path)
    table, runs = table_and_runs(path, segment)
    counts = {}
    for s, l in zip(table[2].tolist(), table[3].tolist()):
        counts[(s, l)] = counts.get((s, l), 0) + 1
    assert {k[1]: v for k, v in counts.items()} == \
        {lid.ledger_id: n for lid, n in written.items()}
    assert per_ledger_from_runs(runs) == per_ledger_from_table(table)
    # runs are maximal: two neighbours never name the same ledger
    keys = list(zip(runs[0].tolist(), runs[1].tolist()))
    assert all(a != b for a, b in zip(keys, keys[1:]))
    # locations are in file order and each names its record
    assert np.all(np.diff(table[0].astype(np.int64)) > 0)
    jf.write_segment_map(path, segment)
    assert jf.read_segment_map(os.path.splitext(path)[0]) == per_ledger_from_table(table)


def test_both_stop_at_the_first_damaged_record(tmp_path):
    path, segment, _written = segment_of(tmp_path)
    whole, _ = table_and_runs(path, segment)
    cut = int(whole[0][len(whole[0]) // 2]) & 0xFFFFFFFF      # a record in the middle
    with open(path, "r+b") as f:
        f.seek(cut + 20)
        byte = f.read(1)
        f.seek(cut + 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    table, runs = table_and_runs(path, segment)
    assert len(table[0]) == len(whole[0]) // 2
    assert per_ledger_from_runs(runs) == per_ledger_from_table(table)


def test_reads_in_any_order_refuse_exactly_the_damaged_records(tmp_path):
    """A segment's reads remember the records whose crcs passed (entrylog.pyx,
    _segment_check): whatever the order of the reads, a record is served iff it reads as
    good on a fresh mapping, and a damaged one never gets its bit."""
    import random
    from embedlog.errors import CorruptedDataError
    path, segment, _written = segment_of(tmp_path)
    log_id = (1 << 31) | segment
    locs = table_and_runs(path, segment)[0][0].tolist()
    rnd = random.Random(47)
    damaged = rnd.sample(range(len(locs)), 12)
    with open(path, "r+b") as f:
        for i in damaged:
            off = (locs[i] & 0xFFFFFFFF) + 9 + rnd.randrange(0, 40)     # header or payload
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ (1 << rnd.randrange(8))]))

    def read(m, loc):
        try:
            return m.read_at(loc)
        except CorruptedDataError:
            return None

    truth = []
    for loc in locs:
        m = nel.MappedLog.open_segment(path, log_id)
        try:
            truth.append(read(m, loc))
        finally:
            m.close()
    assert sum(t is None for t in truth) == len(damaged)
    for order in ("forward", "backward", "random", "random"):
        idx = list(range(len(locs)))
        if order == "backward":
            idx.reverse()
        elif order == "random":
            rnd.shuffle(idx)
        m = nel.MappedLog.open_segment(path, log_id)
        try:
            for _ in range(2):
                for i in idx:
                    assert read(m, locs[i]) == truth[i], (order, i)
            checked = set(m.segment_checked())
            assert len(checked) == len(locs) - len(damaged)
            for i in damaged:
                assert 512 + ((locs[i] & 0xFFFFFFFF) - 512) // 32 * 32 not in checked
        finally:
            m.close()


def test_a_trim_writes_each_map_from_what_the_leader_wrote_not_a_read_back(tmp_path, monkeypatch):
    """The maps of journals this process wrote come from the runs the group leader counted
    (jbuffer.LedgerRuns) without reading the segment back from the disk, and equal a walk of
    it: lone appends alternating between ledgers (more changes of ledger per file than
    RUNS_COMPACT_AT, so the runs are merged on the way), batches, and a scope's V2 entries."""
    class NoReadBack:
        class MappedLog:
            @staticmethod
            def open_segment(path, log_id):
                raise AssertionError(f"a trim read {path}, which this process wrote, back")
    monkeypatch.setattr(jf, "nel", NoReadBack)
    with embedlog.open(tmp_path, **CONFIG) as log:
        handles = [log.create_ledger() for _ in range(3)] + [log.create_ledger(scope_id=7)]
        for i in range(30_000):
            h = handles[i % 4]
            if i % 1000 == 999:
                h.append_many([payload(h.ledger_id.qualified_name, i)] * 50)
            else:
                h.append(payload(h.ledger_id.qualified_name, i)[:40])
        log.bookie.checkpoint()
        journal = os.path.join(tmp_path, "journal")
        segs = [n for n in os.listdir(journal) if n.endswith(".seg")]
        assert len(segs) >= 2
    monkeypatch.undo()
    for name in segs:
        path = os.path.join(journal, name)
        table, runs = table_and_runs(path, jf.read_segment(path))
        assert len(runs[0]) > 4096                   # the walk's runs: one per change of ledger
        assert jf.read_segment_map(os.path.splitext(path)[0]) == per_ledger_from_table(table) \
            == per_ledger_from_runs(runs)
