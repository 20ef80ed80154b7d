#!/usr/bin/env python
"""What this machine charges for memory and preallocation (the probes behind
docs/PERFORMANCE_HISTORY.md's "This VM punishes fresh memory"):

    python benchmarks/vm_probe.py [--touch-gib 16] [--write-gib 2]

- touch: first write to GiBs of never-used anonymous memory (a VM backs them on demand);
- write: 1 MiB pwrite + fdatasync loops over a new file, keeping the written pages in the
  page cache or dropping them after each sync (POSIX_FADV_DONTNEED), pwrite time alone too;
- sync: 300 pwrite + fdatasync of 12 KiB into space that is written zeros, fallocate'd, or
  past the end of the file (why the journal preallocates with written zeros);
- direct: journal-like groups (145 KB: 1000 x 100 B entries; 4 KiB: one entry) written at
  the tail and fdatasync'd, buffered or with O_DIRECT (whole 4 KiB blocks, the partial
  block written again, as journal_direct_writes does), into written zeros, fallocate'd
  space or past the end (why the journal writes with O_DIRECT into written zeros).

    python benchmarks/vm_probe.py --only direct
"""
import argparse
import os
import statistics
import tempfile
import time


def touch(gib):
    import numpy as np
    t = time.perf_counter()
    a = np.ones(gib << 30, dtype=np.uint8)
    dt = time.perf_counter() - t
    del a
    print(f"touch: {gib} GiB of fresh memory in {dt:.1f} s ({gib * 2**30 / dt / 1e9:.2f} GB/s)")


def write(root, gib, drop):
    path = os.path.join(root, "write.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    buf = os.urandom(1 << 20)
    t = time.perf_counter()
    off, tw = 0, 0.0
    while off < gib << 30:
        t1 = time.perf_counter()
        os.pwrite(fd, buf, off)
        tw += time.perf_counter() - t1
        os.fdatasync(fd)
        if drop:
            os.posix_fadvise(fd, off, len(buf), os.POSIX_FADV_DONTNEED)
        off += len(buf)
    dt = time.perf_counter() - t
    os.close(fd)
    os.unlink(path)
    print(f"write ({'drop' if drop else 'keep'} pages): {off / dt / 1e9:.2f} GB/s in all, "
          f"pwrite alone {off / tw / 1e9:.2f} GB/s")


def sync(root, mode, n=300, size=4096 * 3 + 100):
    path = os.path.join(root, f"sync-{mode}.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    total = n * size + (1 << 20)
    if mode == "zeros":
        os.pwrite(fd, bytes(total), 0)
        os.fsync(fd)
    elif mode == "fallocate":
        os.posix_fallocate(fd, 0, total)
        os.fsync(fd)
    buf = os.urandom(size)
    lat = []
    for i in range(n):
        t = time.perf_counter()
        os.pwrite(fd, buf, i * size)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
    os.close(fd)
    os.unlink(path)
    print(f"sync into {mode}: median {statistics.median(lat) * 1e6:.0f} us, "
          f"mean {statistics.mean(lat) * 1e6:.0f} us")


def direct(root, group, io, space, n=1000):
    import mmap
    path = os.path.join(root, "direct.bin")
    total = (group + 8192) * n
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    if space == "zeros":
        for off in range(0, total, 1 << 20):
            os.pwrite(fd, bytes(1 << 20), off)
    elif space == "fallocate":
        os.posix_fallocate(fd, 0, total)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    fd = os.open(path, os.O_RDWR | (os.O_DIRECT if io == "direct" else 0))
    buf = mmap.mmap(-1, group + 8192)          # page-aligned, as O_DIRECT needs
    buf[:group] = os.urandom(group)
    view = memoryview(buf)
    off, t_write, t_sync = 0, 0.0, 0.0
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        if io == "direct":
            lag = off % 4096
            os.pwrite(fd, view[:(lag + group + 4095) & ~4095], off - lag)
        else:
            os.pwrite(fd, view[:group], off)
        t_write += time.perf_counter() - t
        t = time.perf_counter()
        os.fdatasync(fd)
        t_sync += time.perf_counter() - t
        off += group
    dt = time.perf_counter() - t0
    view.release()
    buf.close()
    os.close(fd)
    os.unlink(path)
    print(f"direct: {group} B groups, {io} into {space}: {dt / n * 1e6:.0f} us per group "
          f"(pwrite {t_write / n * 1e6:.0f}, fdatasync {t_sync / n * 1e6:.0f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--touch-gib", type=int, default=16)
    ap.add_argument("--write-gib", type=int, default=2)
    ap.add_argument("--only", choices=("sync", "write", "touch", "direct"))
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="vm-probe-", dir="/tmp")
    run = lambda name: args.only in (None, name)     # noqa: E731
    try:
        if run("direct"):
            for group in (145_000, 4096):
                for _round in range(2):
                    for io, space in (("buffered", "zeros"), ("direct", "zeros"),
                                      ("direct", "fallocate"), ("direct", "extend")):
                        direct(root, group, io, space)
        if run("sync"):
            for mode in ("zeros", "fallocate", "extend", "zeros", "fallocate", "extend"):
                sync(root, mode)
        if run("write"):
            for drop in (False, True, False, True):
                write(root, args.write_gib, drop)
        if run("touch"):
            touch(args.touch_gib)
            write(root, args.write_gib, False)
    finally:
        os.rmdir(root)


if __name__ == "__main__":
    main()
