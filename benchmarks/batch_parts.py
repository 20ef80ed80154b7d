#!/usr/bin/env python
"""Where a durable batch's time goes: the caller's CPU and the disk, one after the other.

    python benchmarks/batch_parts.py [--size 100] [--batch 1000] [--seconds 4] [--rounds 3]

compare.py's batch cells sit at 0.5-0.7x the floor; this splits one embedlog batch
(append_many of --batch entries of --size bytes to one of 8 ledgers, in turn, on a fresh log
with the defaults) into what the caller's thread does, each part timed around the function
that does it (wrapped for this run only), in µs per batch (the means of the median round):

- add: WriteHandle._add, and within it the native add kernel (journal_kernels.add_payloads:
  V1 framing, CRC32C, the journal record, the memtable's copy);
- wait: the journal's wait for durability, and within it the group's O_DIRECT write and
  fdatasync (one native request, fileio.write_direct_synced); the rest of the wait is the
  salt walk (and its ledger runs), the group's Python, GIL hand-offs to the flusher, a file
  roll now and then;

and, in the same rounds, the floor's batch (benchmarks/floor.pyx as compare.py runs it: the
same entries framed by a bare C loop, one pwrite and one fdatasync, into written zeros; and
its "no zeros" variant, appending with O_DIRECT), and the add kernel alone on a journal
buffer and a memtable, back to back ("warm") and with each group written with O_DIRECT and
fdatasync'd between ("after I/O", as in a log: on this VM a core comes back from the sleep
in the I/O with cold caches). The ratio embedlog / floor is what the batch cells measure.
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import embedlog  # noqa: E402
from embedlog import fileio  # noqa: E402
from embedlog._native import journal_kernels  # noqa: E402
from embedlog._native.journal_buffer import JournalBuffer  # noqa: E402
from embedlog._native.memtable import MemTable  # noqa: E402
from embedlog.embedded import WriteHandle  # noqa: E402
import compare  # noqa: E402  (this directory)

NLEDGERS = 8
DIGEST_CRC32C = 3


def remove(d) -> None:
    """Delete a phase's files and sync, so that the next phase's fdatasyncs do not wait
    for the discards (this machine's / is mounted with ``discard``: a delete's blocks are
    trimmed in the next journal commit, which an fdatasync extending a file waits for)."""
    shutil.rmtree(d, ignore_errors=True)
    os.sync()


class Timed:
    """Wraps functions for a run, summing their seconds under a label."""

    def __init__(self):
        self.seconds = collections.Counter()
        self._undo = []

    def wrap(self, owner, name, label):
        f = getattr(owner, name)
        acc = self.seconds

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[label] += time.perf_counter() - t
        setattr(owner, name, timed)
        self._undo.append((owner, name, f))

    def undo(self):
        for owner, name, f in reversed(self._undo):
            setattr(owner, name, f)
        self._undo.clear()


def embedlog_parts(root, payloads, seconds) -> dict:
    """µs per batch of each part of an embedlog batch."""
    timed = Timed()
    timed.wrap(WriteHandle, "_add", "add")
    timed.wrap(WriteHandle, "_wait", "wait")
    timed.wrap(fileio, "write_direct_synced", "io")
    timed.wrap(journal_kernels, "add_payloads", "kernel")     # the bookie calls it by the module
    d = tempfile.mkdtemp(dir=root)
    try:
        with embedlog.open(d) as log:
            writers = [log.create_ledger(digest="crc32c") for _ in range(NLEDGERS)]
            writers[0].append_many(payloads)            # warm-up: files made, arenas grown
            timed.seconds.clear()
            k = 0
            t0 = time.perf_counter()
            end = t0 + seconds
            while time.perf_counter() < end:
                writers[k % NLEDGERS].append_many(payloads)
                k += 1
            total = time.perf_counter() - t0
            direct = log.bookie.journal.direct_writes
    finally:
        timed.undo()
        remove(d)
    s = timed.seconds
    out = {name: s[name] / k * 1e6 for name in ("add", "kernel", "wait", "io")}
    out["batch"] = total / k * 1e6
    out["direct"] = direct
    return out


def floor_batch(root, payloads, seconds, cls) -> float:
    """µs per batch of compare.py's floor store ``cls``."""
    d = tempfile.mkdtemp(dir=root)
    try:
        store = cls(d, NLEDGERS)
        firsts = [0] * NLEDGERS
        preps = []
        k = 0
        for k in range(64):                     # prepared outside the clock, as compare.py does
            ledger = k % NLEDGERS
            preps.append(store.prep_batch(ledger, firsts[ledger], payloads))
            firsts[ledger] += len(payloads)
        spent, done = 0.0, 0
        room = len(payloads) * (40 + max(map(len, payloads)))
        while spent < seconds:
            for p in preps:
                store.ensure(room)              # zeros ahead of each batch, off the clock
                t = time.perf_counter()
                store.commit_batch(p)
                spent += time.perf_counter() - t
                done += 1
        store.close()
        return spent / done * 1e6
    finally:
        remove(d)


def kernel_alone(root, payloads, seconds, with_io) -> float:
    """ns per entry of the add kernel alone (the median call, the arena's first fill left
    out); ``with_io``: each group written with O_DIRECT and fdatasync'd before the next is
    framed. A lower bound of the kernel in a log: one memtable, cleared and reused, where a
    log's two take turns and a flush runs beside them."""
    bufs = [JournalBuffer(), JournalBuffer()]
    for b in bufs:
        b.groups = True
    mt = MemTable(64 << 20)
    d = tempfile.mkdtemp(dir=root)
    fd = os.open(os.path.join(d, "j"), os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    eids = [0] * NLEDGERS
    times = []
    offset, tail = 0, b""
    try:
        end = time.perf_counter() + seconds
        k = 0
        while time.perf_counter() < end:
            buf = bufs[k % 2]
            ledger = k % NLEDGERS
            buf.set_lead(offset)            # where the group lands (its partial block first)
            t = time.perf_counter()
            n, _length = journal_kernels.add_payloads(buf, mt, 0, ledger + 1, eids[ledger], -1, 0,
                                                      DIGEST_CRC32C, None, payloads, 0, 1 << 20)
            times.append(time.perf_counter() - t)
            eids[ledger] += n
            if with_io:
                tail, _sync_s = buf.write_direct_synced(fd, offset, tail)
                offset += buf.nbytes
            buf.clear()
            if mt.used_bytes > (60 << 20):
                mt.clear()
            k += 1
    finally:
        os.close(fd)
        remove(d)
    times = times[len(times) // 5:]          # the arena's first fill is fresh memory
    return statistics.median(times) / len(payloads) * 1e9


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    args = ap.parse_args(argv)
    payloads = compare.payload_pool(args.size, args.batch)
    rounds = collections.defaultdict(list)
    runs = []
    for r in range(args.rounds):
        parts = embedlog_parts(args.dir, payloads, args.seconds)
        runs.append(parts)
        rounds["floor"].append(floor_batch(args.dir, payloads, args.seconds / 2, compare.FloorStore))
        rounds["nozeros"].append(floor_batch(args.dir, payloads, args.seconds / 2,
                                             compare.NoZerosFloorStore))
        rounds["warm"].append(kernel_alone(args.dir, payloads, args.seconds / 2, False))
        rounds["after_io"].append(kernel_alone(args.dir, payloads, args.seconds / 2, True))
        print(f"round {r + 1}: embedlog {parts['batch']:.0f} µs/batch, floor "
              f"{rounds['floor'][-1]:.0f}, no zeros {rounds['nozeros'][-1]:.0f}", flush=True)
    m = {name: statistics.median(v) for name, v in rounds.items()}
    # the embedlog parts of one round, the median one by batch time, so that they add up
    m.update(sorted(runs, key=lambda p: p["batch"])[len(runs) // 2])
    n = args.batch
    print(f"\n{args.batch} x {args.size} B, {args.rounds} rounds (load {os.getloadavg()[0]:.1f}; "
          f"journal O_DIRECT: {m['direct']}): embedlog's parts are the means per batch of "
          f"the median round; the floors and the kernel alone, medians over the rounds")
    print("| part | µs per batch | ns per entry |")
    print("| --- | ---: | ---: |")
    rows = [
        ("embedlog batch (append_many, durable)", m["batch"]),
        ("- add (the caller's framing)", m["add"]),
        ("  - of it the native add kernel", m["kernel"]),
        ("  - of it the call's Python", m["add"] - m["kernel"]),
        ("- wait (the group, durable)", m["wait"]),
        ("  - of it the O_DIRECT write and fdatasync", m["io"]),
        ("  - of it the rest: the salt walk and its runs, the group's Python, GIL hand-offs, "
         "rolls" + ("" if m["direct"] else " (no O_DIRECT here: the whole write and sync)"),
         m["wait"] - m["io"]),
        ("- the rest (the handle's call, delivery)", m["batch"] - m["add"] - m["wait"]),
        ("floor batch (written zeros)", m["floor"]),
        ("floor batch, no zeros (O_DIRECT appends)", m["nozeros"]),
    ]
    for label, us in rows:
        print(f"| {label} | {us:.0f} | {us * 1000 / n:.0f} |")
    print(f"| add kernel alone, back to back | | {m['warm']:.0f} |")
    print(f"| add kernel alone, a group's O_DIRECT write and fdatasync between | | {m['after_io']:.0f} |")
    print(f"\nembedlog / floor {m['floor'] / m['batch']:.2f}x, / floor without zeros "
          f"{m['nozeros'] / m['batch']:.2f}x; with no caller CPU at all (the I/O alone) "
          f"{m['floor'] / m['io']:.2f}x and {m['nozeros'] / m['io']:.2f}x")


if __name__ == "__main__":
    main()
