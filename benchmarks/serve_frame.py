#!/usr/bin/env python
"""A lone add's own cost in the bookie server, without the network: the frame fed to a
connection of BookieServer as its socket would (FrameReader.feed_data), answered once
durable; beside the floor, the same add straight into the Bookie (add_entries, then the
journal's sync on the same thread, as the server's loop does when the journal is idle).

    python benchmarks/serve_frame.py [--adds 5000] [--rounds 3]

1 KiB entries, one at a time, each waited for before the next; with the journal's fdatasync
(journal_sync_data) and without it, which leaves the Python path and the journal's write.
CPU (process time) and wall time per add, the first fifth of each run left out. Rounds
alternate server and floor; the table shows the median round of each row.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from embedlog._native import format as F  # noqa: E402
from embedlog.bookie.bookie import Bookie  # noqa: E402
from embedlog.config import BookieConfig  # noqa: E402
from embedlog.net import protocol as P  # noqa: E402
from embedlog.net.framereader import FrameReader  # noqa: E402
from embedlog.net.server import READ_BUFFER_BYTES, BookieServer  # noqa: E402

KEY = F.master_key(b"serve-frame")
LEDGER = 5


class _Writer:
    """The connection's StreamWriter: counts answers, wakes the waiting add."""

    class _Transport:
        def get_write_buffer_size(self):
            return 0

    transport = _Transport()

    def __init__(self):
        self.answered = None

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def write(self, data):
        if not self.answered.done():
            self.answered.set_result(bytes(data[16:20]))   # the status (RESP_HEAD)

    def writelines(self, parts):
        self.write(b"".join(parts))

    def is_closing(self):
        return False

    def close(self):
        pass

    async def drain(self):
        pass


def _entries(adds: int) -> list:
    payload = os.urandom(1024)
    return [F.encode_entry(0, LEDGER, i, i - 1, 1024 * (i + 1), "crc32c", payload)
            for i in range(adds)]


def _timed(run, adds: int) -> tuple:
    """(CPU µs, wall µs) per add of run(i), past the first fifth."""
    skip, cpu, wall = adds // 5, 0.0, 0.0
    for i in range(adds):
        c0, t0 = time.process_time(), time.perf_counter()
        run(i)
        if i >= skip:
            cpu += time.process_time() - c0
            wall += time.perf_counter() - t0
    n = adds - skip
    return cpu / n * 1e6, wall / n * 1e6


def served(directory: str, entries: list, sync: bool) -> tuple:
    bookie = Bookie(directory, BookieConfig(journal_sync_data=sync))
    loop = asyncio.new_event_loop()
    server = BookieServer(bookie, loop=loop)
    server._room_freed = asyncio.Event()
    frames = [P.add_request(i + 1, 0, LEDGER, KEY, [e]) for i, e in enumerate(entries)]
    reader, writer = FrameReader(limit=READ_BUFFER_BYTES, loop=loop), _Writer()

    async def main():
        task = loop.create_task(server._serve(reader, writer))
        await asyncio.sleep(0)
        for i, frame in enumerate(frames):
            writer.answered = loop.create_future()
            c0, t0 = time.process_time(), time.perf_counter()
            reader.feed_data(frame)
            status = await writer.answered
            if status != bytes(4):
                raise SystemExit(f"add {i} answered with status {status.hex()}")
            if i >= len(frames) // 5:
                times[0] += time.process_time() - c0
                times[1] += time.perf_counter() - t0
        reader.feed_eof()
        await task

    times = [0.0, 0.0]
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        bookie.close()
    n = len(frames) - len(frames) // 5
    return times[0] / n * 1e6, times[1] / n * 1e6


def floor(directory: str, entries: list, sync: bool) -> tuple:
    bookie = Bookie(directory, BookieConfig(journal_sync_data=sync))
    try:
        def add(i):
            seq = bookie.add_entries([entries[i]], KEY, ledger=(0, LEDGER))
            if not bookie.sync_if_idle(seq):
                bookie.wait_durable(seq)
        return _timed(add, len(entries))
    finally:
        bookie.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adds", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    entries = _entries(args.adds)
    rows = {}
    base = tempfile.mkdtemp(prefix="serve-frame-")
    try:
        for r in range(args.rounds):
            for sync in (True, False):
                for name, run in (("served", served), ("floor", floor)):
                    d = os.path.join(base, f"{name}-{sync}-{r}")
                    rows.setdefault((sync, name), []).append(run(d, entries, sync))
                    shutil.rmtree(d)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"# a lone add in the bookie server, without the network ({time.strftime('%Y-%m-%d')}, "
          f"nproc={os.cpu_count()}, load {load:.2f}, median of {args.rounds} rounds)\n")
    print("| fdatasync | served CPU / wall µs | floor CPU / wall µs | served - floor, CPU / wall µs "
          "| served / floor, wall |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for sync in (True, False):
        s = [statistics.median(x) for x in zip(*rows[(sync, "served")])]
        f = [statistics.median(x) for x in zip(*rows[(sync, "floor")])]
        print(f"| {'yes' if sync else 'no'} | {s[0]:.1f} / {s[1]:.1f} | {f[0]:.1f} / {f[1]:.1f} "
              f"| {s[0] - f[0]:.1f} / {s[1] - f[1]:.1f} | {s[1] / f[1]:.2f}x |")


if __name__ == "__main__":
    main()
