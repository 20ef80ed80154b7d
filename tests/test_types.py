"""Issue 17: type information. embedlog ships py.typed and a .pyi stub for every Cython
module; mypy's stubtest checks each stub against the compiled module (every public name
present, signatures that agree), and mypy sees the types through the package's public
names (a wrong use is an error, not Any)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from support.cliutil import ROOT

NATIVE = ["format", "journal_format", "journal_buffer", "journal_waiters", "journal_scan", "busy_io",
          "journal_kernels", "memtable", "entrylog", "entrylogger", "index", "reader", "arrowread", "arenas", "bkwire", "bkencode",
          "bkserve", "addpath", "frames", "produce_queue", "wire_sizes"]
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


USER_PROGRAM = '''
from __future__ import annotations

import concurrent.futures

import embedlog
import embedlog.aio
from embedlog.errors import EmbedlogError


def embedded(path: str) -> int:
    with embedlog.open(path) as log:
        w = log.create_ledger()
        fut: concurrent.futures.Future[int] = w.append_async(b"x")
        last: int = w.append_many([b"a", bytearray(b"b"), memoryview(b"c")])
        r = log.open_ledger(w.ledger_id)
        data: bytes = r.read_entry(0)
        for e in r.read(0, last):
            data = e.data
        s = log.open_stream("events")
        position: int = s.append(b"event")
        w.append("str")                                           # line 22: a str payload
        return fut.result() + len(data) + position


def cluster(uri: str) -> list[str]:
    with embedlog.Client(uri) as client:
        w = client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        w.append(b"ok")
        client.open_stream("orders").append("str")                # line 30
        return client.list_streams()


async def with_asyncio(path: str) -> None:
    async with embedlog.aio.open(path) as log:
        w = await log.create_ledger()
        n: int = await w.append(b"x")
        await w.append("str")                                     # line 38
        r = await log.open_ledger(w.ledger_id)
        async for e in r.read(0, n):
            print(e.entry_id, e.data.hex())
        s = await log.open_stream("events")
        async for row in s.read(0):
            print(row.position, row.data.hex())
    try:
        embedlog.open(path).close()
    except EmbedlogError as exc:
        print(exc)
'''


def _site(tmp_path, how: str) -> str:
    """A virtual environment where embedlog is installed as ``how`` says: "editable" as the
    Makefile installs it (editable_mode=compat: a .pth line naming the source tree), or
    "regular" as a wheel puts it (the package's files in site-packages)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    if how == "editable":
        with open(os.path.join(site, "__editable__.embedlog-0.1.0.pth"), "w") as f:
            f.write(ROOT + "\n")
    else:
        shutil.copytree(os.path.join(ROOT, "embedlog"), os.path.join(site, "embedlog"),
                        ignore=lambda d, names: [n for n in names if n == "__pycache__"
                                                 or n.endswith((".so", ".c", ".pyc"))])
    return python


@pytest.mark.parametrize("how", ["editable", "regular"])
def test_mypy_strict_sees_the_public_api(tmp_path, how):
    """Issue 27 item 8: embedlog.open, Client, the handles, their futures and embedlog.aio
    have types, so `mypy --strict` on a user's program flags a str payload (three calls)
    and nothing else, with embedlog installed editable (as the Makefile does) or not."""
    mypy_available()
    python = _site(tmp_path, how)
    (tmp_path / "prog.py").write_text(USER_PROGRAM)
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--cache-dir", str(tmp_path / "cache"), "--python-executable", python,
                        "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env=env)
    errors = [l for l in r.stdout.splitlines() if ": error:" in l]
    assert [l.split(":")[1] for l in errors] == ["22", "30", "38"], r.stdout + r.stderr
    assert all('"str"' in l and '"append"' in l for l in errors), r.stdout


def test_the_makefile_installs_so_that_mypy_finds_embedlog():
    """setuptools' default editable install is an import hook that mypy does not follow."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read()
    assert "--config-settings editable_mode=compat" in text
