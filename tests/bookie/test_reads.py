"""Embedded reads: read_batch, read_arrays and read_arrow agree wherever the entries are
(memtable, entry logs, both), and every digest is checked on each path."""
import os

import pytest

import embedlog
from embedlog.errors import CorruptedDataError, DigestMismatchError, NoSuchEntryError


def payloads(n, seed=0):
    return [os.urandom((i * 37 + seed) % 300) for i in range(n)]     # sizes 0..299, some empty


def split(offsets, values):
    return [bytes(values[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]


@pytest.mark.parametrize("digest", ["crc32c", "crc32", "mac", "dummy"])
def test_every_read_path_returns_the_same_payloads_from_memtable_and_entry_logs(tmp_path, digest):
    with embedlog.open(tmp_path, flush_interval_ms=0) as log:
        w = log.create_ledger(digest=digest)
        flushed = payloads(3000, 1)
        w.append_many(flushed)
        log.bookie.checkpoint()                # these are in the entry logs now
        fresh = payloads(500, 2)
        w.append_many(fresh)                   # and these still in the memtable
        want = flushed + fresh
        r = log.open_ledger(w.ledger_id)
        assert r.read_batch(0, 3499) == want
        for lo, hi in ((0, 3499), (0, 2999), (2990, 3010), (3000, 3499), (17, 17)):
            offsets, values = r.read_arrays(lo, hi)
            assert offsets.dtype.name == "int32" and offsets[0] == 0
            assert split(offsets, values) == want[lo:hi + 1], (lo, hi)
        assert r.read_arrow(2990, 3010).to_pylist() == want[2990:3011]
        with pytest.raises(NoSuchEntryError):
            r.read_arrays(0, 3500)


@pytest.mark.parametrize("layout", [1, 2])
def test_read_arrays_checks_digests_in_the_entry_logs(tmp_path, layout):
    # layout 2: the entry's storage is its journal record, whose crc is checked first
    suffixes, error = ((".log",), DigestMismatchError) if layout == 1 else ((".txn", ".seg"), CorruptedDataError)
    with embedlog.open(tmp_path, flush_interval_ms=0, storage_layout=layout) as log:
        w = log.create_ledger(digest="crc32c")
        marker = b"find-me-" + os.urandom(24)
        w.append_many([os.urandom(64) for _ in range(10)] + [marker] + [os.urandom(64)])
        w.close()
        log.bookie.checkpoint()
        lid = w.ledger_id
    logs = [os.path.join(dp, f) for dp, _, fs in os.walk(tmp_path) for f in fs if f.endswith(suffixes)]
    for path in logs:
        data = bytearray(open(path, "rb").read())
        at = data.find(marker)
        if at >= 0:
            data[at + 3] ^= 0x10
            open(path, "r+b").write(data)
            break
    else:
        raise AssertionError("the entry was not found in any entry log")
    with embedlog.open(tmp_path, flush_interval_ms=0) as log:
        r = log.open_ledger(lid)
        assert len(split(*r.read_arrays(0, 9))) == 10
        with pytest.raises(error):
            r.read_arrays(0, 11)
        with pytest.raises(error):
            r.read_batch(5, 11)
