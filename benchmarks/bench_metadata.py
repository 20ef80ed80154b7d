"""Metadata operations per second on every driver: SQLite, ZooKeeper (3 layouts), etcd.

    python benchmarks/bench_metadata.py [--ledgers N] [--iterate-ledgers M] [--drivers ...]

Workloads (named once, inputs built before timing):

- ``create``: N create_ledger_metadata calls, one after another (latency-bound, one client)
- ``read``: N read_ledger_metadata calls
- ``cas_update``: N write_ledger_metadata calls, each on the version the last one returned
- ``generate_id``: N generate_ledger_id calls
- ``iterate``: one iterate_ledgers pass over M ledgers (bulk-loaded untimed, see populate)

ZooKeeper and etcd run as child processes on loopback (tests/support/servers.py), each with one
client: the figures are round trips of this host, not a cluster's throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support import servers  # noqa: E402

from embedlog._native.format import LedgerId  # noqa: E402
from embedlog.meta import open_metadata_store  # noqa: E402
from embedlog.meta.api import LedgerMetadata  # noqa: E402

DRIVERS = ["sqlite", "zk+flat", "zk+hierarchical", "zk+longhierarchical", "etcd"]


def metadata(ledger: int) -> LedgerMetadata:
    # a realistic record: 3 bookies, one fragment, a little custom metadata (~400 bytes)
    return LedgerMetadata(LedgerId(0, ledger), 3, 3, 2, password=b"p" * 20,
                          fragments=((0, ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")),),
                          custom_metadata={"application": b"bench"})


def populate(store, m: int) -> None:
    """Untimed bulk load for ``iterate``, batched below the driver (one create per round
    trip would take minutes on ZooKeeper): the same keys and bytes the driver writes."""
    records = ((metadata(i).ledger_id, metadata(i).to_bytes()) for i in range(m))
    kind = type(store).__name__
    if kind == "SqliteMetadataStore":
        import sqlite3
        with sqlite3.connect(store.path) as conn:
            conn.executemany("INSERT INTO ledgers VALUES (?, ?, 0)",
                             ((lid.qualified_name, data) for lid, data in records))
    elif kind == "ZkMetadataStore":
        records = list(records)
        for parent in {store.ledger_path(lid).rsplit("/", 1)[0] for lid, _ in records}:
            store._zk.ensure_path(parent)
        pending = []
        for start in range(0, len(records), 200):      # multi-op transactions, pipelined
            txn = store._zk.transaction()
            for lid, data in records[start:start + 200]:
                txn.create(store.ledger_path(lid), data)
            pending.append(txn.commit_async())
            if len(pending) == 16 or start + 200 >= len(records):   # a bounded window
                for r in pending:
                    failed = [x for x in r.get(timeout=120) if isinstance(x, Exception)]
                    if failed:
                        raise RuntimeError(f"bulk load failed: {failed[0]!r}")
                pending = []
    else:
        from etcd3 import transactions as tx
        ops = []
        for lid, data in records:
            ops.append(tx.Put(store.ledger_key(lid), data))
            if len(ops) == 100:            # etcd allows 128 operations per transaction
                store._etcd.transaction(compare=[], success=ops, failure=[])
                ops = []
        if ops:
            store._etcd.transaction(compare=[], success=ops, failure=[])


def timed(fn, count: int) -> float:
    started = time.perf_counter()
    fn()
    return count / (time.perf_counter() - started)


def bench_driver(uri_for, n: int, m: int) -> dict:
    out = {}
    with open_metadata_store(uri_for("ops")) as store:
        records = [metadata(i) for i in range(n)]
        versions = {}

        def create():
            for r in records:
                versions[r.ledger_id] = store.create_ledger_metadata(r).version

        def read():
            for r in records:
                store.read_ledger_metadata(r.ledger_id)

        updated = [r.with_(length=1000) for r in records]

        def cas():
            for r in updated:
                store.write_ledger_metadata(r, versions[r.ledger_id])

        def generate():
            for _ in range(n):
                store.generate_ledger_id()

        out["create"] = timed(create, n)
        out["read"] = timed(read, n)
        out["cas_update"] = timed(cas, n)
        out["generate_id"] = timed(generate, n)

    with open_metadata_store(uri_for("iter")) as store:
        populate(store, m)
        started = time.perf_counter()
        try:
            seen = sum(1 for _ in store.iterate_ledgers(0))
            elapsed = time.perf_counter() - started
            out["iterate"] = seen / elapsed
            out["iterate_s"] = elapsed
            if seen != m:
                out["iterate_error"] = f"listed {seen} of {m}"
        except Exception as exc:          # flat ZooKeeper can exceed a packet: report it
            out["iterate_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledgers", type=int, default=2000,
                        help="ledgers for create / read / cas_update / generate_id (2000)")
    parser.add_argument("--iterate-ledgers", type=int, default=100_000,
                        help="ledgers listed by the iterate workload (100000)")
    parser.add_argument("--drivers", nargs="+", default=DRIVERS, choices=DRIVERS)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    results = {}
    tmp = tempfile.mkdtemp(prefix="embedlog-bench-meta-")
    zk = etcd = None
    try:
        for driver in args.drivers:
            family = driver.split("+")[0]
            if family == "zk" and zk is None:
                zk = servers.ZooKeeperServer(heap_mb=1024)   # holds 100k+ znodes
            if family == "etcd" and etcd is None:
                etcd = servers.EtcdServer()
            run = uuid.uuid4().hex[:8]
            if family == "sqlite":
                uri_for = lambda name: f"sqlite://{tmp}/{name}-{run}.db"  # noqa: E731
            elif family == "zk":
                uri_for = lambda name: f"{driver}://{zk.hosts}/{run}-{name}/ledgers"  # noqa: E731
            else:
                uri_for = lambda name: f"etcd://{etcd.endpoint}/{run}-{name}"  # noqa: E731
            started = time.perf_counter()
            results[driver] = bench_driver(uri_for, args.ledgers, args.iterate_ledgers)
            results[driver]["wall_s"] = time.perf_counter() - started
            print(f"# {driver} done in {results[driver]['wall_s']:.1f}s", file=sys.stderr)
    finally:
        for server in (zk, etcd):
            if server is not None:
                server.stop()
        for f in Path(tmp).glob("*"):
            f.unlink()
        os.rmdir(tmp)

    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"ops/s; create/read/cas_update/generate_id over {args.ledgers} ledgers, "
          f"iterate over {args.iterate_ledgers}")
    print("| driver | create | read | cas_update | generate_id | iterate (ledgers/s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for driver, r in results.items():
        it = r.get("iterate_error") or f"{r['iterate']:,.0f} ({r['iterate_s']:.2f} s)"
        print(f"| {driver} | {r['create']:,.0f} | {r['read']:,.0f} | {r['cas_update']:,.0f} "
              f"| {r['generate_id']:,.0f} | {it} |")


if __name__ == "__main__":
    main()
