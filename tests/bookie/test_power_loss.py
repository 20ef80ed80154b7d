"""Power loss, for every file of a bookie: the journal, entry logs, index files, lastMark
and the small files, each cut back to what had reached stable storage (embedlog.fileio
records it), then reopened. Every acknowledged entry reads back with its bytes (LevelDB's
fault-injection test, beyond the journal). Checkpoints run every few milliseconds and old
journals are deleted at once, so a mark moved past entry-log or index data that was not
durable would lose entries."""
import os
import random
import threading

import pytest

import embedlog
from embedlog import failpoints, fileio
from embedlog.bookie import journal
from embedlog.errors import EmbedlogError
from support.crash_child import payload
from support.crashutil import abandon
from support.cliutil import wait_until

CFG = dict(skip_list_size_limit=64 << 10, entry_log_size_limit=256 << 10, flush_interval_ms=20,
           journal_max_size_mb=1, journal_pre_alloc_size_mb=1, journal_max_backups=0,
           page_limit=16, gc_wait_time_ms=0)


@pytest.mark.parametrize("seed", range(4))
def test_power_loss_keeps_every_acknowledged_entry(tmp_path, monkeypatch, seed):
    rnd = random.Random(seed)
    # with enable_busy_wait, the thread's path however slow the disk syncs
    monkeypatch.setattr(journal, "BUSY_SYNC_MAX_S", float("inf"))
    path = tmp_path / "d"
    fileio.record_durable(True)
    try:
        # seeds 2 and 3 with enable_busy_wait: its thread's write and sync record alike
        log = embedlog.open(path, **CFG, enable_busy_wait=seed >= 2)
        handles = [log.create_ledger(scope_id=rnd.choice((0, 5))) for _ in range(4)]
        acked = {h.ledger_id: [] for h in handles}
        stop = threading.Event()

        def write(h, mine):
            q = h.ledger_id.qualified_name
            while not stop.is_set():
                e = len(mine)
                try:
                    if rnd.random() < 0.3:
                        last = h.append_many([payload(q, e + k) for k in range(5)])
                        mine.extend(range(e, last + 1))
                    else:
                        mine.append(h.append(payload(q, e)))
                except EmbedlogError:
                    return                    # the power went

        threads = [threading.Thread(target=write, args=(h, acked[h.ledger_id])) for h in handles]
        for t in threads:
            t.start()
        target = rnd.randint(300, 1500)
        wait_until(lambda: sum(map(len, acked.values())) >= target and
                   log.bookie.statistics()["checkpoints"] >= 4, timeout_s=120, what="writes")
        stop.set()
        abandon(log)                           # the power goes: nothing more is written ...
        for t in threads:
            t.join(10)
        cut = fileio.power_loss(str(path))     # ... and what was not durable is gone
    finally:
        fileio.record_durable(False)
    assert cut, "nothing was cut: the test would not test anything"
    with embedlog.open(path, **CFG) as log:
        for lid, ids in acked.items():
            assert ids == list(range(len(ids))), lid
            if ids:
                got = log.open_ledger(lid).read_batch(0, ids[-1])
                assert got == [payload(lid.qualified_name, e) for e in ids], (lid, cut)


@pytest.mark.parametrize("layout", [1, 2])
def test_what_power_loss_keeps_was_synced(tmp_path, monkeypatch, layout):
    """fileio records durability in the call that syncs (its only fsync and fdatasync, and
    the journal's write and sync in one call), so what power_loss keeps of each file is what
    a real sync of that file covered: the journal's groups, rolls and preallocation, entry
    logs and their seals, index files, atomic writes, and compaction's rewritten logs and
    index files. Then the power goes."""
    synced: dict = {}             # real path -> the largest size a sync of it covered
    lock = threading.Lock()

    def spy(real):
        def sync(fd):
            path, size = os.path.realpath(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size
            real(fd)
            with lock:
                synced[path] = max(synced.get(path, 0), size)
        return sync

    monkeypatch.setattr(os, "fdatasync", spy(os.fdatasync))
    monkeypatch.setattr(os, "fsync", spy(os.fsync))
    # a journal group's write and fdatasync are one native call: counted once it returns
    real_one = fileio.write_direct_synced

    def write_synced(busy, buf, fd, offset, tail, name):
        result = real_one(busy, buf, fd, offset, tail, name)
        with lock:
            path = os.path.realpath(f"/proc/self/fd/{fd}")
            synced[path] = max(synced.get(path, 0), os.fstat(fd).st_size)
        return result
    monkeypatch.setattr(fileio, "write_direct_synced", write_synced)
    path = tmp_path / "d"
    fileio.record_durable(True)
    try:
        log = embedlog.open(path, **dict(CFG, storage_layout=layout))
        gone, kept = log.create_ledger(), log.create_ledger()
        acked = []
        for i in range(600):             # interleaved: every entry log holds both ledgers
            gone.append(b"g" * 1000)
            acked.append(kept.append(payload(kept.ledger_id.qualified_name, i)))
        gone.close()
        log.delete_ledger(gone.ledger_id)
        log.bookie.gc.run_once(force_major=True)   # kept's entries move: its index is rewritten
        # layout 2: no compaction of segments yet; GC frees a segment only at zero live bytes
        assert log.bookie.gc.stats["compactions"] >= 1 or layout == 2
        for i in range(600, 700):
            acked.append(kept.append(payload(kept.ledger_id.qualified_name, i)))
        wait_until(lambda: log.bookie.statistics()["checkpoints"] >= 4, timeout_s=60,
                   what="checkpoints")
        abandon(log)
        records = fileio.recorded()
        cut = fileio.power_loss(str(path))
    finally:
        fileio.record_durable(False)
    assert records and cut
    for file, (length, size) in records.items():
        # an atomic write syncs <file>.tmp, compaction <file>.compacting, then renames; a
        # journal kept for reuse (<id>.free) was synced as <id>.txn
        names = [file + suffix for suffix in ("", ".tmp", ".compacting")]
        if file.endswith((".free", ".seg")):          # and a segment (layout 2) too
            names.append(os.path.splitext(file)[0] + ".txn")
        covered = max(synced.get(os.path.realpath(name), -1) for name in names)
        assert covered >= max(length, size), (file, length, size, covered)
    with embedlog.open(path, **CFG) as log:
        lid = kept.ledger_id
        assert log.open_ledger(lid).read_batch(0, acked[-1]) == [
            payload(lid.qualified_name, e) for e in acked]


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_a_power_loss_during_a_groups_fdatasync_keeps_any_of_its_sectors(tmp_path, seed, direct):
    """The power goes while a group's fdatasync has not returned: the device kept any of its
    sectors, in any order (here a random half, with one lost before one kept, so later
    records of the group survive a hole). The group was never acknowledged; the bookie must
    start (the code before each group began with its bounds refused: "corruption in the
    middle") and serve every acknowledged entry."""
    rnd = random.Random(seed)
    path = tmp_path / "d"
    cfg = dict(journal_direct_writes=direct, journal_reuse_files=False)
    fileio.record_durable(True)
    reached, release = threading.Event(), threading.Event()
    try:
        log = embedlog.open(path, **cfg)
        w = log.create_ledger()
        acked = []
        for _ in range(rnd.randint(1, 4)):
            batch = [payload("l", len(acked) + k) for k in range(rnd.randint(1, 60))]
            w.append_many(batch)
            acked.extend(batch)
        failpoints.arm("journal.before_sync", lambda: (reached.set(), release.wait(30)))

        def never_acknowledged():
            with pytest.raises(EmbedlogError):         # its journal was abandoned
                w.append_many([payload("l", len(acked) + k) for k in range(300)])

        held = threading.Thread(target=never_acknowledged)
        held.start()
        assert reached.wait(30)              # written, not synced: never acknowledged
        abandon(log)

        def arrived(_path, n):
            keep = [rnd.random() < 0.5 for _ in range(n)]
            lost = rnd.randrange(n // 2)
            keep[lost], keep[rnd.randrange(lost + 1, n)] = False, True
            return keep

        cut = fileio.power_loss(str(path), arrived)
    finally:
        failpoints.disarm()
        release.set()
        fileio.record_durable(False)
    held.join(30)
    assert any("some sectors arrived" in str(c) for c in cut), cut
    with embedlog.open(path, **cfg) as log:
        r = log.open_ledger(w.ledger_id)
        got = r.read_batch(0, r.last_add_confirmed)
        assert got[:len(acked)] == acked
        assert got == [payload("l", e) for e in range(len(got))]
        assert log.bookie.replay_report["torn"]
