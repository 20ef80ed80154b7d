"""SIGKILL at each named failure point of the journal, the memtable flush and the
checkpoint: the writer (tests/support/crash_child.py) is killed there, the directory is reopened,
and every entry it was told was acknowledged reads back with its bytes. A test below fails
when a failure point exists that no test arms."""
import glob
import os
import re
import subprocess
import sys

import pytest

from support.cliutil import ROOT, SUPPORT, TESTS
import embedlog
from embedlog import LedgerId, failpoints
from support.crash_child import payload

POINTS = ["journal.before_write", "journal.before_sync", "journal.after_sync",
          "journal.prealloc_before_zero", "memtable.before_flush",
          "checkpoint.before_index_flush", "checkpoint.before_lastmark", "checkpoint.after_lastmark",
          "journal.reuse_before_header", "journal.reuse_before_rename"]


@pytest.mark.parametrize("point", POINTS)
def test_killed_at_a_named_point_loses_nothing(tmp_path, point):
    # crash on a later hit, so the writer has acknowledged entries and checkpointed first
    # (journals of 8 MiB, so the preallocator writes zeros ahead of 1 MiB chunks; of 1 MiB
    # and none kept as backups for the reuse points, so trimmed journals are reused soon)
    reuse = point.startswith("journal.reuse")
    env = {**os.environ, "EMBEDLOG_FAILPOINTS": f"{point}=crash:{3 if reuse else 5}",
           "CRASH_CHILD_JOURNAL_MB": "1" if reuse else "8",
           "CRASH_CHILD_JOURNAL_BACKUPS": "0" if reuse else "5",
           # journals are reused in layout 1 only (layout 2 keeps them as segments)
           "CRASH_CHILD_LAYOUT": "1" if reuse else "2",
           "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(SUPPORT, "crash_child.py"), str(tmp_path), "7"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == -9, (point, proc.returncode, proc.stderr[-2000:])
    acked = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ACK":
            acked.setdefault(parts[1], set()).add(int(parts[2]))
    with embedlog.open(tmp_path) as log:
        for q, ids in acked.items():
            r = log.open_ledger(LedgerId.parse(q))
            assert r.last_add_confirmed >= max(ids), (point, q)
            got = r.read_batch(0, max(ids))
            assert all(got[e] == payload(q, e) for e in ids), (point, q)


def test_every_failure_point_is_armed_by_some_test():
    text = "".join(open(f).read() for f in glob.glob(os.path.join(TESTS, "**", "*.py"), recursive=True)
                   if not f.endswith("test_crash_points.py")) + " ".join(POINTS)
    unarmed = [p for p in failpoints.POINTS if not re.search(re.escape(p) + r"\b", text)]
    assert not unarmed, f"failure points no test arms: {unarmed}"
