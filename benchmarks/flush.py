#!/usr/bin/env python
"""A memtable flush's own cost (EntryLogger.flush_memtable), per entry, beside its floor: the
same framed bytes, already contiguous, written with one pwrite per 4 MiB into a fresh file.

    python benchmarks/flush.py [--rounds 10] [--memtable-mib 48]

A memtable of --memtable-mib MiB of encoded entries (CRC32C digests), flushed into a fresh
entry log with the bookie's default page-cache budget (entry_log_page_cache_bytes, 64 MiB);
1 KiB and 100 B entries, all of one ledger in id order (what one writer's adds leave) and of
64 ledgers taken turn about (what many writers' lone adds leave). CPU (process time, user +
system) per entry; rounds alternate flush and floor, the first two of each left out; the
table shows the median. The flush does more than the floor: it sorts, frames each entry into
its 4 MiB staging buffer, checksums the blocks and hands the locations over.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from embedlog._native import entrylogger as EL  # noqa: E402
from embedlog._native import format as F  # noqa: E402
from embedlog._native import journal_buffer as JB  # noqa: E402
from embedlog._native import journal_kernels as JK  # noqa: E402
from embedlog._native import memtable as MT  # noqa: E402
from embedlog.config import BookieConfig  # noqa: E402

CRC = F.digest_code("crc32c")
STAGE = 4 << 20


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def entries_of(size: int, ledgers: int, total_bytes: int) -> list:
    n = total_bytes // (size + 60)
    return [F.encode_entry(0, 1 + i % ledgers, i // ledgers, -1, 0, CRC, os.urandom(size))
            for i in range(n)]


def flush_once(entries: list, limit: int) -> float:
    mt = MT.MemTable(limit)
    assert JK.add_encoded_entries(JB.JournalBuffer(), mt, entries, 0) == len(entries)
    d = tempfile.mkdtemp(prefix="flush-bench-")
    try:
        el = EL.EntryLogger(d, 1 << 30)
        el.page_cache_bytes = BookieConfig().entry_log_page_cache_bytes
        t = cpu()
        el.flush_memtable(mt, lambda *a: None)
        t = cpu() - t
        el.close()
        return t
    finally:
        shutil.rmtree(d)


def floor_once(framed: bytes) -> float:
    d = tempfile.mkdtemp(prefix="flush-floor-")
    try:
        fd = os.open(os.path.join(d, "log"), os.O_WRONLY | os.O_CREAT, 0o644)
        view = memoryview(framed)
        t = cpu()
        for at in range(0, len(view), STAGE):
            os.pwrite(fd, view[at:at + STAGE], 1024 + at)
        t = cpu() - t
        os.close(fd)
        return t
    finally:
        shutil.rmtree(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--memtable-mib", type=int, default=48)
    args = ap.parse_args()
    total = args.memtable_mib << 20
    print("| entry | ledgers | entries | flush ns/entry | floor ns/entry | flush / floor |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in (1024, 100):
        for ledgers in (1, 64):
            entries = entries_of(size, ledgers, total)
            framed = b"".join(len(e).to_bytes(4, "big") + e for e in entries)
            flush, floor = [], []
            for r in range(args.rounds + 2):
                f, g = flush_once(entries, total + (16 << 20)), floor_once(framed)
                if r >= 2:
                    flush.append(f)
                    floor.append(g)
            a = statistics.median(flush) * 1e9 / len(entries)
            b = statistics.median(floor) * 1e9 / len(entries)
            print(f"| {size} B | {ledgers} | {len(entries):,} | {a:.0f} | {b:.0f} | {a / b:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
