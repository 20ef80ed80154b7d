"""SIGKILL inside garbage collection and compaction, at every named failure point:
the reopened bookie serves every live entry with its bytes, and one more GC cycle
leaves no compaction file, no dead entry log and no deleted ledger behind. Both layouts:
layout 1 compacts entry logs, layout 2 the journal segments below the LastLogMark (into
entry logs, by the same transaction)."""
import os
import subprocess
import sys

import pytest

from support.cliutil import ROOT, SUPPORT, TESTS
import embedlog
from embedlog import LedgerId
from embedlog.cli.shell import Layout, check_ledger

from support.crash_child import payload
from support.gc_child import CONFIG

CONFIG_MAJOR = 0.8                    # major_compaction_threshold's default

COMPACTION = ["compaction.during_copy", "compaction.after_write", "compaction.after_manifest",
              "compaction.after_rename", "compaction.after_index_flush",
              "compaction.after_delete_sources"]
POINTS = ([(1, p) for p in ["gc.before_delete_ledger", "gc.after_delete_ledger",
                            "gc.before_delete_log", *COMPACTION]]
          # layout 2: the ledger points and a segment deleted whole are test_layout2.py's
          + [(2, p) for p in COMPACTION])


def run_child(path, point, layout=1):
    env = {**os.environ, "EMBEDLOG_FAILPOINTS": f"{point}=crash", "GC_CHILD_LAYOUT": str(layout),
           "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, os.path.join(SUPPORT, "gc_child.py"), str(path)],
                           capture_output=True, text=True, env=env, timeout=120)
    live, dead = {}, []
    for line in child.stdout.splitlines():
        parts = line.split()
        if parts[0] == "LIVE":
            live[parts[1]] = int(parts[2])
        elif parts[0] == "DEAD":
            dead.append(parts[1])
    return child, live, dead


def leftovers(currents):
    return sorted(n for c in currents for n in os.listdir(c)
                  if n.endswith((".compacting", ".compaction", ".tmp")))


@pytest.mark.parametrize("layout,point", POINTS)
def test_sigkill_in_gc_and_compaction_loses_and_leaks_nothing(tmp_path, layout, point):
    child, live, dead = run_child(tmp_path, point, layout)
    assert child.returncode == -9, f"{point} was never reached: {child.stderr[-2000:]}"
    assert "GC" in child.stdout and "DONE" not in child.stdout
    assert len(live) == 4 and len(dead) == 5
    with embedlog.open(tmp_path, **CONFIG) as log:
        b = log.bookie
        assert b.layout == layout
        # the checkpoint after replay writes lastMark.tmp in the background: not a leftover
        assert b.checkpointer.replay_checkpointed.wait(30)
        assert leftovers(b.ledger_currents) == [], "start-up left compaction files"
        rep = b.compaction_report
        if point in ("compaction.during_copy", "compaction.after_write"):
            assert rep["discarded"] and not rep["rolled_forward"], rep      # undone
        elif point.startswith("compaction."):
            assert rep["rolled_forward"] and not rep["discarded"], rep      # finished

        def check():
            for q, n in live.items():
                got = log.open_ledger(LedgerId.parse(q)).read_batch(0, n - 1)
                assert got == [payload(q, e) for e in range(n)], (point, q)
        check()
        report = b.gc.run_once(force_major=True)
        assert report["ledgers"]["aborted"] is None
        assert not any(b.has_ledger(LedgerId.parse(q)) for q in dead)
        check()
        # nothing leaks: every entry log (and segment) left holds a live ledger, and they
        # are about the size of the live data
        usages = b.gc.usages()
        assert all(u > 0 for u in usages.values()), usages
        live_bytes = sum(len(payload(q, e)) + 40 for q, n in live.items() for e in range(n))
        on_disk = sum(os.path.getsize(os.path.join(c, f)) for c in b.ledger_currents
                      for f in os.listdir(c) if f.endswith(".log"))
        slack = 2 * CONFIG["entry_log_size_limit"]
        if layout == 2:
            # compaction left no segment below the threshold, nor any no index names
            assert all(u >= CONFIG_MAJOR for i, u in usages.items() if i >> 31), usages
            assert {i & 0x7FFFFFFF for i in usages if i >> 31} <= b.storage.segments_in_use()
            on_disk += sum(os.path.getsize(os.path.join(b.journal_dir, f))
                           for f in os.listdir(b.journal_dir) if f.endswith(".seg"))
            slack += 2 << 20                 # and the journal's newest (1 MiB) files
        assert on_disk <= live_bytes + slack, (on_disk, live_bytes)
        layout = Layout(str(tmp_path), b.ledger_dirs, b.journal_dir, None)
        b.checkpoint()
        for q in live:
            lid = LedgerId.parse(q)
            r = check_ledger(layout, (lid.scope_id, lid.ledger_id), {})
            assert r["errors"] == [] and r["good"] == live[q], r


def test_an_entry_log_killed_before_its_header_is_discarded(tmp_path):
    """A crash between creating an entry log file and writing its header leaves zeros;
    start-up drops that file instead of refusing to start (seen in the SIGKILL test)."""
    import embedlog
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger()
        w.append_many([b"x" * 100] * 100)
        w.close()
        lid = w.ledger_id
    empty = tmp_path / "current" / "ff0.log"
    with open(empty, "wb") as f:
        f.truncate(1 << 20)                     # what ftruncate left before the header
    with embedlog.open(tmp_path) as log:
        assert log.open_ledger(lid).read_batch(0, 99)[99] == b"x" * 100
    assert not empty.exists()
