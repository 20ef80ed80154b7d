#!/usr/bin/env python
"""A bookie under a flood of requests and under a reader that never reads, with the default
limits unless told otherwise (docs/SECURITY.md, "Resource limits").

    python benchmarks/backpressure.py [--seconds 10] [--throttle-ms 10000]

One bookie process (LocalCluster, no proxies). Prints:
- flood: N long-poll reads sent at once on one connection (N = twice the per-connection
  long-poll bound), for a LAC that never comes: how many waited (answered at their 3 s
  timeout) and how many were answered at once (past the bound), the bookie's RSS, and a
  well-behaved client's single-add latency (p50 / p99) meanwhile;
- slow reader: 2 MiB reads sent for --seconds without reading an answer: requests that got
  into the socket, the replies an unbounded bookie would have held, the bookie's RSS growth,
  and a well-behaved client's single-add latency (p50 / p99) before and during.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from embedlog.config import BookieConfig  # noqa: E402
from embedlog.harness import LocalCluster  # noqa: E402
from embedlog.harness.hostile import flood, rss_bytes, slow_reader  # noqa: E402
from embedlog.net import protocol as P  # noqa: E402

MiB = 1024 * 1024


def add_latencies(w, n: int) -> list:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        w.append(b"x" * 100)
        out.append(time.perf_counter() - t0)
    return out


def pct(xs, q) -> float:
    return float(np.percentile(np.array(xs) * 1e6, q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--throttle-ms", type=int, default=BookieConfig().max_throttle_time_ms)
    args = ap.parse_args()
    per_conn = BookieConfig().max_long_polls_per_connection
    with tempfile.TemporaryDirectory() as base, LocalCluster(
            bookies=1, base_dir=base, proxies=False, autorecovery=False,
            bookie_config={"max_throttle_time_ms": args.throttle_ms}) as cluster:
        client = cluster.client()
        pid = cluster.pid(0)
        address = client._ctx.address_of(cluster.bookie_id(0))
        big = client.create_ledger(1, 1, 1, password=b"pw")
        big.append_many([bytes([i]) * MiB for i in range(4)])
        lid = big.ledger_id
        small = client.create_ledger(1, 1, 1, password=b"pw")
        quiet = add_latencies(small, 2000)
        rss0 = rss_bytes(pid)
        print(f"bookie RSS at rest: {rss0 / MiB:.1f} MiB; lone 100 B add p50 {pct(quiet, 50):.0f} us, "
              f"p99 {pct(quiet, 99):.0f} us")

        n = 2 * per_conn
        polls = [P.read_request(i + 1, lid.scope_id, lid.ledger_id, 0, flags=P.FLAG_LONG_POLL,
                                previous_lac=10**9, timeout_ms=3000) for i in range(n)]
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.wait(0.1):
                peak[0] = max(peak[0], rss_bytes(pid))

        watcher = threading.Thread(target=watch)
        meanwhile = []
        adder = threading.Thread(target=lambda: meanwhile.extend(add_latencies(small, 500)))
        watcher.start()
        adder.start()
        out = flood(address, polls, timeout_s=30)
        adder.join()
        stop.set()
        watcher.join()
        at_once = sum(1 for t in out["answered_s"] if t < 1.5)
        print(f"flood: {n} long polls on one connection -> {at_once} answered at once (past "
              f"max_long_polls_per_connection), {len(out['answered_s']) - at_once} at their 3 s "
              f"timeout, statuses {out['statuses']}; bookie RSS peak {peak[0] / MiB:.1f} MiB; "
              f"another client's 100 B add meanwhile p50 {pct(meanwhile, 50):.0f} us, "
              f"p99 {pct(meanwhile, 99):.0f} us ({len(meanwhile)} adds)")

        during = []

        def sample():
            during.extend(add_latencies(small, 50))
            return rss_bytes(pid)

        rss1 = rss_bytes(pid)
        res = slow_reader(address, lambda rid: P.read_request(rid, lid.scope_id, lid.ledger_id, 0, 4),
                          seconds=args.seconds, reply_bytes=2 * MiB, sample=sample, sample_every_s=0.25)
        print(f"slow reader for {args.seconds:.0f} s: {res['requests_sent']} requests into the socket "
              f"({res['reply_bytes_owed'] / 2**30:.0f} GiB of replies owed); bookie RSS "
              f"{rss1 / MiB:.1f} -> max {max(res['samples']) / MiB:.1f} MiB "
              f"(+{(max(res['samples']) - rss1) / MiB:.1f}); another client's 100 B add meanwhile "
              f"p50 {pct(during, 50):.0f} us, p99 {pct(during, 99):.0f} us ({len(during)} adds)")
        client.close()


if __name__ == "__main__":
    main()
