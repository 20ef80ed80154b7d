"""Issue 25 item 7: a bookie process that dies unasked is seen, not guessed. LocalCluster
reports it (exit signal, its log's last lines) at the next verb and at close, once; bookies
a test kills or stops on purpose are not reported."""
from __future__ import annotations

import os
import signal

import pytest

from support.cliutil import wait_until
from embedlog.errors import BookieCrashedError
from embedlog.harness import LocalCluster


def crash(cluster, i: int, sig) -> None:
    os.kill(cluster.pid(i), sig)
    wait_until(lambda: not cluster.is_running(i), what=f"bookie {i} to exit")


def test_a_crash_is_reported_once_at_the_next_verb(tmp_path):
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False) as cluster:
        cluster.kill_bookie(0)                      # on purpose: never reported
        cluster.stop_bookie(1)
        crash(cluster, 2, signal.SIGSEGV)
        with pytest.raises(BookieCrashedError) as e:
            cluster.client()
        message = str(e.value)
        assert "bookie 2" in message and cluster.bookie_id(2) in message
        assert "SIGSEGV" in message
        assert "listening on" in message            # a line of its bookie.log
        assert "bookie 0" not in message and "bookie 1" not in message
        cluster.restart_bookie(2)                   # reported once: the cluster goes on
        cluster.client().close()
        crash(cluster, 2, signal.SIGKILL)
        with pytest.raises(BookieCrashedError, match="bookie 2 .*SIGKILL"):
            cluster.restart_bookie(0)
    # every crash was reported: close did not raise


def test_close_cleans_up_then_reports_a_crash():
    with pytest.raises(BookieCrashedError, match="bookie 1 .*SIGABRT") as e:
        with LocalCluster(bookies=2, proxies=False, autorecovery=False) as cluster:
            base_dir, pids = cluster.base_dir, [cluster.pid(0), cluster.pid(1)]
            crash(cluster, 1, signal.SIGABRT)
    assert "bookie 0" not in str(e.value)           # close's own stop is asked for
    assert not os.path.exists(base_dir)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
