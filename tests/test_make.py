"""Issue 17 item 10: `make run` installs only what the embedded demo needs (no extra: a first
run takes seconds, not the minutes PySpark's 455 MB take), while `make test` installs every
extra; and the demo really runs with none of the optional packages importable."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from support.cliutil import ROOT, cli_env

OPTIONAL = ("kazoo", "etcd3", "pyspark", "pyarrow", "pandas", "lmdb", "rocksdict", "pytest",
            "hypothesis", "trustme", "google_crc32c", "atheris", "pytest_benchmark", "uvloop")


def dry_run(target: str, tmp_path, only: str | None = "pip install") -> list:
    if shutil.which("make") is None:
        pytest.fail("make is not installed (the README's two commands are make targets)")
    r = subprocess.run(["make", "-n", target, f"VENV={tmp_path}/venv"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [l for l in r.stdout.splitlines() if only is None or only in l]


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


# setup.py run with setup() and cythonize() replaced by probes: nothing is built
PROBE = """
import json, runpy, setuptools, Cython.Build
seen = {}
Cython.Build.cythonize = lambda exts, **kw: seen.update(nthreads=kw.get("nthreads")) or []
setuptools.setup = lambda **kw: seen.update(parallel=kw["options"]["build_ext"]["parallel"])
runpy.run_path("setup.py")
print(json.dumps(seen))
"""


def test_make_run_builds_the_modules_once_in_parallel(tmp_path):
    """Issue 27 item 10: the editable install compiles nothing; one build_ext compiles every
    module, Cython and the C compiler one job per core; run builds no benchmark module."""
    run = dry_run("run", tmp_path, only=None)
    assert [l for l in run if "build_ext" in l] == [f"{tmp_path}/venv/bin/python setup.py build_ext --inplace"], run
    installs = [l for l in run if "pip install" in l and "-e ." in l]
    assert installs and all(l.startswith("EMBEDLOG_NO_EXT=1 ") for l in installs), installs
    assert not any("floor" in l for l in run), run
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = os.cpu_count()
    assert json.loads(r.stdout.splitlines()[-1]) == {"nthreads": jobs, "parallel": jobs}
