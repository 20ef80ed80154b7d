"""Layout 2: the journal's files are the storage of the entries they hold (docs/FORMATS.md,
"Layout 2"). Entries below the LastLogMark live only in ``.seg`` files: they must come back
after SIGKILL, a damaged record must be refused (never served), and GC must free a segment
no index names, while a layout 1 directory keeps opening as one."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import embedlog
from embedlog.bookie import journal_files
from embedlog.cli.shell import shell
from embedlog.errors import CorruptedDataError, DigestMismatchError, EmbedlogError

from support.cliutil import ROOT, SUPPORT, TESTS
from support.crash_child import payload

CONFIG = dict(storage_layout=2, skip_list_size_limit=128 << 10, journal_max_size_mb=1, journal_pre_alloc_size_mb=1,
              flush_interval_ms=100, gc_wait_time_ms=0)


def _flip_payload_byte(path: str, loc: int, mask: int) -> None:
    """XOR ``mask`` into a payload byte of the segment record at ``loc``: past the record's
    9-byte head, 60 bytes into the entry (its header and digest are before that)."""
    with open(path, "r+b") as f:
        off = (loc & 0xFFFFFFFF) + 9 + 60
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ mask]))


def files(path, suffix):
    return sorted(n for n in os.listdir(path) if n.endswith(suffix))


def entry_logs(tmp_path):
    return files(os.path.join(tmp_path, "current"), ".log")


def fill(log, n_ledgers=3, entries=600):
    handles = [log.create_ledger() for _ in range(n_ledgers)]
    for e in range(entries):
        for h in handles:
            h.append(payload(h.ledger_id.qualified_name, e))
    for h in handles:
        h.close()
    return [h.ledger_id for h in handles]


def _live_among_dead(log, n_dead, entries):
    """A ledger of ``entries`` interleaved with ``n_dead`` ledgers of 1000-byte entries (to be
    deleted), all closed and checkpointed: segments the live one alone keeps."""
    live, dead = log.create_ledger(), [log.create_ledger() for _ in range(n_dead)]
    for e in range(entries):
        live.append(payload(live.ledger_id.qualified_name, e))
        for h in dead:
            h.append(bytes(1000))
    for h in (live, *dead):
        h.close()
    log.bookie.checkpoint()
    return live, dead


def check(log, ledgers, entries=600):
    for lid in ledgers:
        got = log.open_ledger(lid).read_batch(0, entries - 1)
        assert got == [payload(lid.qualified_name, e) for e in range(entries)], lid


def test_new_directory_is_layout_2_and_writes_no_entry_log(tmp_path):
    with embedlog.open(tmp_path, **CONFIG) as log:
        assert log.bookie.layout == 2
        ledgers = fill(log)
        log.bookie.checkpoint()
        assert files(os.path.join(tmp_path, "journal"), ".seg")
        check(log, ledgers)
        assert log.bookie.storage.stats["entry_log_bytes_written"] == 0
        # each ledger's header and its 600 locations, at least once
        assert log.statistics()["index_bytes_written"] >= 3 * (1024 + 600 * 8)
    assert open(os.path.join(tmp_path, "current", "LAYOUT")).read() == "2\n"
    assert entry_logs(tmp_path) == []
    with embedlog.open(tmp_path, **CONFIG) as log:
        check(log, ledgers)


def test_layout_1_directory_keeps_opening_as_layout_1(tmp_path):
    with embedlog.open(tmp_path, **dict(CONFIG, storage_layout=1)) as log:
        assert log.bookie.layout == 1
        ledgers = fill(log)
        log.bookie.checkpoint()
    assert not os.path.exists(os.path.join(tmp_path, "current", "LAYOUT"))
    assert entry_logs(tmp_path)
    with embedlog.open(tmp_path, **CONFIG) as log:          # asked for 2: it stays 1
        assert log.bookie.layout == 1
        check(log, ledgers)
        assert files(os.path.join(tmp_path, "journal"), ".seg") == []


def test_a_lost_layout_file_is_read_from_the_journal(tmp_path, caplog):
    """Opened as layout 1, a layout 2 directory's journals would be trimmed and reused."""
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log)
        log.bookie.checkpoint()
    os.unlink(os.path.join(tmp_path, "current", "LAYOUT"))
    with embedlog.open(tmp_path, **dict(CONFIG, storage_layout=1)) as log:
        assert log.bookie.layout == 2
        check(log, ledgers)
    assert "LAYOUT is missing" in caplog.text
    assert open(os.path.join(tmp_path, "current", "LAYOUT")).read() == "2\n"


CHILD = textwrap.dedent("""
    import sys, embedlog
    from support.crash_child import payload
    log = embedlog.open(sys.argv[1], **eval(sys.argv[2]))
    handles = [log.create_ledger() for _ in range(3)]
    for e in range(600):
        for h in handles:
            h.append(payload(h.ledger_id.qualified_name, e))
    log.bookie.checkpoint()
    print(" ".join(h.ledger_id.qualified_name for h in handles), flush=True)
    sys.stdin.read()
""")


def test_sigkill_with_entries_only_in_segments_loses_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), repr(CONFIG)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    names = child.stdout.readline().split()
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert len(names) == 3
    journal = os.path.join(tmp_path, "journal")
    assert files(journal, ".seg"), "the checkpoint kept no segment"
    assert entry_logs(tmp_path) == []
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = sorted(log.bookie.list_ledgers(), key=lambda l: l.qualified_name)
        assert sorted(l.qualified_name for l in ledgers) == sorted(names)
        # the first entries are below the mark: served from a .seg, not replayed
        key = (ledgers[0].scope_id, ledgers[0].ledger_id)
        assert log.bookie.storage.location(key, 0) >> 63
        check(log, ledgers)


def _segment_path(log, loc):
    seg = (loc >> 32) & 0x7FFFFFFF
    stem = log.bookie.storage.entry_logger.segment_files[seg]
    return next(p for p in (stem + ".seg", stem + ".txn") if os.path.exists(p))


def test_a_damaged_last_entry_leaves_the_ledger_readable_below_it(tmp_path):
    """An open ledger whose last entry is damaged: a reader takes the LAC the entry below
    it carries (a lower bound) and reads the rest; a recovery, which must know the last
    entry, still refuses (the old code: both opens raised CorruptedDataError)."""
    with embedlog.open(tmp_path, **CONFIG) as log:
        w = log.create_ledger()
        lid = w.ledger_id
        for e in range(100):
            w.append(payload(lid.qualified_name, e))        # left open, as a crashed writer's
        log.bookie.checkpoint()
        loc = log.bookie.storage.location((lid.scope_id, lid.ledger_id), 99)
        path = _segment_path(log, loc)
    _flip_payload_byte(path, loc, 0x40)
    with embedlog.open(tmp_path, **CONFIG) as log:
        r = log.open_ledger(lid, recovery=False)
        assert r.last_add_confirmed == 97                   # what entry 98 carries
        assert r.read_batch(0, 97) == [payload(lid.qualified_name, e) for e in range(98)]
        with pytest.raises(CorruptedDataError):
            log.open_ledger(lid)                            # recovery reads entry 99


def test_a_damaged_segment_record_is_refused_never_served(tmp_path):
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log)
        log.bookie.checkpoint()
        lid = ledgers[0]
        key = (lid.scope_id, lid.ledger_id)
        loc = log.bookie.storage.location(key, 5)
        assert loc >> 63
        path = _segment_path(log, loc)
    _flip_payload_byte(path, loc, 0x40)           # one payload byte of entry 5
    with embedlog.open(tmp_path, **CONFIG) as log:
        reader = log.open_ledger(lid)
        with pytest.raises(CorruptedDataError):
            reader.read_entry(5)
        with pytest.raises(CorruptedDataError):
            log.bookie.read_entries(lid, 5, 1, 1 << 20)     # the wire's path: as stored
        assert reader.read_entry(4) == payload(lid.qualified_name, 4)
        check(log, ledgers[1:])


def test_gc_frees_a_segment_no_index_names(tmp_path):
    with embedlog.open(tmp_path, **CONFIG) as log:
        dead = fill(log, n_ledgers=2)
        log.bookie.checkpoint()
        live = fill(log, n_ledgers=1)
        log.bookie.checkpoint()
        journal = os.path.join(tmp_path, "journal")
        before = files(journal, ".seg")
        assert before
        for lid in dead:
            log.delete_ledger(lid)
        log.bookie.checkpoint()
        report = log.bookie.gc.run_once()
        freed = report["segments"]["deleted"]
        assert freed, report
        after = files(journal, ".seg")
        assert not set("%x.seg" % i for i in freed) & set(after)
        check(log, live)
    with embedlog.open(tmp_path, **CONFIG) as log:
        check(log, live)


@pytest.mark.parametrize("point", ["gc.before_delete_ledger", "gc.after_delete_ledger"])
def test_sigkill_in_gc_over_segments_loses_nothing(tmp_path, point):
    from embedlog import LedgerId
    from embedlog.cli.shell import Layout, check_ledger
    env = {**os.environ, "EMBEDLOG_FAILPOINTS": f"{point}=crash", "GC_CHILD_LAYOUT": "2",
           "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    # journals of 1 MiB: the child's writes leave segments, some holding only dead ledgers
    child = subprocess.run([sys.executable, os.path.join(SUPPORT, "gc_child.py"), str(tmp_path)],
                           capture_output=True, text=True, env=env, timeout=120)
    live = {p[1]: int(p[2]) for p in map(str.split, child.stdout.splitlines()) if p[0] == "LIVE"}
    dead = [p[1] for p in map(str.split, child.stdout.splitlines()) if p[0] == "DEAD"]
    assert len(live) == 4 and len(dead) == 5
    assert child.returncode == -9, child.stderr[-2000:]
    with embedlog.open(tmp_path, **CONFIG) as log:
        b = log.bookie
        assert b.layout == 2

        def check():
            for q, n in live.items():
                got = log.open_ledger(LedgerId.parse(q)).read_batch(0, n - 1)
                assert got == [payload(q, e) for e in range(n)], (point, q)
        check()
        b.gc.run_once(force_major=True)
        assert not any(b.has_ledger(LedgerId.parse(q)) for q in dead)
        b.checkpoint()
        b.gc.run_once()
        check()
        # every segment left is named by a live ledger's index
        used = b.storage.segments_in_use()
        from embedlog.bookie.journal_files import read_segment
        journal = b.journal_dir
        left = {read_segment(os.path.join(journal, n)) for n in files(journal, ".seg")}
        assert left <= used, (left, used)
        layout = Layout(str(tmp_path), b.ledger_dirs, b.journal_dir, None)
        for q in live:                 # the shell's consistency check reads layout 2
            lid = LedgerId.parse(q)
            r = check_ledger(layout, (lid.scope_id, lid.ledger_id), {})
            assert r["errors"] == [] and r["good"] == live[q], r


SEGMENT_CHILD = textwrap.dedent("""
    import sys, embedlog
    from support.crash_child import payload
    log = embedlog.open(sys.argv[1], **eval(sys.argv[2]))
    dead, live = log.create_ledger(), log.create_ledger()
    for e in range(2500):                 # segments holding only the dead ledger
        dead.append(bytes(1024))
    for e in range(300):
        live.append(payload(live.ledger_id.qualified_name, e))
    dead.close(); live.close()
    log.bookie.checkpoint()
    log.delete_ledger(dead.ledger_id)
    log.bookie.checkpoint()
    print(live.ledger_id.qualified_name, flush=True)
    log.bookie.gc.run_once()
    print("DONE", flush=True)
""")


def test_sigkill_before_a_segment_is_deleted_loses_nothing_and_leaks_nothing(tmp_path):
    from embedlog import LedgerId
    env = {**os.environ, "EMBEDLOG_FAILPOINTS": "gc.before_delete_segment=crash",
           "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", SEGMENT_CHILD, str(tmp_path), repr(CONFIG)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == -9, child.stderr[-2000:]
    q = child.stdout.split()[0]
    journal = os.path.join(tmp_path, "journal")
    before = files(journal, ".seg")
    with embedlog.open(tmp_path, **CONFIG) as log:
        r = log.open_ledger(LedgerId.parse(q))
        assert r.read_batch(0, 299) == [payload(q, e) for e in range(300)]
        report = log.bookie.gc.run_once()
        assert report["segments"]["deleted"], report
        assert len(files(journal, ".seg")) < len(before)
        assert r.read_batch(0, 299) == [payload(q, e) for e in range(300)]


def test_a_damaged_index_file_is_rebuilt_from_the_segments(tmp_path):
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log)
        log.bookie.checkpoint()
        lid = ledgers[1]
        idx_path = log.bookie.ledgers[(lid.scope_id, lid.ledger_id)].path
    with open(idx_path, "r+b") as f:
        f.write(b"XXXX")                        # its magic
    with embedlog.open(tmp_path, **CONFIG) as log:
        key = (lid.scope_id, lid.ledger_id)
        assert log.bookie.storage.damaged[key]["entries_found"] == 600
        check(log, ledgers)                     # every entry, from the segments


@pytest.mark.parametrize("maps", ["kept", "deleted", "damaged"])
def test_a_lost_index_file_is_found_from_the_segments(tmp_path, maps):
    """From each segment's map, or, where the map is gone or damaged too, from its records
    (the old code found nothing then: the ledger was not held, and GC freed its segments)."""
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log)
        log.bookie.checkpoint()
        lid = ledgers[2]
        idx_path = log.bookie.ledgers[(lid.scope_id, lid.ledger_id)].path
    journal = os.path.join(tmp_path, "journal")
    assert files(journal, ".seg.map")
    for name in files(journal, ".seg.map"):
        if maps == "deleted":
            os.unlink(os.path.join(journal, name))
        elif maps == "damaged":
            with open(os.path.join(journal, name), "r+b") as f:
                f.seek(20)
                b = f.read(1)
                f.seek(20)
                f.write(bytes([b[0] ^ 1]))
    os.unlink(idx_path)
    # the offline check finds it from the segments too, before any bookie starts (it read
    # only entry logs, none in layout 2, and said OK); it writes no map (it reads files only)
    r = CliRunner().invoke(shell, ["localconsistencycheck", "--dir", str(tmp_path), "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 1, r.output
    [row] = json.loads(r.output)["unindexed_ledgers"]
    assert row["qualified_name"] == lid.qualified_name and row["problem"] == "its index file is missing"
    assert 0 < row["entries"] < 600 and row["first_entry_id"] == 0
    assert maps != "deleted" or not files(journal, ".seg.map")
    with embedlog.open(tmp_path, **CONFIG) as log:
        key = (lid.scope_id, lid.ledger_id)
        found = log.bookie.storage.damaged[key]["entries_found"]   # said, and fenced
        assert found == row["entries"]
        # the entries in .seg files come back; those in the newest journal below the mark
        # have no map yet (docs/FORMATS.md, "Layout 2"): refused, never wrong bytes
        assert 0 < found < 600
        got = log.open_ledger(lid).read_batch(0, found - 1)
        assert got == [payload(lid.qualified_name, e) for e in range(found)]
    # the maps read from the records were written again: the next start reads no segment
    for name in files(journal, ".seg"):
        assert journal_files.read_segment_map(os.path.join(journal, name[:-4])) is not None


def test_a_start_walks_the_journal_records_for_cuts_only_when_it_rebuilds(tmp_path, monkeypatch):
    """The TRUNCATE and TRIM records a rebuild applies are read by a walk of every journal
    record (scrub.journal_cuts); a start with every index file whole must not pay it (it
    did for a while: 0.5 s of a 0.55 s open after 384 MB, every start, growing with the
    log), and one with a lost index file must still apply them."""
    from embedlog.bookie import scrub
    walks = []
    real = scrub.journal_cuts
    monkeypatch.setattr(scrub, "journal_cuts", lambda logs: walks.append(len(logs)) or real(logs))
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log)
        log.bookie.checkpoint()
        lid = ledgers[1]
        idx_path = log.bookie.ledgers[(lid.scope_id, lid.ledger_id)].path
    assert files(os.path.join(tmp_path, "journal"), ".seg")
    with embedlog.open(tmp_path, **CONFIG) as log:
        check(log, ledgers)
    assert walks == []
    os.unlink(idx_path)
    with embedlog.open(tmp_path, **CONFIG) as log:
        assert (lid.scope_id, lid.ledger_id) in log.bookie.storage.damaged
        check(log, [ledgers[0], ledgers[2]])
    assert len(walks) == 1 and walks[0] > 0          # once, over the segments


def test_compaction_frees_segments_a_long_lived_ledger_pins(tmp_path):
    """One live ledger interleaved with dead ones keeps every segment named: compaction
    copies its entries into an entry log and frees the segments (usage from .seg.map)."""
    from embedlog.cli.shell import Layout, check_ledger
    cfg = dict(CONFIG, entry_log_size_limit=4 << 20, compaction_rate_by_entries=1_000_000)
    with embedlog.open(tmp_path, **cfg) as log:
        b = log.bookie
        live, dead = _live_among_dead(log, 9, 400)
        journal = b.journal_dir
        segs = files(journal, ".seg")
        assert len(segs) >= 3
        for h in dead:
            log.delete_ledger(h.ledger_id)
        b.checkpoint()
        report = b.gc.run_once()
        assert report["segments"]["deleted"] == []          # the live ledger names them all
        usages = {i: u for i, u in b.gc.usages().items() if i >> 31}
        assert len(usages) == len(segs) and all(0 < u < 0.2 for u in usages.values()), usages
        report = b.gc.run_once(force_minor=True)
        assert report["compaction"]["kind"] == "minor" and report["compaction"]["freed_bytes"] > 0
        assert files(journal, ".seg") == [] and files(journal, ".seg.map") == []
        assert entry_logs(tmp_path)                          # made by compaction
        assert b.gc.stats["segments_deleted"] == len(segs)
        key = (live.ledger_id.scope_id, live.ledger_id.ledger_id)
        assert not b.storage.location(key, 0) >> 63          # an entry log's location now
        check(log, [live.ledger_id], 400)
        b.checkpoint()
        layout = Layout(str(tmp_path), b.ledger_dirs, b.journal_dir, None)
        r = check_ledger(layout, key, {})
        assert r["errors"] == [] and r["good"] == 400, r
    with embedlog.open(tmp_path, **cfg) as log:
        assert log.bookie.layout == 2
        check(log, [live.ledger_id], 400)


def test_a_segment_above_the_threshold_is_kept_and_the_newest_journal_never_compacted(tmp_path):
    with embedlog.open(tmp_path, **dict(CONFIG, compaction_rate_by_entries=1_000_000)) as log:
        b = log.bookie
        ledgers = fill(log)
        b.checkpoint()
        log.delete_ledger(ledgers[0])
        b.checkpoint()
        before = files(b.journal_dir, ".seg")
        txn = files(b.journal_dir, ".txn")
        usages = {i: u for i, u in b.gc.usages().items() if i >> 31}
        assert len(usages) == len(before) and all(0.5 < u < 0.8 for u in usages.values()), usages
        report = b.gc.run_once(force_minor=True)             # 0.2: none is under it
        assert report["compaction"]["candidates"] == 0
        assert files(b.journal_dir, ".seg") == before
        report = b.gc.run_once(force_major=True)             # 0.8: every .seg, no .txn
        assert report["compaction"]["candidates"] == len(before)
        assert files(b.journal_dir, ".seg") == []
        assert set(txn) <= set(files(b.journal_dir, ".txn"))
        check(log, ledgers[1:])
    with embedlog.open(tmp_path, **CONFIG) as log:
        check(log, ledgers[1:])


def _segment_entries(log, lid, entries):
    """(path, locations) of a closed ledger's entries, all in one segment below the mark."""
    key = (lid.scope_id, lid.ledger_id)
    locs = [log.bookie.storage.location(key, e) for e in range(entries)]
    assert all(loc >> 63 for loc in locs)
    segs = {loc >> 32 for loc in locs}
    return [(_segment_path(log, loc), loc) for loc in locs], segs


def test_a_segment_read_checks_each_record_once_while_mapped_in_any_order(tmp_path):
    import random
    from embedlog._native import entrylog as nel
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log, n_ledgers=2, entries=400)
        log.bookie.checkpoint()
        found, segs = _segment_entries(log, ledgers[0], 400)
    by_seg = {}
    for path, loc in found:
        by_seg.setdefault(loc >> 32, (path, []))[1].append(loc)
    for seg_id, (path, locs) in by_seg.items():
        m = nel.MappedLog.open_segment(path, seg_id)
        try:
            order = list(enumerate(locs))
            random.Random(3).shuffle(order)
            for i, loc in order:
                assert m.read_at(loc)               # read and checked
            for i, loc in order:
                assert m.read_at(loc)               # again: from the bitmap
            checked = set(m.segment_checked())
            # each record read has its bit, and only those: ledger 1's records between them
            # were never read, so never checked
            assert checked == {512 + ((loc & 0xFFFFFFFF) - 512) // 32 * 32 for loc in locs}
        finally:
            m.close()
    with embedlog.open(tmp_path, **CONFIG) as log:
        check(log, ledgers, entries=400)


def test_a_damaged_record_is_refused_each_time_whatever_was_read_around_it(tmp_path):
    from embedlog._native import entrylog as nel
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log, n_ledgers=1, entries=300)
        log.bookie.checkpoint()
        found, _ = _segment_entries(log, ledgers[0], 300)
    lid = ledgers[0]
    path, loc = found[150]
    same = [e for e, (p, l) in enumerate(found) if p == path]
    _flip_payload_byte(path, loc, 0x01)             # one payload byte of entry 150
    m = nel.MappedLog.open_segment(path, loc >> 32)
    try:
        for e in (same[0], 149, 151, same[-1], 152):   # reads on both sides of it
            assert m.read_at(found[e][1])
        for _ in range(2):
            with pytest.raises(CorruptedDataError):
                m.read_at(loc)
        off = loc & 0xFFFFFFFF
        assert 512 + (off - 512) // 32 * 32 not in m.segment_checked()
    finally:
        m.close()
    with embedlog.open(tmp_path, **CONFIG) as log:
        reader = log.open_ledger(lid)
        assert reader.read_batch(0, 149) == [payload(lid.qualified_name, e) for e in range(150)]
        with pytest.raises(CorruptedDataError):
            reader.read_entry(150)
        with pytest.raises(CorruptedDataError):
            reader.read_batch(140, 160)
        assert reader.read_batch(151, 299) == [payload(lid.qualified_name, e)
                                               for e in range(151, 300)]
        with pytest.raises(CorruptedDataError):
            reader.read_entry(150)
        with pytest.raises(CorruptedDataError):
            log.bookie.read_entries(lid, 150, 1, 1 << 20)


def test_a_record_damaged_after_its_first_read_is_refused_by_the_reader(tmp_path):
    """A first read of a segment record checks its crc, and for a CRC32C entry the digest
    with it, so the reader does not compute the digest again; every later read (the record's
    bit set) must still check the digest: bytes damaged after the first read are refused by
    read_entry, read_batch and read_arrays, never served."""
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log, n_ledgers=1, entries=300)
        log.bookie.checkpoint()
        found, _ = _segment_entries(log, ledgers[0], 300)
        lid = ledgers[0]
        reader = log.open_ledger(lid)
        assert reader.read_entry(150) == payload(lid.qualified_name, 150)     # checked once
        assert reader.read_batch(140, 160)[10] == payload(lid.qualified_name, 150)
        path, loc = found[150]
        _flip_payload_byte(path, loc, 0x01)         # under the mapping the reads used
        for read in (lambda: reader.read_entry(150), lambda: reader.read_batch(140, 160),
                     lambda: reader.read_arrays(140, 160)):
            with pytest.raises((DigestMismatchError, CorruptedDataError)):
                read()
        assert reader.read_entry(151) == payload(lid.qualified_name, 151)


@pytest.mark.parametrize("digest", ["crc32c", "dummy"])
def test_a_location_near_a_checked_record_or_naming_another_is_refused(tmp_path, digest):
    """A damaged index location next to a checked record (in its 32-byte granule, whose
    bit is set, or a few bytes on) or naming another entry's record: the bytes there are
    intact, so the bitmap alone would pass some of them: the type byte and the reader's
    checks of the entry's ids (and digest) refuse them."""
    import numpy as np
    from embedlog.errors import EmbedlogError
    with embedlog.open(tmp_path, **CONFIG) as log:
        h = log.create_ledger(digest=digest)
        for e in range(200):
            h.append(payload(h.ledger_id.qualified_name, e))
        h.close()
        lid = h.ledger_id
        log.bookie.checkpoint()
        reader = log.open_ledger(lid)
        q = lid.qualified_name
        assert reader.read_batch(0, 199) == [payload(q, e) for e in range(200)]   # all checked
        key = (lid.scope_id, lid.ledger_id)
        idx = log.bookie.storage.ledgers[key]
        good = [log.bookie.storage.location(key, e) for e in range(200)]
        for bad in [good[11]] + [good[10] + d for d in (1, 8, 9, 20, 40, 45, 60)]:
            idx.set_locations(np.array([10]), np.array([bad], dtype=np.uint64))
            r = log.open_ledger(lid)
            try:
                got = r.read_entry(10)
            except EmbedlogError:
                pass
            else:
                pytest.fail(f"location {bad:#x} served {got[:40]!r} as entry 10")
        idx.set_locations(np.array([10]), np.array([good[10]], dtype=np.uint64))
        assert log.open_ledger(lid).read_entry(10) == payload(q, 10)


def test_entries_erased_while_a_flush_waits_for_the_journal_get_no_location(tmp_path):
    """A layout 2 flush waits for the journal before it sets locations; a truncation (or a
    deletion) meanwhile hides entries of its snapshot under the storage lock. The flush must
    set locations from a walk in the same hold, or the erased entries come back. (The first
    walk ran beside drop_ledger too: tools/gc_soak.py's deletes then failed every flush with
    "live records walked, counted".)"""
    from embedlog.bookie.descriptors import NO_LEDGER_END
    from embedlog.errors import NoSuchEntryError
    with embedlog.open(tmp_path, **CONFIG) as log:
        st = log.bookie.storage
        w = log.create_ledger()
        q = w.ledger_id.qualified_name
        w.append_many([payload(q, e) for e in range(100)])
        key = (w.ledger_id.scope_id, w.ledger_id.ledger_id)
        wait, waits = st.wait_journal, []

        def erase_then_wait(seq, locked):
            waits.append(seq)
            st.erase(key, 50, NO_LEDGER_END)
            wait(seq, locked)
        st.wait_journal = erase_then_wait
        log.bookie.checkpoint()                 # flushes the memtable holding 0..99
        st.wait_journal = wait
        assert waits, "the flush never waited for the journal"
        assert st.location(key, 49) >> 63       # a segment's location
        with pytest.raises(NoSuchEntryError):
            st.location(key, 50)
        assert log.bookie.read_entry(w.ledger_id, 49)


def test_a_flush_walks_its_snapshot_under_the_lock_drop_ledger_takes(tmp_path):
    """drop_ledger (a deletion) hides a snapshot's records under the storage lock while the
    flusher may be walking them: the walk, nogil in the memtable, must hold that lock too,
    or its count disagrees with the memtable's and every flush fails ("live records walked,
    counted": tools/gc_soak.py's random deletes met it within seconds)."""
    with embedlog.open(tmp_path, **CONFIG) as log:
        st = log.bookie.storage
        w = log.create_ledger()
        q = w.ledger_id.qualified_name
        w.append_many([payload(q, e) for e in range(10)])
        held = []

        class Snapshot:                         # the active memtable, its walks watched
            max_pending = st.active.max_pending

            def flush_wheres(self, starts=None):
                held.append(st.lock.locked())
                return st.active.flush_wheres(starts)
        assert st._flush_to_segments(Snapshot(), False)
        assert held == [True], held             # one walk, in the hold that sets locations
        assert log.open_ledger(w.ledger_id).read_batch(0, 9) == [payload(q, e) for e in range(10)]


REUSE_CHILD = textwrap.dedent("""
    import os, signal, sys, embedlog
    from support.crash_child import payload
    log = embedlog.open(sys.argv[1], **eval(sys.argv[2]))
    b = log.bookie
    dead = log.create_ledger()
    for e in range(25):                   # segments holding only the dead ledger
        dead.append_many([payload("dead", e * 100 + k) + bytes(900) for k in range(100)])
    dead.close()
    b.checkpoint()
    log.delete_ledger(dead.ledger_id)
    b.checkpoint()
    report = b.gc.run_once()
    print("DEAD", dead.ledger_id.qualified_name, len(report["segments"]["deleted"]),
          b.statistics()["journal"].get("segments_kept", 0), flush=True)
    live = log.create_ledger()
    q = live.ledger_id.qualified_name
    n = 0
    while b.statistics()["journal"]["files_reused"] < int(sys.argv[3]) and n < 30_000:
        n = 1 + live.append_many([payload(q, n + k) for k in range(100)])
    for _ in range(5):
        n = 1 + live.append(payload(q, n))
    print("LIVE", q, n, b.statistics()["journal"]["files_reused"], flush=True)
    if sys.argv[4] == "checkpoint":       # the reused journals become segments first
        b.checkpoint()
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("reuses,then", [(1, "kill"), (2, "checkpoint")])
def test_a_freed_segment_is_reused_by_the_journal_and_its_previous_life_stays_dead(
        tmp_path, reuses, then):
    """GC keeps a segment no index names as a journal file for reuse (no zeros, no file
    growth for the journal that takes it); after a SIGKILL, with the entries in the reused
    journal (replayed) or in the segment it became (read through the index), every
    acknowledged entry reads back and nothing of the file's previous life does."""
    from embedlog import LedgerId
    from embedlog.cli.shell import Layout, check_ledger
    cfg = dict(CONFIG, journal_max_backups=0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", REUSE_CHILD, str(tmp_path), repr(cfg),
                            str(reuses), then], capture_output=True, text=True, env=env,
                           timeout=120)
    assert child.returncode == -9, child.stderr[-2000:]
    rows = {p[0]: p[1:] for p in map(str.split, child.stdout.splitlines())}
    dead, deleted, kept = rows["DEAD"][0], int(rows["DEAD"][1]), int(rows["DEAD"][2])
    q, n, reused = rows["LIVE"][0], int(rows["LIVE"][1]), int(rows["LIVE"][2])
    assert deleted >= 2 and kept >= reuses and reused >= reuses, child.stdout
    with embedlog.open(tmp_path, **cfg) as log:
        b = log.bookie
        assert dead not in {str(x) for x in log.list_ledgers()}
        assert not b.has_ledger(LedgerId.parse(dead))
        r = log.open_ledger(LedgerId.parse(q))
        assert r.read_batch(0, n - 1) == [payload(q, e) for e in range(n)]
        b.checkpoint()
        b.gc.run_once()
        assert r.read_batch(0, n - 1) == [payload(q, e) for e in range(n)]
        lid = LedgerId.parse(q)
        layout = Layout(str(tmp_path), b.ledger_dirs, b.journal_dir, None)
        report = check_ledger(layout, (lid.scope_id, lid.ledger_id), {})
        assert report["errors"] == [] and report["good"] == n, report
    with embedlog.open(tmp_path, **cfg) as log:
        assert log.open_ledger(LedgerId.parse(q)).read_batch(0, n - 1) == \
            [payload(q, e) for e in range(n)]


def test_a_segment_number_whose_file_now_holds_another_segment_reads_as_freed(tmp_path):
    """A reader maps a segment by number; should the file it finds hold another segment
    now (GC dropped the number and the journal reused the file meanwhile: opening releases
    the GIL), it is refused as freed, never read at the old number's offsets, even where
    that file holds a valid record there (here: the same bytes under another number)."""
    import shutil
    import struct
    from embedlog._native import journal_format as jformat
    with embedlog.open(tmp_path, **CONFIG) as log:
        ledgers = fill(log, n_ledgers=1, entries=300)
        log.bookie.checkpoint()
        found, _segs = _segment_entries(log, ledgers[0], 300)
        el = log.bookie.storage.entry_logger
        path, loc = found[100]
        seg = (loc >> 32) & 0x7FFFFFFF
        stem = el.segment_files[seg]
        want = el.read_encoded(loc)
        twin = stem + "-twin"                         # its bytes, another segment's header
        shutil.copyfile(path, twin + ".seg")
        with open(twin + ".seg", "r+b") as f:
            h = f.read(jformat.HEADER_SIZE)
            (log_id,), (prev,), (size,), (was,), (salt,) = (
                struct.unpack_from(">" + c, h, o) for c, o in
                (("Q", 8), ("Q", 20), ("Q", 32), ("Q", 44), ("I", 52)))
            f.seek(0)
            f.write(jformat.file_header(log_id, prev, size, was, salt, segment=seg + 1000))
        el.forget(loc >> 32)
        el.add_segment(seg, twin)
        with pytest.raises(CorruptedDataError, match="no entry at location"):
            el.read_encoded(loc)
        el.forget(loc >> 32)
        el.add_segment(seg, stem)
        assert el.read_encoded(loc) == want
        check(log, ledgers, entries=300)


def test_a_freed_segment_is_deleted_when_reuse_is_off_or_the_pool_is_full(tmp_path):
    from embedlog.bookie.journal_files import FREE, MAX_FREE
    cfg = dict(CONFIG, journal_reuse_files=False)
    with embedlog.open(tmp_path, **cfg) as log:
        b = log.bookie
        dead = log.create_ledger()
        for e in range(25):
            dead.append_many([bytes(1000)] * 100)
        dead.close()
        b.checkpoint()
        log.delete_ledger(dead.ledger_id)
        b.checkpoint()
        assert b.gc.run_once()["segments"]["deleted"]
        journal = b.journal_dir
        assert files(journal, FREE) == [] and files(journal, ".seg.map") == []
        assert b.statistics()["journal"].get("segments_kept", 0) == 0
        # with reuse on, never more than MAX_FREE kept
        b.config.journal_reuse_files = True
        dead = log.create_ledger()
        for e in range(12 * 10):
            dead.append_many([bytes(1000)] * 100)
        dead.close()
        b.checkpoint()
        log.delete_ledger(dead.ledger_id)
        b.checkpoint()
        assert len(b.gc.run_once()["segments"]["deleted"]) > MAX_FREE
        assert len(files(journal, FREE)) == MAX_FREE
        assert files(journal, ".seg.map") == [f for f in files(journal, ".seg.map")
                                              if f[:-4] in files(journal, ".seg")]
        # reuse turned off again: the next checkpoint's trim deletes the kept files
        b.config.journal_reuse_files = False
        w = log.create_ledger()
        w.append_many([bytes(1000)] * 2000)             # a roll, so the trim has work
        b.checkpoint()
        assert files(journal, FREE) == []
        assert b.statistics()["journal"]["files_reused"] == 0


def test_power_loss_in_a_reused_segment_keeps_every_acknowledged_entry(tmp_path):
    """Power loss while the journal writes into a freed segment it took for reuse: past what
    its new life made durable the file holds the previous life, not zeros; every
    acknowledged entry reads back, nothing of the dead ledger does."""
    from embedlog import fileio
    from support.crashutil import abandon
    from support.cliutil import wait_until
    path = tmp_path / "d"
    cfg = dict(CONFIG, journal_max_backups=0)
    fileio.record_durable(True)
    try:
        log = embedlog.open(path, **cfg)
        b = log.bookie
        dead = log.create_ledger()
        for e in range(25):
            dead.append_many([payload("dead", e * 100 + k) + bytes(900) for k in range(100)])
        dead.close()
        b.checkpoint()
        log.delete_ledger(dead.ledger_id)
        b.checkpoint()
        b.gc.run_once()
        assert b.statistics()["journal"].get("segments_kept", 0) >= 1
        w = log.create_ledger()
        acked = []
        wait_until(lambda: (acked.extend(range(len(acked), 1 + w.append_many(
                                [payload("p", len(acked) + k) for k in range(50)]))) or
                            b.statistics()["journal"]["files_reused"] >= 1),
                   timeout_s=120, what="a freed segment reused")
        for _ in range(20):
            acked.append(w.append(payload("p", len(acked))))
        abandon(log)
        cut = fileio.power_loss(str(path))
    finally:
        fileio.record_durable(False)
    assert any("previous life" in str(how) for _p, how in cut), cut
    with embedlog.open(path, **cfg) as log:
        assert not log.bookie.has_ledger(dead.ledger_id)
        r = log.open_ledger(w.ledger_id)
        assert r.last_add_confirmed == acked[-1]
        assert r.read_batch(0, acked[-1]) == [payload("p", e) for e in acked]


RETIRE_CHILD = textwrap.dedent("""
    import os, signal, sys, embedlog
    from support.crash_child import payload
    log = embedlog.open(sys.argv[1], **eval(sys.argv[2]))
    b = log.bookie
    dead, live = log.create_ledger(), log.create_ledger()
    q = live.ledger_id.qualified_name
    print("DEAD", dead.ledger_id.qualified_name, flush=True)
    print("LIVE", q, flush=True)
    for e in range(25):                   # segments holding only the dead ledger
        dead.append_many([bytes(1000)] * 100)
    n = 0

    def add():
        global n
        n = 1 + live.append_many([payload(q, n + k) for k in range(100)])
        print("ACK", n, flush=True)
    add()
    dead.close()
    b.checkpoint()
    log.delete_ledger(dead.ledger_id)
    b.checkpoint()
    b.gc.run_once()                       # journal.retire_before_rename
    while b.statistics()["journal"]["files_reused"] < 2 and n < 30_000:
        add()                             # journal.reuse_before_header / _rename
    print("END", flush=True)              # not reached: the failure point crashed first
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("point", ["journal.retire_before_rename", "journal.reuse_before_header",
                                   "journal.reuse_before_rename"])
def test_sigkill_while_a_freed_segment_is_kept_or_reused_loses_and_leaks_nothing(tmp_path, point):
    """SIGKILL between a freed segment's map and its rename to ``.free``, and at each step
    of the journal taking a kept file: every acknowledged entry reads back, the dead ledger
    stays dead, and the next GC and rolls keep and reuse files as before."""
    from embedlog import LedgerId
    from embedlog.bookie.journal_files import FREE
    from embedlog.cli.shell import Layout, check_ledger
    cfg = dict(CONFIG, journal_max_backups=0)
    env = {**os.environ, "EMBEDLOG_FAILPOINTS": f"{point}=crash",
           "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", RETIRE_CHILD, str(tmp_path), repr(cfg)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == -9 and "END" not in child.stdout, child.stderr[-2000:]
    rows = [p for p in map(str.split, child.stdout.splitlines())]
    dead = LedgerId.parse([r[1] for r in rows if r[0] == "DEAD"][0])
    lid = LedgerId.parse([r[1] for r in rows if r[0] == "LIVE"][0])
    q, n = lid.qualified_name, max(int(r[1]) for r in rows if r[0] == "ACK")
    journal = os.path.join(tmp_path, "journal")
    if point == "journal.retire_before_rename":
        assert n == 100 and files(journal, FREE) == []   # killed in the first GC
    with embedlog.open(tmp_path, **cfg) as log:
        b = log.bookie
        r = log.open_ledger(lid)
        assert r.read_batch(0, n - 1) == [payload(q, e) for e in range(n)], point
        b.gc.run_once(force_major=True)
        assert not b.has_ledger(dead)
        w = log.create_ledger()
        k = 0
        while b.statistics()["journal"]["files_reused"] < 1 and k < 30_000:
            k = 1 + w.append_many([bytes(1000)] * 100)
        assert b.statistics()["journal"]["files_reused"] >= 1, point
        b.checkpoint()
        b.gc.run_once()
        assert r.read_batch(0, n - 1) == [payload(q, e) for e in range(n)], point
        layout = Layout(str(tmp_path), b.ledger_dirs, b.journal_dir, None)
        report = check_ledger(layout, (lid.scope_id, lid.ledger_id), {})
        assert report["errors"] == [] and report["good"] == n, report
        # no map outlives its segment
        assert {f[:-len(".map")] for f in files(journal, ".seg.map")} <= set(files(journal, ".seg"))
    with embedlog.open(tmp_path, **cfg) as log:
        assert log.open_ledger(lid).read_batch(0, n - 1) == [payload(q, e) for e in range(n)]


@pytest.mark.parametrize("damage", ["cut", "version"])
def test_one_damaged_entry_log_leaves_the_other_ledgers_served(tmp_path, damage):
    """An entry log compaction made from segments is cut or its version byte flipped: the
    directory still opens, the other ledger reads, the damaged log's ledger gets the
    project's error (the old code: CorruptedDataError from open(), nothing served)."""
    cfg = dict(CONFIG, entry_log_size_limit=4 << 20, compaction_rate_by_entries=1_000_000)
    with embedlog.open(tmp_path, **cfg) as log:
        other = log.create_ledger()
        live, dead = _live_among_dead(log, 6, 300)
        for h in dead:
            log.delete_ledger(h.ledger_id)
        log.bookie.checkpoint()
        log.bookie.gc.run_once(force_minor=True)          # live's entries -> an entry log
        other.append_many([payload(other.ledger_id.qualified_name, e) for e in range(100)])
        other.close()
        log.bookie.checkpoint()
    logs = files(os.path.join(tmp_path, "current"), ".log")
    assert len(logs) == 1
    path = os.path.join(tmp_path, "current", logs[0])
    if damage == "cut":
        os.truncate(path, os.path.getsize(path) // 2)
    else:
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(b"\x20")
    with embedlog.open(tmp_path, **cfg) as log:
        q = other.ledger_id.qualified_name
        assert log.open_ledger(other.ledger_id).read_batch(0, 99) == [payload(q, e) for e in range(100)]
        with pytest.raises(EmbedlogError):
            log.open_ledger(live.ledger_id).read_entry(0)
        log.bookie.gc.run_once()                           # a cycle goes on past it
        assert log.bookie.gc.damaged_logs == {int(logs[0][:-4], 16)}
        assert log.open_ledger(other.ledger_id).read_entry(99) == payload(q, 99)


@pytest.mark.parametrize("rewritten", [True, False])
def test_a_rebuild_honours_a_streams_truncation(tmp_path, rewritten):
    """A stream's dirty entries 5..9 (OLD) are truncated by a new term's add at 4, then
    written again (NEW, and the head trimmed below 2) or not; the index file is damaged.
    The rebuild reads the TRUNCATE and TRIM records in the segments: entries a cut forgot
    stay forgotten (the old code served OLD 5..9 under good digests when they were not
    written again, and the trimmed head)."""
    from embedlog import LedgerId
    from embedlog._native.format import encode_entry, master_key
    scope = 0x53545245414D0001

    def entries(lid, first, n, tag, lac):
        out, length = [], 0
        for e in range(first, first + n):
            p = (b"%s-%d-" % (tag, e)) * 20
            length += len(p)
            out.append(encode_entry(scope, lid, e, lac if e == first else e - 1, length, "crc32c", p))
        return out

    with embedlog.open(tmp_path, **CONFIG) as log:
        b = log.bookie
        s = log.open_stream("s")
        s.take_over()
        lid, term = s._md.ledger_id.ledger_id, s._md.term
        s.close()
        b.wait_durable(b.add_entries(entries(lid, 0, 10, b"OLD", -1), master_key(b""), term=term + 1))
        filler = log.create_ledger()
        filler.append_many([bytes(1000)] * 1500)            # the next segments
        b.wait_durable(b.add_entries(entries(lid, 4, 1, b"NOOP", 3), master_key(b""),
                                     term=term + 2, truncate=True))
        if rewritten:
            b.wait_durable(b.add_entries(entries(lid, 5, 5, b"NEW", 4), master_key(b""), term=term + 2))
            b.wait_durable(b.trim(LedgerId(scope, lid), master_key(b""), term + 2, 2))   # 0, 1 go
        filler.append_many([bytes(1000)] * 1500)
        b.checkpoint()
        key = (scope, lid)
        path = b.ledgers[key].path
    with open(path, "r+b") as f:
        f.write(b"XXXX")
    with embedlog.open(tmp_path, **CONFIG) as log:
        stored = log.bookie.storage
        assert stored.damaged[key]["entries_ambiguous"] == []
        read = lambda e: log.bookie.read_entry(LedgerId(scope, lid), e)   # noqa: E731
        kept = 2 if rewritten else 0                        # the trim's first kept entry
        assert [read(e)[-6:] for e in range(kept, 4)] == [b"OLD-%d-" % e for e in range(kept, 4)]
        for e in range(kept):
            with pytest.raises(EmbedlogError):
                read(e)
        assert read(4).endswith(b"NOOP-4-")
        for e in range(5, 10):
            if rewritten:
                assert read(e).endswith(b"NEW-%d-" % e)
            else:
                with pytest.raises(EmbedlogError):
                    read(e)
