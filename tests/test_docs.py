"""Issue 17 item 1: every Python block of README.md and docs/*.md runs as written, each in a
fresh interpreter in an empty directory (blocks that need a cluster start a LocalCluster,
as their text says). A block that fails names its file and line."""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from support.cliutil import ROOT, cli_env
from support.servers import skip_unless_ci

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks() -> list:
    out = []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        text = open(path).read()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(pytest.param(m.group(1), id=f"{os.path.relpath(path, ROOT)}:{line}"))
    return out


def test_there_are_blocks_to_run():
    ids = [p.id for p in blocks()]
    assert any(i.startswith("README.md") for i in ids) and len(ids) >= 7, ids


@pytest.mark.parametrize("code", blocks())
def test_block_runs_as_written(code, tmp_path):
    if "pyspark" in code or "embedlog.spark" in code:
        if importlib.util.find_spec("pyspark") is None or shutil.which("java") is None:
            skip_unless_ci("this block needs PySpark and Java (the spark extra, `make test`)")
    if "BookKeeperCluster" in code or "PulsarCluster" in code:
        from embedlog.harness.peers import jars
        peer = "pulsar-broker-4.0.0" if "PulsarCluster" in code else "bookkeeper-4.17.2"
        if shutil.which("java") is None or not jars.is_fetched(peer):
            skip_unless_ci(f"this block needs Java and {peer}'s jars (`make peers`)")
    script = tmp_path / "block.py"
    script.write_text(code)
    work = tmp_path / "cwd"
    work.mkdir()
    r = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True,
                       env=cli_env(TMPDIR=str(tmp_path)), timeout=600)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-4000:]}"
