"""Where a produced message's CPU goes, thread by thread: one message per call.

    python benchmarks/produce_threads.py [--messages 1000000] [--sizes 100,1024] [--rounds 3]
                                         [--storage-layout 2] [--dir /tmp] [--served-seconds 4]

Rows, interleaved by round so a neighbour's load hits every row alike:

- ``embedded produce``: ``WriteHandle.produce`` of --messages messages into an embedded log
  (the queue bounded at 100,000, produce waiting for room), ``flush()`` inside the time;
- ``embedded append_async``: the same with a future per message, a window of 2,000 (the
  caller waits on the oldest future, as replication.py's rows);
- ``served produce``: a client's ``produce`` into one bookie process (1/1/1, LocalCluster on
  loopback, no proxies) for --served-seconds.

For each: messages/s and the CPU µs per message of each thread (utime + stime from
/proc/PID/task/TID/stat over the timed run): the caller's thread, the client's loop thread
(served), and the other threads of the process (the embedded log's produce flusher, its
journal and memtable-flush threads) largest first; for the served row also the bookie
process's threads (its event loop first). The sum is what replication.py's rows report as
one figure. Targets of the per-message path: at most 1.5 µs of CPU per produced message
and 2.5 per append_async, embedded and served client, whole process.
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import embedlog  # noqa: E402
from embedlog import Client  # noqa: E402
from embedlog.harness import LocalCluster  # noqa: E402

TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def task_ticks(pid: int) -> dict:
    """utime + stime ticks of every thread of process ``pid``, by thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:       # a thread that ended meanwhile
            continue
        out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def per_thread(before: dict, after: dict, n: int, names: dict) -> list:
    """[(name, µs per message)] of the threads that ran, named ones first, the rest largest
    first as 'other'."""
    used = {t: (after[t] - before.get(t, 0)) * TICK_US / n for t in after}
    rows = [(name, used.pop(t, 0.0)) for t, name in names.items()]
    rows += [("other", v) for v in sorted(used.values(), reverse=True) if v >= 0.005]
    return rows


def load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def embedded_produce(directory: str, size: int, n: int, layout: int) -> tuple:
    with embedlog.open(directory, storage_layout=layout) as log:
        w = log.create_ledger()
        w.configure_producer(queue_buffering_max_messages=100_000, block=True)
        data = os.urandom(size)
        for _ in range(100_000):            # the queue's buffer (its bound) faulted in once
            w.produce(data)
        w.flush()
        me = os.getpid()
        before, t0 = task_ticks(me), time.perf_counter()
        produce = w.produce
        for _ in range(n):
            produce(data)
        w.flush()
        rate = n / (time.perf_counter() - t0)
        return rate, per_thread(before, task_ticks(me), n, {threading.get_native_id(): "caller"})


def embedded_append_async(directory: str, size: int, n: int, layout: int) -> tuple:
    with embedlog.open(directory, storage_layout=layout) as log:
        w = log.create_ledger()
        data = os.urandom(size)
        for _ in range(20_000):
            w.append_async(data)
        w.flush()
        me = os.getpid()
        before, t0 = task_ticks(me), time.perf_counter()
        out: collections.deque = collections.deque()
        append = w.append_async
        for _ in range(n):
            if len(out) >= 2000:
                out.popleft().result()
            out.append(append(data))
        for f in out:
            f.result()
        rate = n / (time.perf_counter() - t0)
        return rate, per_thread(before, task_ticks(me), n, {threading.get_native_id(): "caller"})


def served_produce(client, bookie_pid: int, size: int, seconds: float) -> tuple:
    w = client.create_ledger(1, 1, 1)
    try:
        w.configure_producer(queue_buffering_max_messages=100_000, block=True)
        data = os.urandom(size)
        loop_tid = next(t.native_id for t in threading.enumerate() if t.name == "embedlog-client")
        me = os.getpid()
        before, bbefore, t0 = task_ticks(me), task_ticks(bookie_pid), time.perf_counter()
        produce, n = w.produce, 0
        while time.perf_counter() - t0 < seconds:
            for _ in range(1000):
                produce(data)
            n += 1000
        w.flush()
        rate = n / (time.perf_counter() - t0)
        client_rows = per_thread(before, task_ticks(me), n,
                                 {threading.get_native_id(): "caller", loop_tid: "loop"})
        bookie_rows = per_thread(bbefore, task_ticks(bookie_pid), n, {bookie_pid: "bookie loop"})
        return rate, client_rows + [("bookie " + k if k == "other" else k, v) for k, v in bookie_rows]
    finally:
        w.close()


def show(row: str, size: int, rate: float, threads: list) -> None:
    total = sum(v for _, v in threads)
    split = ", ".join(f"{name} {v:.2f}" for name, v in threads)
    print(f"| {row} | {size} B | {rate:,.0f} | {total:.2f} | {split} | {load()} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--storage-layout", type=int, default=2, choices=(1, 2))
    ap.add_argument("--served-seconds", type=float, default=4.0)
    ap.add_argument("--dir", default="/tmp")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    base = tempfile.mkdtemp(prefix="embedlog-produce-threads-", dir=args.dir)
    print(f"# produce_threads.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load {load()}, storage_layout {args.storage_layout}, under {args.dir}\n")
    print("| row | entry | msgs/s | CPU µs/msg | by thread (µs/msg) | load |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    try:
        with LocalCluster(bookies=1, base_dir=os.path.join(base, "cluster"), proxies=False,
                          autorecovery=False,
                          bookie_config={"storage_layout": args.storage_layout}) as lc, \
                Client(lc.metadata_uri, **lc.client_config) as client:
            for _ in range(args.rounds):
                for size in sizes:
                    for name, run in (("embedded produce", embedded_produce),
                                      ("embedded append_async", embedded_append_async)):
                        d = tempfile.mkdtemp(dir=base)
                        n = args.messages if run is embedded_produce else args.messages // 3
                        show(name, size, *run(d, size, n, args.storage_layout))
                        shutil.rmtree(d, ignore_errors=True)
                    show("served produce, 1/1/1", size,
                         *served_produce(client, lc.pid(0), size, args.served_seconds))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
