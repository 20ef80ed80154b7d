"""The native tests under AddressSanitizer and UndefinedBehaviorSanitizer (`make test-asan`).

    python tools/sanitize.py [--no-build] [PYTEST ARGS ...]

Copies the package, its Cython sources and the tests into build/asan/tree (the in-place
build stays uninstrumented), builds the extension modules there with EMBEDLOG_SANITIZE=1
(-fsanitize=address,undefined, UB reports abort), and runs pytest on the tests that touch
native code with the sanitizer runtimes preloaded into the ordinary interpreter. Child
processes (LocalCluster's bookies, crash children) inherit the environment, so they run
the instrumented modules too. Every report goes to build/asan/reports/ as well as stderr;
the run fails on any report, even one from a child whose output nobody read.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "asan")
TREE = os.path.join(WORK, "tree")
REPORTS = os.path.join(WORK, "reports")
COPIED = ("setup.py", "pyproject.toml", "README.md", "pyx", "embedlog", "tests", "tools")
# what touches native code: the kernels and structures themselves (with their models), the
# bookie's journal, reads, crash and damage tests, the wire's limits, and the striped volume
# through the client and the client's add path, and the produce queue under both writers
# (its model test comes with tests/shared/test_native_models*); about 5 minutes here (the whole of tests/bookie and tests/net takes 13)
TESTS = ["tests/shared/test_memtable_bounds.py", "tests/shared/test_format.py",
         "tests/shared/test_arenas.py", "tests/shared/test_arrowread.py",
         "tests/bookie/test_journal.py", "tests/bookie/test_reads.py",
         "tests/bookie/test_journal_reuse.py::test_a_reused_files_previous_life_never_reads_as_current",
         "tests/bookie/test_crash.py", "tests/bookie/test_journal_damage.py",
         "tests/bookie/test_disk_damage.py", "tests/bookie/test_metadata_rollback.py",
         "tests/bookie/test_layout2.py",      # segment reads and their compaction (mmap)
         "tests/bookie/test_busy_wait.py",    # enable_busy_wait's I/O thread
         "tests/bookie/test_segment_scan.py",
         "tests/net/test_entry_id_bounds.py", "tests/net/test_preauth_limits.py",
         "tests/net/test_frame_reader.py",
         "tests/net/test_bkwire.py", "tests/net/test_bkserve.py",
         "tests/client/test_striped_volume.py", "tests/client/test_addpath.py",
         "tests/client/test_inflight.py", "tests/net/test_add_body.py",
         "tests/bookie/test_entry_log_page_cache.py", "tests/shared/test_flush_boundaries.py",
         "tests/harness/test_produce_embedded.py", "tests/client/test_produce.py",
         "tests/harness/test_embedded.py::test_a_long_batch_goes_in_chunks_each_made_durable"]
TESTS += sorted(os.path.relpath(p, ROOT) for p in
                glob.glob(os.path.join(ROOT, "tests", "shared", "test_native_models*.py")))


def _runtime(name: str) -> str:
    path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not os.path.isabs(path):
        sys.exit(f"sanitize: gcc has no {name} (install gcc's sanitizer runtimes)")
    return path


def _copy_tree() -> None:
    shutil.rmtree(TREE, ignore_errors=True)
    os.makedirs(TREE)
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "*.html", "crashes")
    for name in COPIED:
        src, dst = os.path.join(ROOT, name), os.path.join(TREE, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=ignore)    # copy2 keeps mtimes: .c files are reused
        else:
            shutil.copy2(src, dst)


def build() -> None:
    _copy_tree()
    env = dict(os.environ, EMBEDLOG_SANITIZE="1")
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-j", "2"], cwd=TREE,
                   env=env, check=True, stdout=subprocess.DEVNULL)


def run(pytest_args: list[str]) -> int:
    shutil.rmtree(REPORTS, ignore_errors=True)
    os.makedirs(REPORTS)
    env = dict(os.environ)
    env.update({
        "LD_PRELOAD": f"{_runtime('libasan.so')} {_runtime('libubsan.so')}",
        # CPython's own allocations look like leaks at exit; the interpreter is not built
        # with ASan, so its link order is not ASan's to check
        "ASAN_OPTIONS": f"detect_leaks=0:verify_asan_link_order=0:abort_on_error=1:"
                        f"log_path={REPORTS}/asan",
        "UBSAN_OPTIONS": f"print_stacktrace=1:halt_on_error=1:log_path={REPORTS}/ubsan",
        "PYTHONPATH": TREE + os.pathsep + os.path.join(TREE, "tests"),
        "EMBEDLOG_SANITIZED": "1",
    })
    # a base temp of its own: `make test` runs this beside the suite's own pytest
    basetemp = tempfile.mkdtemp(prefix="embedlog-asan-")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
           *TESTS, *pytest_args]
    try:
        code = subprocess.run(cmd, cwd=TREE, env=env).returncode
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)
    reports = sorted(glob.glob(os.path.join(REPORTS, "*")))
    for path in reports:
        print(f"\n== sanitizer report {path}", file=sys.stderr)
        with open(path, errors="replace") as f:
            sys.stderr.write(f.read())
    if reports:
        print(f"sanitize: {len(reports)} sanitizer report(s): failing the run", file=sys.stderr)
        return 1
    return code


def main(argv: list[str]) -> int:
    if "--no-build" in argv:
        argv.remove("--no-build")
    else:
        build()
    return run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
