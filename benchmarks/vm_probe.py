#!/usr/bin/env python
"""What this machine charges for memory and preallocation (the probes behind
docs/PERFORMANCE.md's "This VM punishes fresh memory"):

    python benchmarks/vm_probe.py [--touch-gib 16] [--write-gib 2]

- touch: first write to GiBs of never-used anonymous memory (a VM backs them on demand);
- write: 1 MiB pwrite + fdatasync loops over a new file, keeping the written pages in the
  page cache or dropping them after each sync (POSIX_FADV_DONTNEED), pwrite time alone too;
- sync: 300 pwrite + fdatasync of 12 KiB into space that is written zeros, fallocate'd, or
  past the end of the file (why the journal preallocates with written zeros).
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--touch-gib", type=int, default=16)
    ap.add_argument("--write-gib", type=int, default=2)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="vm-probe-", dir="/tmp")
    try:
        for mode in ("zeros", "fallocate", "extend", "zeros", "fallocate", "extend"):
            sync(root, mode)
        for drop in (False, True, False, True):
            write(root, args.write_gib, drop)
        touch(args.touch_gib)
        write(root, args.write_gib, False)
    finally:
        os.rmdir(root)


if __name__ == "__main__":
    main()
