"""Journal crash safety: torn tails at every byte, corruption in the middle, power loss,
group commit, and acknowledgement only after fdatasync."""
import errno
import os
import queue
import threading
import time

import pytest

import embedlog
from embedlog import failpoints, fileio
from embedlog._native import journal_format as jformat, journal_scan as jscan
from embedlog.bookie import journal as journal_mod
from embedlog.errors import EmbedlogError, JournalCorruptedError
from support.crashutil import abandon, copy_dir, journal_records, newest_journal

CFG = dict(journal_pre_alloc_size_mb=1, flush_interval_ms=0)


def write_and_crash(path, payloads, **cfg):
    log = embedlog.open(path, **{**CFG, **cfg})
    w = log.create_ledger()
    for p in payloads:
        w.append(p)
    lid = w.ledger_id
    abandon(log)
    return lid


def read_all(path, lid, **cfg):
    with embedlog.open(path, **{**CFG, **cfg}) as log:
        r = log.open_ledger(lid)
        out = r.read_batch(0, r.last_add_confirmed) if r.last_add_confirmed >= 0 else []
        return out, log.bookie.replay_report


def _other_nonzero(b, r):
    j = 1 + r % 255
    return j if j != b else 1 + j % 255


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path):
    """A torn write leaves zeros where its bytes never arrived: cut, logged and kept aside.
    Garbage over the last record (a complete record failing its checksum, such as a flipped
    bit) and a file cut inside a record are damage (issue 26, item 3): refused with the file
    and offset, unless journal_skip_corrupt_records accepts the loss, which is reported."""
    payloads = [b"entry-%03d" % i + os.urandom(40) for i in range(20)]
    base = tmp_path / "base"
    lid = write_and_crash(base, payloads)
    jpath = newest_journal(base)
    records, end, status = journal_records(jpath)
    assert status == "clean"
    last_off, _t, body_start, body_len = records[-1]
    rel = os.path.relpath(jpath, base)
    for cut in range(last_off, body_start + body_len):
        for garbage in (False, True):
            d = tmp_path / f"cut{cut}{'g' if garbage else 'z'}"
            copy_dir(base, d)
            with open(d / rel, "r+b") as f:
                n = body_start + body_len - cut
                f.seek(cut)
                old = f.read(n)
                # garbage differs from the record at every byte (a random byte equal to the
                # one it replaced would leave the record whole) and is never zero (zeros are
                # what a torn write leaves)
                junk = bytes(_other_nonzero(b, r) for b, r in zip(old, os.urandom(n)))
                new = junk if garbage else bytes(n)
                f.seek(cut)
                f.write(new)
            if garbage:
                # the length intact: a whole record failing its checksum is damage; garbage in
                # the length may also read as a shorter record, or the end of the journal
                try:
                    got, report = read_all(d, lid)
                except JournalCorruptedError as exc:
                    assert f"offset {last_off}" in str(exc), cut
                    got, report = read_all(d, lid, journal_skip_corrupt_records=True)
                    assert got == payloads[:-1] and report["damaged_tails"], cut
                else:
                    assert cut < last_off + 4 and got == payloads[:-1], cut
                continue
            got, report = read_all(d, lid)
            # the torn record was the last add: every earlier one survives, byte for byte
            assert got in (payloads[:-1], payloads), cut
            if new == old:                   # zeros over bytes that were zero: still whole
                assert got == payloads and not report["torn"], cut
            elif cut >= last_off + 4:        # past the length field: a torn record, kept aside
                assert report["torn"] and os.listdir(d / "journal" / "torn"), cut
    # the file cut inside the last record, or exactly before it: what followed is gone, and
    # the open says so
    for cut in range(last_off, body_start + body_len):
        d = tmp_path / f"z{cut}"
        copy_dir(base, d)
        with open(d / rel, "r+b") as f:
            f.truncate(cut)
        with pytest.raises(JournalCorruptedError, match="cut|ends"):
            read_all(d, lid)
        if cut in (last_off, last_off + 5, body_start + body_len - 1):
            got, report = read_all(d, lid, journal_skip_corrupt_records=True)
            assert got == payloads[:-1] and report["damaged_tails"], cut


def test_restart_twice_after_torn_tail(tmp_path):
    payloads = [os.urandom(50) for _ in range(10)]
    lid = write_and_crash(tmp_path, payloads)
    jpath = newest_journal(tmp_path)
    records, _, _ = journal_records(jpath)
    last_off, _t, body_start, body_len = records[-1]
    with open(jpath, "r+b") as f:                  # tear the last record: its end never
        f.seek(last_off + 12)                      # reached the disk (zeros, as preallocated)
        f.write(bytes(body_start + body_len - last_off - 12))
    log = embedlog.open(tmp_path, **CFG)
    assert log.bookie.replay_report["torn"]
    r = log.open_ledger(lid)                       # recovery closes it at entry 8
    assert r.read_batch(0, r.last_add_confirmed) == payloads[:-1]
    w = log.create_ledger()
    more = [os.urandom(70) for _ in range(25)]
    for p in more:
        w.append(p)
    lid2 = w.ledger_id
    abandon(log)
    got, report = read_all(tmp_path, lid2)
    assert got == more and not report["torn"]
    got, _ = read_all(tmp_path, lid)
    assert got == payloads[:-1]


def test_corruption_in_the_middle_stops_with_file_and_offset(tmp_path):
    payloads = [os.urandom(60) for _ in range(30)]
    lid = write_and_crash(tmp_path, payloads)
    jpath = newest_journal(tmp_path)
    records, _, _ = journal_records(jpath)
    victim = records[10]
    with open(jpath, "r+b") as f:
        f.seek(victim[2] + 20)
        b = f.read(1)
        f.seek(victim[2] + 20)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(JournalCorruptedError) as exc:
        embedlog.open(tmp_path, **CFG)
    assert os.path.basename(jpath) in str(exc.value) and str(victim[0]) in str(exc.value)
    # the opt-in steps over it and reports what it skipped; nothing else is lost
    with embedlog.open(tmp_path, journal_skip_corrupt_records=True, **CFG) as log:
        skipped = log.bookie.replay_report["skipped"]
        assert skipped and skipped[0][1] == victim[0]
        r = log.open_ledger(lid, recovery=False)
        present = []
        for eid in range(len(payloads)):
            try:
                present.append(log.bookie.read_payload(lid, eid, 3, None) == payloads[eid])
            except embedlog.errors.NoSuchEntryError:
                present.append(None)
    assert present.count(None) >= 1 and all(p in (True, None) for p in present)


@pytest.mark.parametrize("rtype,body", [
    ("EXPLICIT_LAC", bytes(16)),                  # 16 bytes where 24 belong
    ("TERM", bytes(30)),
    ("LEDGER_KEY", bytes(16) + b"k" * 100),       # a key longer than any master key
])
def test_record_with_a_good_checksum_and_a_bad_body_stops_with_file_and_offset(tmp_path, rtype, body):
    """A record whose checksum is right but whose body does not fit its type (a bug, or a
    file made by hand) is refused with the file and offset, not a struct.error."""
    from embedlog._native import journal_buffer as jbuffer, journal_format as jformat
    write_and_crash(tmp_path, [b"x" * 10] * 5)
    jpath = newest_journal(tmp_path)
    _records, end, _status = journal_records(jpath)
    buf = jbuffer.JournalBuffer()
    buf.add_record(getattr(jformat, rtype), body)
    fd = os.open(jpath, os.O_RDWR)
    try:
        buf.write_to(fd, end)
    finally:
        os.close(fd)
    with pytest.raises(JournalCorruptedError) as exc:
        embedlog.open(tmp_path, **CFG)
    assert os.path.basename(jpath) in str(exc.value) and f"offset {end}" in str(exc.value)


def test_power_loss_drops_unsynced_data(tmp_path):
    log = embedlog.open(tmp_path, **CFG)
    w = log.create_ledger()
    acked = [os.urandom(80) for _ in range(20)]
    for p in acked:
        w.append(p)
    synced_size = log.bookie.journal.files.offset
    reached, release = threading.Event(), threading.Event()

    def hold():
        reached.set()
        release.wait(10)

    failpoints.arm("journal.before_sync", hold)
    try:
        fut = w.append_async(b"never acknowledged")
        assert reached.wait(10)
        assert not fut.done()                        # written, not synced: not acknowledged
        jpath = newest_journal(tmp_path)
        lid = w.ledger_id
        # power loss: what was not synced never reached the disk
        with open(jpath, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(synced_size)
            f.write(bytes(size - synced_size))
    finally:
        failpoints.disarm()
        release.set()
    abandon(log)
    with open(jpath, "r+b") as f:                     # the page cache may have won the race
        size = os.fstat(f.fileno()).st_size
        f.seek(synced_size)
        f.write(bytes(size - synced_size))
    got, _ = read_all(tmp_path, lid)
    assert got == acked


def test_group_commit_shares_fdatasyncs(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        handles = [log.create_ledger() for _ in range(16)]
        base = log.statistics()["journal"]["fsyncs"]
        start = threading.Barrier(16)

        def work(h):
            start.wait()
            for i in range(100):
                h.append(b"x" * 100)

        threads = [threading.Thread(target=work, args=(h,)) for h in handles]
        [t.start() for t in threads]
        [t.join() for t in threads]
        stats = log.statistics()["journal"]
        fsyncs = stats["fsyncs"] - base
        assert fsyncs < 1600 * 0.8, stats          # shared: fewer syncs than adds
        assert stats["group_entries_max"] > 1
        assert stats["queue_empty"] > 0


def test_time_and_bytes_triggers_are_counted(tmp_path):
    with embedlog.open(tmp_path, journal_flush_when_queue_empty=False,
                       journal_max_group_wait_ms=1.0, journal_buffered_writes_threshold=4096,
                       **CFG) as log:
        w = log.create_ledger()
        w.append(b"lone")                            # waits for the group timer
        w.append_many([b"y" * 1000] * 10)            # crosses the bytes threshold
        stats = log.statistics()["journal"]
        assert stats["time"] >= 1 and stats["bytes"] >= 1


def test_add_never_acknowledged_before_fdatasync(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        w.append(b"first")
        reached, release = threading.Event(), threading.Event()
        failpoints.arm("journal.before_sync", lambda: (reached.set(), release.wait(10)))
        try:
            fut = w.append_async(b"held")
            assert reached.wait(10)
            assert not fut.done() and w.last_add_confirmed == 0
        finally:
            failpoints.disarm()
            release.set()
        assert fut.result(10) == 1 and w.last_add_confirmed == 1


def test_a_group_is_written_and_synced_in_one_call_by_its_leader(tmp_path, monkeypatch):
    """By default a group's O_DIRECT write and its fdatasync are one native call
    (JournalBuffer.write_direct_synced, through fileio.write_direct_synced), made by the
    appending thread that leads it; with a failure point armed the group takes the plain
    path: the write, journal.before_sync, then the sync."""
    calls, synced = [], []
    real_one, real_sync = fileio.write_direct_synced, fileio.sync
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        # from here on (the new journal's header was synced at the start)
        monkeypatch.setattr(fileio, "write_direct_synced", lambda busy, *a: (
            calls.append((busy, threading.get_ident())), real_one(busy, *a))[1])
        monkeypatch.setattr(fileio, "sync", lambda fd, path, length, **k: (
            length is not None and path.endswith(".txn") and synced.append(length),
            real_sync(fd, path, length, **k))[1])
        w.append(b"one")
        if log.bookie.journal.direct_writes:
            assert calls == [(None, threading.get_ident())] and not synced
        else:                                  # a file system that refuses O_DIRECT
            assert not calls and synced
        calls.clear()
        hits = []
        failpoints.arm("journal.before_sync", lambda: hits.append(1))
        try:
            w.append(b"two")
        finally:
            failpoints.disarm()
        assert hits == [1] and not calls and synced
        lid = w.ledger_id
    got, _ = read_all(tmp_path, lid)
    assert got == [b"one", b"two"]


@pytest.mark.parametrize("busy", [False, True], ids=["one-call", "busy-thread"])
def test_a_group_whose_write_and_sync_failed_for_lack_of_space_is_not_replayed(tmp_path,
                                                                               monkeypatch, busy):
    """The group's write and sync reached the disk in one request (by the leader, or by
    enable_busy_wait's thread), then the sync reported ENOSPC: the group fails, its bytes are
    cut off the journal, and a crash does not bring it back."""
    cfg = dict(CFG, enable_busy_wait=busy)
    # the thread's path however slow the disk syncs
    monkeypatch.setattr(journal_mod, "BUSY_SYNC_MAX_S", float("inf"))
    real = fileio.write_direct_synced
    calls = []

    def full_once(*args):
        result = real(*args)
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return result

    log = embedlog.open(tmp_path, **cfg)
    w = log.create_ledger()
    w.append(b"acked-0")
    monkeypatch.setattr(fileio, "write_direct_synced", full_once)
    with pytest.raises(EmbedlogError):
        w.append(b"FAILED-1")
    assert calls == [1]
    lid = w.ledger_id
    abandon(log)
    monkeypatch.undo()
    with embedlog.open(tmp_path, **cfg) as log:
        r = log.open_ledger(lid)
        assert r.read_batch(0, r.last_add_confirmed) == [b"acked-0"]
        w2 = log.create_ledger()                    # and the journal goes on
        assert w2.append(b"after") == 0


def test_journal_sync_off_still_replays_after_clean_close(tmp_path):
    with embedlog.open(tmp_path, journal_sync_data=False, **CFG) as log:
        w = log.create_ledger()
        w.append_many([b"a"] * 100)
        w.close()
        assert log.statistics()["journal"]["fsyncs"] == 0
    got, _ = read_all(tmp_path, w.ledger_id)
    assert got == [b"a"] * 100


def test_journal_rolls_and_old_journals_are_trimmed(tmp_path):
    with embedlog.open(tmp_path, journal_max_size_mb=1, journal_max_backups=1,
                       skip_list_size_limit=1 << 20, **CFG) as log:
        w = log.create_ledger()
        for _ in range(12):
            w.append_many([os.urandom(1000)] * 300)
        log.bookie.checkpoint()
        files = os.listdir(tmp_path / "journal")
        assert len([f for f in files if f.endswith(".txn")]) <= 3
        w.close()
    got, _ = read_all(tmp_path, w.ledger_id)
    assert len(got) == 3600



def test_concurrent_large_groups_with_small_preallocation_reopen_intact(tmp_path):
    """Stress for a race once seen here: the preallocator computed where to write zeros
    from the write head of before a group it had not seen written, and zeroed part of it."""
    payloads = [os.urandom(n) for n in (0, 1, 100, 1024, 70_000, 300_000)] * 20
    for rnd in range(3):
        d = tmp_path / f"r{rnd}"
        with embedlog.open(d, journal_pre_alloc_size_mb=1, journal_max_size_mb=8,
                           skip_list_size_limit=1 << 20, flush_interval_ms=0) as log:
            handles = [log.create_ledger() for _ in range(4)]
            threads = [threading.Thread(target=lambda h=h: [h.append_many(payloads) for _ in range(3)])
                       for h in handles]
            [t.start() for t in threads]
            [t.join() for t in threads]
            ids = [h.ledger_id for h in handles]
            abandon(log)                                       # replay everything
        with embedlog.open(d) as log:
            for lid in ids:
                r = log.open_ledger(lid)
                assert r.read_batch(0, r.last_add_confirmed) == payloads * 3


def test_an_add_framed_during_a_write_waits_for_its_own_group(tmp_path):
    """Regression: records framed while a leader was writing got a sequence number inside
    that leader's group, so they were acknowledged when it synced, before being written."""
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        w.append(b"warm")
        gates = queue.Queue()                      # one gate per group: each waits for its own

        def hold():
            gate = threading.Event()
            gates.put(gate)
            gate.wait(30)

        failpoints.arm("journal.before_write", hold)
        opened = []
        try:
            f1 = w.append_async(b"one")            # group A: held before its write
            opened.append(gates.get(timeout=30))
            f2 = w.append_async(b"two")            # framed while A is out of the buffer
            opened[0].set()                         # A is written and synced...
            assert f1.result(30) == 1
            opened.append(gates.get(timeout=30))    # ...and group B (holding "two") is held
            assert not f2.done(), "acknowledged before its record was written"
        finally:
            failpoints.disarm()
            for gate in opened:
                gate.set()
            while not gates.empty():
                gates.get().set()
        assert f2.result(30) == 2


@pytest.mark.parametrize("scope", [0, 7])          # V1 and V2 entries
def test_an_entry_record_checks_every_byte_of_header_digest_and_payload(tmp_path, scope):
    """ENTRY_CRC32C records: the record checksum covers the entry's header and digest, the
    digest covers the payload; a bit flipped anywhere makes the record bad. Other digests
    keep ENTRY records (checksum over the whole body)."""
    from embedlog._native import (journal_format as jformat, journal_buffer as jbuffer,
                                  journal_scan as jscan, journal_kernels as jkernels,
                                  memtable as nmt)
    from embedlog._native.format import DIGEST_CODES

    def framed(digest, payloads):
        jb = jbuffer.JournalBuffer()
        n, _ = jkernels.add_payloads(jb, nmt.MemTable(1 << 20), scope, 5, 0, -1, 0,
                               DIGEST_CODES[digest], None, payloads, 0, 1 << 20)
        assert n == len(payloads)
        p = tmp_path / f"{digest}.bin"
        fd = os.open(p, os.O_RDWR | os.O_CREAT)
        try:
            jb.write_to(fd, 0)
        finally:
            os.close(fd)
        return bytearray(p.read_bytes())

    for digest in ("crc32", "dummy"):
        records, _end, status, _ = jscan.scan(bytes(framed(digest, [b"x" * 30])), 0)
        assert status == "clean" and [r[1] for r in records] == [jformat.ENTRY]
    data = framed("crc32c", [b"first", os.urandom(300)])
    records, end, status, _ = jscan.scan(bytes(data), 0)
    assert status == "clean" and end == len(data) - 4       # write_to's zero length after it
    assert [r[1] for r in records] == [jformat.ENTRY_CRC32C] * 2
    last = records[-1][0]
    for i in range(last, end):
        for bit in (0, 7):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            got, end, status, _ = jscan.scan(bytes(bad), 0)
            assert len(got) == 1 and end == last and status == "torn", (i, bit)


def test_journal_headers_of_versions_1_and_2_still_open_and_unknown_versions_do_not():
    from embedlog._native import journal_format as jformat
    from embedlog._native.format import crc32c

    def with_version(v):
        h = bytearray(jformat.file_header(0x1234))
        h[4:8] = v.to_bytes(4, "big")
        h[16:20] = crc32c(bytes(h[:16])).to_bytes(4, "big")
        return bytes(h)

    assert jformat.check_file_header(jformat.file_header(0x1234)) == 0x1234
    assert jformat.check_file_header(with_version(1)) == 0x1234
    assert jformat.check_file_header(with_version(2)) == 0x1234
    # version 4: layout 2's segment number, behind its own crc
    seg = jformat.file_header(0x1234, segment=7)
    assert seg[4:8] == (4).to_bytes(4, "big")
    assert jformat.check_file_header(seg) == 0x1234 and jformat.file_segment(seg) == 7
    assert jformat.file_segment(jformat.file_header(0x1234)) == 0
    with pytest.raises(JournalCorruptedError, match="unknown journal format version 5"):
        jformat.check_file_header(with_version(5))


def test_a_flushed_memtable_moves_the_last_log_mark_so_a_crash_replays_little(tmp_path):
    """As BookKeeper's SortedLedgerStorage: a full memtable's flush is followed by a
    checkpoint, without waiting for flush_interval_ms (an hour here)."""
    from support.cliutil import wait_until
    log = embedlog.open(tmp_path, skip_list_size_limit=1 << 16, flush_interval_ms=3_600_000)
    w = log.create_ledger()
    start = log.bookie.mark.persisted
    payloads = [os.urandom(1000) for _ in range(400)]          # about 6 memtables
    for i in range(0, 400, 50):
        w.append_many(payloads[i:i + 50])
    wait_until(lambda: log.bookie.mark.persisted > start, what="the mark to move")
    wait_until(lambda: log.bookie.checkpointer.last_seq >= log.bookie.journal.synced_seq - (2 << 16),
               what="a checkpoint within two memtables of the tail")
    journalled = log.bookie.journal.stats["bytes_written"]
    lid = w.ledger_id
    abandon(log)
    with embedlog.open(tmp_path) as log:
        r = log.open_ledger(lid)
        assert r.read_batch(0, r.last_add_confirmed) == payloads
        assert 0 < log.bookie.replay_report["bytes"] < journalled / 2


def test_appends_to_many_ledgers_share_one_fdatasync(tmp_path):
    from embedlog.errors import LedgerClosedError
    log = embedlog.open(tmp_path, **CFG)
    ws = [log.create_ledger() for _ in range(8)]
    ws[0].append(b"first")
    before = log.bookie.journal.stats["fsyncs"]
    lasts = log.append_many_ledgers([(w, [b"%d-%d" % (i, k) for k in range(20)])
                                     for i, w in enumerate(ws)])
    assert log.bookie.journal.stats["fsyncs"] - before == 1
    assert lasts == [20] + [19] * 7 and [w.last_add_confirmed for w in ws] == lasts
    ws[3].close()
    with pytest.raises(LedgerClosedError):          # the batch before the closed one counts
        log.append_many_ledgers([(ws[1], [b"kept"]), (ws[3], [b"refused"]), (ws[5], [b"never"])])
    assert (ws[1].last_add_confirmed, ws[5].last_add_confirmed) == (20, 19)
    ids = [w.ledger_id for w in ws]
    abandon(log)
    with embedlog.open(tmp_path, **CFG) as log:
        got = [log.open_ledger(i) for i in ids]
        assert got[1].read_batch(0, 20)[-1] == b"kept" and got[5].last_add_confirmed == 19
        assert got[7].read_batch(0, 19) == [b"7-%d" % k for k in range(20)]


def _journal_bytes(path):
    with open(newest_journal(path), "rb") as f:
        return f.read()


@pytest.mark.parametrize("direct", [True, False])
def test_each_group_leaves_every_acknowledged_byte_of_the_journal_as_it_was(tmp_path, direct):
    """O_DIRECT writes the block the last group ended in again: what it held before is
    written back unchanged, and the rest of the last block is zeros (the end of the log)."""
    rnd = __import__("random").Random(5)
    with embedlog.open(tmp_path, journal_direct_writes=direct, **CFG) as log:
        journal = log.bookie.journal
        assert journal.direct_writes == direct
        w = log.create_ledger()
        before = _journal_bytes(tmp_path)
        acked = journal.synced_seq
        want = []
        # group sizes around and across 4 KiB blocks, one entry and many
        for size, count in [(1, 1), (4000, 1), (4096, 1), (10, 300), (70_000, 1), (1, 1),
                            (4087, 2), (333, 50), (0, 3), (9000, 7)]:
            want += [rnd.randbytes(size) for _ in range(count)]
            w.append_many(want[-count:])
            _file_id, end = journal.position_of(journal.synced_seq)
            now = _journal_bytes(tmp_path)
            _f, prev_end = journal.position_of(acked)
            assert now[:prev_end] == before[:prev_end]
            assert not any(now[end:-(-end // 4096) * 4096])
            before, acked = now, journal.synced_seq
        lid, last = w.ledger_id, w.last_add_confirmed
        abandon(log)
    with embedlog.open(tmp_path, **CFG) as log:
        assert log.open_ledger(lid).read_batch(0, last) == want


def test_direct_writes_off_where_the_file_system_refuses_o_direct(tmp_path, monkeypatch):
    real_open = os.open

    def refuse_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *a)
    monkeypatch.setattr(os, "open", refuse_direct)
    with embedlog.open(tmp_path, **CFG) as log:
        assert not log.bookie.journal.direct_writes
        w = log.create_ledger()
        w.append_many([b"x" * 5000] * 10)
        lid = w.ledger_id
    monkeypatch.undo()
    with embedlog.open(tmp_path, **CFG) as log:
        assert log.open_ledger(lid).read_batch(0, 9) == [b"x" * 5000] * 10


def _threads_appending(log, n, results):
    handles = [log.create_ledger() for _ in range(n)]

    def work(i):
        try:
            results[i] = handles[i].append(b"t%d" % i)
        except Exception as exc:             # the test reads what each waiter got
            results[i] = exc
    return [threading.Thread(target=work, args=(i,)) for i in range(n)]


def test_sync_appenders_waiting_outside_the_lock_return_only_after_their_fdatasync(tmp_path):
    """Appenders whose group is being synced sleep outside the bookie lock: none may come
    back before the sync that covers it, and all come back after it."""
    with embedlog.open(tmp_path, **CFG) as log:
        results = {}
        reached, release = threading.Event(), threading.Event()
        failpoints.arm("journal.before_sync", lambda: (reached.set(), release.wait(10)))
        try:
            threads = _threads_appending(log, 8, results)
            [t.start() for t in threads]
            assert reached.wait(10)
            # the other seven frame their adds and wait for the sync in flight (outside
            # the lock) or lead the next group into the same held failpoint
            deadline = time.monotonic() + 10
            while log.bookie.stats["adds"] < 8:       # every add framed
                assert time.monotonic() < deadline
                time.sleep(0.001)
            assert results == {}
        finally:
            failpoints.disarm()
            release.set()
        [t.join(10) for t in threads]
        assert results == {i: 0 for i in range(8)}


def test_a_failed_sync_wakes_every_waiter_with_the_error(tmp_path):
    log = embedlog.open(tmp_path, **CFG)
    results = {}
    reached, release = threading.Event(), threading.Event()

    def fail():
        reached.set()
        release.wait(10)
        raise OSError(5, "Input/output error (injected)")
    failpoints.arm("journal.before_sync", fail)
    try:
        threads = _threads_appending(log, 8, results)
        [t.start() for t in threads]
        assert reached.wait(10)
        release.set()
        [t.join(10) for t in threads]
        assert not any(t.is_alive() for t in threads)
        assert len(results) == 8 and all(isinstance(r, Exception) for r in results.values()), results
    finally:
        failpoints.disarm()
        release.set()
        abandon(log)


def test_checkpoints_take_turns(tmp_path):
    """Regression: close()'s checkpoint ran beside the background one (after replay) and
    both trimmed the same journal files; the second found them gone (FileNotFoundError).
    A checkpoint started while another is held after moving the mark waits its turn."""
    log = embedlog.open(tmp_path, journal_max_size_mb=1, journal_max_backups=0,
                        journal_pre_alloc_size_mb=1, flush_interval_ms=0)
    try:
        w = log.create_ledger()
        for _ in range(30):
            w.append_many([os.urandom(10_000) for _ in range(10)])
        paused, release, hits, errors = threading.Event(), threading.Event(), [], []

        def hold_the_first():
            hits.append(1)
            if len(hits) == 1:
                paused.set()
                release.wait(10)

        def checkpoint():
            try:
                log.bookie.checkpoint()
            except Exception as exc:          # what each checkpoint raised
                errors.append(exc)
        failpoints.arm("checkpoint.after_lastmark", hold_the_first)   # mark moved, not trimmed
        try:
            first = threading.Thread(target=checkpoint)
            first.start()
            assert paused.wait(10)
            second = threading.Thread(target=checkpoint)
            second.start()
            second.join(0.5)
            assert len(hits) == 1             # the second has not reached the same point
            release.set()
            first.join(10)
            second.join(10)
        finally:
            failpoints.disarm()
            release.set()
        assert errors == [] and len(hits) == 2
    finally:
        log.close()


def test_trimming_a_journal_already_gone_is_not_an_error(tmp_path, monkeypatch):
    with embedlog.open(tmp_path, journal_max_size_mb=1, journal_max_backups=0,
                       journal_pre_alloc_size_mb=1, flush_interval_ms=0) as log:
        w = log.create_ledger()
        for _ in range(30):
            w.append_many([os.urandom(10_000) for _ in range(10)])
        real_unlink = os.unlink

        def someone_else_first(path, *a, **k):
            if path.endswith(".txn"):
                real_unlink(path)             # another trim got there first
            return real_unlink(path, *a, **k)
        monkeypatch.setattr(os, "unlink", someone_else_first)
        log.bookie.checkpoint()
        monkeypatch.undo()
        assert log.bookie.statistics()["checkpoints"] >= 1


def test_an_add_whose_sync_failed_for_lack_of_space_is_not_replayed(tmp_path):
    """Regression: a group whose fdatasync failed with ENOSPC was failed and taken out of
    the memtable, but its bytes stayed in the journal, so a crash brought the failed add
    back. They are cut off at once."""
    import errno
    log = embedlog.open(tmp_path, **CFG)
    w = log.create_ledger()
    w.append(b"acked-0")
    hits = []

    def full_once():
        hits.append(1)
        if len(hits) == 1:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
    failpoints.arm("journal.before_sync", full_once)
    try:
        with pytest.raises(embedlog.errors.EmbedlogError):
            w.append(b"FAILED-1")
    finally:
        failpoints.disarm()
    lid = w.ledger_id
    abandon(log)
    with embedlog.open(tmp_path, **CFG) as log:
        r = log.open_ledger(lid)
        assert r.read_batch(0, r.last_add_confirmed) == [b"acked-0"]


def test_waiting_with_a_timeout_for_what_no_group_will_cover_times_out(tmp_path):
    from embedlog.errors import TimeoutError as EmbedlogTimeout
    with embedlog.open(tmp_path, **CFG) as log:
        log.create_ledger().append(b"x")
        with pytest.raises(EmbedlogTimeout):
            log.bookie.wait_durable(log.bookie.journal.appended_seq + 10, timeout=0.2)


def test_a_publish_wakes_the_waiters_it_covers_and_one_to_lead_the_next_group():
    """Waking everyone on every sync sent the next group's waiters through the GIL for
    nothing; a waiter left asleep must still be woken by a later publish or a wake."""
    from embedlog._native.journal_waiters import DurableSeq
    d = DurableSeq()
    got = {}

    def wait(seq):
        got[seq] = d.wait(seq, d.epoch, 30.0)

    def until(cond):
        deadline = time.monotonic() + 10
        while not cond():
            assert time.monotonic() < deadline
            time.sleep(0.001)

    threads = {s: threading.Thread(target=wait, args=(s,)) for s in (10, 30, 20, 40)}
    for s in (10, 30, 20, 40):
        threads[s].start()
        until(lambda: d.nwaiting == len([t for t in threads.values() if t.ident]))
    d.publish(10)                   # covers 10; 20 is the lowest it does not cover
    threads[10].join(10)
    threads[20].join(10)
    assert got == {10: True, 20: False}
    assert d.nwaiting == 2 and threads[30].is_alive() and threads[40].is_alive()
    d.publish(35)                   # covers 30, picks 40
    threads[30].join(10)
    threads[40].join(10)
    assert got == {10: True, 20: False, 30: True, 40: False} and d.nwaiting == 0
    # a waiter that looked before a publish returns at once; one that times out leaves
    assert d.wait(50, d.epoch - 1, 30.0) is False
    assert d.wait(50, d.epoch, 0.01) is False and d.nwaiting == 0
    # wake() wakes everyone (a failed group, a close)
    threads = [threading.Thread(target=wait, args=(s,)) for s in (60, 70, 80)]
    [t.start() for t in threads]
    until(lambda: d.nwaiting == 3)
    d.wake()
    [t.join(10) for t in threads]
    assert not any(t.is_alive() for t in threads) and d.nwaiting == 0
    assert got[60] is got[70] is got[80] is False


def test_sixteen_appenders_each_come_back_with_its_own_entry_ids(tmp_path):
    """Group commit with targeted wake-ups: every append returns (no waiter left asleep
    without a leader) and reads back, across many groups."""
    with embedlog.open(tmp_path, **CFG) as log:
        handles = [log.create_ledger() for _ in range(16)]
        errors = []

        def work(h):
            try:
                for i in range(150):
                    assert h.append(b"%d" % i) == i
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(h,)) for h in handles]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        assert not any(t.is_alive() for t in threads) and errors == []
        assert log.bookie.journal.durable.nwaiting == 0
        for h in handles:
            assert h.last_add_confirmed == 149
            assert log.open_ledger(h.ledger_id).read_batch(0, 149) == [b"%d" % i for i in range(150)]


@pytest.mark.parametrize("end", ["close", "crash"])
@pytest.mark.parametrize("how", ["async", "threads"])
def test_no_entry_is_acknowledged_across_one_whose_group_failed(tmp_path, how, end):
    """Regression: entry 2, framed while entry 1's group was being synced, went out in the
    next group, which succeeded after entry 1's failed for lack of space; entry 2 was
    acknowledged (its future, or a second thread's append, returned 2) with entry 1
    missing, and the close covered it; without a close, recovery after a crash closed the
    ledger at entry 2 (the bookie's last entry). Nothing past the hole may count."""
    import errno
    log = embedlog.open(tmp_path, **CFG)
    w = log.create_ledger()
    w.append(b"acked-0")
    reached, release, hits = threading.Event(), threading.Event(), []

    def full_once():
        hits.append(1)
        if len(hits) == 1:
            reached.set()
            release.wait(10)
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
    failpoints.arm("journal.before_sync", full_once)
    try:
        if how == "async":
            first = w.append_async(b"FAILED-1")
            assert reached.wait(10)
            second = w.append_async(b"after-the-hole-2")
        else:
            first, second = {}, {}
            def add(out, data):
                try:
                    out["id"] = w.append(data)
                except Exception as exc:
                    out["error"] = exc
            t1 = threading.Thread(target=add, args=(first, b"FAILED-1"))
            t1.start()
            assert reached.wait(10)
            t2 = threading.Thread(target=add, args=(second, b"after-the-hole-2"))
            t2.start()
            deadline = time.monotonic() + 10
            while log.bookie.stats["adds"] < 3:            # entry 2 framed behind the held sync
                assert time.monotonic() < deadline
                time.sleep(0.001)
        release.set()
        # entry 2 is refused either way, never acknowledged: by the handle (LedgerClosedError:
        # its group was written after entry 1's failed) or with entry 1's group's error (it
        # was still in the buffer behind that group when the failure cut it; seen at load 10)
        if how == "async":
            with pytest.raises(embedlog.errors.EmbedlogError):
                first.result(10)
            with pytest.raises(embedlog.errors.EmbedlogError):
                second.result(10)
        else:
            t1.join(10)
            t2.join(10)
            assert "error" in first and "id" not in first
            assert isinstance(second.get("error"), embedlog.errors.EmbedlogError), second
            assert "id" not in second
    finally:
        failpoints.disarm()
        release.set()
    assert w.last_add_confirmed == 0
    if end == "close":
        w.close()
    lid = w.ledger_id
    abandon(log)
    with embedlog.open(tmp_path, **CFG) as log:
        r = log.open_ledger(lid)               # recovers it if it was not closed
        assert r.last_add_confirmed == 0
        assert r.read_batch(0, 0) == [b"acked-0"]


def _groups(jpath):
    """(offset, length) of each group of a journal file, from its GROUP records."""
    data = open(jpath, "rb").read()
    records = jscan.scan_file(data)[0]
    return [(off, jformat.decode_record(t, data[body:body + n])[0])
            for off, t, body, n in records if t == jformat.GROUP]


@pytest.mark.parametrize("where", ["inside", "its_group_record", "skip_corrupt",
                                   "earlier_group", "flipped_bit"])
def test_a_power_loss_inside_the_last_group_is_torn_not_corruption(tmp_path, where):
    """Until a group's fdatasync returns its sectors reach the disk in any order, so a
    power loss can leave a sector of zeros inside the newest journal's last group with
    later records of the group whole. No group is written before the one ahead of it was
    synced, so that group was never acknowledged: cut as torn at the first bad record (the
    old code refused the start as corruption in the middle). Each group's first record, a
    GROUP record, bounds it. Zeros inside an earlier group, and a flipped bit (no sector of
    zeros) inside the last one, stay damage."""
    first = [b"first-%03d" % i + os.urandom(90) for i in range(50)]
    last = [b"last-%03d" % i + os.urandom(90) for i in range(300)]
    log = embedlog.open(tmp_path, **CFG)
    w = log.create_ledger()
    w.append_many(first)
    w.append_many(last)
    lid = w.ledger_id
    abandon(log)
    jpath = newest_journal(tmp_path)
    groups = _groups(jpath)
    (g1, n1), (g2, n2) = groups[-2:]
    assert n2 > 300 * 100, "the last batch was not one group: the test would test nothing"
    entries = journal_records(jpath)[0]
    with open(jpath, "r+b") as f:
        if where in ("inside", "skip_corrupt"):
            sector = (g2 + n2 // 2) & ~511          # records of the group follow it
            f.seek(sector)
            f.write(bytes(512))
            cut_at = next(off for off, _t, body, n in entries if body + n > sector)
        elif where == "its_group_record":
            # that sector's new bytes never came: it holds the previous group's tail as before
            assert g2 % 512, "the last group begins on a sector: the test tests nothing"
            f.seek(g2)
            f.write(bytes(512 - g2 % 512))
            cut_at = g2
        elif where == "earlier_group":
            f.seek((g1 + n1 // 2) & ~511)
            f.write(bytes(512))
        else:
            f.seek(g2 + n2 // 2)
            b = f.read(1)
            f.seek(g2 + n2 // 2)
            f.write(bytes([b[0] ^ 0x10]))
    cfg = dict(journal_skip_corrupt_records=True) if where == "skip_corrupt" else {}
    if where in ("earlier_group", "flipped_bit"):
        with pytest.raises(JournalCorruptedError, match="corrupt at offset"):
            embedlog.open(tmp_path, **CFG)
        return
    got, report = read_all(tmp_path, lid, **cfg)
    assert [t[1] for t in report["torn"]] == [cut_at] and not report["skipped"], report
    kept = [e for e in entries if e[0] < cut_at and e[1] in jformat.ENTRY_TYPES]
    assert len(first) <= len(kept) < len(first) + len(last)
    assert got == (first + last)[:len(kept)]
    assert os.path.exists(os.path.join(tmp_path, "journal", "torn", "%s.%d" % (
        os.path.basename(jpath), cut_at)))
    # the cut is whole: a second start finds a clean journal
    got_again, report = read_all(tmp_path, lid)
    assert got_again == got and not report["torn"]


def test_a_lost_sector_over_two_groups_is_not_taken_for_a_torn_one(tmp_path):
    """A sector lost whole (zeros, after every group was synced and acknowledged) from the
    start of a group G that is not the last through the last group's GROUP record: what
    follows is the last group's records, with no GROUP record of their own. A power loss
    tearing the last group leaves the sector holding its start as it was before the write
    (the previous group's tail, then zeros): a sector that begins at G and is zeros does
    not show that, so the start is refused, and G is not cut (the first version of the
    rule cut it: helper's finding)."""
    cfg = dict(CFG, journal_direct_writes=False)
    log = embedlog.open(tmp_path, **cfg)
    w = log.create_ledger()
    files = log.bookie.journal.files
    w.append(b"a" * 100)
    before = files.offset
    w.append(b"b" * 100)
    overhead = files.offset - before - 100            # a lone group's bytes beyond its payload
    pad = (512 - files.offset % 512) % 512
    while pad <= overhead:
        pad += 512
    w.append(b"p" * (pad - overhead))                 # the next group begins on a sector
    g = files.offset
    assert g % 512 == 0
    w.append(b"G" * 100)
    w.append_many([b"last-%03d" % i + bytes(92) for i in range(50)])
    abandon(log)
    jpath = newest_journal(tmp_path)
    starts = [off for off, _n in _groups(jpath)]
    assert starts[-2] == g and starts[-1] < g + 512
    with open(jpath, "r+b") as f:
        f.seek(g)
        f.write(bytes(512))
    with pytest.raises(JournalCorruptedError, match=f"corrupt at offset {g}"):
        embedlog.open(tmp_path, **cfg)
