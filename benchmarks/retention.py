#!/usr/bin/env python
"""A log under retention, layout 2: ledgers written in turn, the oldest deleted once more
than KEEP are held, checkpoints and garbage collection on their own threads. With
journal_reuse_files (the default) the journal takes the segments GC frees; without it every
journal is a new file. Both logs in one process, fresh, in alternating 0.5 s segments so
that a shared machine's noise hits both alike, timed once each has written WARM journals.

    python benchmarks/retention.py [--size 100] [--batch 100] [--seconds 20]

Prints, per log, for the timed part: the median rate of durable batches, the journal's
bytes and the preallocation zeros written per payload byte, the groups that extended a
file, the journal files made and reused, the fdatasync mean.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import embedlog  # noqa: E402

SEGMENT_S = 0.5
KEEP = 4                 # ledgers held; each takes about one journal of payload
JOURNAL_MB = 16
WARM = 12                # journals written before the clock (GC has freed some by then)


class Retained:
    """One log: a ledger takes JOURNAL_MB of payload, then the next; the oldest beyond KEEP
    is deleted (GC frees its segments once a checkpoint has passed them)."""

    def __init__(self, path: str, reuse: bool, payloads: list):
        self.log = embedlog.open(path, storage_layout=2, journal_max_size_mb=JOURNAL_MB,
                                 journal_max_backups=0, journal_reuse_files=reuse,
                                 gc_wait_time_ms=200, flush_interval_ms=200)
        self.payloads = payloads
        self.per_ledger = JOURNAL_MB << 20
        self.held: list = []
        self.written = 0            # payload bytes into the current ledger
        self.payload_total = 0
        self.w = self._next()

    def _next(self):
        w = self.log.create_ledger(digest="crc32c")
        self.held.append(w.ledger_id)
        if len(self.held) > KEEP:
            self.log.delete_ledger(self.held.pop(0))
        return w

    def batch(self) -> float:
        t0 = time.perf_counter()
        self.w.append_many(self.payloads)
        dt = time.perf_counter() - t0
        n = sum(map(len, self.payloads))
        self.written += n
        self.payload_total += n
        if self.written >= self.per_ledger:
            self.w.close()
            self.w = self._next()
            self.written = 0
        return dt

    def journal(self) -> dict:
        return dict(self.log.bookie.statistics()["journal"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args(argv)
    payloads = [os.urandom(args.size) for _ in range(args.batch)]
    root = tempfile.mkdtemp(prefix="embedlog-retention-", dir="/tmp")
    logs = {}
    try:
        for name, reuse in (("reuse", True), ("no reuse", False)):
            logs[name] = Retained(os.path.join(root, name.replace(" ", "-")), reuse, payloads)
        warm = WARM * (JOURNAL_MB << 20)
        for r in logs.values():                        # untimed: until WARM journals written
            while r.payload_total < warm:
                r.batch()
        base = {name: (r.journal(), r.payload_total) for name, r in logs.items()}
        rates = {name: [] for name in logs}
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline:
            for name, r in logs.items():
                end, n, timed = time.perf_counter() + SEGMENT_S / len(logs), 0, 0.0
                while time.perf_counter() < end:
                    timed += r.batch()
                    n += len(payloads)
                rates[name].append(n / timed)
        print(f"retention: {args.batch} x {args.size} B per durable batch, {KEEP} ledgers of "
              f"{JOURNAL_MB} MiB held, {JOURNAL_MB} MiB journals, timed {args.seconds:.0f} s "
              f"after {WARM} journals; load {os.getloadavg()[0]:.2f}")
        print("| log | entries/s (median of segments) | journal bytes / payload byte | zeros / "
              "payload byte | groups extending a file | journals made | journals reused | "
              "fdatasync mean |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, r in logs.items():
            j0, p0 = base[name]
            j = {k: v - j0.get(k, 0) for k, v in r.journal().items() if isinstance(v, (int, float))}
            payload = r.payload_total - p0
            fs = j["fsync_time_s"] / j["fsyncs"] * 1e6 if j["fsyncs"] else 0
            print(f"| {name} | {statistics.median(rates[name]):,.0f} | "
                  f"{j['bytes_written'] / payload:.2f} | {j['zeros_written'] / payload:.2f} | "
                  f"{j['groups_extending']:,} of {j['groups']:,} | {j['files_created']} | "
                  f"{j['files_reused']} | {fs:.0f} us |")
    finally:
        for r in logs.values():
            r.log.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
