"""Reused journal files (journal_reuse_files, BookKeeper's journalReuseFiles): a journal
trimmed after a checkpoint is renamed and overwritten instead of a new file preallocated with
zeros. Its previous life's records stay behind the new tail; salted record checksums keep
them from reading as current ones, through a scan, a SIGKILL and a power loss."""
import os
import threading

import pytest

import embedlog
from embedlog import fileio
from embedlog._native import journal_buffer as jbuffer, journal_format as jformat
from embedlog._native import journal_scan as jscan
from embedlog.bookie.journal import Journal
from embedlog.bookie.journal_files import FREE, MAX_FREE, MAX_FREE_BURST, journal_ids
from embedlog.config import BookieConfig
from embedlog.errors import EmbedlogError
from support.cliutil import wait_until
from support.crash_child import payload
from support.crashutil import abandon

REUSE = dict(journal_max_size_mb=1, journal_max_backups=0, journal_pre_alloc_size_mb=1,
             skip_list_size_limit=64 << 10, flush_interval_ms=20,
             storage_layout=1)          # layout 2 keeps trimmed journals as segments


def _life(path, log_id, salt, bodies, recycled_from=0, terminate=True):
    """Write one life of a journal file: its header, then ``bodies`` as FENCE-like records."""
    buf = jbuffer.JournalBuffer()
    for b in bodies:
        buf.add_record(jformat.TRUNCATE, b)
    buf.salt(salt)
    size = os.path.getsize(path) if os.path.exists(path) else 0
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, jformat.file_header(log_id, 0, size, recycled_from, salt), 0)
        end = jformat.HEADER_SIZE + buf.nbytes
        before = os.pread(fd, 4, end)
        buf.write_to(fd, jformat.HEADER_SIZE)
        if not terminate:             # its zero length lost: the previous life's bytes follow
            os.pwrite(fd, before, end)
    finally:
        os.close(fd)


def _body(i):
    return i.to_bytes(8, "big") + (7).to_bytes(8, "big") + i.to_bytes(8, "big")


@pytest.mark.parametrize("terminate", [True, False])
def test_a_reused_files_previous_life_never_reads_as_current(tmp_path, terminate):
    path = str(tmp_path / "j.txn")
    old_salt = 0
    _life(path, 1, old_salt, [_body(i) for i in range(500)])
    records, _end, status, _ = jscan.scan_file(open(path, "rb").read())
    assert len(records) == 500 and status == "clean"
    salt = jformat.new_salt(2, old_salt)
    assert salt not in (0, old_salt)
    _life(path, 2, salt, [_body(1000 + i) for i in range(40)], recycled_from=1, terminate=terminate)
    data = open(path, "rb").read()
    assert jformat.file_salt(data[:jformat.HEADER_SIZE]) == (1, salt)
    records, end, status, _ = jscan.scan_file(data)
    assert len(records) == 40, "a record of the previous life was read as current"
    # with its zero length, the end of the new life is clean; without it (lost to a power
    # loss) the previous life's bytes there read as a torn tail, never as more records
    assert status == ("clean" if terminate else "torn")
    # the same bytes read with no salt (a reader that ignored the header) find the old life
    # only after the new records' checksums fail: nothing of the new life checks unsalted
    assert len(jscan.scan(data, jformat.HEADER_SIZE)[0]) == 0
    # damage in the middle of the new life is still told from the end
    bad = bytearray(data)
    bad[records[10][2] + 3] ^= 0x40
    _r, end, status, _ = jscan.scan_file(bytes(bad))
    assert status == "corrupt" and end == records[10][0]


def _journal_stats(log):
    return log.bookie.statistics()["journal"]


def test_steady_state_reuses_journals_and_writes_no_zeros(tmp_path):
    """After the first journals are trimmed, every roll takes a kept file: no preallocation
    zeros are written, at most MAX_FREE_BURST files are kept, and everything reads back."""
    path = tmp_path / "d"
    data = os.urandom(1000)
    with embedlog.open(path, **REUSE) as log:
        w = log.create_ledger()
        wait_until(lambda: (w.append_many([data] * 100) is not None and
                            _journal_stats(log)["files_reused"] >= 2),
                   timeout_s=120, what="two journals reused")
        zeros = _journal_stats(log)["zeros_written"]
        reused = _journal_stats(log)["files_reused"]
        for _ in range(60):                       # ~6 MiB: six more rolls
            w.append_many([data] * 100)
        wait_until(lambda: _journal_stats(log)["files_reused"] >= reused + 4, timeout_s=120,
                   what="more reuse")
        assert _journal_stats(log)["zeros_written"] == zeros
        jdir = os.path.join(path, "journal")
        assert len(journal_ids(jdir, FREE)) <= MAX_FREE_BURST
        last = w.append(b"last")
    with embedlog.open(path, **REUSE) as log:
        r = log.open_ledger(w.ledger_id)
        assert r.last_add_confirmed == last
        assert r.read_batch(last - 1, last) == [data, b"last"]


@pytest.mark.parametrize("direct", [True, False])
def test_a_deleted_ledgers_records_in_a_reused_file_stay_dead_after_sigkill(tmp_path, direct):
    """The previous life of the file a crash leaves newest holds a deleted ledger's entries:
    replay must not bring them back (with O_DIRECT's zero padding after the tail, and with
    buffered writes, where only a zero length separates it from the previous life)."""
    path = tmp_path / "d"
    cfg = dict(REUSE, journal_direct_writes=direct)
    log = embedlog.open(path, **cfg)
    gone = log.create_ledger()
    for i in range(9):
        gone.append_many([payload("gone", i * 100 + k) for k in range(100)])
    gone.close()
    log.delete_ledger(gone.ledger_id)
    kept = log.create_ledger()
    acked = []
    wait_until(lambda: (acked.extend(range(len(acked), 1 + kept.append_many(
                            [payload("kept", len(acked) + k) for k in range(100)]))) or
                        _journal_stats(log)["files_reused"] >= 1),
               timeout_s=120, what="the deleted ledger's journal reused")
    for _ in range(5):
        acked.append(kept.append(payload("kept", len(acked))))
    abandon(log)                                  # SIGKILL: no close, no checkpoint
    with embedlog.open(path, **cfg) as log:
        assert gone.ledger_id not in log.list_ledgers()
        with pytest.raises(EmbedlogError):
            log.open_ledger(gone.ledger_id)
        r = log.open_ledger(kept.ledger_id)
        assert r.read_batch(0, acked[-1]) == [payload("kept", e) for e in acked]


def test_power_loss_in_a_reused_file_keeps_every_acknowledged_entry(tmp_path):
    """Power loss where the unsynced part of a reused journal holds its previous life (not
    zeros): every acknowledged entry reads back, nothing of the previous life does."""
    path = tmp_path / "d"
    fileio.record_durable(True)
    try:
        log = embedlog.open(path, **REUSE)
        w = log.create_ledger()
        acked = []
        wait_until(lambda: (acked.extend(range(len(acked), 1 + w.append_many(
                                [payload("p", len(acked) + k) for k in range(50)]))) or
                            _journal_stats(log)["files_reused"] >= 3),
                   timeout_s=120, what="three journals reused")
        for _ in range(20):
            acked.append(w.append(payload("p", len(acked))))
        abandon(log)
        cut = fileio.power_loss(str(path))
    finally:
        fileio.record_durable(False)
    assert any("previous life" in str(how) for _p, how in cut), cut
    with embedlog.open(path, **REUSE) as log:
        r = log.open_ledger(w.ledger_id)
        assert r.last_add_confirmed == acked[-1]
        assert r.read_batch(0, acked[-1]) == [payload("p", e) for e in acked]


def test_journals_kept_for_reuse_go_when_reuse_is_turned_off(tmp_path):
    path = tmp_path / "d"
    with embedlog.open(path, **REUSE) as log:
        w = log.create_ledger()
        wait_until(lambda: (w.append_many([b"x" * 1000] * 100) is not None and
                            journal_ids(os.path.join(path, "journal"), FREE)),
                   timeout_s=120, what="a journal kept for reuse")
    off = dict(REUSE, journal_reuse_files=False)
    with embedlog.open(path, **off) as log:
        w = log.create_ledger()
        wait_until(lambda: (w.append_many([b"y" * 1000] * 100) is not None and
                            log.bookie.statistics()["checkpoints"] >= 2 and
                            not journal_ids(os.path.join(path, "journal"), FREE)),
                   timeout_s=120, what="the kept journals deleted")
        assert _journal_stats(log)["files_reused"] == 0


@pytest.mark.parametrize("reuse,freed,kept", [(True, 5, 5), (True, 12, 12), (True, 20, MAX_FREE_BURST),
                                              (False, 12, 0)])
def test_a_trim_keeps_as_many_journals_as_it_frees_up_to_the_burst_bound(tmp_path, reuse, freed, kept):
    """A checkpoint that lagged lets the journal roll more than MAX_FREE files; its trim keeps
    them all (up to MAX_FREE_BURST), so the next such stretch finds kept files instead of
    preallocating new ones (a pool of eight ran dry: compare.py's steady item wrote zeros).
    Files short of journal_max_size_mb are never kept; with reuse off, none are."""
    # a journal never started: no checkpoint of a bookie's trims the same files meanwhile
    config = BookieConfig(**{**REUSE, "journal_reuse_files": reuse})
    lock = threading.Lock()
    jdir = str(tmp_path / "journal")
    journal = Journal(jdir, config, threading.Condition(lock), lock)
    size = 1 << 20                                       # journal_max_size_mb=1: whole files
    for i in range(1, freed + 2):
        with open(os.path.join(jdir, "%x.txn" % i), "wb") as f:
            f.truncate(size if i <= freed else size // 2)   # the last one is short
    journal.trim(freed + 2)
    assert len(journal_ids(jdir, FREE)) == kept
    assert journal_ids(jdir) == []                       # the rest deleted
    assert MAX_FREE < MAX_FREE_BURST


@pytest.mark.parametrize("reuse", [True, False])
def test_a_damaged_last_record_of_a_journal_a_later_one_follows_is_refused(tmp_path, reuse):
    """A bad last record was cut as a torn write (a WARNING, one acknowledged entry gone)
    when it looked torn: always in a reused file (stale bytes where a torn write missed),
    in a new one when a sector of it read as zeros. But a roll syncs a journal before it
    begins the next, so the last record of a journal a later one follows was durable and
    acknowledged: the open is refused, as for damage in a new file, unless the operator
    accepts the loss (journal_skip_corrupt_records)."""
    from embedlog.errors import JournalCorruptedError
    cfg = dict(REUSE, journal_reuse_files=reuse, flush_interval_ms=0,
               skip_list_size_limit=64 << 20)
    path = tmp_path / "d"
    jdir = os.path.join(path, "journal")
    data = os.urandom(1000)
    log = embedlog.open(path, **cfg)
    w = log.create_ledger()
    if reuse:                                   # journals to reuse: three, trimmed and kept
        for _ in range(30):
            w.append_many([data] * 100)
        log.bookie.checkpoint()
        assert journal_ids(jdir, FREE)
    mark = log.bookie.mark.persisted
    for _ in range(30):                         # three journals replay will read
        last = w.append_many([data] * 100)
    abandon(log)
    replayed = [i for i in journal_ids(jdir) if i >= mark[0]]
    assert len(replayed) >= 3, replayed
    victim = os.path.join(jdir, "%x.txn" % replayed[-2])     # a later journal follows it
    with open(victim, "r+b") as f:
        image = f.read()
        recycled_from, _salt = jformat.file_salt(image[:jformat.HEADER_SIZE])
        assert bool(recycled_from) == reuse
        records, _end, status, _ = jscan.scan_file(image)
        assert status == "clean"
        _off, _t, body, n = records[-1]
        sector = -(-body // 512) * 512
        assert sector + 512 <= body + n
        f.seek(sector)
        f.write(bytes(512))                     # a sector lost: it reads as a torn write did
    with pytest.raises(JournalCorruptedError, match="acknowledged record was damaged"):
        embedlog.open(path, **cfg)
    with embedlog.open(path, **dict(cfg, journal_skip_corrupt_records=True)) as log:
        report = log.bookie.replay_report
        assert [p for p, _o, _why in report["damaged_tails"]] == [victim]
        assert log.bookie.read_last_entry_id(w.ledger_id) == last
