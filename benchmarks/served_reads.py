#!/usr/bin/env python
"""Reads served by a bookie process: the wire read path, beside the embedded read.

    python benchmarks/served_reads.py [--entries 200000] [--rounds 3]

One bookie (LocalCluster, TCP loopback, E=Qw=Qa=1) holds a closed ledger of --entries
entries of 100 B and one of 1 KiB, checkpointed, so reads come from the entry logs through
the index. Per round and size: a scan (read_batch of 1,000 entries per call, over the whole
ledger: entries/s) and point reads (read_entry of random ids one after another: reads/s).
The same ledger written by the embedded log is read the same way in-process. Rounds are
interleaved; the table shows the best round of each row.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import embedlog  # noqa: E402
from embedlog.harness import LocalCluster  # noqa: E402

BATCH = 1000


def fill(handle, size: int, n: int) -> None:
    chunk = [os.urandom(size) for _ in range(BATCH)]
    for _ in range(n // BATCH):
        handle.append_many(chunk)
    handle.close()


def scan(reader, n: int) -> float:
    t0 = time.perf_counter()
    got = 0
    for first in range(0, n, BATCH):
        got += len(reader.read_batch(first, min(first + BATCH, n) - 1))
    assert got == n, got
    return n / (time.perf_counter() - t0)


def points(reader, n: int, seconds: float) -> float:
    rng = random.Random(7)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(200):
            reader.read_entry(rng.randrange(n))
        done += 200
    return done / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="point reads per round and row")
    args = ap.parse_args()
    n = args.entries // BATCH * BATCH
    base = tempfile.mkdtemp(prefix="embedlog-served-reads-", dir="/tmp")
    best: dict = {}
    try:
        with LocalCluster(bookies=1, base_dir=os.path.join(base, "c"), proxies=False,
                          autorecovery=False) as lc, \
                embedlog.open(os.path.join(base, "embedded")) as log:
            c = lc.client()
            ledgers = {}
            for size in (100, 1024):
                for where, store in (("served (1 bookie process, TCP loopback)", c),
                                     ("embedded (in-process)", log)):
                    w = store.create_ledger(1, 1, 1) if store is c else store.create_ledger()
                    fill(w, size, n)
                    ledgers[(where, size)] = (store, w.ledger_id)
            log.bookie.checkpoint()
            for _ in range(args.rounds):
                for (where, size), (store, lid) in ledgers.items():
                    r = store.open_ledger(lid)
                    for kind, rate in (("scan", scan(r, n)), ("point", points(r, n, args.seconds))):
                        key = (where, size, kind)
                        best[key] = max(best.get(key, 0.0), rate)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# served reads ({time.strftime('%Y-%m-%d')}, nproc={os.cpu_count()}, "
          f"{n:,} entries, best of {args.rounds} interleaved rounds)\n")
    print("| reader | entry | scan entries/s | point reads/s |")
    print("| --- | ---: | ---: | ---: |")
    for where in ("served (1 bookie process, TCP loopback)", "embedded (in-process)"):
        for size in (100, 1024):
            print(f"| {where} | {size} B | {best[(where, size, 'scan')]:,.0f} | "
                  f"{best[(where, size, 'point')]:,.0f} |")


if __name__ == "__main__":
    main()
