#!/usr/bin/env python
"""The lone add's floor under three client designs, beside the served and in-process adds.

    python benchmarks/lone_add_floor.py [--rounds 3] [--seconds 2] [--size 1024]

The target: a lone served add (one durable append at a time, 1/1/1, loopback) to wait at
most 2.5x the in-process add at p50. Each round measures, one after the other, p50 in µs:
- in-process: the embedded log's lone add (journal write + fdatasync, no socket);
- served: the same add through one bookie process (LocalCluster, the client as users run it);
- three bare round trips of the same bytes to an asyncio echo server in a second process
  (no journal, no protocol), under three client designs:
  - hand-off: embedlog's client today: the caller hands the bytes to the loop thread
    (call_soon_threadsafe), which writes them; the loop reads the answer and completes a
    concurrent Future (replication.py's round_trip_floor);
  - caller writes: the caller writes the frame to the socket itself (under a lock); the
    loop still reads the answer and completes the Future;
  - no loop: the caller writes and reads the answer itself, blocking.
A design's floor is the in-process add plus its round trip: no served add of that design
can beat it. Each is printed as a ratio to the in-process add, as the target is.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import os
import shutil
import socket
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import embedlog  # noqa: E402
from embedlog.harness import LocalCluster  # noqa: E402
from replication import client_of, echo_server, latency, round_trip_floor, timed  # noqa: E402  (this directory)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def caller_writes(size: int, seconds: float) -> float:
    """p50 of the round trip where the caller writes its bytes itself and the loop thread
    reads the 32-byte answers and completes the callers' Futures."""
    loop = asyncio.new_event_loop()
    waiting: collections.deque = collections.deque()
    lock = threading.Lock()
    got = bytearray()
    with echo_server(size) as port, _connect(port) as sock:    # the server ends with it

        def readable():
            got.extend(sock.recv(65536))
            while len(got) >= 32:
                del got[:32]
                waiting.popleft().set_result(None)
        loop.add_reader(sock.fileno(), readable)
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        data = os.urandom(size)

        def one():
            fut = concurrent.futures.Future()
            with lock:
                waiting.append(fut)
                sock.sendall(data)
            fut.result()
        try:
            return timed(one, seconds)[0]
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.remove_reader(sock.fileno())
            loop.close()


def no_loop(size: int, seconds: float) -> float:
    """p50 of the round trip where the caller writes and reads itself, blocking."""
    data = os.urandom(size)
    with echo_server(size) as port, _connect(port) as sock:    # the server ends with it

        def one():
            sock.sendall(data)
            n = 0
            while n < 32:
                n += len(sock.recv(32 - n))
        return timed(one, seconds)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per measure")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--dir", default="/tmp")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="embedlog-lone-floor-", dir=args.dir)
    print(f"# lone add of {args.size} B, p50 in µs; in brackets, over the in-process add\n")
    print("| round | in-process | served 1/1/1 | hand-off trip | floor | caller writes trip | floor "
          "| no loop trip | floor |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    try:
        for r in range(args.rounds):
            d = os.path.join(base, f"embedded-{r}")
            with embedlog.open(d) as log:
                inproc = latency(log.create_ledger(), args.size, args.seconds)[0]
            shutil.rmtree(d, ignore_errors=True)
            d = os.path.join(base, f"cluster-{r}")
            with LocalCluster(bookies=1, base_dir=d, proxies=False, autorecovery=False) as lc, \
                    client_of(lc) as c:
                served = latency(c.create_ledger(1, 1, 1), args.size, args.seconds)[0]
            shutil.rmtree(d, ignore_errors=True)
            trips = (round_trip_floor(args.size, args.seconds)[0],
                     caller_writes(args.size, args.seconds), no_loop(args.size, args.seconds))
            cells = [f"{inproc:.0f}", f"{served:.0f} ({served / inproc:.2f}x)"]
            for trip in trips:
                cells += [f"{trip:.0f}", f"{inproc + trip:.0f} ({(inproc + trip) / inproc:.2f}x)"]
            print(f"| {r} | " + " | ".join(cells) + " |", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
