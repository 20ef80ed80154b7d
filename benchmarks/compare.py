#!/usr/bin/env python
"""Macro comparison: the same work on embedlog and its peers, in one run.

    python benchmarks/compare.py [--quick] [--out FILE]

Stores: embedlog, SQLite (WAL, synchronous=FULL), LMDB (sync=True), RocksDB via
rocksdict (WriteOptions sync=True); references: a plain file (records framed
before the clock, pwrite into pre-zeroed space + os.fdatasync) and the floor, a bare C
loop doing the least work for the same result (benchmarks/floor.pyx, built on first use:
V1 framing with CRC32C, one pwrite and one fdatasync per batch), and the design floor, the
floor plus the entry log's copy the contract also writes (unsynced, fdatasync'd every 64 MiB),
and the floor without its zeros, the same loop appending to a new file with O_DIRECT and
nothing written ahead (what a fresh log held to 1.15 bytes per payload byte can do).
Every store gets the same work: entries keyed by (ledger, entry)
over 8 interleaved ledgers (batch i goes to ledger i % 8; peers key an entry by
the 16-byte big-endian pair), "durable" meaning the store's synchronous commit
(an fdatasync for the plain file) per batch before the next batch starts.

Inputs (payloads, keys, framed records) are built outside the timed region: the
clock runs only around each store call. Each (work item, store) is bounded by a
time budget (3 s, or 0.5 s with --quick), split into segments run round-robin
over the stores (the figure is the median segment rate), so that noise on a
shared machine hits every store alike. Each store works in its own directory
under a fresh tempfile.mkdtemp(dir="/tmp"), removed afterwards. Ratios are
embedlog / peer: above 1 is better for embedlog on throughputs, below 1 is better
for embedlog on s/GB.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

NLEDGERS = 8
NTHREADS = 16
KEY = struct.Struct(">QQ")
REC = struct.Struct(">IQQ")          # plain-file record: payload length, ledger, entry
LEN = struct.Struct(">I")            # plain-file per-ledger read files: payload length
PEERS = ("sqlite", "lmdb", "rocksdb")
# not stores: the disk's ceiling, the least work, and the least work that writes what the
# durability contract writes (the journal record and the entry log's copy)
REFERENCES = ("file", "floor", "design", "nozeros")
STORES = ("embedlog",) + PEERS + REFERENCES
MB = 1_000_000
perf = time.perf_counter
EMBEDLOG_DEFAULTS: dict = {}         # --storage-layout


def payload_pool(size: int, n: int = 1000, seed: int = 7) -> list:
    rnd = random.Random(seed)
    return [rnd.randbytes(size) for _ in range(n)]


def key(ledger: int, entry: int) -> bytes:
    return KEY.pack(ledger, entry)


# ----------------------------------------------------------------------------------------
# stores: open(dir), write_batch(ledger, first, payloads) prepared untimed by prep_batch,
# append_one, concurrent appends, get, scan, close.
# ----------------------------------------------------------------------------------------

class EmbedlogStore:
    name = "embedlog"

    def __init__(self, path: str, nledgers: int = NLEDGERS, **config):
        import embedlog
        self.log = embedlog.open(path, **{**EMBEDLOG_DEFAULTS, **config})
        self.writers = [self.log.create_ledger(digest="crc32c") for _ in range(nledgers)]
        self.readers = None

    def prep_batch(self, ledger, first, payloads):
        return self.writers[ledger], payloads

    def commit_batch(self, prepared):
        w, payloads = prepared
        w.append_many(payloads)

    def prep_one(self, ledger, entry, data):
        return self.writers[ledger], data

    def commit_one(self, prepared):
        w, data = prepared
        w.append(data)

    def prep_multi(self, batches):
        return [(self.writers[ledger], payloads) for ledger, _first, payloads in batches]

    def commit_multi(self, prepared):
        self.log.append_many_ledgers(prepared)    # one group commit for every ledger

    def thread_appender(self, t):
        w = self.writers[t]

        def append(entry, data):
            w.append(data)
        return append

    def finish_writes(self):
        for w in self.writers:
            w.close()
        self.readers = [self.log.open_ledger(w.ledger_id) for w in self.writers]

    def get_many(self, pairs):
        rs = self.readers
        for l, e in pairs:
            rs[l].read_entry(e)
        return len(pairs)

    def get(self, l, e):
        return self.readers[l].read_entry(e)

    def scan(self, ledger, n):
        r = self.readers[ledger]
        out = []
        for first in range(0, n, 100_000):
            out.extend(r.read_batch(first, min(n, first + 100_000) - 1))
        return out

    def close(self):
        self.log.close()


class SqliteStore:
    name = "sqlite"
    INSERT = "INSERT INTO t(k, v) VALUES (?, ?)"

    def __init__(self, path: str, nledgers: int = NLEDGERS):
        import sqlite3
        self.sqlite3 = sqlite3
        self.file = os.path.join(path, "db.sqlite")
        self.conn = self._connect()
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
        self.local = threading.local()

    def _connect(self):
        c = self.sqlite3.connect(self.file, isolation_level=None, check_same_thread=False, timeout=60)
        assert c.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        c.execute("PRAGMA synchronous=FULL")
        return c

    def prep_batch(self, ledger, first, payloads):
        return [(key(ledger, first + i), p) for i, p in enumerate(payloads)]

    def commit_batch(self, rows):
        c = self.conn
        c.execute("BEGIN")
        c.executemany(self.INSERT, rows)
        c.execute("COMMIT")

    def prep_one(self, ledger, entry, data):
        return (key(ledger, entry), data)

    def commit_one(self, row):
        self.conn.execute(self.INSERT, row)     # autocommit: one synchronous transaction

    def thread_appender(self, t):
        conn = self._connect()
        self._thread_conns = getattr(self, "_thread_conns", [])
        self._thread_conns.append(conn)

        def append(entry, data):
            conn.execute(self.INSERT, (key(t, entry), data))
        return append

    def finish_writes(self):
        for c in getattr(self, "_thread_conns", []):
            c.close()
        self.cur = self.conn.cursor()

    def get_many(self, pairs):
        ex = self.cur.execute
        for l, e in pairs:
            ex("SELECT v FROM t WHERE k = ?", (KEY.pack(l, e),)).fetchone()
        return len(pairs)

    def get(self, l, e):
        return self.cur.execute("SELECT v FROM t WHERE k = ?", (key(l, e),)).fetchone()[0]

    def scan(self, ledger, n):
        rows = self.cur.execute("SELECT v FROM t WHERE k >= ? AND k < ? ORDER BY k",
                                (key(ledger, 0), key(ledger + 1, 0))).fetchall()
        return [r[0] for r in rows]

    def close(self):
        self.conn.close()


class LmdbStore:
    name = "lmdb"

    def __init__(self, path: str, nledgers: int = NLEDGERS):
        import lmdb
        self.env = lmdb.open(os.path.join(path, "lmdb"), map_size=1 << 37, sync=True,
                             metasync=True, max_dbs=0, lock=True)

    def prep_batch(self, ledger, first, payloads):
        return [(key(ledger, first + i), p) for i, p in enumerate(payloads)]

    def commit_batch(self, rows):
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(rows)

    def prep_one(self, ledger, entry, data):
        return (key(ledger, entry), data)

    def commit_one(self, row):
        with self.env.begin(write=True) as txn:
            txn.put(row[0], row[1])

    def thread_appender(self, t):
        env = self.env

        def append(entry, data):
            with env.begin(write=True) as txn:
                txn.put(key(t, entry), data)
        return append

    def finish_writes(self):
        self.txn = self.env.begin(buffers=False)

    def get_many(self, pairs):
        g = self.txn.get
        for l, e in pairs:
            g(KEY.pack(l, e))
        return len(pairs)

    def get(self, l, e):
        return self.txn.get(key(l, e))

    def scan(self, ledger, n):
        end = key(ledger + 1, 0)
        cur = self.txn.cursor()
        out = []
        if cur.set_range(key(ledger, 0)):
            for k, v in cur:
                if k >= end:
                    break
                out.append(v)
        return out

    def close(self):
        if hasattr(self, "txn"):
            self.txn.abort()
        self.env.close()


class RocksStore:
    name = "rocksdb"

    def __init__(self, path: str, nledgers: int = NLEDGERS):
        import rocksdict
        self.rd = rocksdict
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        self.db = rocksdict.Rdict(os.path.join(path, "rocks"), opts)
        self.wo = rocksdict.WriteOptions()
        self.wo.sync = True
        self.db.set_write_options(self.wo)

    def prep_batch(self, ledger, first, payloads):
        return [(key(ledger, first + i), p) for i, p in enumerate(payloads)]

    def commit_batch(self, rows):
        wb = self.rd.WriteBatch(raw_mode=True)
        put = wb.put
        for k, v in rows:
            put(k, v)
        self.db.write(wb, write_opt=self.wo)

    def prep_one(self, ledger, entry, data):
        return (key(ledger, entry), data)

    def commit_one(self, row):
        self.db.put(row[0], row[1], write_opt=self.wo)

    def thread_appender(self, t):
        db, wo = self.db, self.wo

        def append(entry, data):
            db.put(key(t, entry), data, write_opt=wo)
        return append

    def finish_writes(self):
        pass

    def get_many(self, pairs):
        g = self.db.get
        for l, e in pairs:
            g(KEY.pack(l, e))
        return len(pairs)

    def get(self, l, e):
        return self.db.get(key(l, e))

    def scan(self, ledger, n):
        ro = self.rd.ReadOptions()
        ro.set_iterate_upper_bound(key(ledger + 1, 0))
        return list(self.db.values(from_key=key(ledger, 0), read_opt=ro))

    def close(self):
        self.db.close()


class FileStore:
    """A plain append-only file: framed records pwritten into pre-zeroed space + fdatasync.

    Writes go to one log file (records of all ledgers interleaved). Reads use a second
    layout written for them: one file per ledger of length-prefixed payloads, an
    in-memory offset table and an mmap (what a hand-rolled store would do).
    """
    name = "file"
    CHUNK = 64 << 20

    def __init__(self, path: str, nledgers: int = NLEDGERS):
        self.path = path
        self.fd = os.open(os.path.join(path, "log"), os.O_RDWR | os.O_CREAT, 0o644)
        self.off = 0
        self.zero_end = 0
        self.lock = threading.Lock()
        self.nledgers = nledgers
        self.reads = None

    def ensure(self, nbytes):
        """Pre-zero space ahead of the tail (untimed in single-writer items)."""
        if self.off + nbytes <= self.zero_end:
            return
        grow = max(self.CHUNK, nbytes)
        zeros = bytes(1 << 20)
        pos = self.zero_end
        while pos < self.zero_end + grow:
            pos += os.pwrite(self.fd, zeros, pos)
        os.fsync(self.fd)
        self.zero_end = pos

    def prep_batch(self, ledger, first, payloads):
        buf = b"".join([REC.pack(len(p), ledger, first + i) + p for i, p in enumerate(payloads)])
        self.ensure(len(buf))
        return buf

    def commit_batch(self, buf):
        os.pwrite(self.fd, buf, self.off)
        self.off += len(buf)
        os.fdatasync(self.fd)

    def prep_multi(self, batches):
        buf = b"".join([REC.pack(len(p), ledger, first + i) + p
                        for ledger, first, payloads in batches for i, p in enumerate(payloads)])
        self.ensure(len(buf))
        return buf

    def prep_one(self, ledger, entry, data):
        buf = REC.pack(len(data), ledger, entry) + data
        self.ensure(len(buf))
        return buf

    commit_one = commit_batch

    def thread_appender(self, t):
        lock, fd = self.lock, self.fd

        def append(entry, data):
            buf = REC.pack(len(data), t, entry) + data
            with lock:
                self.ensure(len(buf))
                off = self.off
                self.off += len(buf)
            os.pwrite(fd, buf, off)
            os.fdatasync(fd)           # flushes every page written so far, ours included
        return append

    # reads: one file per ledger, filled by write_read_dataset
    def load_read_files(self, per_ledger: list):
        import mmap
        self.offsets = []
        self.maps = []
        self.files = []
        for l, payloads in enumerate(per_ledger):
            p = os.path.join(self.path, f"ledger-{l}")
            offs = []
            pos = 0
            parts = []
            for d in payloads:
                offs.append(pos + LEN.size)
                parts.append(LEN.pack(len(d)))
                parts.append(d)
                pos += LEN.size + len(d)
            with open(p, "wb") as f:
                f.write(b"".join(parts))
                f.flush()
                os.fdatasync(f.fileno())
            f = open(p, "rb")
            self.files.append(f)
            self.maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            self.offsets.append([(o, len(d)) for o, d in zip(offs, payloads)])

    def finish_writes(self):
        pass

    def get_many(self, pairs):
        maps, offs = self.maps, self.offsets
        for l, e in pairs:
            o, n = offs[l][e]
            maps[l][o:o + n]
        return len(pairs)

    def get(self, l, e):
        o, n = self.offsets[l][e]
        return self.maps[l][o:o + n]

    def scan(self, ledger, n):
        with open(os.path.join(self.path, f"ledger-{ledger}"), "rb") as f:
            data = f.read()
        out = []
        pos, end = 0, len(data)
        unpack = LEN.unpack_from
        while pos < end:
            (ln,) = unpack(data, pos)
            pos += 4
            out.append(data[pos:pos + ln])
            pos += ln
        return out

    def close(self):
        for m in getattr(self, "maps", []):
            m.close()
        for f in getattr(self, "files", []):
            f.close()
        os.close(self.fd)


def load_floor():
    """benchmarks/floor.pyx, built on first use into build/pyxbld (pyximport, with
    embedlog's native.h); `make build-ext` builds it ahead (compare.py --build-floor)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import pyximport
    pyximport.install(build_dir=os.path.join(REPO, "build", "pyxbld"), language_level=3,
                      setup_args={"include_dirs": [os.path.join(REPO, "pyx", "embedlog", "_native")]})
    import floor
    return floor


class FloorStore(FileStore):
    """The floor: the same entries framed as V1 with a CRC32C digest by a bare C loop
    (benchmarks/floor.pyx) into one log file, one pwrite + fdatasync per batch; reads from
    one mapped file per ledger of the same records, digests checked."""
    name = "floor"
    DIRECT = False               # O_DIRECT writes, each batch padded to whole 4 KiB blocks

    def __init__(self, path: str, nledgers: int = NLEDGERS):
        super().__init__(path, nledgers)
        self.native = load_floor()
        self.writer = self.native.Writer()
        self.lengths = [0] * nledgers
        self.readers = None

    def prep_batch(self, ledger, first, payloads):
        self.ensure(len(payloads) * (40 + max(map(len, payloads))))
        return ledger, first, payloads

    def commit_batch(self, prepared):
        ledger, first, payloads = prepared
        n, self.lengths[ledger] = self.writer.frame(payloads, ledger, first, self.lengths[ledger])
        self.off += self.writer.write(self.fd, self.off, n, True, self.DIRECT)

    def prep_one(self, ledger, entry, data):
        return self.prep_batch(ledger, entry, [data])

    commit_one = commit_batch

    def prep_multi(self, batches):
        self.ensure(sum(len(p) * (40 + max(map(len, p))) for _l, _f, p in batches))
        return batches

    def commit_multi(self, batches):
        end = 0
        for ledger, first, payloads in batches:
            end, self.lengths[ledger] = self.writer.frame(payloads, ledger, first,
                                                          self.lengths[ledger], end)
        self.off += self.writer.write(self.fd, self.off, end, True, self.DIRECT)

    def thread_appender(self, t):
        lock, fd, native = self.lock, self.fd, self.native
        writer = native.Writer()
        length = [0]

        def append(entry, data):
            n, length[0] = writer.frame([data], t, entry, length[0])
            with lock:
                self.ensure(n)
                off = self.off
                self.off += -(-n // 4096) * 4096 if self.DIRECT else n
            writer.write(fd, off, n, True, self.DIRECT)   # the fdatasync flushes every page so far
            self.after_append(writer, n)
        return append

    def after_append(self, writer, nbytes) -> None:
        """What else a thread's durable append writes (the design floor's entry log)."""

    def load_read_files(self, per_ledger: list):
        import mmap
        self.maps, self.files, self.readers = [], [], []
        for l, payloads in enumerate(per_ledger):
            p = os.path.join(self.path, f"ledger-{l}")
            n, _ = self.writer.frame(payloads, l, 0, 0)
            with open(p, "wb") as f:
                f.write(self.writer.framed(n))
                f.flush()
                os.fdatasync(f.fileno())
            f = open(p, "rb")
            self.files.append(f)
            self.maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            self.readers.append(self.native.Reader(self.maps[-1]))

    def get_many(self, pairs):
        rs = self.readers
        for l, e in pairs:
            rs[l].get(e)
        return len(pairs)

    def get(self, l, e):
        return self.readers[l].get(e)

    def scan(self, ledger, n):
        return self.readers[ledger].scan()

    def close(self):
        self.readers = None
        super().close()


def prep_multi(store, batches):
    """One durable commit's worth of (ledger, first, payloads) batches: a store's own
    prep_multi, or its batches' rows in one transaction."""
    if hasattr(store, "prep_multi"):
        return store.prep_multi(batches)
    return [row for ledger, first, payloads in batches
            for row in store.prep_batch(ledger, first, payloads)]


def commit_multi(store, prepared):
    getattr(store, "commit_multi", store.commit_batch)(prepared)


class DesignFloorStore(FloorStore):
    """The design floor: what the contract writes, by the floor's bare C loop. Each durable
    batch is the floor's journal write (one pwrite + fdatasync of the framed records), then
    the same records written to an entry log file without a sync (page cache: the kernel
    writes them back in the background), which is fdatasync'd every ENTRY_LOG_SYNC bytes, as
    a checkpoint syncs embedlog's entry logs. Reads are the floor's.

    Synced pages are dropped from the page cache (posix_fadvise DONTNEED: the journal's after
    each batch, the entry log's after each sync), so its writes reuse the pages they free, as
    embedlog's do since 2026-11-27 (entry_log_page_cache_bytes; its journal bypasses the cache
    with O_DIRECT): on this VM a new page costs 15x a reused one per byte copied, and a floor
    that paid it while embedlog did not would be no floor."""
    name = "design"
    ENTRY_LOG_SYNC = 64 << 20

    def __init__(self, path: str, nledgers: int = NLEDGERS):
        super().__init__(path, nledgers)
        self.elfd = os.open(os.path.join(path, "entrylog"), os.O_RDWR | os.O_CREAT, 0o644)
        self.el_off = 0
        self.el_synced = 0

    def _entry_log(self, writer, nbytes):
        """The entry log's copy of what ``writer`` framed last (under self.lock when shared)."""
        off = self.el_off
        self.el_off += nbytes
        writer.write(self.elfd, off, nbytes, False)
        if self.el_off - self.el_synced >= self.ENTRY_LOG_SYNC:
            os.fdatasync(self.elfd)
            os.posix_fadvise(self.elfd, self.el_synced, self.el_off - self.el_synced,
                             os.POSIX_FADV_DONTNEED)
            self.el_synced = self.el_off

    def _journal(self, writer, nbytes):
        """The journal write of what ``writer`` framed last, synced; its pages dropped."""
        off = self.off
        self.off += writer.write(self.fd, off, nbytes)
        os.posix_fadvise(self.fd, off, nbytes, os.POSIX_FADV_DONTNEED)

    def commit_batch(self, prepared):
        ledger, first, payloads = prepared
        n, self.lengths[ledger] = self.writer.frame(payloads, ledger, first, self.lengths[ledger])
        self._journal(self.writer, n)
        self._entry_log(self.writer, n)

    commit_one = commit_batch

    def commit_multi(self, batches):
        end = 0
        for ledger, first, payloads in batches:
            end, self.lengths[ledger] = self.writer.frame(payloads, ledger, first,
                                                          self.lengths[ledger], end)
        self._journal(self.writer, end)
        self._entry_log(self.writer, end)

    def after_append(self, writer, nbytes) -> None:
        with self.lock:
            self._entry_log(writer, nbytes)

    def close(self):
        os.close(self.elfd)
        super().close()


class NoZerosFloorStore(FloorStore):
    """The floor without its zeros: the floor's bare C loop appending at the end of a new
    file with O_DIRECT (each batch padded to whole 4 KiB blocks), nothing written ahead. The
    floor writes into space zeroed before the clock, a second byte per byte that a fresh log
    held to 1.15 bytes per payload byte cannot write; past the end of a new file each
    fdatasync also commits the blocks and the size the write added (ext4's jbd2 commit, XFS's
    log force). O_DIRECT because it is the cheaper of the two ways to extend here (buffered:
    the page cache's copy and writeback on top). Reads are the floor's."""
    name = "nozeros"
    DIRECT = True

    def __init__(self, path: str, nledgers: int = NLEDGERS):
        super().__init__(path, nledgers)
        os.close(self.fd)
        self.fd = os.open(os.path.join(path, "log"), os.O_RDWR | os.O_DIRECT)

    def ensure(self, nbytes):
        """Nothing ahead of the tail: the file grows with each write."""


CLASSES = {c.name: c for c in (EmbedlogStore, SqliteStore, LmdbStore, RocksStore, FileStore,
                                FloorStore, DesignFloorStore, NoZerosFloorStore)}


# ----------------------------------------------------------------------------------------
# work items
# ----------------------------------------------------------------------------------------

class Runner:
    """Runs each work item on every store in rounds.

    All stores of an item are open at once (each in its own directory) and the item's
    time budget per store is split into ROUNDS segments run round-robin, the store order
    rotating each round, so a burst of noise on this shared VM hits every store alike.
    The figure reported is the median of a store's per-segment rates.
    """

    def __init__(self, root: str, budget: float, quick: bool):
        self.root = root
        self.budget = budget
        self.quick = quick
        self.rounds = 2 if quick else 3
        self.results: dict = {}       # (work, unit) -> {store: value}
        self.spread: dict = {}        # (work, unit) -> {store: (min, max)}
        self.notes: list = []
        self.errors: list = []
        self._n = 0

    def fresh_dir(self, tag):
        self._n += 1
        d = os.path.join(self.root, f"{self._n:02d}-{tag}")
        os.makedirs(d)
        return d

    def record(self, work, unit, store, value, spread=None):
        self.results.setdefault((work, unit), {})[store] = value
        if spread:
            self.spread.setdefault((work, unit), {})[store] = spread

    def fail(self, work, store, exc):
        self.errors.append(f"{work} / {store}: {type(exc).__name__}: {exc}")
        print(f"  ! {work} / {store}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def progress(self, work, store, text):
        print(f"  {work:<26} {store:<9} {text}", file=sys.stderr, flush=True)

    def open_all(self, work, setup=None, embedlog_config=None):
        stores = {}
        for name in STORES:
            d = self.fresh_dir(f"{work}-{name}")
            try:
                s = CLASSES[name](d, **(embedlog_config or {})) if name == "embedlog" else CLASSES[name](d)
                s._dir = d
                stores[name] = s
                if setup is not None:
                    setup(name, s)
            except Exception as exc:
                self.fail(work, name, exc)
                self.close_one(work, name, stores)
        return stores

    def close_one(self, work, name, stores):
        s = stores.pop(name, None)
        if s is None:
            return
        try:
            s.close()
        except Exception as exc:
            self.errors.append(f"{work} / {name} close: {type(exc).__name__}: {exc}")
        shutil.rmtree(s._dir, ignore_errors=True)

    def close_all(self, work, stores):
        for name in list(stores):
            self.close_one(work, name, stores)
        gc.collect()

    def rounds_of(self, work, stores, segment, units):
        """segment(name, store, seconds) -> (count, seconds timed); records count / timed."""
        rates = {name: [] for name in stores}
        seg = self.budget / self.rounds
        for rnd in range(self.rounds):
            order = list(stores)
            order = order[rnd % len(order):] + order[:rnd % len(order)] if order else order
            for name in order:
                if name not in stores:
                    continue
                os.sync()                   # start each segment with no dirty pages around
                try:
                    n, timed = segment(name, stores[name], seg)
                except Exception as exc:
                    self.fail(work, name, exc)
                    self.close_one(work, name, stores)
                    continue
                rates[name].append((n / timed, n))
        for name in STORES:
            got = rates.get(name)
            if not got or name not in stores:
                continue
            per_seg = [r for r, _ in got]
            med = statistics.median(per_seg)
            for unit, scale in units:
                self.record(work, unit, name, med * scale,
                            (min(per_seg) * scale, max(per_seg) * scale))
            self.progress(work, name, f"{med:,.0f}/s (segments {min(per_seg):,.0f}..{max(per_seg):,.0f}, "
                          f"{sum(n for _, n in got):,} ops)")

    # -- appends ------------------------------------------------------------------------

    def batches(self, work, batch, size, mbs=False, steady=False):
        """Durable batches over the 8 ledgers. ``steady``: embedlog with 32 MiB journals and
        no backups kept, timed only once eight journals in a row were reused with no zeros
        written (untimed batches until then), so what it writes is the steady state's: no
        preallocation. Layout 2 reuses no journal (a trimmed one is a segment): timed once
        eight new journals in a row were made, and their segments kept as storage."""
        pool = payload_pool(size, max(batch, 1000))[:batch]
        state = {}

        def segment(name, s, seconds):
            next_eid = state.setdefault(name, [0] * NLEDGERS)
            timed = 0.0
            n = 0
            deadline = perf() + seconds
            while perf() < deadline:
                l = (n // batch) % NLEDGERS
                prepared = s.prep_batch(l, next_eid[l], pool)
                t0 = perf()
                s.commit_batch(prepared)
                timed += perf() - t0
                next_eid[l] += batch
                n += batch
            return n, timed
        config = dict(journal_max_size_mb=32, journal_max_backups=0) if steady else None
        stores = self.open_all(work, embedlog_config=config)
        base = {"journal": {}, "entry_log_bytes_written": 0, "memtable_bytes": 0, "payload": 0}
        try:
            if steady and "embedlog" in stores:
                s = stores["embedlog"]
                warm, mark = perf(), None
                layout2 = s.log.statistics().get("layout", 1) == 2
                while perf() - warm < 180:        # until 8 reuses in a row wrote no zeros
                    segment("embedlog", s, 0.2)
                    j = s.log.statistics()["journal"]
                    if layout2:
                        if j.get("files_created", 0) >= 9:
                            break
                        continue
                    if j["files_reused"] < 2:
                        continue
                    if mark is None or j["zeros_written"] != mark[1]:
                        mark = (j["files_reused"], j["zeros_written"])
                    elif j["files_reused"] >= mark[0] + 8:
                        break
                s.log.bookie.checkpoint()          # the warm-up's pages are not the timed part's
                base = s.log.statistics()
                base["payload"] = sum(state["embedlog"]) * size
                self.notes.append(f"{work} / embedlog: timed after {base['payload'] / 2**20:,.0f} "
                                  f"MiB untimed, once {base['journal']['files_reused']} journals "
                                  f"had been reused ({base['journal'].get('files_created', 0)} made)")
            units = [("entries/s", 1)] + ([("MB/s", size / MB)] if mbs else [])
            self.rounds_of(work, stores, segment, units)
            if "embedlog" in stores:
                # the index pages the timed part dirtied reach disk at a checkpoint: take one
                # (untimed) so they are counted, as many times as checkpoints wrote them
                stores["embedlog"].log.bookie.checkpoint()
                st = stores["embedlog"].log.statistics()
                j = {k: v - base["journal"].get(k, 0) for k, v in st["journal"].items()}
                payload = sum(state["embedlog"]) * size - base["payload"]
                per = (lambda b: b / payload) if payload else (lambda b: 0.0)
                # the entry logs' share of the timed payload: what they took in, plus what the
                # memtable gained (still to be flushed), less what it held when the clock
                # started (flushed during the timed part, but the untimed part's)
                logged = st["entry_log_bytes_written"] - base["entry_log_bytes_written"]
                # layout 2 never copies the memtable: its entries' storage is the journal
                held = st["memtable_bytes"] - base["memtable_bytes"] if st.get("layout", 1) == 1 else 0
                index = st["index_bytes_written"] - base.get("index_bytes_written", 0)
                self.notes.append(
                    f"{work} / embedlog: {j['bytes_written'] / 2**20:,.0f} MiB journalled, "
                    f"{st['memtable_flushes']} memtable flushes, {st['checkpoints']} checkpoints, "
                    f"fdatasync time {j['fsync_time_s']:.2f} s in {j['fsyncs']:,} syncs; bytes "
                    f"written per payload byte: journal {per(j['bytes_written']):.2f} + "
                    f"preallocation zeros {per(j['zeros_written']):.2f} + entry logs "
                    f"{per(logged + held):.2f} (written {per(logged):.2f}, the memtable's change "
                    f"{held / 2**20:+,.0f} MiB) + index writes {per(index):.2f} = "
                    f"{per(j['bytes_written'] + j['zeros_written'] + logged + held + index):.2f}"
                    f" (layout {st.get('layout', 1)}); journals reused {j['files_reused']}; "
                    f"in whole blocks (O_DIRECT writes each group's partial first block again "
                    f"and pads its last) the journal writes {per(j['blocks_written']):.2f}, "
                    f"the total "
                    f"{per(j['blocks_written'] + j['zeros_written'] + logged + held + index):.2f}")
        finally:
            self.close_all(work, stores)

    def multi(self, work="append_multi8x125_100B", per_ledger=125, size=100):
        """One durable commit per call for 125 entries to each of the 8 ledgers."""
        pool = payload_pool(size, per_ledger)
        state = {}

        def segment(name, s, seconds):
            next_eid = state.setdefault(name, [0] * NLEDGERS)
            timed = 0.0
            n = 0
            deadline = perf() + seconds
            while perf() < deadline:
                prepared = prep_multi(s, [(l, next_eid[l], pool) for l in range(NLEDGERS)])
                t0 = perf()
                commit_multi(s, prepared)
                timed += perf() - t0
                for l in range(NLEDGERS):
                    next_eid[l] += per_ledger
                n += per_ledger * NLEDGERS
            return n, timed
        stores = self.open_all(work)
        try:
            self.rounds_of(work, stores, segment, [("entries/s", 1)])
            if "embedlog" in stores:
                j = stores["embedlog"].log.statistics()["journal"]
                self.notes.append(f"{work} / embedlog: append_many_ledgers, {j['records_written']:,} "
                                  f"journal records in {j['fsyncs']:,} fdatasyncs")
        finally:
            self.close_all(work, stores)

    def append_sync(self, work="append_sync_100B", embedlog_config=None):
        """One durable append at a time; ``embedlog_config`` for embedlog's (the
        enable_busy_wait row)."""
        pool = payload_pool(100)
        state = {}
        spent = {}
        cpu = {}

        def segment(name, s, seconds):
            next_eid = state.setdefault(name, [0] * NLEDGERS)
            timed = 0.0
            i = 0
            deadline = perf() + seconds
            c0 = time.process_time()           # every thread's: a spinning one's too
            while perf() < deadline:
                l = i % NLEDGERS
                prepared = s.prep_one(l, next_eid[l], pool[i % 1000])
                t0 = perf()
                s.commit_one(prepared)
                timed += perf() - t0
                next_eid[l] += 1
                i += 1
            cpu[name] = cpu.get(name, 0.0) + time.process_time() - c0
            spent[name] = spent.get(name, 0.0) + timed
            return i, timed
        stores = self.open_all(work, embedlog_config=embedlog_config)
        try:
            j0 = stores["embedlog"].log.statistics()["journal"] if "embedlog" in stores else None
            self.rounds_of(work, stores, segment, [("entries/s", 1)])
            if j0 is not None and "embedlog" in stores:
                j = stores["embedlog"].log.statistics()["journal"]
                adds = sum(state.get("embedlog", [0]))
                syncs = j["fsyncs"] - j0["fsyncs"]
                t_sync = j["fsync_time_s"] - j0["fsync_time_s"]
                if adds and syncs:
                    per = spent["embedlog"] / adds * 1e6
                    self.notes.append(
                        f"{work} / embedlog: {adds:,} appends took {per:.0f} us each on average "
                        f"and {syncs:,} fdatasyncs {t_sync / syncs * 1e6:.0f} us each: about "
                        f"{per - t_sync / adds * 1e6:.0f} us per append is spent outside fdatasync"
                        + (f" (file: {spent['file'] / sum(state['file']) * 1e6:.0f} us per "
                           "pwrite + fdatasync)" if state.get("file") else "")
                        + f"; the process's CPU {cpu['embedlog'] / adds * 1e6:.0f} us per append"
                        + (f" (file: {cpu['file'] / sum(state['file']) * 1e6:.0f} us)"
                           if state.get("file") else ""))
        finally:
            self.close_all(work, stores)

    def concurrent(self, work="append_concurrent16_100B"):
        pool = payload_pool(100)
        appenders = {}
        next_eid = {}

        def setup(name, s):
            if name == "embedlog":
                s.writers.extend(s.log.create_ledger(digest="crc32c")
                                 for _ in range(NTHREADS - len(s.writers)))
            if name in REFERENCES:
                s.ensure(256 << 20 if not self.quick else 32 << 20)
            appenders[name] = [s.thread_appender(t) for t in range(NTHREADS)]
            next_eid[name] = [0] * NTHREADS

        def segment(name, s, seconds):
            apps = appenders[name]
            eids = next_eid[name]
            counts = [0] * NTHREADS
            errors = []
            start = threading.Barrier(NTHREADS + 1)
            stop = [0.0]

            def worker(t):
                append = apps[t]
                start.wait()
                e = eids[t]
                try:
                    while perf() < stop[0]:
                        append(e, pool[(t * 61 + e) % 1000])
                        e += 1
                except Exception as exc:
                    errors.append(exc)
                counts[t] = e - eids[t]
                eids[t] = e
            threads = [threading.Thread(target=worker, args=(t,)) for t in range(NTHREADS)]
            for th in threads:
                th.start()
            t0 = perf()
            stop[0] = t0 + seconds
            start.wait()
            for th in threads:
                th.join()
            wall = perf() - t0
            if errors:
                raise errors[0]
            return sum(counts), wall
        stores = self.open_all(work, setup)
        try:
            self.rounds_of(work, stores, segment, [("entries/s", 1)])
            if "embedlog" in stores:
                j = stores["embedlog"].log.statistics()["journal"]
                self.notes.append(
                    f"{work} / embedlog: {j['records_written']:,} journal records shared "
                    f"{j['fsyncs']:,} fdatasyncs (largest group {j['group_entries_max']} records)")
        finally:
            self.close_all(work, stores)

    # -- reads --------------------------------------------------------------------------

    def reads(self):
        per_ledger = 25_000 if self.quick else 125_000
        pool = payload_pool(100, 1000, seed=11)

        def expect(l, e):
            return pool[(l * 37 + e) % 1000]

        rnd = random.Random(5)
        pairs = [(rnd.randrange(NLEDGERS), rnd.randrange(per_ledger)) for _ in range(200_000)]
        chunks = [pairs[i:i + 1000] for i in range(0, len(pairs), 1000)]

        def setup(name, s):
            # the data set, untimed: 8 ledgers interleaved, batches of 1000
            if name in REFERENCES:
                s.load_read_files([[expect(l, e) for e in range(per_ledger)] for l in range(NLEDGERS)])
            else:
                for first in range(0, per_ledger, 1000):
                    for l in range(NLEDGERS):
                        batch = [expect(l, e) for e in range(first, min(per_ledger, first + 1000))]
                        s.commit_batch(s.prep_batch(l, first, batch))
            s.finish_writes()
            for l, e in pairs[:2000]:
                got = s.get(l, e)
                if got is None or bytes(got) != expect(l, e):
                    raise AssertionError(f"{name}: wrong value for ({l}, {e})")
            got = s.scan(0, per_ledger)
            if len(got) != per_ledger or bytes(got[-1]) != expect(0, per_ledger - 1):
                raise AssertionError(f"{name}: scan returned {len(got)} entries")

        pos = {}

        def random_segment(name, s, seconds):
            i = pos.get(name, 0)
            n, t0 = 0, perf()
            deadline = t0 + seconds
            while True:
                n += s.get_many(chunks[i % len(chunks)])
                i += 1
                now = perf()
                if now >= deadline:
                    break
            pos[name] = i
            return n, now - t0

        def scan_segment(name, s, seconds):
            n, t0 = 0, perf()
            deadline = t0 + seconds
            while True:
                for v in s.scan(n // per_ledger % NLEDGERS, per_ledger):
                    n += 1                  # every store's entries are touched in Python alike
                now = perf()
                if now >= deadline:
                    break
            return n, now - t0

        stores = self.open_all("read", setup)
        try:
            self.rounds_of("read_random_100B", stores, random_segment, [("gets/s", 1)])
            self.rounds_of("read_seq_100B", stores, scan_segment, [("entries/s", 1)])
        finally:
            self.close_all("read", stores)
        self.notes.append(f"reads: {NLEDGERS} ledgers x {per_ledger:,} entries of 100 B written in "
                          "batches of 1000 before timing, reads from a warm page cache; random gets "
                          "over all of them; scans of one whole ledger at a time (embedlog: read_batch "
                          "in chunks of 100k; file: one file per ledger split by length prefixes)")

    # -- reopen after a crash -----------------------------------------------------------

    def crash(self, work="reopen_after_crash"):
        mb = 48 if self.quick else 384
        self.notes.append(
            f"reopen_after_crash: a child process writes {mb} MiB of 1 KiB entries (batches of "
            "1000, 8 ledgers, durable) and SIGKILLs itself after the last acknowledgement; the "
            "parent times the open (plus one read); s per GB of payload ingested before the "
            "kill, for every store.")
        for store in STORES:
            if store in REFERENCES:
                self.record(work, "s/GB", store, None)
                continue
            d = self.fresh_dir(f"crash-{store}")
            try:
                if store == "embedlog":
                    argv = [sys.executable, "-c", EMBEDLOG_CHILD, d, str(mb)]
                else:
                    argv = [sys.executable, "-c",
                            f"import sys; sys.path.insert(0, {HERE!r}); import compare; "
                            "compare.peer_crash_child(sys.argv[1], sys.argv[2], int(sys.argv[3]))",
                            store, d, str(mb)]
                env = dict(os.environ)
                env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
                p = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
                if p.returncode != -signal.SIGKILL:
                    raise RuntimeError(f"child exited {p.returncode}: {p.stderr[-2000:]}")
                info = json.loads(p.stdout.strip().splitlines()[-1])
                gc.collect()
                os.sync()
                secs, extra = reopen(store, d, info)
                gb = info["payload_bytes"] / 1e9
                if store == "embedlog":
                    replayed = info["journal_bytes_replayed"]
                    self.notes.append(
                        f"reopen_after_crash / embedlog: open took {secs:.2f} s, replaying "
                        f"{replayed / 2**20:,.0f} MiB of journal ({extra['records']:,} records; "
                        f"the rest was checkpointed before the kill) at "
                        f"{replayed / 1e9 / max(extra['replay_s'], 1e-9):.2f} GB/s of replay "
                        f"({extra['replay_s']:.2f} s of the open; the checkpoint after it runs in "
                        f"the background); child ingest {info['ingest_s']:.2f} s; every ledger's LAC "
                        f"after reopen is its last acknowledged entry: {extra['verified']}")
                else:
                    self.notes.append(f"reopen_after_crash / {store}: open took {secs * 1000:.1f} ms "
                                      f"(child ingest {info['ingest_s']:.2f} s)")
                self.record(work, "s/GB", store, secs / gb)
                self.progress(work, store, f"{secs:.3f} s -> {secs / gb:.3f} s/GB")
            except Exception as exc:
                self.fail(work, store, exc)
            finally:
                shutil.rmtree(d, ignore_errors=True)


EMBEDLOG_CHILD = r"""
import json, os, sys, time, random
import embedlog
d, mb = sys.argv[1], int(sys.argv[2])
rnd = random.Random(3)
pool = [rnd.randbytes(1024) for _ in range(1000)]
log = embedlog.open(d)
ws = [log.create_ledger(digest="crc32c") for _ in range(8)]
nbatches = mb * 2**20 // (1024 * 1000)
t0 = time.perf_counter()
for i in range(nbatches):
    ws[i % 8].append_many(pool)
ingest = time.perf_counter() - t0
j = log.bookie.journal
with log.bookie.cv:
    seq = j.synced_seq
    mark = log.bookie.mark.persisted
    files = list(j._starts)            # (start seq, file id, offset) of each journal file
mark_seq = 0
if mark and tuple(mark) != (0, 0):
    for start_seq, fid, start_off in files:
        if fid == mark[0]:
            mark_seq = start_seq + (mark[1] - start_off)
print(json.dumps({"ledgers": [w.ledger_id.qualified_name for w in ws],
                  "per_ledger": [len(range(l, nbatches, 8)) * 1000 for l in range(8)],
                  "entries": nbatches * 1000, "payload_bytes": nbatches * 1000 * 1024,
                  "journal_bytes_written": j.stats["bytes_written"],
                  "journal_bytes_replayed": seq - mark_seq, "mark": mark,
                  "ingest_s": ingest}), flush=True)
os.kill(os.getpid(), 9)
"""


def peer_crash_child(store, d, mb):
    """Child body for a peer: ingest mb MiB of 1 KiB entries durably, then SIGKILL itself."""
    s = CLASSES[store](d)
    rnd = random.Random(3)
    pool = [rnd.randbytes(1024) for _ in range(1000)]
    nbatches = mb * 2**20 // (1024 * 1000)
    eids = [0] * NLEDGERS
    timed = 0.0
    for i in range(nbatches):
        l = i % NLEDGERS
        prepared = s.prep_batch(l, eids[l], pool)
        t0 = perf()
        s.commit_batch(prepared)
        timed += perf() - t0
        eids[l] += 1000
    print(json.dumps({"entries": nbatches * 1000, "payload_bytes": nbatches * 1000 * 1024,
                      "ingest_s": timed}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def reopen(store, d, info):
    """Open a store after the kill and read one entry; returns (seconds, details).

    Only the open and that first read are timed; checks and the close come after.
    """
    if store == "embedlog":
        import embedlog
        import embedlog.embedded     # noqa: F401  imported before the clock, as the peers are
        import embedlog.meta.sqlite  # noqa: F401  (the open's metadata store: no compile in the clock)
        t0 = perf()
        log = embedlog.open(d)
        secs = perf() - t0
        try:
            records = log.bookie.replay_report["records"]
            replay_s = log.bookie.replay_report.get("seconds", 0.0)
            ok = True      # every acknowledged entry survived: each ledger's LAC is its last add
            for q, n in zip(info["ledgers"], info["per_ledger"]):
                r = log.open_ledger(embedlog.LedgerId.parse(q))
                if r.last_add_confirmed != n - 1 or len(r.read_batch(n - 1, n - 1)[0]) != 1024:
                    ok = False
            return secs, {"records": records, "replay_s": replay_s, "verified": "yes" if ok else "NO"}
        finally:
            log.close()
    t0 = perf()
    s = CLASSES[store](d)
    s.finish_writes()
    got = s.get(0, 0)
    secs = perf() - t0
    try:
        if got is None or len(bytes(got)) != 1024:
            raise AssertionError(f"{store}: entry (0, 0) lost after the crash")
        last = info["entries"] // 1000 - 1          # last batch: ledger last % 8
        l, e = last % NLEDGERS, (last // NLEDGERS) * 1000 + 999
        if s.get(l, e) is None:
            raise AssertionError(f"{store}: acknowledged entry ({l}, {e}) lost after the crash")
    finally:
        s.close()
    return secs, {}


# ----------------------------------------------------------------------------------------
# machine facts and output
# ----------------------------------------------------------------------------------------

def fdatasync_probe(root) -> dict:
    p = os.path.join(root, "fsync-probe")
    n, size = 200, 4096
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, bytes(n * size), 0)
        os.fsync(fd)
        buf = os.urandom(size)
        lat = []
        for i in range(n):
            t0 = perf()
            os.pwrite(fd, buf, i * size)
            os.fdatasync(fd)
            lat.append(perf() - t0)
    finally:
        os.close(fd)
        os.unlink(p)
    lat.sort()
    return {"median_us": statistics.median(lat) * 1e6, "p99_us": lat[int(n * 0.99) - 1] * 1e6,
            "mean_us": statistics.fmean(lat) * 1e6}


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def machine_facts(root) -> list:
    import embedlog
    probe = fdatasync_probe(root)
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except Exception:
        commit = "unknown"
    import lmdb
    import sqlite3
    try:
        from importlib.metadata import version
        rocks_v = version("rocksdict")
    except Exception:
        rocks_v = "?"
    return [
        f"- date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; "
        f"load average at start {loadavg()} (other work on this shared machine makes figures noisy)",
        f"- machine: nproc {len(os.sched_getaffinity(0))}, {platform.machine()}, "
        f"Linux {platform.release()}, Python {platform.python_version()}",
        f"- fdatasync probe (200 x pwrite 4 KiB + fdatasync on a pre-zeroed file in {root}): "
        f"median {probe['median_us']:.0f} us, mean {probe['mean_us']:.0f} us, "
        f"p99 {probe['p99_us']:.0f} us",
        f"- embedlog {embedlog.__version__} at {commit}; SQLite {sqlite3.sqlite_version}, "
        f"LMDB {'.'.join(map(str, lmdb.version()))} (py-lmdb {lmdb.__version__}), "
        f"rocksdict {rocks_v}",
    ]


def fmt(v, unit):
    if v is None:
        return "n/a"
    if unit == "s/GB":
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    if unit == "MB/s":
        return f"{v:,.0f}"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def table(results) -> list:
    out = ["| work | unit | embedlog | sqlite | lmdb | rocksdb | file | floor | design floor "
           "| floor, no zeros | embedlog/best peer | embedlog/floor | embedlog/design floor "
           "| embedlog/floor, no zeros |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
           "| ---: | ---: |"]
    for (work, unit), row in results.items():
        e = row.get("embedlog")
        cells = [work, unit, fmt(e, unit)]
        lower_better = unit == "s/GB"
        best, best_name = None, None
        for p in PEERS + REFERENCES:
            v = row.get(p)
            r = ratio(e, v)
            cells.append(fmt(v, unit) + (f" ({r:.2f}x)" if r is not None else ""))
            if p in PEERS and v is not None and (
                    best is None or (v < best if lower_better else v > best)):
                best, best_name = v, p
        r = ratio(e, best)
        cells.append(f"{r:.2f}x ({best_name})" if r is not None else "n/a")
        for ref in ("floor", "design", "nozeros"):
            r = ratio(e, row.get(ref))
            cells.append(f"{r:.2f}x" if r is not None else "n/a")
        out.append("| " + " | ".join(cells) + " |")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="0.5 s per item and store, small data")
    ap.add_argument("--out", help="also write the markdown report to this file")
    ap.add_argument("--only", help="comma-separated work items to run (for debugging)")
    ap.add_argument("--build-floor", action="store_true",
                    help="build the floor's native module (benchmarks/floor.pyx) and exit")
    ap.add_argument("--storage-layout", type=int, choices=(1, 2),
                    help="embedlog's storage_layout for its new directories (default: its own)")
    args = ap.parse_args(argv)
    if args.storage_layout:
        EMBEDLOG_DEFAULTS["storage_layout"] = args.storage_layout
    if args.build_floor:
        print(f"floor: {load_floor().__file__}")
        return 0
    budget = 0.5 if args.quick else 3.0
    root = tempfile.mkdtemp(prefix="embedlog-compare-", dir="/tmp")
    t_start = perf()
    try:
        facts = machine_facts(root)
        for line in facts:
            print(line, file=sys.stderr)
        r = Runner(root, budget, args.quick)
        items = [
            ("append_sync_100B", lambda: r.append_sync()),
            ("append_sync_100B_busy_wait", lambda: r.append_sync(
                "append_sync_100B_busy_wait", {"enable_busy_wait": True})),
            ("append_batch100_100B", lambda: r.batches("append_batch100_100B", 100, 100)),
            ("append_batch1000_100B", lambda: r.batches("append_batch1000_100B", 1000, 100)),
            ("append_batch1000_1KiB", lambda: r.batches("append_batch1000_1KiB", 1000, 1024, mbs=True)),
            ("append_batch1000_1KiB_steady", lambda: r.batches("append_batch1000_1KiB_steady", 1000,
                                                               1024, mbs=True, steady=True)),
            ("append_multi8x125_100B", lambda: r.multi()),
            ("append_concurrent16_100B", lambda: r.concurrent()),
            ("read", lambda: r.reads()),
            ("reopen_after_crash", lambda: r.crash()),
        ]
        only = set(args.only.split(",")) if args.only else None
        unknown = only - {name for name, _run in items} if only else set()
        if unknown:
            ap.error(f"--only: no work item {', '.join(sorted(unknown))}; "
                     f"the items are {', '.join(n for n, _r in items)}")
        for name, run in items:
            if only and name not in only:
                continue
            run()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    elapsed = perf() - t_start
    cmd = "python benchmarks/compare.py" + (" --quick" if args.quick else "") + (
        f" --storage-layout {args.storage_layout}" if args.storage_layout else "")
    lines = [f"Command: `{cmd}` ({elapsed:.0f} s; {budget:g} s per work item and store, "
             f"in {r.rounds} round-robin segments)", ""]
    lines += facts + [f"- load average at end {loadavg()}", ""]
    lines += table(r.results) + [""]
    lines.append("Cells show each store's figure and, in brackets, the ratio embedlog / it. "
                 "\"best peer\" is the best of SQLite, LMDB and RocksDB (highest throughput, "
                 "lowest s/GB); \"file\" writes records framed before the clock (the disk's "
                 "ceiling); \"floor\" is the least work for the same result as a bare C loop "
                 "(benchmarks/floor.pyx: V1 framing with one CRC32C pass, one pwrite and one "
                 "fdatasync per batch; reads from mapped files with digests checked); \"design "
                 "floor\" is the floor plus what else the durability contract writes: the same "
                 "records into an entry log file, unsynced, fdatasync'd every 64 MiB. "
                 "MB = 10^6 bytes of payload.")
    lines.append("")
    lines += ["- " + n for n in r.notes]
    lines += ["", "Spread (slowest..fastest segment) behind each median:", ""]
    for (work, unit), row in r.spread.items():
        lines.append(f"- {work} ({unit}): " + "; ".join(
            f"{name} {fmt(lo, unit)}..{fmt(hi, unit)}" for name, (lo, hi) in row.items()))
    if r.errors:
        lines.append("")
        lines.append("Errors:")
        lines += ["- " + e for e in r.errors]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 1 if r.errors else 0


if __name__ == "__main__":
    sys.exit(main())
