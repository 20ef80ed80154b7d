"""enable_busy_wait (busy_io.BusyWriter): the journal's small groups written and synced by a
thread of their own while the group's leader spins. The same durability as the plain path
(the SIGKILL and power-loss tests run it too: test_crash.py, test_power_loss.py); here its
own paths: the thread asleep, a failed write or sync (a full disk's group: test_journal.py,
with and without it), the spinning left off while the disk syncs slowly."""
import errno
import os

import pytest

import embedlog
from embedlog._native import journal_buffer as jbuffer
from embedlog._native.busy_io import BusyWriter
from embedlog.bookie import journal
from support.cliutil import wait_until

CFG = dict(journal_pre_alloc_size_mb=1, flush_interval_ms=0, enable_busy_wait=True)
SPIN_SYNC_MAX_S = journal.BUSY_SYNC_MAX_S


@pytest.fixture(autouse=True)
def _spin_however_slow_the_disk(monkeypatch):
    # the thread's own paths, whatever the disk's fdatasync takes on the machine running them
    monkeypatch.setattr(journal, "BUSY_SYNC_MAX_S", float("inf"))


def test_lone_appends_go_through_the_spinning_thread_and_read_back(tmp_path):
    payloads = [os.urandom(100 + i) for i in range(300)]
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        busy = log.bookie.journal._busy
        for p in payloads:
            w.append(p)
        stats = log.statistics()["journal"]
        assert busy.handed > 0                      # the thread wrote and synced groups ...
        assert busy.handed + busy.done_here >= 300  # ... and every group went this way
        assert stats["fsyncs"] >= 300 and stats["fsync_time_s"] > 0
        lid = w.ledger_id
    with embedlog.open(tmp_path) as log:             # read back without it
        assert log.open_ledger(lid).read_batch(0, 299) == payloads


def test_a_leader_finding_the_thread_asleep_writes_itself_and_wakes_it(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        w.append(b"first")
        busy = log.bookie.journal._busy
        wait_until(lambda: busy.sleeping, timeout_s=10, what="the busy thread asleep")
        here, handed = busy.done_here, busy.handed
        w.append(b"second")                         # no wake-up waited for
        assert busy.done_here == here + 1 and busy.handed == handed
        for i in range(50):                         # woken, it takes the groups again
            w.append(b"more %d" % i)
        assert busy.handed > handed
        got = log.open_ledger(w.ledger_id, recovery=False).read_batch(0, 50)   # to the LAC
        assert got == [b"first", b"second"] + [b"more %d" % i for i in range(49)]


def test_large_groups_take_the_plain_path(tmp_path):
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        busy = log.bookie.journal._busy
        before = busy.handed + busy.done_here
        w.append_many([b"x" * 1000] * 200)          # one group of about 200 KiB
        assert busy.handed + busy.done_here == before


def test_the_leader_syncs_itself_while_the_disk_syncs_slowly(tmp_path, monkeypatch):
    """Spinning pays only through short syncs (journal.BUSY_SYNC_MAX_S): while the recent
    fdatasyncs are slower, the leader writes and syncs its group in its own call; once they
    are quick again the thread takes the groups."""
    monkeypatch.setattr(journal, "BUSY_SYNC_MAX_S", SPIN_SYNC_MAX_S)
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        j = log.bookie.journal
        busy = j._busy
        before = busy.handed + busy.done_here
        for i in range(5):
            j._fsync_recent_s = 1.0                 # a disk taking a second per sync
            w.append(b"slow %d" % i)
        assert busy.handed + busy.done_here == before
        j._fsync_recent_s = 0.0                     # and quick again
        w.append(b"quick")
        assert busy.handed + busy.done_here > before
        got = log.open_ledger(w.ledger_id, recovery=False).read_batch(0, 4)   # to the LAC
        assert got == [b"slow %d" % i for i in range(5)]


def test_buffered_journal_writes_take_the_plain_path(tmp_path):
    with embedlog.open(tmp_path, **CFG, journal_direct_writes=False) as log:
        w = log.create_ledger()
        for i in range(20):
            w.append(b"b%d" % i)
        busy = log.bookie.journal._busy
        assert busy.handed + busy.done_here == 0
        assert log.statistics()["journal"]["fsyncs"] >= 20
        assert log.open_ledger(w.ledger_id, recovery=False).read_batch(0, 18) == \
            [b"b%d" % i for i in range(19)]


def _records(n):
    buf = jbuffer.JournalBuffer()
    buf.set_lead(0)
    for i in range(n):
        buf.add_record(1, b"record %d " % i * 20)
    return buf


def test_a_failed_write_raises_and_the_thread_serves_the_next(tmp_path):
    busy = BusyWriter()
    try:
        path = tmp_path / "j"
        path.write_bytes(b"")
        ro = os.open(path, os.O_RDONLY)
        try:
            for _ in range(3):                      # by the thread or here: the same error
                with pytest.raises(OSError) as caught:
                    busy.write_direct_sync(_records(5), ro, 0, b"")
                assert caught.value.errno == errno.EBADF
        finally:
            os.close(ro)
        fd = os.open(path, os.O_RDWR)
        try:
            buf = _records(5)
            tail, sync_s = busy.write_direct_sync(buf, fd, 0, b"")
            assert sync_s >= 0
            plain = tmp_path / "plain"
            pfd = os.open(plain, os.O_RDWR | os.O_CREAT)
            try:
                assert _records(5).write_direct(pfd, 0, b"") == tail
            finally:
                os.close(pfd)
            assert path.read_bytes() == plain.read_bytes()
            assert len(tail) == buf.nbytes % jbuffer.DIRECT_ALIGN_BYTES
        finally:
            os.close(fd)
    finally:
        busy.close()
        busy.close()                                # idempotent
    with pytest.raises(ValueError):
        busy.write_direct_sync(_records(1), 0, 0, b"")
