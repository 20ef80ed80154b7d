"""Journal.sync_if_idle: a served add that finds the journal idle is synced by its caller
(the server's loop) instead of the journal's thread; in every other case it does nothing
and returns False at once, so the caller never waits there for a group timer, a roll, a
preallocation, another group or a slow disk. A failed group raises, as waiting would."""
import errno
import threading
import time

import pytest

import embedlog
from embedlog import failpoints, fileio
from embedlog.errors import EmbedlogError
from support.crashutil import abandon

CFG = dict(journal_pre_alloc_size_mb=1, flush_interval_ms=0)


def _frame(log, w, payload: bytes = b"x") -> int:
    """Journal one add of ``w`` without waiting for it; returns the seq to wait for."""
    seq, _length = w._frame(w._next_entry_id, [payload])
    w._next_entry_id += 1
    return seq


def test_an_idle_journal_is_synced_in_the_callers_thread(tmp_path, monkeypatch, any_disk_is_quick):
    log = embedlog.open(tmp_path, **CFG)
    try:
        w = log.create_ledger()
        w.append(b"first")
        j = log.bookie.journal
        synced_by = []
        for name in ("sync", "write_direct_synced"):     # a group synced alone, or with its write
            real = getattr(fileio, name)
            monkeypatch.setattr(fileio, name, lambda *a, _real=real, **k: (
                synced_by.append(threading.get_ident()), _real(*a, **k))[1])
        groups = j.stats["groups"]
        seq = _frame(log, w, b"lone")
        assert j.synced_seq < seq
        assert log.bookie.sync_if_idle(seq) is True
        assert j.synced_seq >= seq and j.stats["groups"] == groups + 1
        assert synced_by == [threading.get_ident()]
        assert log.bookie.sync_if_idle(seq) is True          # already durable: nothing to do
        assert j.stats["groups"] == groups + 1
    finally:
        log.close()


@pytest.mark.parametrize("why", ["group timer", "slow disk", "callbacks waiting", "group in flight",
                                 "roll due", "closed"])
def test_anything_else_returns_false_at_once_and_the_journal_thread_syncs_it(tmp_path, why):
    cfg = dict(CFG)
    if why == "group timer":
        cfg.update(journal_flush_when_queue_empty=False, journal_max_group_wait_ms=300)
    log = embedlog.open(tmp_path, **cfg)
    try:
        w = log.create_ledger()
        w.append(b"first")
        j = log.bookie.journal
        seq = _frame(log, w, b"second")
        done = threading.Event()
        with log.bookie.cv:
            if why == "slow disk":
                j._fsync_recent_s = 0.01
            elif why == "callbacks waiting":
                j.on_durable(seq, lambda error: None)     # the thread owns this group now
            elif why == "group in flight":
                j._syncing = True
            elif why == "roll due":
                j._needs_roll = True
            elif why == "closed":
                j._closed = True
            t0 = time.monotonic()
            assert j.sync_if_idle(seq) is False
            assert time.monotonic() - t0 < 0.1 and j.synced_seq < seq
            if why == "group in flight":
                j._syncing = False
            elif why == "closed":
                j._closed = False
            if why != "callbacks waiting":
                j.on_durable(seq, lambda error: done.set() if error is None else None)
        if why != "callbacks waiting":
            assert done.wait(10)
        log.bookie.wait_durable(seq, timeout=10)
        assert j.synced_seq >= seq
    finally:
        log.close()


def test_a_group_that_fails_raises_and_is_never_acknowledged(tmp_path, any_disk_is_quick):
    log = embedlog.open(tmp_path, **CFG)
    w = log.create_ledger()
    w.append(b"acked-0")
    lid = w.ledger_id
    seq = _frame(log, w, b"FAILED-1")
    failpoints.arm("journal.before_sync",
                   lambda: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left (injected)")))
    try:
        with pytest.raises(EmbedlogError, match="disk full"):
            log.bookie.sync_if_idle(seq)
    finally:
        failpoints.disarm()
    # the journal goes on in a new file: a later look leaves the add to the thread, which
    # tells it the same
    assert log.bookie.sync_if_idle(seq) is False
    errors = []
    done = threading.Event()
    log.bookie.on_durable(seq, lambda error: (errors.append(error), done.set()))
    assert done.wait(10) and isinstance(errors[0], EmbedlogError) and "disk full" in str(errors[0])
    abandon(log)
    with embedlog.open(tmp_path, **CFG) as log:
        r = log.open_ledger(lid)
        assert r.read_batch(0, r.last_add_confirmed) == [b"acked-0"]
