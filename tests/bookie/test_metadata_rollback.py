"""Metadata that goes back in time (issue 26, item 1): an older meta.db restored (same
instance id, so the cookie passes) hands out ledger ids again. The bookie must never put a
new ledger's entries into the data it holds for an old one of the same id: the embedded
log skips ids its bookie holds, the store's generator is moved past them at start-up, and
the index keeps the ledger's incarnation (its metadata ctime), so an add or a recovery for
another incarnation is refused (LedgerExistsError)."""
import glob
import os
import shutil
import signal

import pytest

import embedlog
from embedlog._native import format as nf
from embedlog.errors import LedgerExistsError, NoSuchLedgerError
from embedlog.meta.api import LedgerMetadata


def _copy_meta(src_dir, dst_dir):
    os.makedirs(dst_dir, exist_ok=True)
    for p in glob.glob(os.path.join(src_dir, "meta.db*")):
        shutil.copy2(p, dst_dir)


def _restore_meta(backup_dir, log_dir):
    for p in glob.glob(os.path.join(log_dir, "meta.db*")):
        os.unlink(p)
    _copy_meta(backup_dir, log_dir)


def _list_again(lm, md) -> None:
    """The store lists ``md`` under its id in place of what it listed (another ledger's
    incarnation): deleted, its deletion record gone, created again, as a restored backup or
    an id used again leaves it."""
    lm.remove_ledger_metadata(md.ledger_id)
    lm.purge_deletions(2 ** 62)
    lm.create_ledger_metadata(md)


def _closed_ledger(log):
    """A closed ledger of two entries: its id, the bookie, the ledger manager, its metadata."""
    w = log.create_ledger()
    w.append_many([b"a", b"b"])
    w.close()
    lm = log.metadata.ledger_manager
    return w.ledger_id, log.bookie, lm, lm.read_ledger_metadata(w.ledger_id)


def test_a_restored_old_metadata_never_reuses_a_held_ledger_id(tmp_path):
    d, old, new = str(tmp_path / "log"), str(tmp_path / "old"), str(tmp_path / "new")
    with embedlog.open(d):
        pass
    _copy_meta(d, old)                          # the backup: no ledger yet
    with embedlog.open(d) as log:
        w = log.create_ledger()
        w.append_many([b"old-%d" % i for i in range(200)])
        w.close()
        first = w.ledger_id
    _copy_meta(d, new)
    _restore_meta(old, d)                       # the metadata goes back in time
    with embedlog.open(d) as log:
        w2 = log.create_ledger()
        assert w2.ledger_id != first
        w2.append_many([b"new-%d" % i for i in range(5)])
        w2.close()
    _restore_meta(new, d)                       # and forward again
    with embedlog.open(d) as log:
        r = log.open_ledger(first)
        assert r.last_add_confirmed == 199
        assert r.read_batch(0, 199) == [b"old-%d" % i for i in range(200)]


def test_an_add_for_another_incarnation_of_a_ledger_id_is_refused(tmp_path):
    with embedlog.open(str(tmp_path / "log")) as log:
        lid, b, lm, v = _closed_ledger(log)
        # the store lists a new ledger under the same id (what a restored backup and a
        # create_ledger with the generator's old counter make): another ctime, OPEN
        _list_again(lm, LedgerMetadata(
            ledger_id=lid, ensemble_size=1, write_quorum=1, ack_quorum=1,
            digest_type=v.value.digest_type, password=v.value.password,
            fragments=v.value.fragments, ctime_ms=v.value.ctime_ms + 1))
        b.fetch_ledger_facts(lid)                # what a restarted bookie would read
        key = nf.master_key(b"")
        entry = nf.encode_entry(0, lid.ledger_id, 2, 1, 3, nf.digest_code("crc32c"), b"c")
        # an add is refused with an error a writer replaces the bookie for; the rest is
        # answered as by a bookie that does not hold the ledger
        with pytest.raises(LedgerExistsError, match="earlier ledger"):
            b.add_entries([entry], key)
        with pytest.raises(NoSuchLedgerError):
            b.fence(lid, key)
        for read in (lambda: b.read_entry(lid, 0), lambda: b.last_add_confirmed(lid),
                     lambda: b.read_payloads(lid, 0, 1, nf.digest_code("crc32c"), None)):
            with pytest.raises(NoSuchLedgerError, match="earlier ledger"):
                read()
        assert b.statistics()["foreign_ledgers"] == 1
        # the old data is untouched: served again once the store lists its ledger again
        v = lm.read_ledger_metadata(lid)
        _list_again(lm, v.value.with_(ctime_ms=v.value.ctime_ms - 1))
        b.fetch_ledger_facts(lid)
        assert b.last_recoverable_entry(lid) == 1
        assert b.read_payloads(lid, 0, 1, nf.digest_code("crc32c"), None) == [b"a", b"b"]


def test_a_running_bookie_rereads_unwatched_facts_when_a_writer_starts_again(tmp_path,
                                                                           monkeypatch):
    """SQLite has no watch to drop what a bookie cached of a ledger: the id deleted and
    given to a new ledger while the bookie runs, the new writer's add of entry 0 (which the
    bookie already holds) makes it read facts over a second old again
    (LedgerDescriptors.FACTS_RECHECK_S), and it is refused; so does a read."""
    from embedlog.bookie import descriptors
    monkeypatch.setattr(descriptors, "FACTS_RECHECK_S", 0.0)   # every look is past it
    with embedlog.open(str(tmp_path / "log")) as log:
        lid, b, lm, v = _closed_ledger(log)
        assert not lm.watches_ledgers
        _list_again(lm, v.value.with_(ctime_ms=v.value.ctime_ms + 1))
        key = nf.master_key(b"")
        entry = nf.encode_entry(0, lid.ledger_id, 0, -1, 1, nf.digest_code("crc32c"), b"x")
        with pytest.raises(LedgerExistsError, match="earlier ledger"):
            b.add_entries([entry], key)
        with pytest.raises(NoSuchLedgerError, match="earlier ledger"):
            b.read_entry(lid, 0)


def _age(facts, seconds: float) -> None:
    """Facts read (and last tried) ``seconds`` earlier."""
    facts.fetched_s -= seconds
    facts.tried_s -= seconds


def test_a_writers_adds_to_a_fenced_ledger_read_the_store_once_a_second(tmp_path,
                                                                       monkeypatch):
    """A stale writer's in-flight adds to its recovered (fenced) ledger each came to read
    the metadata again, inline: now facts over FACTS_RECHECK_S old are read once, and
    while the store cannot answer an add is refused without asking it again within the
    second. The ledger's own writer, adding past the last entry, never reads it."""
    from embedlog.errors import MetadataError
    with embedlog.open(str(tmp_path / "log")) as log:
        lid, b, lm, _v = _closed_ledger(log)
        mine = (lid.scope_id, lid.ledger_id)
        d = b.descriptors
        d.ledgers[mine].fenced = True
        key = nf.master_key(b"")
        reads = []
        real = lm.read_ledger_metadata
        monkeypatch.setattr(lm, "read_ledger_metadata",
                            lambda *a, **k: reads.append(a) or real(*a, **k))
        _age(d._facts[mine], 2.0)
        for eid in range(2, 40):
            d.check_key(mine, key, True, first_entry=eid)
        assert len(reads) == 1
        # the store cannot answer: one try, then refused without another for a second
        _age(d._facts[mine], 2.0)

        def down(*a, **k):
            reads.append(a)
            raise MetadataError("the store is down")
        monkeypatch.setattr(lm, "read_ledger_metadata", down)
        for eid in range(40, 60):
            with pytest.raises(MetadataError):
                d.check_key(mine, key, True, first_entry=eid)
        assert len(reads) == 2
        # the own writer of a live ledger never waits for the store (an outage included)
        monkeypatch.setattr(lm, "read_ledger_metadata", real)
        w = log.create_ledger()
        w.append(b"a")
        own = (w.ledger_id.scope_id, w.ledger_id.ledger_id)
        _age(d._facts[own], 2.0)
        monkeypatch.setattr(lm, "read_ledger_metadata", down)
        assert not b.needs_ledger_facts(w.ledger_id, "create")
        for eid in range(1, 20):
            d.check_key(own, key, True, first_entry=eid)
        assert len(reads) == 2
        monkeypatch.setattr(lm, "read_ledger_metadata", real)


def test_the_embedded_open_checks_the_incarnation_it_just_read(tmp_path):
    """open_ledger holds the metadata it read: data held under another incarnation than
    that one is not served or fenced even while the cached facts look fresh (a watch event
    still in flight on ZooKeeper's thread; here SQLite within its second)."""
    from embedlog.meta.api import LedgerState
    with embedlog.open(str(tmp_path / "log")) as log:
        lid, b, lm, v = _closed_ledger(log)
        held = v.value
        _list_again(lm, held.with_(ctime_ms=held.ctime_ms + 1))
        assert not b.needs_ledger_facts(lid, "read")            # the facts look fresh
        with pytest.raises(NoSuchLedgerError, match="earlier ledger"):
            log.open_ledger(lid)
        _list_again(lm, held.with_(ctime_ms=held.ctime_ms + 2, state=LedgerState.OPEN,
                                   last_entry_id=-1, length=0))
        b.fetch_ledger_facts(lid)
        _list_again(lm, held.with_(ctime_ms=held.ctime_ms + 3, state=LedgerState.OPEN,
                                   last_entry_id=-1, length=0))
        with pytest.raises(NoSuchLedgerError, match="earlier ledger"):
            log.open_ledger(lid)                                  # open: recovery's fence
        assert not b.descriptors.ledgers[(lid.scope_id, lid.ledger_id)].fenced


@pytest.mark.parametrize("restart", [True, False])
def test_the_embedded_open_reads_the_facts_before_serving_or_fencing_held_data(tmp_path, restart,
                                                                                 monkeypatch):
    """open_ledger, as the server before a request: a held ledger whose facts are missing
    (a restart) or unwatched and over FACTS_RECHECK_S old is looked up in the store first,
    so the old data under an id the store now gives a new ledger is neither read as the new
    ledger's (closed) nor fenced for its recovery (open): it answers as a bookie that does
    not hold it."""
    from embedlog.bookie import descriptors
    from embedlog.meta.api import LedgerState
    d = str(tmp_path / "log")
    monkeypatch.setattr(descriptors, "FACTS_RECHECK_S", 0.0)   # every look is past it
    with embedlog.open(d) as log:
        lid, _b, lm, v = _closed_ledger(log)
        held = v.value
        _list_again(lm, held.with_(ctime_ms=held.ctime_ms + 1))
        if restart:
            log.close()
            log = embedlog.open(d)
            lm = log.metadata.ledger_manager
        with pytest.raises(NoSuchLedgerError, match="earlier ledger"):
            log.open_ledger(lid)                                  # closed: a read
        _list_again(lm, held.with_(ctime_ms=held.ctime_ms + 2, state=LedgerState.OPEN,
                                   last_entry_id=-1, length=0))
        with pytest.raises(NoSuchLedgerError, match="earlier ledger"):
            log.open_ledger(lid)                                  # open: recovery's fence
        assert not log.bookie.descriptors.ledgers[(lid.scope_id, lid.ledger_id)].fenced
        # the old data is untouched: served again once the store lists its ledger again
        _list_again(lm, held)
        assert log.open_ledger(lid).read_batch(0, 1) == [b"a", b"b"]
        log.close()


_KILLED_AFTER_FIRST_ADDS = """
import os, signal, sys
import embedlog
log = embedlog.open(sys.argv[1], flush_interval_ms=600_000)   # no checkpoint before the kill
w = log.create_ledger()
w.append_many([b"old-0", b"old-1", b"old-2"])
print(w.ledger_id.ledger_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)      # durable in the journal; no index header on disk
"""


def test_an_index_replayed_before_its_header_reached_disk_keeps_its_incarnation(tmp_path):
    """Killed before a checkpoint wrote the new ledger's index header, the bookie replays
    its index from the journal, the incarnation with it (the INCARNATION record): when the
    id was used again while it was down, the new ledger's recovery and reads are refused
    (not its ctime adopted for the old data), and the old data is kept."""
    import subprocess
    import sys
    from embedlog import LedgerId
    from embedlog.meta.api import LedgerState
    from support.cliutil import ROOT
    d = str(tmp_path / "log")
    child = subprocess.run([sys.executable, "-c", _KILLED_AFTER_FIRST_ADDS, d],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": ROOT})
    assert child.returncode == -9, child.stderr[-2000:]
    lid = LedgerId(0, int(child.stdout.split()[0]))
    with embedlog.open(d) as log:
        lm = log.metadata.ledger_manager
        held = lm.read_ledger_metadata(lid).value
        idx = log.bookie.descriptors.ledgers[(0, lid.ledger_id)]
        assert idx.incarnation == held.ctime_ms
        _list_again(lm, held.with_(ctime_ms=held.ctime_ms + 5, state=LedgerState.OPEN,
                                   last_entry_id=-1, length=0))
        with pytest.raises(NoSuchLedgerError, match="earlier ledger"):
            log.open_ledger(lid)
        assert idx.incarnation == held.ctime_ms and not idx.fenced
        _list_again(lm, held)
        log.bookie.fetch_ledger_facts(lid)          # (the next look a second on would)
        assert log.open_ledger(lid).read_batch(0, 2) == [b"old-0", b"old-1", b"old-2"]


def test_a_held_ledger_is_never_read_on_no_facts_while_the_store_cannot_answer(own_zookeeper,
                                                                             tmp_path):
    """Reads go on through a metadata outage on facts read before, never on none: a bookie
    that restarted (or whose watch dropped the facts) and cannot reach the store cannot tell
    the data it holds is the listed ledger's (a restored ZooKeeper gave the id to a new one:
    tests/client/test_id_reuse.py served the old entries as the new ledger's so, once in ~20
    runs at load 8, from a bookie whose reconnection to the restored server hung)."""
    from embedlog.errors import MetadataError, TimeoutError
    from embedlog.harness.servers import suspend
    from support.cliutil import wait_until
    uri = f"zk+hierarchical://{own_zookeeper.hosts}/unreadable?timeout_s=2"
    d = str(tmp_path / "log")
    with embedlog.open(d, metadata_uri=uri) as log:
        lid, _b, _lm, _v = _closed_ledger(log)
    pid = own_zookeeper.proc.pid
    with embedlog.open(d, metadata_uri=uri) as log:
        b = log.bookie
        assert b.needs_ledger_facts(lid, "read")           # none read since start
        suspend(pid)                                      # the store stops answering
        try:
            with pytest.raises((MetadataError, TimeoutError)):
                b.fetch_ledger_facts(lid, "read")
        finally:
            os.kill(pid, signal.SIGCONT)

        def read_once_it_answers():
            try:
                return b.fetch_ledger_facts(lid, "read") is not None
            except (MetadataError, TimeoutError):
                return False
        wait_until(read_once_it_answers, 60, "the facts read once the store answers")
        suspend(pid)
        try:
            assert b.fetch_ledger_facts(lid, "read") is None   # read on what was read
            assert b.read_payloads(lid, 0, 1, nf.digest_code("crc32c"), None) == [b"a", b"b"]
        finally:
            os.kill(pid, signal.SIGCONT)
