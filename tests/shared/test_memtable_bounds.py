"""The memtable's reservations against any id pattern a client can send: gapped ids (a
striped ensemble gives every bookie ids with gaps), descending ids, many ledgers per call,
and the blocks' own memory counted against the memtable's limit."""
import pytest

from embedlog._native import format as nf
from embedlog._native import journal_buffer as jbuffer, journal_kernels as jkernels
from embedlog._native import memtable as nm

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
