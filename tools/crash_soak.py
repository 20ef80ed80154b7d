#!/usr/bin/env python
"""Soak: SIGKILL an appending child thousands of times; every ack must survive.

    python tools/crash_soak.py --cycles 5000 [--dir D]

The same cycle as tests/bookie/test_crash.py (which runs 20 in the default test run).
Exits 1 (after "LOST OR CHANGED") if an acknowledged entry is lost or changed.
"""
import argparse
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# crash_child.py is in tests/support/, test_crash.py (the cycle) in tests/bookie/
# (tests/bookie/test_soak_tools.py runs this script, so a move breaks a test)
for _dir in ("tests/bookie", "tests", ""):
    sys.path.insert(0, os.path.join(HERE, "..", _dir))

import embedlog  # noqa: E402
from embedlog import LedgerId  # noqa: E402
from support.crash_child import payload  # noqa: E402
from test_crash import run_cycle  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--verify-every", type=int, default=10, help="cycles between full verifications")
    args = ap.parse_args()
    path = args.dir or tempfile.mkdtemp(prefix="embedlog-soak-")
    rnd = random.Random(args.seed)
    acked_total = {}
    t0 = time.time()
    for cycle in range(1, args.cycles + 1):
        for q, ids in run_cycle(path, rnd.randrange(1 << 30), rnd).items():
            acked_total.setdefault(q, set()).update(ids)
        if cycle % args.verify_every == 0 or cycle == args.cycles:
            with embedlog.open(path) as log:
                for q, ids in acked_total.items():
                    r = log.open_ledger(LedgerId.parse(q))
                    got = r.read_batch(0, max(ids))
                    bad = [e for e in ids if got[e] != payload(q, e)]
                    if bad:
                        print(f"LOST OR CHANGED: ledger {q} entries {bad[:10]}", flush=True)
                        sys.exit(1)
            n = sum(map(len, acked_total.values()))
            print(f"cycle {cycle}/{args.cycles}: {n:,} acknowledged entries verified "
                  f"in {len(acked_total)} ledgers, {time.time() - t0:.0f} s (seed {args.seed}, dir {path})",
                  flush=True)


if __name__ == "__main__":
    main()
