"""The soak scripts in tools/ run (they import the test layout, which moves): a short run
of each that needs no cluster. tools/crash_soak.py imported test_crash from tests/ after
it moved to tests/bookie/ (issue 26 item 8); tools/gc_soak.py runs over both storage
layouts."""
import os
import re
import subprocess
import sys

import pytest

from support.cliutil import ROOT


def test_crash_soak_runs_a_few_cycles(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "crash_soak.py"),
                        "--cycles", "3", "--verify-every", "1", "--seed", "26",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cycle 3/3:" in r.stdout, r.stdout


@pytest.mark.parametrize("layout", [1, 2])
def test_gc_soak_runs_briefly_and_frees_what_it_deletes(tmp_path, layout):
    """Seconds of writes and random deletes with GC and compaction on small files (2 MiB
    entry logs and journals, so layout 2 rolls segments): every live ledger reads back, and
    the closing GC leaves no file of deleted ledgers only (the tool exits non-zero if so)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gc_soak.py"),
                        "--storage-layout", str(layout), "--dir", str(tmp_path),
                        "--duration-s", "6", "--report-s", "3", "--alternate-s", "0",
                        "--retain-mb", "4", "--entry-log-mb", "2", "--journal-mb", "2",
                        "--ledger-entries", "256", "--gc-wait-ms", "200",
                        "--minor-interval-s", "1", "--major-interval-s", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert f"layout {layout};" in r.stdout and "live entries read back and checked" in r.stdout
    freed = re.search(r"(\d+) entry logs deleted whole .*?(\d+) segments deleted whole", r.stdout)
    assert freed, r.stdout
    logs, segments = map(int, freed.groups())
    # positive deletion in the layout's own files: entry logs in 1, journal segments in 2
    assert (logs if layout == 1 else segments) > 0, r.stdout


@pytest.mark.parametrize("layout", [1, 2])
def test_gc_soak_killed_at_gc_and_compaction_points_loses_and_leaks_nothing(tmp_path, layout):
    """--kill-cycles: children SIGKILLed at GC and compaction failure points (ones a few
    seconds reach: a ledger dropped by GC, an entry log or segment deleted whole, a
    compaction's commit); after each, every closed ledger reads back, deleted ones are
    dropped, and no file of deleted ledgers only is left."""
    points = ["gc.before_delete_ledger", "compaction.after_manifest",
              "gc.before_delete_log" if layout == 1 else "gc.before_delete_segment"]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gc_soak.py"),
                        "--storage-layout", str(layout), "--dir", str(tmp_path), "--seed", "3",
                        "--kill-cycles", "3", "--kill-points", ",".join(points),
                        "--duration-s", "3", "--report-s", "3",
                        "--alternate-s", "0", "--retain-mb", "4", "--entry-log-mb", "2",
                        "--journal-mb", "2", "--ledger-entries", "256", "--gc-wait-ms", "200",
                        "--minor-interval-s", "1", "--major-interval-s", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "cycle 3/3:" in r.stdout and "killed there" in r.stdout, r.stdout
