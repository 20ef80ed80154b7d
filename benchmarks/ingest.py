#!/usr/bin/env python
"""Sustained durable ingest through the embedded API, with memory accounting.

    python benchmarks/ingest.py --entry-size 1024 --total-gib 4          # 4 GiB of 1 KiB entries
    python benchmarks/ingest.py --entry-size 100 --entries 50000000      # 50M entries, heap bound

Appends with append_many (batches of --batch entries, each durable before the next)
across --ledgers ledgers, so journal and entry logs are both written. Prints the
throughput every few seconds and at the end, with the anonymous resident memory
(RssAnon: the heap, not the page cache of mapped files) against the configured
bound: skip_list_size_limit + page_limit * 8 KiB + 200 MiB.
"""
import argparse
import os
import shutil
import tempfile
import time

import embedlog


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry-size", type=int, default=1024)
    ap.add_argument("--total-gib", type=float, default=None)
    ap.add_argument("--entries", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    total = args.entries or int((args.total_gib or 1.0) * (1 << 30) / args.entry_size)
    path = args.dir or tempfile.mkdtemp(prefix="embedlog-ingest-", dir="/tmp")
    rows = []
    payloads = [os.urandom(args.entry_size) for _ in range(args.batch)]
    try:
        with embedlog.open(path) as log:
            cfg = log.config
            bound = cfg.skip_list_size_limit + cfg.page_limit * 8192 + (200 << 20)
            handles = [log.create_ledger() for _ in range(args.ledgers)]
            base_rss = rss_anon_bytes()
            written = 0
            peak = 0
            t0 = last = time.perf_counter()
            last_written = 0
            i = 0
            while written < total:
                n = min(args.batch, total - written)
                handles[i % args.ledgers].append_many(payloads[:n])
                i += 1
                written += n
                now = time.perf_counter()
                if now - last >= 5 or written == total:
                    rss = rss_anon_bytes()
                    peak = max(peak, rss)
                    rate = (written - last_written) / (now - last)
                    rows.append((now - t0, written, rate, rss))
                    print(f"{now - t0:7.1f} s  {written:>12,} entries  {rate:>12,.0f} entries/s  "
                          f"{rate * args.entry_size / 1e6:8.1f} MB/s  RssAnon {rss / 2**20:7.1f} MiB",
                          flush=True)
                    last, last_written = now, written
            elapsed = time.perf_counter() - t0
            stats = log.statistics()
        print(f"\ningested {written:,} entries of {args.entry_size} B in {elapsed:.1f} s: "
              f"{written / elapsed:,.0f} entries/s, {written * args.entry_size / elapsed / 1e6:,.1f} MB/s")
        print(f"RssAnon peak {peak / 2**20:.1f} MiB (at start {base_rss / 2**20:.1f} MiB); bound "
              f"{bound / 2**20:.1f} MiB -> {'within' if peak <= bound else 'OVER'}")
        print(f"journal: {stats['journal']['fsyncs']:,} fdatasyncs, {stats['journal']['bytes_written'] / 2**30:.2f} GiB; "
              f"memtable flushes {stats['memtable_flushes']}, entry log rolls {stats['entry_log_rolls']}")
    finally:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
