"""Run embedlog's fuzz targets (tools/fuzz/targets.py) under atheris, each in its own process.

    python tools/fuzz.py [TARGET ...] --seconds N [--jobs 1] [--merge]
    python tools/fuzz.py --build-instrumented        # the Cython modules with coverage (clang)
    python tools/fuzz.py --list

Each target runs for N seconds on a working copy of its corpus (build/fuzz/<target>/corpus,
seeded from tools/fuzz/corpus/<target> and tools/fuzz/regressions/<target>), with a
per-input timeout, an RSS limit and a maximum input length. The repository corpus only
grows with --merge (libFuzzer's -merge=1 keeps the inputs that add coverage). Crashing,
hanging or memory-hungry inputs land in tools/fuzz/crashes/<target>/. A JSON summary per
target (executions, exec/s, libFuzzer's cov/ft, corpus sizes, crashes) is printed and
written to <workdir>/<target>/summary.json and <workdir>/summary.json.

atheris sees the coverage of embedlog's Python code (instrumented on import), and of the
Cython modules when they are built with clang's -fsanitize=fuzzer-no-link into
build/fuzz-instrumented: the runner builds them (installing clang as root if it must)
whenever they are missing or older than pyx/, so every target's coverage is visible by
default; --plain runs the regular in-place modules (Python coverage only).
With EMBEDLOG_FUZZ_TARGET set, this script is the child that runs one target (libFuzzer's
arguments on the command line). Figures and findings: docs/SECURITY.md, "Fuzzing".
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FUZZ = os.path.join(HERE, "fuzz")
CORPUS = os.path.join(FUZZ, "corpus")
REGRESSIONS = os.path.join(FUZZ, "regressions")
CRASHES = os.path.join(FUZZ, "crashes")
INSTRUMENTED = os.path.join(ROOT, "build", "fuzz-instrumented")
NATIVE_DIR = os.path.join(INSTRUMENTED, "lib", "embedlog", "_native")
PYX = os.path.join(ROOT, "pyx", "embedlog", "_native")
# the packages whose Python code atheris instruments, per target (default: embedlog). tomllib
# is pure Python: its branches guide the fuzzer towards TOML that parses
INSTRUMENT = {"config_toml": ["embedlog", "tomllib"]}


# -- the child: one target under atheris ---------------------------------------------------------

class _NativeFinder:
    """Imports embedlog._native.<module> from the instrumented build instead of the package."""

    def __init__(self, directory):
        self.directory = directory

    def find_spec(self, name, path=None, target=None):
        # the name first: importing importlib.util here before it is loaded asks this finder
        # for it again, for ever (nothing imports it early when embedlog's install is a plain
        # path in a .pth file, as the Makefile's editable_mode=compat makes it)
        if not name.startswith("embedlog._native."):
            return None
        import importlib.util
        found = glob.glob(os.path.join(self.directory, name.rsplit(".", 1)[1] + ".cpython-*.so"))
        return importlib.util.spec_from_file_location(name, found[0]) if found else None


def child(target: str, libfuzzer_args: list) -> None:
    import atheris
    native = os.environ.get("EMBEDLOG_FUZZ_NATIVE")
    if native:
        # the instrumented modules call libFuzzer's coverage hooks (__sanitizer_cov_*): load
        # atheris's libFuzzer with RTLD_GLOBAL first so they resolve, and have Fuzz() use it
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | os.RTLD_GLOBAL)
        import atheris.core_with_libfuzzer  # noqa: F401
        sys.setdlopenflags(flags)
        sys.meta_path.insert(0, _NativeFinder(native))
    sys.path[:0] = [FUZZ, ROOT]
    with atheris.instrument_imports(include=INSTRUMENT.get(target, ["embedlog"])):
        import targets
        fn = targets.TARGETS[target]
        # the targets import their parsers lazily: run each seed once so every module they
        # use is imported (and instrumented) here; libFuzzer replays the seeds itself next
        for path in _inputs(target)[:8]:
            try:
                fn(open(path, "rb").read())
            except Exception:
                pass
    if native:
        import embedlog._native.format as f
        assert f.__file__.startswith(native), f.__file__
    # libFuzzer re-runs argv[0] through the shell for -merge (and -fork): make it this child
    argv0 = shlex.join([sys.executable, os.path.abspath(__file__)])
    atheris.Setup([argv0] + libfuzzer_args, fn,
                  **({"internal_libfuzzer": True} if native else {}))
    atheris.Fuzz()


def _inputs(target: str) -> list:
    return sorted(glob.glob(os.path.join(CORPUS, target, "*"))
                  + glob.glob(os.path.join(REGRESSIONS, target, "*")))


# -- the parent ----------------------------------------------------------------------------------

def _sources_hash() -> str:
    import hashlib
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(PYX, "*.pyx")) + glob.glob(os.path.join(PYX, "*.pxd"))
                       + glob.glob(os.path.join(PYX, "*.h"))):
        h.update(os.path.basename(path).encode() + b"\0" + open(path, "rb").read())
    return h.hexdigest()


def native_status() -> str:
    """'current', 'stale' (pyx/ changed since the instrumented build) or 'missing'."""
    try:
        built = open(os.path.join(INSTRUMENTED, "SOURCES.sha256")).read().strip()
    except FileNotFoundError:
        return "missing"
    return "current" if built == _sources_hash() else "stale"


def build_instrumented() -> None:
    """The Cython modules built with clang -fsanitize=fuzzer-no-link into build/fuzz-instrumented."""
    clang = shutil.which("clang") or shutil.which("clang-14")
    if clang is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=600", "clang"],
                       check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        clang = shutil.which("clang")
    if clang is None:
        sys.exit("clang is needed for --build-instrumented (apt-get install clang)")
    env = {**os.environ, "CC": clang, "LDSHARED": f"{clang} -shared -pthread",
           "CFLAGS": "-fsanitize=fuzzer-no-link"}
    shutil.rmtree(INSTRUMENTED, ignore_errors=True)
    digest = _sources_hash()
    subprocess.run([sys.executable, "setup.py", "build_ext",
                    "--build-lib", os.path.join(INSTRUMENTED, "lib"),
                    "--build-temp", os.path.join(INSTRUMENTED, "tmp")],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(INSTRUMENTED, "SOURCES.sha256"), "w") as f:
        f.write(digest + "\n")            # what the modules were built from (see native_status)
    print(f"instrumented modules in {NATIVE_DIR}")


_STAT = re.compile(r"cov: (\d+) ft: (\d+) corp: (\d+)/(\d+)(\w*)")
_FINAL = re.compile(r"stat::(\w+):\s*(\d+)")
_LOADED = re.compile(r"INFO: Loaded \d+ modules\s+\((\d+) inline 8-bit counters\)")


def parse_log(text: str) -> dict:
    """libFuzzer's figures from its stderr: the last cov/ft/corp line and the final stats."""
    out = {}
    stats = _STAT.findall(text)
    if stats:
        cov, ft, units, size, unit = stats[-1]
        out.update(cov=int(cov), ft=int(ft), corpus_units=int(units),
                   corpus_bytes=int(size) * {"": 1, "b": 1, "Kb": 1024, "Mb": 1 << 20}.get(unit, 1))
    final = dict((k, int(v)) for k, v in _FINAL.findall(text))
    out["executions"] = final.get("number_of_executed_units")
    out["exec_per_s"] = final.get("average_exec_per_sec")
    out["new_units"] = final.get("new_units_added")
    out["peak_rss_mb"] = final.get("peak_rss_mb")
    out["native_counters"] = sum(int(n) for n in _LOADED.findall(text))
    return out


def run_target(target: str, args, native: str | None) -> dict:
    import targets
    work = os.path.join(args.workdir, target)
    corpus = os.path.join(work, "corpus")
    crashes = os.path.join(args.crash_dir, target)
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(crashes, exist_ok=True)
    for path in _inputs(target):               # the working copy: repo seeds + regressions
        dst = os.path.join(corpus, os.path.basename(path))
        if not os.path.exists(dst):
            shutil.copyfile(path, dst)
    before_corpus = len(os.listdir(corpus))
    before_crashes = set(os.listdir(crashes))
    max_len = args.max_len or targets.MAX_LEN.get(target, targets.DEFAULT_MAX_LEN)
    cmd = [sys.executable, os.path.abspath(__file__), corpus,
           f"-max_total_time={args.seconds}", f"-timeout={args.timeout}",
           f"-rss_limit_mb={args.rss_limit_mb}", f"-max_len={max_len}",
           f"-artifact_prefix={crashes}{os.sep}", "-print_final_stats=1", f"-seed={args.seed}"]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "EMBEDLOG_FUZZ_TARGET": target}          # makes tools/fuzz.py the child
    if native:
        env["EMBEDLOG_FUZZ_NATIVE"] = native
    # the targets' scratch files (a bookie's directory for bookie_add): libFuzzer ends the
    # child with _exit, so its atexit cleanup never runs; this root goes when the target is done
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    env["EMBEDLOG_FUZZ_TMP_ROOT"] = tmp_root = tempfile.mkdtemp(prefix=f"embedlog-fuzz-{target}-", dir=shm)
    try:
        return _run_child(target, args, cmd, env, work, corpus, crashes, max_len, before_corpus,
                          before_crashes, native)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


def _run_child(target, args, cmd, env, work, corpus, crashes, max_len, before_corpus,
               before_crashes, native) -> dict:
    log_path = os.path.join(work, "fuzz.log")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        # the hard stop is a backstop: libFuzzer stops itself at -max_total_time
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work,
                                timeout=args.seconds + 120 + 2 * args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "killed"
    summary = {"target": target, "seconds": round(time.monotonic() - t0, 1), "returncode": rc,
               "native_coverage": bool(native), "max_len": max_len,
               "corpus_files_before": before_corpus}
    summary.update(parse_log(open(log_path, encoding="utf-8", errors="replace").read()))
    summary["corpus_files_after"] = len(os.listdir(corpus))
    summary["crashes"] = sorted(os.path.join(crashes, n)     # crash-, timeout-, oom- files
                                for n in set(os.listdir(crashes)) - before_crashes)
    if not os.listdir(crashes):
        os.rmdir(crashes)                      # keep tools/fuzz/crashes/ to what needs a look
    if args.merge and not summary["crashes"]:
        repo = os.path.join(CORPUS, target)
        n0 = len(os.listdir(repo))
        subprocess.run(cmd[:2] + [repo, corpus, "-merge=1", f"-max_len={max_len}",
                                  f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_limit_mb}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=work)
        summary["merged_into_repo"] = len(os.listdir(repo)) - n0
    summary["log"] = log_path
    with open(os.path.join(work, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("EMBEDLOG_FUZZ_TARGET"):
        child(os.environ["EMBEDLOG_FUZZ_TARGET"], argv)
        return 0
    sys.path[:0] = [FUZZ, ROOT]
    import targets
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help="targets to run (default: all)")
    ap.add_argument("--seconds", type=int, default=60, help="fuzzing time per target")
    ap.add_argument("--jobs", type=int, default=1, help="targets fuzzed at once")
    ap.add_argument("--merge", action="store_true",
                    help="add the new inputs that raise coverage to tools/fuzz/corpus")
    ap.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    ap.add_argument("--rss-limit-mb", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=0, help="largest input (default: per target)")
    ap.add_argument("--seed", type=int, default=0,
                    help="libFuzzer's random seed (0: a new one each run; tests fix it to repeat)")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "fuzz"))
    ap.add_argument("--crash-dir", default=CRASHES)
    ap.add_argument("--plain", action="store_true", help="ignore the instrumented build")
    ap.add_argument("--build-instrumented", action="store_true")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(targets.TARGETS))
        return 0
    if args.build_instrumented:
        build_instrumented()
        if not args.targets:
            return 0
    unknown = set(args.targets) - set(targets.TARGETS)
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)}; known: {', '.join(targets.TARGETS)}")
    status = native_status()
    if status != "current" and not args.plain:
        # the Cython parsers (entry logs, index files, journal scan) are only visible to the
        # fuzzer through clang's coverage hooks: build them so, unless told not to
        print(f"note: building the instrumented modules ({status}); --plain skips this",
              file=sys.stderr)
        build_instrumented()
        status = native_status()
    native = NATIVE_DIR if status == "current" and not args.plain else None
    args.workdir = os.path.abspath(args.workdir)
    args.crash_dir = os.path.abspath(args.crash_dir)
    names = args.targets or list(targets.TARGETS)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(lambda t: run_target(t, args, native), names))
    if os.path.isdir(args.crash_dir) and not os.listdir(args.crash_dir):
        os.rmdir(args.crash_dir)
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"{'target':<14} {'execs':>10} {'exec/s':>7} {'cov':>6} {'ft':>6} "
          f"{'corpus':>11} {'rss MB':>6}  crashes")
    for r in results:
        print(f"{r['target']:<14} {r['executions'] or 0:>10} {r['exec_per_s'] or 0:>7} "
              f"{r.get('cov', 0):>6} {r.get('ft', 0):>6} "
              f"{r['corpus_files_before']:>5}->{r['corpus_files_after']:<5} "
              f"{r['peak_rss_mb'] or 0:>6}  {len(r['crashes']) or '-'}")
        for c in r["crashes"]:
            print(f"    {c}")
    print(json.dumps(results, indent=1))
    bad = [r for r in results if r["crashes"] or r["returncode"] != 0]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
