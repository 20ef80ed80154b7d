"""Power loss, for every file of a bookie: the journal, entry logs, index files, lastMark
and the small files, each cut back to what had reached stable storage (embedlog.fileio
records it), then reopened. Every acknowledged entry reads back with its bytes (LevelDB's
fault-injection test, beyond the journal). Checkpoints run every few milliseconds and old
journals are deleted at once, so a mark moved past entry-log or index data that was not
durable would lose entries."""
import random
import threading

import pytest

import embedlog
from embedlog import fileio
from embedlog.errors import EmbedlogError
from crash_child import payload
from crashutil import abandon
from cliutil import wait_until

CFG = dict(skip_list_size_limit=64 << 10, entry_log_size_limit=256 << 10, flush_interval_ms=20,
           journal_max_size_mb=1, journal_pre_alloc_size_mb=1, journal_max_backups=0,
           page_limit=16, gc_wait_time_ms=0)


@pytest.mark.parametrize("seed", range(4))
def test_power_loss_keeps_every_acknowledged_entry(tmp_path, seed):
    rnd = random.Random(seed)
    path = tmp_path / "d"
    fileio.record_durable(True)
    try:
        log = embedlog.open(path, **CFG)
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
