"""The soak scripts in tools/ run (they import the test layout, which moves): a short run
of each that needs no cluster. tools/crash_soak.py imported test_crash from tests/ after
it moved to tests/bookie/ (issue 26 item 8)."""
import os
import subprocess
import sys

from support.cliutil import ROOT


def test_crash_soak_runs_a_few_cycles(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "crash_soak.py"),
                        "--cycles", "3", "--verify-every", "1", "--seed", "26",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cycle 3/3:" in r.stdout, r.stdout
