#!/usr/bin/env python
"""What the disk alone lets a served row carry: the bookies' writes with no protocol, no
Python on the add path and no client, on the disk the row's bookies share.

    python benchmarks/disk_floor.py [--dir /tmp] [--seconds 5] [--group-kib 1024]

One process per bookie, all started together. Each does what its bookie's contract writes
for 1 KiB adds (a journal record is 1,069 bytes):
- its journal: ``--group-kib`` of records written, then fdatasync, over and over (group
  commit; the bookies' groups under benchmarks/replication.py's window are 1.07-1.11 MB
  in its 1/1/1 and 3/3/2 rows, from their embedlog_journal_group_bytes metric);
- its entry log, from a second thread: the same bytes, 64 MiB at a time once the journal
  has taken 64 MiB (a memtable flush), written 4 MiB per pwrite with writeback started
  after each (sync_file_range, as entrylogger.pyx does) and an fdatasync at the end (the
  checkpoint's).
A row with E bookies and write quorum Qw puts Qw / E of its adds on each journal, so it
carries (the slowest journal's records/s) x E / Qw adds/s. benchmarks/replication.py prints
its served rows against this floor, measured in the same run.
"""
from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from embedlog.config import BookieConfig  # noqa: E402
from embedlog.harness.servers import die_with_parent  # noqa: E402
from flush import STAGE as CHUNK  # noqa: E402  (the flush's write size, benchmarks/flush.py)

RECORD = 1069                 # a 1 KiB entry's journal record: a log's bytes_written / records
FLUSH = BookieConfig().skip_list_size_limit     # a memtable's bytes (skipListSizeLimit)
JOURNAL_SPAN = 1 << 30        # the journal file is rewritten in place past this
SYNC_FILE_RANGE_WRITE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sync_file_range.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong,
                                  ctypes.c_uint)


def _bookie(directory: str, index: int, group: int, seconds: float, go, results,
            parent: int) -> None:
    # a benchmark killed mid-floor must not leave its bookies writing, or waiting, for ever
    die_with_parent()
    if os.getppid() != parent:        # it died before the line above
        os._exit(1)
    try:
        results.put(_write(directory, index, group, seconds, go))
    except BaseException as exc:      # told to the parent, which waits for every bookie
        results.put(exc)


def _write(directory: str, index: int, group: int, seconds: float, go) -> tuple:
    """(records/s, fdatasync seconds) of one bookie; its two files are removed after."""
    jpath = os.path.join(directory, f"journal-{index}")
    epath = os.path.join(directory, f"entrylog-{index}")
    jfd = os.open(jpath, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        efd = os.open(epath, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            return _run(jfd, efd, group, seconds, go)
        finally:
            os.close(efd)
            os.unlink(epath)
    finally:
        os.close(jfd)
        os.unlink(jpath)


def _run(jfd: int, efd: int, group: int, seconds: float, go) -> tuple:
    os.posix_fallocate(jfd, 0, JOURNAL_SPAN)     # preallocated, as the journal's files are
    os.fsync(jfd)
    records = os.urandom(group)
    chunk = os.urandom(CHUNK)
    due = threading.Semaphore(0)                 # one release per FLUSH bytes journalled
    stop = threading.Event()
    failed = []

    def flusher():
        offset = 0
        try:
            while True:
                due.acquire()
                if stop.is_set():
                    return
                for _ in range(FLUSH // CHUNK):
                    os.pwrite(efd, chunk, offset)
                    if _libc.sync_file_range(efd, offset, CHUNK, SYNC_FILE_RANGE_WRITE):
                        raise OSError(ctypes.get_errno(), "sync_file_range")
                    offset += CHUNK
                os.fdatasync(efd)
        except OSError as exc:        # a floor without its entry log would flatter
            failed.append(exc)
    thread = threading.Thread(target=flusher)
    thread.start()
    go.wait()
    written = joff = unflushed = 0
    syncs = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        os.pwrite(jfd, records, joff)
        joff = (joff + group) % JOURNAL_SPAN
        t = time.perf_counter()
        os.fdatasync(jfd)
        syncs.append(time.perf_counter() - t)
        written += group
        unflushed += group
        if unflushed >= FLUSH:
            unflushed -= FLUSH
            due.release()
    elapsed = time.perf_counter() - start
    stop.set()
    due.release()
    thread.join()
    if failed:
        raise failed[0]
    return written / RECORD / elapsed, syncs


def measure(directory: str, bookies: int, seconds: float = 5.0, group: int = 1 << 20) -> dict:
    """The slowest journal's records/s with ``bookies`` writing at once, and the p50/p99 of
    their fdatasyncs (ms). Dirty pages left by earlier work are written out first, so the
    floor is the disk's, not what the work before it left to write back."""
    os.sync()
    ctx = mp.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_bookie,
                         args=(directory, i, group, seconds, go, results, os.getpid()))
             for i in range(bookies)]
    for p in procs:
        p.start()
    go.set()
    got = [results.get() for _ in procs]
    for p in procs:
        p.join()
    for r in got:
        if isinstance(r, BaseException):
            raise RuntimeError(f"a disk-floor bookie failed: {r}") from r
    syncs = sorted(s for _, ss in got for s in ss)
    return {"records_s": min(r for r, _ in got),
            "sync_p50_ms": syncs[len(syncs) // 2] * 1e3,
            "sync_p99_ms": syncs[min(len(syncs) - 1, int(len(syncs) * 0.99))] * 1e3}


def row_floor(measured: dict, ensemble: int, write_quorum: int) -> float:
    """adds/s of 1 KiB a row E/Qw carries when each of its journals takes ``measured``."""
    return measured["records_s"] * ensemble / write_quorum


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--group-kib", type=int, default=1024)
    args = ap.parse_args()
    print(f"# the disk's floor for served rows ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"under {args.dir}, groups of {args.group_kib} KiB, {args.seconds:g} s)\n")
    print("| bookies writing | slowest journal (records/s) | fdatasync p50 / p99 (ms) | rows it carries |")
    print("| ---: | ---: | ---: | --- |")
    for n, rows in ((1, ((1, 1),)), (3, ((3, 3), (3, 2)))):
        m = measure(args.dir, n, args.seconds, args.group_kib << 10)
        carried = ", ".join(f"{e}/{q}: {row_floor(m, e, q):,.0f} adds/s" for e, q in rows)
        print(f"| {n} | {m['records_s']:,.0f} | {m['sync_p50_ms']:.2f} / {m['sync_p99_ms']:.2f} "
              f"| {carried} |")


if __name__ == "__main__":
    main()
