"""Issue 27 item 7: a LocalCluster made without `with` (as the README's Spark example does)
leaves nothing running when its owner dies: an exception runs close() at exit (bookies
stopped, the temporary directory removed), and even a SIGKILLed owner's bookies stop on
their own (each watches its parent)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from embedlog.proc import process_state
from support.cliutil import ROOT, cli_env, wait_until

CHILD = textwrap.dedent("""
    import os, signal, sys
    from embedlog.harness import LocalCluster

    cluster = LocalCluster(bookies=2, proxies=False, autorecovery=False)
    print(cluster.base_dir, *[cluster.pid(i) for i in range(2)], flush=True)
    if sys.argv[1] == "raise":
        raise RuntimeError("the owner fails")
    os.kill(os.getpid(), signal.SIGKILL)
""")


def alive(pid: int) -> bool:
    """Running (a zombie no one reaped yet counts as gone)."""
    return process_state(pid) not in ("", "Z", "X")


@pytest.mark.parametrize("death", ["raise", "sigkill"])
def test_bookies_die_with_their_owner(death):
    r = subprocess.run([sys.executable, "-c", CHILD, death], capture_output=True, text=True,
                       env=cli_env(), cwd=ROOT, timeout=120)
    base_dir, *pids = r.stdout.split()
    pids = [int(p) for p in pids]
    try:
        assert len(pids) == 2, (r.returncode, r.stdout, r.stderr)
        if death == "raise":
            assert r.returncode == 1 and "RuntimeError: the owner fails" in r.stderr, r.stderr
        else:
            assert r.returncode == -signal.SIGKILL
        wait_until(lambda: not any(map(alive, pids)), 60, "the bookies to exit")
        if death == "raise":                       # close() ran at exit: the directory is gone
            assert not os.path.exists(base_dir)
    finally:
        for pid in filter(alive, pids):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base_dir, ignore_errors=True)
