#!/usr/bin/env python
"""The cost of TLS (and of the shared token) on adds: one bookie process, E=Qw=Qa=1,
100 B entries, plain TCP beside TLS (server certificate; then with client certificates).

    python benchmarks/tls.py [--seconds 3] [--window 2000]

Throughput keeps --window adds outstanding with append_async; latency is the p50 of single
durable appends one after another (benchmarks/replication.py measures the same way).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from replication import latency, throughput  # noqa: E402

from embedlog.harness import LocalCluster  # noqa: E402

SETUPS = [("plain TCP", {}), ("TLS", {"tls": True}),
          ("TLS + client certificates", {"tls": True, "tls_client_auth": True}),
          ("plain TCP + token", {"auth_token": "bench-token-0123456789abcdef"})]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="embedlog-tls-bench-", dir="/tmp")
    print(f"| setup | adds/s (window {args.window}) | lone add p50 / p95 / p99 (µs) |")
    print("| --- | ---: | ---: |")
    try:
        for i, (name, opts) in enumerate(SETUPS):
            with LocalCluster(bookies=1, base_dir=os.path.join(base, f"c{i}"), proxies=False,
                              autorecovery=False, **opts) as lc:
                w = lc.client().create_ledger(1, 1, 1)
                tput = throughput(w, args.size, args.seconds, args.window)
                p50, p95, p99 = latency(w, args.size, args.seconds)
            print(f"| {name} | {tput:,.0f} | {p50:,.0f} / {p95:,.0f} / {p99:,.0f} |", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
