"""A signal (SIGTERM or Ctrl-C: KeyboardInterrupt) that falls while a bookie starts its
threads: the start is abandoned cleanly, whichever thread it met. `embedlog bookie serve`
once answered a SIGTERM during its start with "RuntimeError: cannot join thread before it
is started": the interrupt fell between a service's thread being made and started, and the
abandoned start then joined that thread."""
import threading

import pytest

import embedlog


@pytest.mark.parametrize("thread", ["embedlog-memtable-flush", "embedlog-journal",
                                    "embedlog-sync", "embedlog-disk-check", "embedlog-gc"])
def test_an_interrupt_as_a_thread_starts_abandons_the_start_cleanly(tmp_path, monkeypatch, thread):
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger()
        w.append_many([b"kept %d" % i for i in range(100)])
        w.close()
    start = threading.Thread.start

    def interrupted(self):
        if self.name == thread:
            raise KeyboardInterrupt     # as the signal handler raises it, before the thread runs
        start(self)

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        embedlog.open(tmp_path, gc_wait_time_ms=1000, disk_check_interval_ms=1000)
    monkeypatch.setattr(threading.Thread, "start", start)
    with embedlog.open(tmp_path) as log:        # the directory was let go, nothing lost
        assert log.open_ledger(w.ledger_id).read_batch(0, 99) == [b"kept %d" % i for i in range(100)]
