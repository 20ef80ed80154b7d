"""Issue 17 item 10: `make run` installs only what the embedded demo needs (no extra: a first
run takes seconds, not the minutes PySpark's 455 MB take), while `make test` installs every
extra; and the demo really runs with none of the optional packages importable."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from cliutil import ROOT, cli_env

OPTIONAL = ("kazoo", "etcd3", "pyspark", "pyarrow", "pandas", "lmdb", "rocksdict", "pytest",
            "hypothesis", "trustme", "google_crc32c", "atheris", "pytest_benchmark", "uvloop")


def dry_run(target: str, tmp_path) -> list:
    if shutil.which("make") is None:
        pytest.fail("make is not installed (the README's two commands are make targets)")
    r = subprocess.run(["make", "-n", target, f"VENV={tmp_path}/venv"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [l for l in r.stdout.splitlines() if "pip install" in l]


def test_make_run_installs_no_extra(tmp_path):
    run = dry_run("run", tmp_path)
    assert run and not any("[" in l or "spark" in l for l in run), run
    assert any(l.rstrip().endswith("-e .") for l in run), run
    test = dry_run("test", tmp_path)
    assert any(".[test,bench,zk,etcd,spark]" in l for l in test), test


BLOCKED = textwrap.dedent("""
    import importlib.abc, sys
    OPTIONAL = %r

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in OPTIONAL:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked: not a core dependency)")
            return None

    sys.meta_path.insert(0, Blocked())
    for name in list(sys.modules):
        if name.split(".")[0] in OPTIONAL:
            del sys.modules[name]
    from embedlog.cli import main
    main(["demo", "--entries", "3000", "--ledgers", "2", "--json"], prog_name="embedlog")
""") % (OPTIONAL,)


def test_the_demo_needs_no_optional_package(tmp_path):
    r = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, cwd=ROOT,
                       env=cli_env(TMPDIR=str(tmp_path)), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert '"verified": 3000' in r.stdout
    assert list(tmp_path.iterdir()) == []          # and it left nothing behind (item 5)
