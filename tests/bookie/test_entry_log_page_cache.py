"""entry_log_page_cache_bytes: a memtable flush starts the writeback of what it wrote and
drops pages written more than that many bytes ago from the page cache, once written back.
The page cache then holds about that much of the entry logs (mincore says so), every entry
still reads back, before and after a reopen, and with 0 every page stays to the kernel."""
import ctypes
import glob
import os

import embedlog

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident_bytes(path: str, size: int | None = None) -> int:
    """Bytes of ``path`` (of its first ``size``) in the page cache (mincore over a read-only
    map of it)."""
    size = os.path.getsize(path) if size is None else size
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, 1, 1, fd, 0)          # PROT_READ, MAP_SHARED
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def _write(path, cache_bytes):
    cfg = dict(skip_list_size_limit=1 * MiB, entry_log_page_cache_bytes=cache_bytes,
               entry_log_size_limit=8 * MiB,           # the budget spans sealed logs too
               storage_layout=1)                       # entry logs: layout 1's storage
    payloads = [os.urandom(1000) + i.to_bytes(24, "big") for i in range(24_000)]
    with embedlog.open(path, **cfg) as log:
        w = log.create_ledger()
        for i in range(0, len(payloads), 500):
            w.append_many(payloads[i:i + 500])
        log.bookie.checkpoint()                         # every memtable flushed and synced
        # the log being written counts up to its end: creating it read its first 8 MiB
        # (ALLOC_CHUNK, allocated) into the cache as zeros, which its writes then fill
        current = log.bookie.storage.entry_logger.current
        resident = sum(resident_bytes(p, current.position if p == current.path else None)
                       for p in glob.glob(os.path.join(path, "**", "*.log"), recursive=True))
        stats = log.statistics()
        r = log.open_ledger(w.ledger_id)
        assert [bytes(e) for e in r.read_batch(0, len(payloads) - 1)] == payloads
    with embedlog.open(path, **cfg) as log:           # and from the files alone
        r = log.open_ledger(w.ledger_id)
        assert [bytes(r.read_entry(e)) for e in range(0, len(payloads), 997)] == payloads[::997]
    return resident, stats


def test_the_page_cache_keeps_about_the_budget_of_entry_log_pages(tmp_path):
    resident, stats = _write(str(tmp_path / "budget"), 2 * MiB)
    written = stats["entry_log_bytes_written"]
    assert written > 20 * MiB
    # the budget, plus pages no flush writes: each log's header, its seal's map and checksums
    assert resident <= 2 * MiB + 4 * 64 * 1024, (resident, written)
    assert stats["entry_log_bytes_dropped_from_cache"] >= written - 2 * MiB - PAGE


def test_with_no_budget_the_kernel_keeps_every_page(tmp_path):
    resident, stats = _write(str(tmp_path / "all"), 0)
    assert resident >= stats["entry_log_bytes_written"] * 0.9
    assert stats["entry_log_bytes_dropped_from_cache"] == 0


CHILD = r"""
import os, sys
import embedlog
path, cfg = sys.argv[1], eval(sys.argv[2])
with_ids = [os.urandom(1000) + i.to_bytes(24, "big") for i in range(24_000)]
log = embedlog.open(path, **cfg)
w = log.create_ledger()
for i in range(0, len(with_ids), 500):
    w.append_many(with_ids[i:i + 500])
log.bookie.checkpoint()               # most of the log is on disk, its pages dropped
w.append_many([b"after the checkpoint"] * 10)
print(w.ledger_id.qualified_name, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_log_whose_pages_were_dropped_is_sealed_and_read_after_sigkill(tmp_path):
    """The start-up seal of a log a SIGKILL left unsealed walks it from disk (its pages were
    dropped) and finds every entry; the adds after the checkpoint come back from the journal."""
    import subprocess
    import sys
    path = str(tmp_path / "killed")
    cfg = dict(skip_list_size_limit=1 * MiB, entry_log_page_cache_bytes=2 * MiB,
               entry_log_size_limit=64 * MiB,           # one log, left unsealed
               storage_layout=1)
    p = subprocess.run([sys.executable, "-c", CHILD, path, repr(cfg)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == -9, p.stderr[-2000:]
    name = p.stdout.strip()
    logs = glob.glob(os.path.join(path, "**", "*.log"), recursive=True)
    # 25 MB of entries, of which the budget and a few pages are left in the cache
    assert len(logs) == 1 and resident_bytes(logs[0], 48 * MiB) <= 4 * MiB
    with embedlog.open(path, **cfg) as log:
        assert log.bookie.compaction_report["sealed"] == [1]
        r = log.open_ledger(embedlog.LedgerId.parse(name))
        got = r.read_batch(0, 24_009)
        assert len(got) == 24_010
        assert [int.from_bytes(bytes(e)[1000:], "big") for e in got[:24_000]] == list(range(24_000))
        assert [bytes(e) for e in got[24_000:]] == [b"after the checkpoint"] * 10
