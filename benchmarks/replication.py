#!/usr/bin/env python
"""Replicated adds through bookie processes, beside the same work in-process.

    python benchmarks/replication.py [--seconds 5] [--recovery-entries 1000000]
                                     [--striped-entries 1000000]

For E=Qw=Qa=1 on one bookie and E=3,Qw=3,Qa=2 on three (LocalCluster on loopback,
no fault proxies), with 100 B and 1 KiB entries:
- throughput: append_async with a window of outstanding adds (BookKeeper's benchmark
  keeps a throttle of outstanding adds the same way), and beside it (rows ", produce")
  one produce() per message into a queue of --produce-window messages, waiting at the bound,
  flush() at the end (a Kafka producer's loop);
- latency: p50/p95/p99 of single durable appends issued one after another, on the fresh
  ledger before the throughput run (a lone add on a quiet bookie), and p50 again right after
  it, while the bookies still flush what the window wrote (lone adds were measured only
  there before 2026-11-27: that figure also carries the bookie's background flush, and a
  faster window leaves more of it);
beside the embedded log (in-process transport: no socket, no second process) doing
the same appends, so the network's and the protocol's share is visible, and beside the
lone add's floor: the in-process add plus a bare loopback round trip of the same bytes
through the same threads and asyncio, with no journal and no protocol (round_trip_floor).
Then striped ensembles (E > Qw: each bookie gets every E-th run of ids, with gaps), 3/2/2
on three bookies and 5/3/2 on five, 1 KiB entries: throughput over --striped-entries adds
(1,000,000 by default: a ledger longer than any one memtable) rather than over
--seconds, and every bookie process must still be running after it. Then the
time to recover (fence, read forward, close) a ledger of --recovery-entries entries
whose writer was abandoned. Last, for each ensemble size, the disk's floor (disk_floor.py,
same directory): the adds/s the bookies' journal and entry-log writes alone carry on the
disk they share, beside each 1 KiB served row. Every cluster's bookies first take
2 x skip_list_size_limit bytes of 1 KiB adds each (warm()), so every served row meets
bookies whose memtables are already in use, as a running bookie's are.

CPU per add over the throughput run: the client's (this process, every thread; in brackets
the part its cyclic garbage collector took, timed by gc.callbacks) and the bookies' (utime +
stime of every bookie process from /proc/PID/stat, summed over the ensemble: with Qw copies,
per copy is that over Qw), in µs per add.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import disk_floor  # noqa: E402  (benchmarks/, this script's directory)
import embedlog  # noqa: E402
from embedlog import Client  # noqa: E402
from embedlog.config import BookieConfig  # noqa: E402
from embedlog.harness import LocalCluster  # noqa: E402


def client_of(lc) -> Client:
    """A plain Client of the cluster: LocalCluster.client() routes every call through the
    harness's fault hook (5-8% of a client's samples), which no user's client pays."""
    return Client(lc.metadata_uri, **lc.client_config)


def warm(client, bookies: int, window: int) -> None:
    """Fill every bookie's two memtables once, before its cluster's first row: the first
    2 x skip_list_size_limit bytes a bookie takes fault its memtables' arenas in (about
    33,000 minor faults per bookie at 64 MiB each), and from then on the arenas are reused.
    Without it the 1/1/1 and 3/3/2 1 KiB rows, run after their 100 B rows, met warm bookies
    and the striped rows fresh ones (1.3-2.1 µs more bookie CPU per 3/2/2 add over 300,000
    adds, 2026-11-27)."""
    w = client.create_ledger(bookies, bookies, bookies)
    throughput(w, 1024, 0.0, window, count=2 * BookieConfig().skip_list_size_limit // 1024 + window)
    w.close()


def cpu_seconds(pids) -> float:
    """utime + stime of the processes ``pids`` (their threads included)."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])   # fields 14 and 15 of stat(5)
    return ticks / os.sysconf("SC_CLK_TCK")


def measured(pids, run):
    """``run()``'s adds/s, with the client's CPU µs per add (and its collector's part of
    it) and the bookies' CPU µs per add."""
    in_gc = started = 0.0

    def clock(phase, _info):
        nonlocal in_gc, started
        if phase == "start":
            started = time.perf_counter()
        else:
            in_gc += time.perf_counter() - started

    gc.callbacks.append(clock)
    try:
        c0, b0 = time.process_time(), cpu_seconds(pids)
        rate, sent = run()
        c1, b1 = time.process_time(), cpu_seconds(pids)
    finally:
        gc.callbacks.remove(clock)
    return (rate, ((c1 - c0) * 1e6 / sent, in_gc * 1e6 / sent),
            ((b1 - b0) * 1e6 / sent) if pids else 0.0)


def throughput(handle, size: int, seconds: float, window: int, count: int | None = None):
    """``(adds/s, adds)`` for ``seconds``, or, with ``count``, over exactly ``count`` adds.

    At most ``window`` adds are outstanding: adds complete in order, so the caller waits on
    the oldest future when the window is full (a user's bounded producer). A semaphore with a
    done-callback per add, as before, cost the calling process 1.5-2 us per add of
    threading.Condition work that was counted as the client's CPU."""
    data = os.urandom(size)
    outstanding: collections.deque = collections.deque()
    t0 = time.perf_counter()
    sent = 0
    while (sent < count) if count is not None else (time.perf_counter() - t0 < seconds):
        for _ in range(100 if count is None else min(100, count - sent)):
            if len(outstanding) >= window:
                outstanding.popleft().result()
            outstanding.append(handle.append_async(data))
            sent += 1
    for f in outstanding:
        f.result()
    return sent / (time.perf_counter() - t0), sent


def produce_throughput(handle, size: int, seconds: float, window: int, count: int | None = None):
    """``(messages/s, messages)``: one ``produce`` per message (confluent-kafka's shape), no
    future, no callback, the queue bounded at ``window`` messages and produce waiting for
    room at the bound (block=True); flush() at the end, inside the time."""
    data = os.urandom(size)
    handle.configure_producer(queue_buffering_max_messages=max(window, 1000), block=True)
    produce = handle.produce
    t0 = time.perf_counter()
    sent = 0
    while (sent < count) if count is not None else (time.perf_counter() - t0 < seconds):
        for _ in range(1000 if count is None else min(1000, count - sent)):
            produce(data)
        sent += 1000 if count is None else min(1000, count - sent)
    assert handle.flush() == 0
    return sent / (time.perf_counter() - t0), sent


def timed(one, seconds: float, *args) -> tuple:
    """p50/p95/p99 (µs) of ``one(*args)`` called one after another for ``seconds``."""
    lat = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s = time.perf_counter()
        one(*args)
        lat.append(time.perf_counter() - s)
    a = np.array(lat) * 1e6
    return np.percentile(a, 50), np.percentile(a, 95), np.percentile(a, 99)


def latency(handle, size: int, seconds: float) -> tuple:
    return timed(handle.append, seconds, os.urandom(size))


# the floor's server: a second process, an asyncio stream server on loopback TCP that
# answers each message of ``size`` bytes with 32 bytes (no journal, no protocol); it ends
# with its one connection
_ECHO = """
import asyncio, sys
size = int(sys.argv[1])
async def main():
    done = asyncio.Event()
    async def serve(reader, writer):
        try:
            while True:
                await reader.readexactly(size)
                writer.write(bytes(32))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            done.set()
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await done.wait()
asyncio.run(main())
"""


@contextlib.contextmanager
def echo_server(size: int):
    """The floor's server (_ECHO) started; yields its port. On the way out it waits for the
    server to end with its connection (close that first), and kills it after 10 s."""
    server = subprocess.Popen([sys.executable, "-c", _ECHO, str(size)], stdout=subprocess.PIPE,
                              text=True)
    try:
        yield int(server.stdout.readline())
    finally:
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:     # it never saw the connection end
            server.kill()
            server.wait()


def round_trip_floor(size: int, seconds: float) -> tuple:
    """p50/p95/p99 (µs) of the lone add's architecture without its work: a caller thread
    hands ``size`` bytes to an asyncio loop thread (call_soon_threadsafe), which writes them
    to the other process over loopback TCP and completes a concurrent Future with the
    answer. A served lone add is this round trip plus the journal's write and sync (the
    in-process add) plus the protocol's own work on both sides."""
    loop = asyncio.new_event_loop()
    waiting: collections.deque = collections.deque()

    class Answers(asyncio.Protocol):
        def data_received(self, data):
            for _ in range(len(data) // 32):
                waiting.popleft().set_result(None)
    try:
        with echo_server(size) as port:
            transport, _ = loop.run_until_complete(loop.create_connection(Answers, "127.0.0.1", port))
            thread = threading.Thread(target=loop.run_forever, daemon=True)
            thread.start()
            data = os.urandom(size)

            def send(fut):
                waiting.append(fut)
                transport.write(data)

            def one():
                fut = concurrent.futures.Future()
                loop.call_soon_threadsafe(send, fut)
                fut.result()
            lat = timed(one, seconds)
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            # the transport's socket closes a step after close(): without that step the server
            # never saw its connection end, and echo_server waited 10 s for it
            transport.close()
            loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    return lat


def tail(directory: str, n: int = 15) -> str:
    with open(os.path.join(directory, "bookie.log"), errors="replace") as f:
        return "".join(f.readlines()[-n:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--produce-window", type=int, default=100_000,
                    help="queue_buffering_max_messages of the produce rows (librdkafka's default)")
    ap.add_argument("--recovery-entries", type=int, default=1_000_000)
    ap.add_argument("--striped-entries", type=int, default=1_000_000,
                    help="adds of 1 KiB per striped row (3/2/2, 5/3/2); 0 leaves those rows out")
    ap.add_argument("--dir", default="/tmp",
                    help="where the logs' and bookies' directories go (a tmpfs such as /dev/shm "
                         "takes the disk out of the rows: fdatasync returns at once)")
    args = ap.parse_args()
    rows = []
    base = tempfile.mkdtemp(prefix="embedlog-repl-bench-", dir=args.dir)
    try:
        for size in (100, 1024):
            with embedlog.open(os.path.join(base, f"embedded-{size}")) as log:
                w = log.create_ledger()
                lat = latency(w, size, args.seconds / 2)
                tput, ccpu, _ = measured((), lambda: throughput(w, size, args.seconds, args.window))
                after = latency(w, size, args.seconds / 2)[0]
            rows.append(("embedded (in-process)", "1/1/1", size, tput, ccpu, None, *lat, after))
            with embedlog.open(os.path.join(base, f"embedded-{size}-p")) as log:
                w = log.create_ledger()
                tput, ccpu, _ = measured((), lambda: produce_throughput(w, size, args.seconds,
                                                                        args.produce_window))
            rows.append(("embedded (in-process), produce", "1/1/1", size, tput, ccpu, None,
                         *(float("nan"),) * 4))
            shutil.rmtree(os.path.join(base, f"embedded-{size}-p"), ignore_errors=True)
            # each setup's files go once its rows are done: under a tmpfs they are memory
            shutil.rmtree(os.path.join(base, f"embedded-{size}"), ignore_errors=True)
        floor = {size: round_trip_floor(size, args.seconds / 2) for size in (100, 1024)}
        for nb, quorum in ((1, (1, 1, 1)), (3, (3, 3, 2))):
            with LocalCluster(bookies=nb, base_dir=os.path.join(base, f"c{nb}"), proxies=False,
                              autorecovery=False) as lc, client_of(lc) as c:
                pids = [lc.pid(i) for i in range(nb)]
                warm(c, nb, args.window)
                for size in (100, 1024):
                    w = c.create_ledger(*quorum)
                    lat = latency(w, size, args.seconds / 2)
                    tput, ccpu, bcpu = measured(pids, lambda: throughput(w, size, args.seconds,
                                                                         args.window))
                    after = latency(w, size, args.seconds / 2)[0]
                    rows.append((f"{nb} bookie process{'es' if nb > 1 else ''} (TCP loopback)",
                                 "/".join(map(str, quorum)), size, tput, ccpu, bcpu, *lat, after))
                    w.close()
                    w = c.create_ledger(*quorum)
                    tput, ccpu, bcpu = measured(pids, lambda: produce_throughput(
                        w, size, args.seconds, args.produce_window))
                    rows.append((f"{nb} bookie process{'es' if nb > 1 else ''} (TCP loopback), produce",
                                 "/".join(map(str, quorum)), size, tput, ccpu, bcpu,
                                 *(float("nan"),) * 4))
                    w.close()
                if nb == 3 and args.recovery_entries:
                    w = c.create_ledger(3, 3, 2)
                    chunk = [os.urandom(100)] * 1000
                    for _ in range(args.recovery_entries // 1000):
                        w.append_many(chunk)
                    with client_of(lc) as c2:
                        t0 = time.perf_counter()
                        r = c2.open_ledger(w.ledger_id)       # fence + recover + close
                        rec_s = time.perf_counter() - t0
                    recovery = (args.recovery_entries, r.last_add_confirmed, rec_s)
            shutil.rmtree(os.path.join(base, f"c{nb}"), ignore_errors=True)
        for nb, quorum in ((3, (3, 2, 2)), (5, (5, 3, 2))) if args.striped_entries else ():
            with LocalCluster(bookies=nb, base_dir=os.path.join(base, f"s{nb}"), proxies=False,
                              autorecovery=False) as lc, client_of(lc) as c:
                pids = [lc.pid(i) for i in range(nb)]
                warm(c, nb, args.window)
                w = c.create_ledger(*quorum)
                try:
                    lat = latency(w, 1024, args.seconds / 2)
                    tput, ccpu, bcpu = measured(pids, lambda: throughput(
                        w, 1024, args.seconds, args.window, count=args.striped_entries))
                    after = latency(w, 1024, args.seconds / 2)[0]
                    w.close()
                finally:
                    dead = [i for i in range(nb) if not lc.is_running(i)]
                    if dead:     # a bookie that died is the result, whatever the client raised
                        sys.exit(f"{'/'.join(map(str, quorum))}: bookie(s) {dead} died; the end of "
                                 f"bookie {dead[0]}'s log:\n{tail(lc.bookie_dir(dead[0]))}")
                rows.append((f"{nb} bookie processes, {args.striped_entries:,} entries (TCP loopback)",
                             "/".join(map(str, quorum)), 1024, tput, ccpu, bcpu, *lat, after))
            shutil.rmtree(os.path.join(base, f"s{nb}"), ignore_errors=True)
        # the disk alone, for each ensemble size above: the same directory, after the rows
        disk = {nb: disk_floor.measure(base, nb, args.seconds)
                for nb in sorted({int(r[1].split("/")[0]) for r in rows if r[5] is not None})}
        print(f"# embedlog replication benchmark ({time.strftime('%Y-%m-%d')}, nproc={os.cpu_count()}, "
              f"load {os.getloadavg()[0]:.2f}, under {args.dir})\n")
        print("| setup | E/Qw/Qa | entry | adds/s (window %d) | MB/s | CPU µs/add client (GC) / bookies "
              "| lone add p50 / p95 / p99 (µs) | lone add p50 after the window (µs) |" % args.window)
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, q, size, tput, ccpu, bcpu, p50, p95, p99, after in rows:
            bookies = "-" if bcpu is None else f"{bcpu:.1f}"
            lone = "-" if p50 != p50 else f"{p50:,.0f} / {p95:,.0f} / {p99:,.0f}"   # nan: none
            print(f"| {name} | {q} | {size} B | {tput:,.0f} | {tput * size / 1e6:,.1f} | "
                  f"{ccpu[0]:.2f} ({ccpu[1]:.2f}) / {bookies} | {lone} | "
                  f"{'-' if after != after else f'{after:,.0f}'} |")
        print("\nThe lone add against its floor (p50, µs): in-process add + a bare loopback round "
              "trip (`round_trip_floor`: threads and asyncio as the client's, no journal, no protocol).\n")
        print("| entry | in-process | round trip | floor | served 1/1/1 | served / in-process "
              "| floor / in-process | served / floor |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for size in (100, 1024):
            local = next(r[6] for r in rows if r[0] == "embedded (in-process)" and r[2] == size)
            served = next(r[6] for r in rows if r[0] == "1 bookie process (TCP loopback)" and r[2] == size)
            trip = floor[size][0]
            print(f"| {size} B | {local:,.0f} | {trip:,.0f} | {local + trip:,.0f} | {served:,.0f} | "
                  f"{served / local:.2f}x | {(local + trip) / local:.2f}x | {served / (local + trip):.2f}x |")
        print("\nThe 1 KiB rows against the disk's floor (`disk_floor.py`, run after them: each bookie's "
              "journal group-committed in 1 MiB groups and its entry log flushed behind it, no "
              "protocol, no client). Floor / the 1/1/1 row is the most a row's ratio to the 1/1/1 row "
              "can be on this disk, at no CPU cost.\n")
        print("| E/Qw/Qa | adds/s | bookies writing at once | their slowest journal (records/s, "
              "fdatasync p50 ms) | floor (adds/s) | row / floor | floor / the 1/1/1 row |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        single = next(r[3] for r in rows if r[1] == "1/1/1" and r[2] == 1024 and r[5] is not None
                      and not r[0].endswith("produce"))
        for name, q, size, tput, _, bcpu, *_ in rows:
            if size != 1024 or bcpu is None or name.endswith("produce"):   # served append_async rows
                continue
            e, qw = map(int, q.split("/")[:2])
            m = disk[e]
            floor_rate = disk_floor.row_floor(m, e, qw)
            print(f"| {q} | {tput:,.0f} | {e} | {m['records_s']:,.0f} ({m['sync_p50_ms']:.2f}) | "
                  f"{floor_rate:,.0f} | {tput / floor_rate:.2f} | {floor_rate / single:.2f} |")
        if args.recovery_entries:
            n, last, s = recovery
            print(f"\nrecovery of a ledger of {n:,} entries (E=3, Qw=3, Qa=2, writer abandoned): "
                  f"{s:.2f} s, closed at entry {last:,}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
