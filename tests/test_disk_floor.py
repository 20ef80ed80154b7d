"""benchmarks/disk_floor.py: the disk's floor that benchmarks/replication.py prints its served
rows against must measure every bookie, say when one fails, and leave nothing behind."""
import os
import sys

import pytest

from embedlog.proc import process_state

# appended, not put first: benchmarks/ must not shadow a module of the tests' own
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "benchmarks"))
import disk_floor  # noqa: E402


def test_three_bookies_are_measured_and_their_files_removed(tmp_path):
    m = disk_floor.measure(str(tmp_path), 3, seconds=0.3, group=64 << 10)
    assert m["records_s"] > 0
    assert 0 < m["sync_p50_ms"] <= m["sync_p99_ms"]
    assert os.listdir(tmp_path) == []
    # a row puts Qw of every E adds on each journal
    assert disk_floor.row_floor(m, 3, 2) == pytest.approx(m["records_s"] * 1.5)
    assert disk_floor.row_floor(m, 3, 3) == pytest.approx(m["records_s"])


def test_a_bookie_that_cannot_write_fails_the_floor(tmp_path):
    with pytest.raises(RuntimeError, match="disk-floor bookie failed"):
        disk_floor.measure(str(tmp_path / "missing"), 2, seconds=0.1)


def test_a_benchmark_killed_mid_floor_leaves_no_bookie_behind(tmp_path):
    """SIGKILL (or timeout's SIGTERM) on the benchmark while its floor runs: the floor's
    bookie processes die with it. They used to stay, blocked for ever, holding the pipe
    of a `benchmark | grep` open, and the pipeline with it."""
    import signal
    import subprocess

    from support.cliutil import wait_until
    script = ("import sys; sys.path.append(sys.argv[1]); import disk_floor; "
              "disk_floor.measure(sys.argv[2], 2, seconds=600, group=64 << 10)")
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    child = subprocess.Popen([sys.executable, "-c", script, bench, str(tmp_path)])
    pids: list = []
    try:
        def bookies():
            with open(f"/proc/{child.pid}/task/{child.pid}/children") as f:
                return [int(p) for p in f.read().split()]
        # both bookies writing their journals (the resource tracker is a child too)
        wait_until(lambda: sum(n.startswith("journal-") for n in os.listdir(tmp_path)) == 2,
                   timeout_s=60, what="both floor bookies writing")
        pids[:] = bookies()
        assert len(pids) >= 2, pids
        child.send_signal(signal.SIGKILL)
        child.wait(30)

        def gone(pid):
            return process_state(pid) in ("", "Z")                # a zombie until reaped
        wait_until(lambda: all(gone(p) for p in pids), timeout_s=30,
                   what="the floor's bookies gone with the benchmark")
    finally:
        child.kill()
        for pid in pids:              # what a failure here would leave writing for 600 s
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name in os.listdir(tmp_path):     # 1 GiB journals a kill leaves: not kept
            os.unlink(tmp_path / name)
