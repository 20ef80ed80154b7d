"""SIGKILL at random moments: every acknowledged entry must come back with its bytes."""
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

from support.cliutil import ROOT, SUPPORT, TESTS
import embedlog
from embedlog import LedgerId
from support.crash_child import payload
from support.reopen_child import CONFIG as REOPEN_CONFIG


def run_cycle(path, seed, rnd, **child_env):
    env = {**os.environ, **child_env,
           "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, os.path.join(SUPPORT, "crash_child.py"), str(path),
                              str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    acked = {}
    lines = []

    def reader():
        for line in child.stdout:
            lines.append(line)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not any(l.startswith("ACK") for l in lines):   # wait until it really writes
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, "child never acknowledged an add"
        time.sleep(0.01)
    time.sleep(rnd.uniform(0.0, 0.4))
    child.send_signal(signal.SIGKILL)
    child.wait()
    t.join(5)
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ACK":
            acked.setdefault(parts[1], set()).add(int(parts[2]))
    return acked


@pytest.mark.parametrize("busy_wait", [False, True])
def test_sigkill_loses_no_acknowledged_entry(tmp_path, busy_wait):
    rnd = random.Random(20261122)
    all_acked = {}
    cycles = int(os.environ.get("EMBEDLOG_CRASH_CYCLES", "20"))
    if busy_wait:           # enable_busy_wait's I/O thread: the same, in fewer cycles
        cycles = max(cycles // 3, 1)
    for cycle in range(cycles):
        acked = run_cycle(tmp_path, rnd.randrange(1 << 30), rnd,
                          CRASH_CHILD_BUSY_WAIT="1" if busy_wait else "0")
        for q, ids in acked.items():
            all_acked.setdefault(q, set()).update(ids)
        # reopen in this process and check everything acknowledged so far, in every cycle
        with embedlog.open(tmp_path) as log:
            for q, ids in all_acked.items():
                lid = LedgerId.parse(q)
                r = log.open_ledger(lid)              # recovery closes the killed writer's ledger
                assert r.last_add_confirmed >= max(ids), (cycle, q)
                got = r.read_batch(0, max(ids))
                for e in ids:
                    assert got[e] == payload(q, e), (cycle, q, e)
        assert sum(len(v) for v in acked.values()) > 0


def run_reopen_child(path, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(SUPPORT, "reopen_child.py"), str(path), *args],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == -9, (args, proc.returncode, proc.stderr[-2000:])
    return proc.stdout.splitlines()


@pytest.mark.parametrize("point", ["checkpoint.before_index_flush", "checkpoint.before_lastmark"])
def test_killed_again_before_the_checkpoint_after_replay_loses_nothing(tmp_path, point):
    """The checkpoint after replay runs in the background: a bookie killed again before it
    ends (held at ``point``) has not moved its mark nor trimmed a journal, so the next
    start replays the first crash's records again, and the fences and adds made since."""
    first = run_reopen_child(tmp_path, "first")
    mark_file = tmp_path / "current" / "lastMark"
    mark = mark_file.read_bytes()
    journals = set(os.listdir(tmp_path / "journal"))
    again = run_reopen_child(tmp_path, "again", point)
    assert "HELD" in again, again[-5:]
    assert mark_file.read_bytes() == mark, "the mark moved before the checkpoint ended"
    assert journals <= set(os.listdir(tmp_path / "journal")), "a journal replay needs was trimmed"
    acked, fenced = {}, {}
    for line in first + again:
        parts = line.split()
        if parts[0] == "ACK":
            acked.setdefault(parts[1], set()).add(int(parts[2]))
        elif parts[0] == "FENCED":
            fenced[parts[1]] = int(parts[2])
    assert len(acked) == 6 and len(fenced) == 3
    with embedlog.open(tmp_path, **REOPEN_CONFIG) as log:
        b = log.bookie
        assert b.replay_report["mark"] == struct.unpack(">QQ", mark[:16])   # replayed from it again
        assert b.replay_report["records"] > 0
        for q, lac in fenced.items():
            assert lac == max(acked[q]), q            # recovery found every acknowledged entry
            assert b.is_fenced(LedgerId.parse(q)), q  # and its fence came back by replay
        for q, ids in acked.items():
            r = log.open_ledger(LedgerId.parse(q))
            assert r.last_add_confirmed == max(ids), q
            got = r.read_batch(0, max(ids))
            assert all(got[e] == payload(q, e) for e in ids), q
