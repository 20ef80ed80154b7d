"""Run the seeded protocol checker (embedlog/harness/checker.py) for a while.

    python tools/protocol_check.py --minutes 60            # many seeds, one after another
    python tools/protocol_check.py --seed 1234             # replay one seed
    python tools/protocol_check.py --seeds 100 --start 500 --steps 60

Each seed is a schedule of writers, readers, recoveries and take-overs under per-message
faults, metadata gates and bookie kills/suspensions on one LocalCluster; after it, every
fault is healed and the protocol's invariants are checked. A seed that breaks one prints
its schedule; the run exits 1 if any did. Every --long-every-th seed (4 by default) writes
long ledgers on striped ensembles (E > Qw): bulk appends of thousands of entries.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embedlog.harness import LocalCluster                 # noqa: E402
from embedlog.harness.checker import BOOKIE_CONFIG, LONG_EVERY, make_schedule, Run   # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, help="run this one seed")
    p.add_argument("--start", type=int, default=1, help="first seed")
    p.add_argument("--seeds", type=int, default=None, help="how many seeds")
    p.add_argument("--minutes", type=float, default=None, help="run seeds for this long")
    p.add_argument("--steps", type=int, default=40, help="steps per schedule")
    p.add_argument("--bookies", type=int, default=5)
    p.add_argument("--long-every", type=int, default=LONG_EVERY,
                   help="seeds this divides write long ledgers on striped ensembles (0: none)")
    p.add_argument("--metadata", default="sqlite", choices=("sqlite", "zk", "etcd"))
    p.add_argument("--seeds-per-cluster", type=int, default=10,
                   help="start a fresh cluster after this many seeds")
    a = p.parse_args(argv)
    if a.seed is not None:
        seeds = iter([a.seed])
    elif a.seeds is not None:
        seeds = iter(range(a.start, a.start + a.seeds))
    else:
        seeds = iter(range(a.start, 1 << 62))
    deadline = time.monotonic() + a.minutes * 60 if a.minutes else None
    totals = {"schedules": 0, "steps": 0, "faults": 0, "acks": 0, "recoveries": 0,
              "take_overs": 0, "errors": 0}
    failed = []
    t0 = time.monotonic()
    cluster = None
    base = tempfile.mkdtemp(prefix="embedlog-check-")
    try:
        for n, seed in enumerate(seeds):
            if deadline is not None and time.monotonic() > deadline:
                break
            if cluster is None or n % a.seeds_per_cluster == 0:
                if cluster is not None:
                    cluster.close()
                    shutil.rmtree(cluster.base_dir, ignore_errors=True)
                cluster = LocalCluster(bookies=a.bookies, metadata=a.metadata, autorecovery=False,
                                       base_dir=os.path.join(base, f"c{n}"), bookie_config=BOOKIE_CONFIG)
            report = Run(cluster, seed, make_schedule(seed, a.steps, a.bookies, a.long_every)).run()
            totals["schedules"] += 1
            totals["steps"] += len(report.schedule)
            for k in ("faults", "acks", "recoveries", "take_overs", "errors"):
                totals[k] += report.counts.get(k, 0)
            print(report, flush=True)
            if report.violations:
                failed.append(seed)
                cluster.close()        # start clean after a violation; its files stay
                print(f"# seed {seed}: the cluster's directories are kept in {cluster.base_dir}")
                cluster = None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        if cluster is not None:
            cluster.close()
            shutil.rmtree(cluster.base_dir, ignore_errors=True)
        if not failed:
            shutil.rmtree(base, ignore_errors=True)
    minutes = (time.monotonic() - t0) / 60
    print(f"# {totals['schedules']} schedules in {minutes:.1f} min: {totals['steps']} steps, "
          f"{totals['faults']} faults, {totals['acks']} acknowledged entries, "
          f"{totals['recoveries']} recoveries, {totals['take_overs']} take-overs, "
          f"{totals['errors']} operations failed as the protocol allows; "
          f"violations in {len(failed)} seed(s){': ' + ', '.join(map(str, failed)) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
