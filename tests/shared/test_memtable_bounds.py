"""The memtable's reservations against any id pattern a client can send: gapped ids (a
striped ensemble gives every bookie ids with gaps), descending ids, many ledgers per call,
and the blocks' own memory counted against the memtable's limit."""
import numpy as np
import pytest

from embedlog._native import format as nf
from embedlog._native import journal_buffer as jbuffer, journal_kernels as jkernels
from embedlog._native import memtable as nm
from embedlog.errors import EntryTooLargeError

CRC32C = nf.digest_code("crc32c")


def _entries(ids, lid=1, scope=0, size=100):
    return [nf.encode_entry(scope, lid if isinstance(lid, int) else lid(i), eid, -1, 0, CRC32C,
                            b"x" * size) for i, eid in enumerate(ids)]


def _add_all(jb, mt, entries):
    """What the bookie does: add until full, then (here) check and clear, and go on."""
    done, held = 0, []
    while done < len(entries):
        n = jkernels.add_encoded_entries(jb, mt, entries, done)
        held.extend(entries[done:done + n])
        if done + n < len(entries):
            assert n or not mt.is_empty()
            _check_holds(mt, held)
            mt.clear()
            held = []
        done += n
        jb.clear()
    _check_holds(mt, held)


def _check_holds(mt, entries):
    for e in entries:
        v, s, l, eid = nf.parse_entry_header(e)[:4]
        assert mt.get_encoded(s, l, eid) == e
    assert mt.used_bytes <= mt.limit_bytes or len(entries) == 1


@pytest.mark.parametrize("step", [2, 3, 64, 65, 1000])
def test_gapped_ids_stay_within_the_reservation(step):
    # the reproducer: 100 calls of 1000 entries whose ids step by 2, 3, 65...
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(256 << 20)
    eid = 0
    for _ in range(100):
        ids = list(range(eid, eid + 1000 * step, step))
        eid += 1000 * step
        _add_all(jb, mt, _entries(ids))


def test_many_ledgers_in_one_call():
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(256 << 20)
    for base in range(0, 5000, 1000):
        _add_all(jb, mt, _entries([0] * 1000, lid=lambda i, b=base: b + i + 1))


def test_descending_and_duplicate_ids():
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(1 << 20)
    ids = list(range(5000, 0, -7)) + list(range(0, 500, 3)) * 2
    _add_all(jb, mt, _entries(ids, size=10))


def test_blocks_count_against_the_limit():
    # entries 64 ids apart open a block each: a block is ~280 bytes, so a memtable of 1 MiB
    # takes far fewer of them than of consecutive ones, and never holds more than its limit
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(1 << 20)
    ids = [64 * i for i in range(20000)]
    n = jkernels.add_encoded_entries(jb, mt, _entries(ids, size=0), 0)
    assert 0 < n < 20000
    assert mt.nblocks_used == n
    assert mt.used_bytes <= mt.limit_bytes
    assert mt.allocated_bytes <= 4 * mt.limit_bytes


def test_add_payloads_counts_its_blocks():
    jb, mt = jbuffer.JournalBuffer(), nm.MemTable(1 << 16)
    payloads = [b"y" * 10] * 10000
    n, _length = jkernels.add_payloads(jb, mt, 0, 7, 0, -1, 0, CRC32C, None, payloads, 0, 1 << 20)
    assert 0 < n < 10000
    assert mt.used_bytes <= mt.limit_bytes
    for eid in range(n):
        assert mt.contains(0, 7, eid)


SEGMENT_BIT = 1 << 63


def _reference_locations(wheres, starts):
    """The numpy translation layout 2's flush used before the walk did it (journal seq + 1
    -> bit 63 | segment << 32 | offset), or None where the walk must refuse."""
    wheres = wheres.copy()
    if not wheres.all():
        return None
    pending = wheres < np.uint64(SEGMENT_BIT)
    if pending.any():
        seqs = wheres[pending] - np.uint64(1)
        if not len(starts) or int(seqs.min()) < int(starts[0, 0]):
            return None
        k = np.searchsorted(starts[:, 0], seqs, side="right") - 1
        offs = starts[k, 2] + (seqs - starts[k, 0])
        if int(offs.max()) > 0xFFFFFFFF:
            return None
        wheres[pending] = np.uint64(SEGMENT_BIT) | (starts[k, 1] << np.uint64(32)) | offs
    return wheres


@pytest.mark.parametrize("seed", range(40))
def test_the_flush_walk_locates_records_as_the_numpy_translation_did(seed):
    """MemTable.flush_wheres(starts) turns each record's journal seq into its segment
    location in its nogil walk: the same locations as the numpy passes it replaced, over
    several segments, ledgers whose seqs interleave (so the walk's guess of the segment
    misses), entries already located, and every refusal (a seq before the first segment, an
    offset past 32 bits, an entry with no journal record)."""
    rnd = np.random.default_rng(seed)
    nseg = int(rnd.integers(0, 6))
    firsts = np.sort(rnd.choice(np.arange(1, 1 << 20, dtype=np.uint64), nseg, replace=False))
    segs = rnd.integers(1, 1 << 31, nseg, dtype=np.uint64)
    offs = rnd.choice(np.array([1024, 4096], dtype=np.uint64), nseg)
    if seed % 5 == 1 and nseg:
        offs[-1] = 0xFFFFFF00          # the last segment's records past 32 bits
    starts = np.stack([firsts, segs, offs], axis=1) if nseg else np.empty((0, 3), np.uint64)
    mt = nm.MemTable(1 << 24)
    for lid in range(1, 4):
        for eid in range(int(rnd.integers(1, 300))):
            kind = rnd.random()
            if kind < 0.03 and seed % 4 == 0:
                mt.next_where = 0                                   # no journal record
            elif kind < 0.1:
                mt.next_where = SEGMENT_BIT | int(rnd.integers(0, 1 << 62))   # located
            else:
                lo = 0 if seed % 3 == 0 else int(firsts[0]) if nseg else 0
                mt.next_where = int(rnd.integers(lo, 1 << 21)) + 1  # a seq + 1
            assert mt.add_encoded(_entries([eid], lid=lid, size=10)[0])
    plain = mt.flush_wheres()
    want = _reference_locations(plain[3], starts)
    got = mt.flush_wheres(starts)
    if want is None:
        assert got is None
    else:
        assert got is not None
        for a, b in zip(got[:3], plain[:3]):
            assert np.array_equal(a, b)
        assert np.array_equal(got[3], want)


def test_the_flush_walk_of_an_empty_memtable():
    mt = nm.MemTable(1 << 20)
    for starts in (None, np.empty((0, 3), np.uint64), np.array([[5, 1, 1024]], np.uint64)):
        got = mt.flush_wheres(starts)
        assert got is not None and all(len(a) == 0 for a in got)


def test_a_refused_put_passes_its_journal_location_to_no_later_entry():
    """``next_where`` belongs to the one put it was set for: refused (the memtable full) or
    forgotten by a clear, it is gone, so a later entry given none (replay's record past a
    32-bit offset) is not indexed at another entry's record."""
    e = _entries(range(4), size=1000)
    mt = nm.MemTable(2048)                   # room for one 1 KiB entry and its block
    mt.next_where = SEGMENT_BIT | 5
    assert mt.add_encoded(e[0])
    mt.next_where = SEGMENT_BIT | 6
    assert not mt.add_encoded(e[1])          # full: refused with its location
    assert mt.flush_wheres()[3].tolist() == [SEGMENT_BIT | 5]
    mt.clear()
    assert mt.add_encoded(e[2])
    assert mt.flush_wheres()[3].tolist() == [0]
    mt.next_where = SEGMENT_BIT | 7          # set, then the memtable cleared before its put
    mt.clear()
    assert mt.add_encoded(e[3])
    assert mt.flush_wheres()[3].tolist() == [0]
    mt.next_where = SEGMENT_BIT | 8          # set, then its put refused: too large
    with pytest.raises(EntryTooLargeError):
        mt.add_encoded(_entries([9], size=4096)[0])
    assert mt.add_encoded(_entries([10], size=10)[0])
    assert sorted(mt.flush_wheres()[3].tolist()) == [0, 0]
