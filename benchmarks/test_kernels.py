"""Kernel benchmarks (pytest-benchmark): `python -m pytest benchmarks/test_kernels.py`.

Each kernel works on 1000 entries of 100 B built before timing, so figures read as
"µs per 1000 entries". Peers for the same work (google-crc32c, zlib) sit in the same
group, so a ratio comes out of one run.
"""
import os
import random
import zlib

import google_crc32c
import numpy as np
import pytest

from embedlog._native import format as fmt
from embedlog._native import index as nix
from embedlog._native import journal_buffer as jbuffer, journal_kernels as jkernels
from embedlog._native import memtable as nmt

N = 1000
PAYLOADS = [os.urandom(100) for _ in range(N)]
ENCODED = [fmt.encode_entry(0, 1, i, i - 1, 100 * (i + 1), "crc32c", p) for i, p in enumerate(PAYLOADS)]


@pytest.mark.benchmark(group="encode_1000x100B")
def test_encode_journal_and_memtable(benchmark):
    # a bookie's memtable (64 MiB, reused after each flush): the steady state, not the
    # first touch of fresh memory
    jb, mt = jbuffer.JournalBuffer(1 << 20), nmt.MemTable(64 << 20)
    state = {"eid": 0}

    def run():
        n, _ = jkernels.add_payloads(jb, mt, 0, 1, state["eid"], -1, 0, 3, None, PAYLOADS, 0, 1 << 20)
        state["eid"] += n
        jb.clear()
        if n < N:
            mt.clear()

    benchmark(run)


@pytest.fixture
def bookie_ledger(tmp_path):
    """A bookie with one ledger; its group commit never syncs during the benchmark (nobody
    waits), so the figures are the add path alone: checks, framing, memtable."""
    import embedlog
    log = embedlog.open(tmp_path, journal_sync_data=False)
    w = log.create_ledger(digest="crc32c")
    yield log.bookie, w.ledger_id, fmt.master_key(b"")
    log.close()


@pytest.mark.benchmark(group="add_path_per_call")
def test_add_path_one_entry_per_call(benchmark, bookie_ledger):
    """The fixed cost of one call of the bookie's add path (µs per call), one entry."""
    bookie, lid, key = bookie_ledger
    state = {"eid": 0, "length": 0}
    one = PAYLOADS[:1]

    def run():
        _seq, state["length"] = bookie.add_payloads(lid, key, state["eid"], -1, state["length"],
                                                    3, None, one)
        state["eid"] += 1
    benchmark(run)


@pytest.mark.benchmark(group="add_path_per_call")
def test_add_path_1000_entries_per_call(benchmark, bookie_ledger):
    """The same path with 1000 x 100 B per call: µs per call = ns per entry."""
    bookie, lid, key = bookie_ledger
    state = {"eid": 0, "length": 0}

    def run():
        _seq, state["length"] = bookie.add_payloads(lid, key, state["eid"], -1, state["length"],
                                                    3, None, PAYLOADS)
        state["eid"] += N
    benchmark(run)


@pytest.mark.benchmark(group="encode_1000x100B")
def test_encode_entry_one_call_each(benchmark):
    benchmark(lambda: [fmt.encode_entry(0, 1, i, -1, 0, "crc32c", p) for i, p in enumerate(PAYLOADS)])


@pytest.mark.benchmark(group="decode_1000x100B")
def test_decode_entry(benchmark):
    benchmark(lambda: [fmt.decode_entry(e, 0, 1, i, 3) for i, e in enumerate(ENCODED)])


@pytest.mark.benchmark(group="crc32c_1000x132B")
def test_crc32c_native(benchmark):
    benchmark(lambda: [fmt.crc32c(e) for e in ENCODED])


@pytest.mark.benchmark(group="crc32c_1000x132B")
def test_crc32c_google(benchmark):
    benchmark(lambda: [google_crc32c.value(e) for e in ENCODED])


@pytest.mark.benchmark(group="crc32_1000x132B")
def test_crc32_native(benchmark):
    benchmark(lambda: [fmt.crc32(e) for e in ENCODED])


@pytest.mark.benchmark(group="crc32_1000x132B")
def test_crc32_zlib(benchmark):
    benchmark(lambda: [zlib.crc32(e) for e in ENCODED])


@pytest.mark.benchmark(group="memtable_1000")
def test_memtable_insert(benchmark):
    mt = nmt.MemTable(1 << 30)

    def run():
        for e in ENCODED:
            mt.add_encoded(e)
        mt.clear()

    benchmark(run)


@pytest.mark.benchmark(group="memtable_1000")
def test_memtable_lookup(benchmark):
    mt = nmt.MemTable(1 << 30)
    for e in ENCODED:
        mt.add_encoded(e)
    benchmark(lambda: [mt.get_encoded(0, 1, i) for i in range(N)])


@pytest.mark.benchmark(group="index_lookup_1000")
def test_index_lookup(benchmark, tmp_path):
    cache = nix.IndexCache(str(tmp_path), 1024)
    idx = cache.open(0, 1, False)
    eids = np.arange(100_000, dtype=np.int64)
    idx.set_locations(eids, eids.astype(np.uint64) + (1 << 32))
    picks = [random.randrange(100_000) for _ in range(N)]
    get = idx.get_location
    benchmark(lambda: [get(i) for i in picks])


@pytest.fixture(scope="module")
def scanned_ledger(tmp_path_factory):
    """One ledger of 125,000 x 100 B in the entry logs (checkpointed), warm in the page cache."""
    import embedlog
    log = embedlog.open(tmp_path_factory.mktemp("scan"))
    w = log.create_ledger(digest="crc32c")
    for _ in range(125):
        w.append_many(PAYLOADS)
    w.close()
    log.bookie.checkpoint()
    r = log.open_ledger(w.ledger_id)
    r.read_batch(0, 124_999)
    yield r
    log.close()


@pytest.mark.benchmark(group="scan_125k_x_100B")
def test_scan_read_batch(benchmark, scanned_ledger):
    benchmark(scanned_ledger.read_batch, 0, 124_999)


@pytest.mark.benchmark(group="scan_125k_x_100B")
def test_scan_read_arrays(benchmark, scanned_ledger):
    benchmark(scanned_ledger.read_arrays, 0, 124_999)


@pytest.mark.benchmark(group="point_reads_1000_of_125k")
def test_point_reads_random(benchmark, scanned_ledger):
    """read_entry of 1000 random entries of the checkpointed ledger (the index pages and
    entry logs warm): two dependent cache misses each, as in a bare C loop's reads."""
    rnd = random.Random(3)
    picks = [rnd.randrange(125_000) for _ in range(N)]
    read = scanned_ledger.read_entry
    benchmark(lambda: [read(e) for e in picks])
