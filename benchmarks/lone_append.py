#!/usr/bin/env python
"""Where a lone durable append's time goes: the embedded log's path around its I/O.

    python benchmarks/lone_append.py [--appends 3000] [--dir DIR ...] [--rounds 3]

For each directory (default: a temporary one under /tmp, the disk, and one under /dev/shm,
where the I/O costs next to nothing and what is left is the path's own CPU), a fresh log
takes ``--appends`` lone 100 B appends to one ledger, each durable before the next.
Printed per round: µs per append and the process's CPU per append; then one round with
each step timed (the group's write and fdatasync, the framing, the waiter's look, the group
taken and finished, the deliver: timers wrapped around those methods, a few µs of their
own) and one under cProfile (the Python calls per append; their time is the profiler's).
compare.py's append_sync_100B row is the figure against the peers and the floor; this is
for finding what to cut.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import embedlog  # noqa: E402
from embedlog import embedded  # noqa: E402
from embedlog.bookie import journal, journal_files  # noqa: E402

PAYLOAD = b"x" * 100
# (class, method, label): wrapped by the timed round; nested ones are taken out of outer ones
STEPS = [(embedded.WriteHandle, "_add", "framing and the add's checks"),
         (embedded.WriteHandle, "_wait", "the wait (all of the group below)"),
         (journal.Journal, "_take_group", "taking the group"),
         (journal.Journal, "_write_group", "the group's write and sync, with their Python"),
         (journal_files.JournalFiles, "_write", "the write (and sync, in one call)"),
         (journal_files.JournalFiles, "sync", "a separate fdatasync"),
         (journal.Journal, "_group_written", "finishing the group"),
         (embedded.WriteHandle, "_deliver", "the deliver")]


def _run(root: str, n: int, on_start=None):
    d = tempfile.mkdtemp(dir=root)
    try:
        log = embedlog.open(d)
        w = log.create_ledger()
        for _ in range(200):
            w.append(PAYLOAD)
        if on_start:
            on_start()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            w.append(PAYLOAD)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        log.close()
        return wall / n * 1e6, cpu / n * 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _timed(root: str, n: int) -> dict:
    spent: dict = {}
    saved = []
    for cls, name, _label in STEPS:
        real = getattr(cls, name)
        saved.append((cls, name, real))

        def timed(self, *a, _real=real, _key=name, **k):
            t = time.perf_counter()
            try:
                return _real(self, *a, **k)
            finally:
                spent[_key] = spent.get(_key, 0.0) + time.perf_counter() - t
        setattr(cls, name, timed)
    try:
        per, _cpu = _run(root, n, spent.clear)
    finally:
        for cls, name, real in saved:
            setattr(cls, name, real)
    return {"total": per, **{k: v / n * 1e6 for k, v in spent.items()}}


def _calls(root: str, n: int) -> tuple[float, float]:
    prof = cProfile.Profile()
    _run(root, n, prof.enable)
    prof.disable()
    stats = pstats.Stats(prof).stats
    every = sum(nc for (_f, _l, _fn), (_cc, nc, _tt, _ct, _cl) in stats.items()) / n
    python = sum(nc for (f, _l, _fn), (_cc, nc, _tt, _ct, _cl) in stats.items() if f != "~") / n
    return python, every


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--appends", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", action="append", help="where the logs go (repeatable)")
    args = ap.parse_args(argv)
    roots = args.dir or ["/tmp", "/dev/shm"]
    print(f"embedlog at {embedlog.__file__}; {args.appends:,} lone 100 B appends per round; "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for root in roots:
        if not os.path.isdir(root):
            print(f"\n{root}: not a directory, skipped")
            continue
        print(f"\n{root}:")
        for r in range(args.rounds):
            per, cpu = _run(root, args.appends)
            print(f"  round {r + 1}: {per:7.1f} µs per append, the process's CPU {cpu:6.1f} µs")
        t = _timed(root, args.appends)
        inner = {"_wait": ("_take_group", "_write_group", "_group_written"),
                 "_write_group": ("_write", "sync")}
        print(f"  timed round: {t['total']:7.1f} µs per append")
        for _cls, name, label in STEPS:
            own = t.get(name, 0.0) - sum(t.get(k, 0.0) for k in inner.get(name, ()))
            print(f"    {label:48s} {own:7.1f} µs" + (" (own)" if name in inner else ""))
        outside = t["total"] - sum(t.get(k, 0.0) for k in ("_add", "_wait", "_deliver"))
        print(f"    {'the append call around them':48s} {outside:7.1f} µs")
        python, every = _calls(root, min(args.appends, 2000))
        print(f"  cProfile: {python:.1f} Python calls per append ({every:.1f} with builtins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
