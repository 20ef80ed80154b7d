#!/usr/bin/env python
"""Stream append throughput and take-over time on the local harness.

    python benchmarks/streams.py [--seconds 4] [--entries-before-takeover 100000]

Appends 100 B and 1 KiB entries to a stream (E=3, Qw=3, Qa=2, three bookie processes)
with a window of outstanding appends, beside a plain ledger doing the same work, then
measures take-over time: from the decision (a second client calls take_over()) to its
first accepted write, with the previous writer still holding the lead, over several
rounds.
"""
import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from embedlog.harness import LocalCluster  # noqa: E402


def window_throughput(append_async, size, seconds, window=2000):
    data = os.urandom(size)
    sem = threading.BoundedSemaphore(window)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(100):
            sem.acquire()
            append_async(data).add_done_callback(lambda f: sem.release())
            n += 1
    for _ in range(window):
        sem.acquire()
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--entries-before-takeover", type=int, default=100_000)
    args = ap.parse_args()
    with LocalCluster(bookies=3, proxies=False, autorecovery=False) as lc:
        c1, c2 = lc.client(), lc.client()
        rows = []
        for size in (100, 1024):
            s = c1.open_stream(f"bench-{size}")
            s.take_over()
            st = window_throughput(s.append_async, size, args.seconds)
            w = c1.create_ledger(3, 3, 2)
            lt = window_throughput(w.append_async, size, args.seconds)
            w.close()
            rows.append((size, st, lt))
        s1 = c1.open_stream("takeover")
        s2 = c2.open_stream("takeover")
        chunk = [os.urandom(100)] * 1000
        for _ in range(args.entries_before_takeover // 1000):
            s1.append_many(chunk)
        times = []
        leaders = [s1, s2]
        for r in range(args.rounds):
            new = leaders[(r + 1) % 2]
            leaders[r % 2].append_many([b"x"] * 100)       # the old leader is active
            t0 = time.perf_counter()
            new.take_over()
            new.append(b"first")
            times.append(time.perf_counter() - t0)
    print(f"# embedlog stream benchmark ({time.strftime('%Y-%m-%d')}, nproc={os.cpu_count()})\n")
    print("| entry | stream appends/s | ledger appends/s | stream / ledger |")
    print("| ---: | ---: | ---: | ---: |")
    for size, st, lt in rows:
        print(f"| {size} B | {st:,.0f} | {lt:,.0f} | {st / lt:.2f} |")
    print(f"\ntake-over (decision to first accepted write), {len(times)} rounds after "
          f"{args.entries_before_takeover:,} entries: median {statistics.median(times) * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
