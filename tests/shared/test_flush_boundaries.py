"""A memtable flush (entrylogger.flush_memtable) frames each ledger's run of entries into a
staging buffer of STAGE_BYTES (4 MiB), one pwrite each, and rolls to a new log where a run
does not fit. Each boundary (two ledgers' entries taken turn about, re-added entries, the
stage's size, an entry at or past it, the end of a log) must land every entry where its
location says, in the logs as written and as a reopen scans them."""
import pytest

from embedlog._native import entrylogger as nelg
from embedlog._native import format as nf
from embedlog._native import journal_buffer as jbuffer, journal_kernels as jkernels
from embedlog._native import memtable as nm

CRC = nf.digest_code("crc32c")


def entry(lid: int, eid: int, size: int, stamp: int = 0) -> bytes:
    payload = (b"%d.%d.%d|" % (lid, eid, stamp) * (size // 8 + 1))[:size]
    return nf.encode_entry(0, lid, eid, -1, 0, CRC, payload, None)


def flush_and_check(tmp_path, entries, mt_limit=64 << 20, log_size=256 << 20):
    mt = nm.MemTable(mt_limit)
    jb = jbuffer.JournalBuffer()
    assert jkernels.add_encoded_entries(jb, mt, entries, 0) == len(entries)
    newest = {}
    for e in entries:                        # a re-added entry: the newest copy wins
        newest[tuple(nf.parse_entry_header(e)[1:4])] = e
    locations = {}

    def on_location(scope, lid, eids, locs):
        assert list(eids) == sorted(eids)   # a ledger's entries in id order
        for e, loc in zip(eids.tolist(), locs.tolist()):
            locations[(scope, lid, e)] = loc

    el = nelg.EntryLogger(str(tmp_path), log_size)
    written = el.flush_memtable(mt, on_location)
    assert written == sum(4 + len(e) for e in newest.values())
    assert locations.keys() == newest.keys()
    for key, e in newest.items():
        assert el.read_encoded(locations[key]) == e, key
    el.close()
    el = nelg.EntryLogger(str(tmp_path), log_size)   # the unsealed log scanned again
    try:
        for key, e in newest.items():
            assert el.read_encoded(locations[key]) == e, key
    finally:
        el.close()


def test_two_ledgers_taken_turn_about(tmp_path):
    # ledger 1's entries alternate with ledger 2's in the memtable: each ledger's run is
    # gathered from every other entry
    entries = [entry(lid, i, 100) for i in range(3000) for lid in (1, 2)]
    flush_and_check(tmp_path, entries)


def test_one_ledger_in_order_is_cut_at_the_stage_size(tmp_path):
    # 10,000 entries of 1 KiB in order: writes of at most 4 MiB
    flush_and_check(tmp_path, [entry(7, i, 1024) for i in range(10_000)])


def test_re_added_entries_are_written_once_the_newest(tmp_path):
    entries = [entry(3, i, 200, 0) for i in range(1500)]
    entries += [entry(3, i, 150, 1) for i in range(0, 1500, 3)]      # every third again
    flush_and_check(tmp_path, entries)


@pytest.mark.parametrize("big", [(4 << 20) - 200, 4 << 20, (5 << 20) + 3])
def test_an_entry_at_or_past_the_stage_size_goes_whole(tmp_path, big):
    entries = [entry(5, i, 1000) for i in range(100)]
    entries.append(entry(5, 100, big))
    entries += [entry(5, 101 + i, 1000) for i in range(100)]
    flush_and_check(tmp_path, entries)


def test_runs_that_end_a_log_roll_to_the_next(tmp_path):
    # logs of 1 MiB: a flush of 6 MiB rolls through several, each run cut at the log's room
    entries = [entry(lid, i, 3000) for i in range(700) for lid in (1, 2, 3)]
    flush_and_check(tmp_path, entries, log_size=1 << 20)
