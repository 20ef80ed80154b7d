#!/usr/bin/env python
"""Replication soak: the randomized fault test for as long as you like.

    python tools/replication_soak.py --minutes 120 [--bookies 5] [--seed N]

Runs rounds of tests/support/replication_chaos.Chaos (kill, suspend, stop, restart bookies on
a seeded schedule while a writer and a reader run) and checks after each round that
every acknowledged entry is readable and readers agree. Prints one line per round.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from embedlog.harness import LocalCluster  # noqa: E402
from support.replication_chaos import Chaos  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--round-seconds", type=float, default=60)
    ap.add_argument("--bookies", type=int, default=5)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    args = ap.parse_args()
    end = time.time() + args.minutes * 60
    rnd = args.seed
    rounds = 0
    while time.time() < end:
        rounds += 1
        with LocalCluster(bookies=args.bookies) as lc:
            chaos = Chaos(lc, rnd, duration_s=args.round_seconds)
            chaos.run()
            bad = chaos.check()
        print(f"round {rounds} seed {rnd}: {chaos.total_acked:,} acks, {len(chaos.actions)} faults, "
              f"{'OK' if not bad else 'VIOLATIONS: ' + '; '.join(bad[:5])}", flush=True)
        if bad:
            sys.exit(1)
        rnd += 1


if __name__ == "__main__":
    main()
