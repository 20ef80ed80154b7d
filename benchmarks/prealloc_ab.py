#!/usr/bin/env python
"""Journal preallocation A/B in one process: zeros always ahead of the tail (the
policy before 645576b) against zeros only ahead of small groups (large O_DIRECT groups extend
the file), on two fresh logs, in alternating 0.4 s segments so that a shared machine's noise
hits both alike.

    python benchmarks/prealloc_ab.py SIZE_BYTES BATCH SECONDS     # e.g. 1024 1000 20

Prints, per policy: the median rate of durable batches (8 ledgers in turn), the quartiles,
the mean fdatasync, and the zeros and journal bytes written.
"""
from __future__ import annotations

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

SEGMENT_S = 0.4


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    size, batch, seconds = int(argv[0]), int(argv[1]), float(argv[2])
    root = tempfile.mkdtemp(prefix="embedlog-prealloc-ab-", dir="/tmp")
    logs = {}
    try:
        for name in ("zeros", "adaptive"):
            log = embedlog.open(os.path.join(root, name))
            if name == "zeros":
                # the policy before: the preallocator always wants zeros ahead
                log.bookie.journal.files.zeros_wanted = lambda: True
            logs[name] = (log, [log.create_ledger() for _ in range(8)])
        payloads = [os.urandom(size) for _ in range(batch)]
        rates = {n: [] for n in logs}
        syncs = {n: [0, 0.0] for n in logs}
        end = time.monotonic() + seconds
        turn = 0
        while time.monotonic() < end:
            order = list(logs.items()) if turn % 2 == 0 else list(reversed(logs.items()))
            for name, (log, handles) in order:
                os.sync()
                j = log.bookie.journal.stats
                f0, s0 = j["fsyncs"], j["fsync_time_s"]
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < SEGMENT_S:
                    if batch == 1:
                        handles[n % 8].append(payloads[0])
                    else:
                        handles[(n // batch) % 8].append_many(payloads)
                    n += batch
                rates[name].append(n / (time.perf_counter() - t0))
                syncs[name][0] += j["fsyncs"] - f0
                syncs[name][1] += j["fsync_time_s"] - s0
            turn += 1
        for name, (log, _h) in logs.items():
            st = log.bookie.statistics()["journal"]
            r = sorted(rates[name])
            print(f"{size} B x {batch} {name:9} median {statistics.median(r):>12,.0f}/s "
                  f"(quartiles {r[len(r) // 4]:,.0f}..{r[3 * len(r) // 4]:,.0f}, {len(r)} segments); "
                  f"fdatasync {1e6 * syncs[name][1] / max(syncs[name][0], 1):.0f} us; zeros "
                  f"{st['zeros_written'] / 2**20:,.0f} MiB, journal {st['bytes_written'] / 2**20:,.0f} MiB")
    finally:
        for log, _h in logs.values():
            log.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
