"""SIGKILL at random moments: every acknowledged entry must come back with its bytes."""
import os
import random
import signal
import subprocess
import sys
import threading
import time

from cliutil import ROOT, TESTS
import embedlog
from embedlog import LedgerId
from crash_child import payload



def run_cycle(path, seed, rnd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS,
                                                       os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, os.path.join(TESTS, "crash_child.py"), str(path),
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


def test_sigkill_loses_no_acknowledged_entry(tmp_path):
    rnd = random.Random(20261122)
    all_acked = {}
    cycles = int(os.environ.get("EMBEDLOG_CRASH_CYCLES", "20"))
    for cycle in range(cycles):
        acked = run_cycle(tmp_path, rnd.randrange(1 << 30), rnd)
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
