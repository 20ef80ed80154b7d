"""A journal that lost a file, a damaged LastLogMark, a zeroed length in the middle: the
bookie refuses to start naming the file, or falls back loudly; it never opens short."""
import os

import pytest

import embedlog
from embedlog.bookie.journal_files import journal_ids
from embedlog.errors import CorruptedDataError, JournalCorruptedError
from support.crashutil import abandon, journal_records, newest_journal

CFG = dict(journal_pre_alloc_size_mb=1, flush_interval_ms=0, journal_max_size_mb=1)


def write(path, n, size=20_000, start=0, **cfg):
    """Append n entries to a new ledger, then crash (no checkpoint): all of it is journal."""
    log = embedlog.open(path, **{**CFG, **cfg})
    w = log.create_ledger()
    for i in range(start, start + n):
        w.append(b"%06d" % i + bytes(size))
    lid = w.ledger_id
    abandon(log)
    return lid


def journals(path):
    jdir = os.path.join(path, "journal")
    return [os.path.join(jdir, "%x.txn" % i) for i in journal_ids(jdir)]


def test_a_missing_journal_between_two_others_stops_start_up(tmp_path):
    lid = write(tmp_path, 150)                        # 3 MB over 1 MB journals
    files = journals(tmp_path)
    assert len(files) >= 3
    os.unlink(files[1])
    with pytest.raises(JournalCorruptedError, match=os.path.basename(files[1])):
        embedlog.open(tmp_path, **CFG)
    # an operator accepts the loss: the bookie starts and says what was lost
    with embedlog.open(tmp_path, journal_allow_missing_files=True, **CFG) as log:
        assert os.path.basename(files[1]) in " ".join(log.bookie.replay_report["missing_files"])
        assert log.bookie.has_ledger(lid)


def test_the_newest_journal_missing_stops_start_up(tmp_path):
    write(tmp_path, 150)
    newest = journals(tmp_path)[-1]
    os.unlink(newest)
    with pytest.raises(JournalCorruptedError, match=os.path.basename(newest)):
        embedlog.open(tmp_path, **CFG)


def test_the_journal_the_mark_points_into_missing_stops_start_up(tmp_path):
    import struct
    lid = write(tmp_path, 150)                       # the mark is in the first of 3+ journals
    mark_id = struct.unpack(">Q", (tmp_path / "current" / "lastMark").read_bytes()[:8])[0]
    mark_file = os.path.join(tmp_path, "journal", "%x.txn" % mark_id)
    assert journals(tmp_path).index(mark_file) < len(journals(tmp_path)) - 2
    os.unlink(mark_file)
    with pytest.raises(JournalCorruptedError, match="LastLogMark"):
        embedlog.open(tmp_path, **CFG)
    with embedlog.open(tmp_path, journal_allow_missing_files=True, **CFG) as log:
        assert log.bookie.has_ledger(lid)


@pytest.mark.parametrize("dirs", [1, 2])
def test_a_damaged_last_mark_falls_back_loudly_and_loses_nothing(tmp_path, dirs, caplog):
    cfg = dict(CFG, ledger_directories=",".join(str(tmp_path / f"l{i}") for i in range(dirs)))
    with embedlog.open(tmp_path / "b", **cfg) as log:
        w = log.create_ledger()
        for i in range(50):
            w.append(b"%04d" % i)
        w.close()
        lid = w.ledger_id
    mark = tmp_path / "l0" / "current" / "lastMark"
    data = mark.read_bytes()
    mark.write_bytes(data[:7])                          # 7 bytes: the case
    with caplog.at_level("ERROR"), embedlog.open(tmp_path / "b", **cfg) as log:
        report = log.bookie.replay_report
        assert report["damaged_marks"] and str(mark) in report["damaged_marks"][0]
        assert report["mark"] == ((0, 0) if dirs == 1 else report["mark"])
        assert log.open_ledger(lid).read_batch(0, 49) == [b"%04d" % i for i in range(50)]
    assert any("damaged LastLogMark" in r.getMessage() for r in caplog.records)
    with embedlog.open(tmp_path / "b", **cfg) as log:     # a good mark was written again
        assert not log.bookie.replay_report["damaged_marks"]


def test_a_zeroed_length_in_the_middle_is_corruption_not_the_end(tmp_path):
    lid = write(tmp_path, 30, size=100, journal_max_size_mb=64)
    path = newest_journal(tmp_path)
    records, _end, _status = journal_records(path)
    off = records[len(records) // 2][0]
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(bytes(4))                               # the record's length field
    with pytest.raises(JournalCorruptedError, match=f"{os.path.basename(path)} is corrupt at offset {off}"):
        embedlog.open(tmp_path, journal_max_size_mb=64, **{k: v for k, v in CFG.items()
                                                           if k != "journal_max_size_mb"})
    with embedlog.open(tmp_path, journal_skip_corrupt_records=True, **CFG) as log:
        # the records after the zeroed one were replayed (only that one is lost)
        assert log.bookie.replay_report["skipped"]
        assert log.bookie.read_last_entry_id(lid) == 29


@pytest.mark.parametrize("layout", [1, 2])
def test_a_journal_cut_before_the_last_mark_is_named_not_a_bare_value_error(tmp_path, layout):
    # a checkpoint wrote the mark into the journal; the file is then cut below the mark.
    # Was: ValueError: madvise start out of bounds
    import struct
    CFG = dict(globals()["CFG"], storage_layout=layout)
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        for i in range(40):
            w.append(b"%06d" % i + bytes(1000))
        w.close()
    mark_id, mark_off = struct.unpack(">QQ", (tmp_path / "current" / "lastMark").read_bytes()[:16])
    path = os.path.join(tmp_path, "journal", "%x.txn" % mark_id)
    assert mark_off > 8192
    os.truncate(path, 4096)
    with pytest.raises(JournalCorruptedError, match=f"{path} ends at offset 4096, before the "
                                                    f"LastLogMark's offset {mark_off}"):
        embedlog.open(tmp_path, **CFG)
    with embedlog.open(tmp_path, journal_skip_corrupt_records=True, **CFG) as log:
        # the operator accepts the loss: entries before the mark were checkpointed, so none is
        assert (path, 4096, mark_off - 4096) in log.bookie.replay_report["skipped"]
        r = log.open_ledger(w.ledger_id)
        if layout == 1:
            assert r.read_batch(0, 39) == [b"%06d" % i + bytes(1000) for i in range(40)]
        else:
            # layout 2: the cut took the entries' only copy; reads say so, never serve bytes
            assert r.read_entry(0) == b"%06d" % 0 + bytes(1000)      # below 4096: kept
            with pytest.raises(CorruptedDataError):
                r.read_entry(39)
