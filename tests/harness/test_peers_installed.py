"""The Java peers run from an installed embedlog, not only from a checkout: their Java
sources are package data of embedlog.harness.peers, in the wheel, and every path the harness
opens resolves inside the installed package (a pip install once failed the README's
"Java client writes to embedlog bookies" with FileNotFoundError: the harness looked for
tools/peers/ beside the package)."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from support.servers import skip_unless_ci

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JAVA = os.path.join(ROOT, "embedlog", "harness", "peers", "java")
BUILD_FILES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """embedlog installed from a wheel of this tree into a directory of its own: the wheel
    is built without the Cython modules (EMBEDLOG_NO_EXT=1, as the Makefile's install; a
    full build takes minutes) and this checkout's compiled modules are copied beside it."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_FILES:
        shutil.copy(os.path.join(ROOT, name), src / name)
    shutil.copytree(os.path.join(ROOT, "embedlog"), src / "embedlog",
                    ignore=lambda d, names: [n for n in names if n == "__pycache__"
                                             or n.endswith((".so", ".c", ".pyc", ".html"))])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["EMBEDLOG_NO_EXT"] = "1"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(tmp / "dist"), str(src)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    wheel, = glob.glob(str(tmp / "dist" / "embedlog-*.whl"))
    site = tmp / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                        "--target", str(site), wheel],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    for so in glob.glob(os.path.join(ROOT, "embedlog", "_native", "*.so")):
        shutil.copy(so, site / "embedlog" / "_native")
    # PYTHONPATH comes before site-packages, where the checkout's editable .pth line sits
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDLOG_")}
    run_env["PYTHONPATH"] = str(site)
    return wheel, site, run_env


def test_the_wheel_holds_every_java_source(installed):
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as z:
        shipped = {n.rsplit("/", 1)[1] for n in z.namelist()
                   if n.startswith("embedlog/harness/peers/java/")}
    ours = set(os.listdir(JAVA))
    assert ours and all(n.endswith(".java") for n in ours), ours
    assert shipped == ours


CHECK = r'''
import os, embedlog
from embedlog.harness.peers import bkdriver, bkmeta, jars
package = os.path.dirname(os.path.abspath(embedlog.__file__))
paths = [bkdriver.DRIVER_SOURCE, bkmeta.SOURCE] + [jars.java_source(n) for n in NAMES]
for p in paths:
    assert os.path.isfile(p), p
    assert os.path.abspath(p).startswith(package + os.sep), (p, package)
print(package)
'''


def test_the_installed_package_finds_its_java_sources(installed, tmp_path):
    _, site, env = installed
    code = CHECK.replace("NAMES", repr(sorted(os.listdir(JAVA))))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == str(site / "embedlog")       # the wheel's, not the checkout's


def readme_block(title_words: str) -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    at = text.index(title_words)
    return re.search(r"```python\n(.*?)```", text[at:], re.S).group(1)


def test_the_readme_java_client_block_runs_from_the_wheel(installed, tmp_path):
    """The README's block where BookKeeper's Java client (BkDriver, compiled from the
    package's own source) writes to embedlog bookies, run against the installed package."""
    from embedlog.harness.peers import jars   # after the fixture: the checkout's, for the skip
    if shutil.which("java") is None or not jars.is_fetched("bookkeeper-4.17.2"):
        skip_unless_ci("needs Java and bookkeeper-4.17.2's jars (`make peers`)")
    _, site, env = installed
    code = readme_block("so a Java client\n(here BookKeeper's own")
    assert "java_client" in code
    script = tmp_path / "block.py"
    script.write_text("import embedlog\nassert embedlog.__file__.startswith(%r)\n"
                      % str(site) + code)
    work = tmp_path / "cwd"
    work.mkdir()
    env = dict(env, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-4000:]}"
