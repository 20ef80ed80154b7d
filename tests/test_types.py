"""Issue 17: type information. embedlog ships py.typed and a .pyi stub for every Cython
module; mypy's stubtest checks each stub against the compiled module (every public name
present, signatures that agree), and mypy sees the types through the package's public
names (a wrong use is an error, not Any)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cliutil import ROOT

NATIVE = ["format", "journal", "memtable", "entrylog", "index", "reader", "arrowread", "arenas"]
CONFIG = """[mypy-embedlog.*]
ignore_errors = True
[mypy-embedlog._native.*]
ignore_errors = False
[mypy]
ignore_missing_imports = True
"""


def mypy_available():
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: it is in the test extra (pip install -e '.[test]')")


def test_every_cython_module_has_a_stub_and_the_package_is_typed():
    assert os.path.exists(os.path.join(ROOT, "embedlog", "py.typed"))
    compiled = {n.split(".")[0] for n in os.listdir(os.path.join(ROOT, "embedlog", "_native"))
                if n.endswith(".so")}
    assert compiled == set(NATIVE)
    for name in NATIVE:
        assert os.path.exists(os.path.join(ROOT, "embedlog", "_native", name + ".pyi")), name


def test_stubs_agree_with_the_compiled_modules(tmp_path):
    mypy_available()
    (tmp_path / "mypy.ini").write_text(CONFIG + f"cache_dir = {tmp_path / 'cache'}\n")
    r = subprocess.run([sys.executable, "-m", "mypy.stubtest", "--mypy-config-file",
                        str(tmp_path / "mypy.ini"), "--ignore-disjoint-bases", "--allowlist",
                        os.path.join(ROOT, "tests", "stubtest-allowlist.txt"),
                        *[f"embedlog._native.{n}" for n in NATIVE]],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]


PROGRAM = '''
import embedlog
from embedlog import LedgerId
from embedlog._native.format import crc32c, parse_entry_header

lid = LedgerId.parse("00000000000000070000000000000001")
name: str = lid.qualified_name
scope: int = lid.scope_id + crc32c(b"x")
version = parse_entry_header(b"")[0]
wrong: bytes = lid.ledger_id              # line 10: an int is no bytes
'''


def test_mypy_sees_the_types(tmp_path):
    mypy_available()
    (tmp_path / "mypy.ini").write_text(CONFIG + f"cache_dir = {tmp_path / 'cache'}\n")
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"),
                        "--no-incremental", str(prog)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "MYPYPATH": ROOT})
    errors = [l for l in r.stdout.splitlines() if ": error:" in l]
    assert len(errors) == 1 and "prog.py:10:" in errors[0] and '"int"' in errors[0], r.stdout
