"""Entry-log compaction: rewrite the live entries of mostly-dead entry logs, then delete them.

Each sealed entry log carries a ledgers map (bytes per ledger); a log's *usage* is the
share of those bytes that belongs to ledgers the bookie still holds (recounted entry by
entry against the index for logs without a map and for ledgers whose entries were
erased since: stream truncation and retention). GC deletes logs with usage 0 outright;
compaction rewrites logs under the minor (0.2) or major (0.8) threshold.

One compaction is a transaction, BookKeeper's TransactionalEntryLogCompactor with
several source logs per target. Its steps, and what a crash (SIGKILL) after each
leaves and what start-up does about it (``recover``):

| step | writes                                                     | after a crash here          |
| ---- | ---------------------------------------------------------- | --------------------------- |
| 1    | live entries of the sources into ``<T>.log.compacting``,   | delete the .compacting file |
|      | sealed (ledgers map) and fsynced                           |                             |
| 2    | manifest ``<T>.compaction`` = target + sources, fsynced     | roll forward: steps 3-6     |
|      | (the commit point)                                         |                             |
| 3    | rename ``<T>.log.compacting`` -> ``<T>.log`` (readable now) | roll forward                |
| 4    | index: each entry still located in a source now points     | roll forward (idempotent:   |
|      | into T; entry logs, then those index files, fsynced        | only locations still in a   |
|      |                                                            | source are moved)           |
| 5    | delete the sources                                         | roll forward                |
| 6    | delete the manifest                                        | nothing left to do          |

The index moves only after the target is durable (steps 1-3), and only entries the
index still places in a source move, so an entry rewritten, truncated or deleted
meanwhile keeps what it has; nothing is lost and nothing is left behind.

Layout 2: a source may be a journal segment (``<id>.seg`` in the journal directory, below
the LastLogMark), named by its log id ``1 << 31 | segment`` as its index locations name it.
Its live entries are copied into the target entry log like an entry log's; step 5 deletes
the ``.seg`` and its ``.seg.map`` (or the journal keeps the ``.seg`` for reuse, as after
GC), unless some index location still names the segment
(entries its scan could not reach, past a damaged record): that segment is kept, and
GC's segment deletion frees it once nothing names it. A ``.txn`` file is never a source:
the journal may still replay it.

Manifest (text)::

    manifest := "embedlog-compaction\\t1\\n" "target=" hex "\\n" "sources=" hex ("," hex)* "\\n"
                "crc=" crc32c-of-the-lines-above:08x "\\n"
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

from embedlog._native import entrylog as nel
from embedlog._native.format import crc32c
from embedlog import failpoints
from embedlog import fileio
from embedlog.bookie import journal_files
from embedlog.fileio import atomic_write, fsync_dir, no_space
from embedlog.errors import CorruptedDataError

log = logging.getLogger("embedlog.bookie.compaction")

MANIFEST_MAGIC = b"embedlog-compaction\t1\n"
MAP_ENTRY_BYTES = 24
MAP_FIXED_BYTES = 12
SEGMENT_LOG = 1 << 31             # a log id with this bit names a journal segment (layout 2)
ENTRY_LOG_RECORD = 4              # bytes an entry costs beside its own in an entry log (size)
SEGMENT_RECORD = 9                # ... and in a journal segment (len, crc, type)


def is_segment(log_id: int) -> bool:
    return bool(log_id & SEGMENT_LOG)


class EntryLogMeta:
    """What GC knows of one sealed entry log: bytes per ledger, and exact live bytes per
    ledger once recounted against the index."""

    __slots__ = ("log_id", "ledgers", "total_bytes", "exact", "recount", "file_bytes", "path")

    def __init__(self, log_id: int, ledgers: dict, recount: bool, file_bytes: int, path=None):
        self.log_id = log_id
        self.ledgers = ledgers
        self.total_bytes = sum(ledgers.values())
        self.exact: dict = {}
        self.recount = recount
        self.file_bytes = file_bytes
        self.path = path                  # a segment's file (an entry log's is the logger's)

    @property
    def record_bytes(self) -> int:
        """Bytes each entry costs beside its own in this file (its map counts them)."""
        return SEGMENT_RECORD if is_segment(self.log_id) else ENTRY_LOG_RECORD

    def live_bytes(self, live_keys) -> int:
        exact = self.exact
        return sum(exact.get(k, n) for k, n in self.ledgers.items() if k in live_keys)

    def usage(self, live_keys) -> float:
        if self.total_bytes <= 0:
            return 0.0
        return min(1.0, self.live_bytes(live_keys) / self.total_bytes)


class RateLimiter:
    """A token bucket (per second) with at most one second of burst; waits on ``stop``."""

    def __init__(self, rate_per_s: float, stop):
        self.rate = max(float(rate_per_s), 1e-9)
        self.stop = stop
        self._t = time.monotonic()

    def acquire(self, n: float) -> None:
        now = time.monotonic()
        self._t = max(self._t, now - 1.0) + n / self.rate
        wait_s = self._t - now
        if wait_s > 0:
            self.stop.wait(wait_s)


def group_by_ledger(scopes, lids):
    """(order, starts, ends): indexes sorting the arrays by (scope, ledger), and the
    bounds of each ledger's run in that order."""
    order = np.lexsort((lids, scopes))
    s, l = scopes[order], lids[order]
    if len(order) == 0:
        return order, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    change = np.flatnonzero((s[1:] != s[:-1]) | (l[1:] != l[:-1])) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [len(order)]))
    return order, starts, ends


def live_mask(storage, ledgers, scopes, lids, eids, locs) -> np.ndarray:
    """True for each entry whose ledger is held and whose index points at that very copy,
    and for every entry of a held ledger whose index was rebuilt (``storage.pinned``)."""
    mask = np.zeros(len(locs), dtype=bool)
    order, starts, ends = group_by_ledger(scopes, lids)
    pinned = getattr(storage, "pinned", ())
    for a, b in zip(starts.tolist(), ends.tolist()):
        sel = order[a:b]
        key = (int(scopes[sel[0]]), int(lids[sel[0]]))
        idx = ledgers.get(key)
        if idx is None or idx.deleted:
            continue
        if key in pinned:
            mask[sel] = True
            continue
        with storage.lock:
            mask[sel] = idx.match_locations(eids[sel], locs[sel])
    return mask


def write_manifest(path: str, target: int, sources: list[int]) -> None:
    body = (MANIFEST_MAGIC + f"target={target:x}\n".encode()
            + ("sources=" + ",".join(f"{s:x}" for s in sources) + "\n").encode())
    body += f"crc={crc32c(body):08x}\n".encode()
    atomic_write(path, body)


def read_manifest(path: str) -> tuple[int, list[int]]:
    data = open(path, "rb").read()
    body, sep, tail = data.rpartition(b"crc=")
    try:
        if not body.startswith(MANIFEST_MAGIC) or not sep or int(tail.strip(), 16) != crc32c(body):
            raise ValueError("bad header or checksum")
        lines = dict(line.split("=", 1) for line in body[len(MANIFEST_MAGIC):].decode().splitlines())
        return int(lines["target"], 16), [int(x, 16) for x in lines["sources"].split(",") if x]
    except (ValueError, KeyError) as exc:
        raise CorruptedDataError(f"compaction manifest {path} is damaged ({exc})") from None


class _Plan:
    """One source log, opened (a mapping of its own), with its live entries."""

    def __init__(self, log_id, mapped, locs, sizes, scopes, lids, eids):
        self.log_id = log_id
        self.mapped = mapped
        self.locs, self.sizes, self.scopes, self.lids, self.eids = locs, sizes, scopes, lids, eids
        self.live_bytes = int(sizes.sum(dtype=np.int64)) + 4 * len(sizes)
        self.keys = set(zip(scopes.tolist(), lids.tolist())) if len(sizes) else set()
        self.file_bytes = os.path.getsize(mapped.path)

    def close(self):
        self.mapped.close()


class Compactor:
    """Runs compaction transactions for a bookie's ledger storage (the GC thread's)."""

    def __init__(self, storage, ledgers, config, disks, stop, stats, retire_segment=None):
        self.storage = storage
        self.retire_segment = retire_segment  # JournalFiles.retire_segment (stem -> whether it went)
        self.ledgers = ledgers            # the bookie's SortedDict (scope, lid) -> LedgerIndex
        self.config = config
        self.disks = disks
        self.stop = stop
        self.stats = stats
        self.bad_logs: set = set()        # logs that failed to parse: reported once, skipped
        self.unfinished: list = []        # (current dir, manifest) whose _finish failed here

    @property
    def entry_logger(self):
        return self.storage.entry_logger

    # -- planning ---------------------------------------------------------------------------

    def segment_path(self, log_id: int) -> str | None:
        """A segment's ``.seg`` file (None if it has none: freed, or still a ``.txn`` the
        journal may replay, which is never compacted)."""
        stem = (self.entry_logger.segment_files or {}).get(log_id & ~SEGMENT_LOG)
        if stem is None or not os.path.exists(stem + journal_files.SEG):
            return None
        return stem + journal_files.SEG

    def plan(self, log_id: int) -> _Plan | None:
        el = self.entry_logger
        try:
            if is_segment(log_id):
                path = self.segment_path(log_id)
                if path is None:
                    return None
                mapped = nel.MappedLog.open_segment(path, log_id)
            else:
                mapped = nel.MappedLog.open_existing(el.path_of(log_id), log_id)
        except FileNotFoundError:
            return None
        try:
            locs, sizes, scopes, lids, eids = mapped.entry_table()
            mask = live_mask(self.storage, self.ledgers, scopes, lids, eids, locs)
            order = np.lexsort((eids, lids, scopes))          # copy sorted by ledger, entry
            keep = order[mask[order]]
            return _Plan(log_id, mapped, locs[keep], sizes[keep], scopes[keep], lids[keep],
                         eids[keep])
        except BaseException:
            mapped.close()
            raise

    def _limiter(self):
        cfg = self.config
        if cfg.is_throttle_by_bytes:
            return RateLimiter(cfg.compaction_rate_by_bytes, self.stop), True
        return RateLimiter(cfg.compaction_rate_by_entries, self.stop), False

    # -- one transaction ----------------------------------------------------------------------

    def compact(self, log_ids: list[int], may_continue=lambda: True) -> int:
        """Compact the given logs (lowest usage first), as many targets as needed. Returns
        the bytes given back. ``may_continue()`` is asked before each source (disk pressure)."""
        freed = 0
        pending = list(log_ids)
        limiter = self._limiter()
        capacity = self.config.entry_log_size_limit - nel.HEADER_SIZE
        carried: _Plan | None = None
        try:
            while (pending or carried) and not self.stop.is_set():
                plans: list[_Plan] = []
                keys: set = set()
                size = 0
                while (pending or carried) and not self.stop.is_set() and may_continue():
                    if carried is not None:
                        p, carried = carried, None
                    else:
                        log_id = pending.pop(0)
                        if log_id in self.bad_logs:
                            continue
                        try:
                            p = self.plan(log_id)
                        except CorruptedDataError as exc:
                            # a damaged log is left as it is (its entries may still be read
                            # where intact); the rest of the candidates go on
                            self.bad_logs.add(log_id)
                            self.stats["compaction_errors"] = self.stats.get("compaction_errors", 0) + 1
                            log.error("cannot compact %s: %s", _name(log_id), exc)
                            continue
                    if p is None:
                        continue
                    reserve = MAP_FIXED_BYTES + MAP_ENTRY_BYTES * len(keys | p.keys)
                    if plans and size + p.live_bytes + reserve > capacity:
                        carried = p
                        break
                    plans.append(p)
                    keys |= p.keys
                    size += p.live_bytes
                if not plans:
                    break
                try:
                    freed += self._transaction(plans, size, len(keys), limiter)
                except _Abandoned:
                    break
                finally:
                    for p in plans:
                        p.close()
                if not may_continue():
                    break
        finally:
            if carried is not None:
                carried.close()
        return freed

    def _transaction(self, plans: list[_Plan], live_bytes: int, nkeys: int, limiter) -> int:
        el = self.entry_logger
        st = self.storage
        limit = max(self.config.entry_log_size_limit,
                    nel.HEADER_SIZE + live_bytes + MAP_FIXED_BYTES + MAP_ENTRY_BYTES * nkeys)
        with st.lock:
            target_id = el.allocate_log_id()
        current = self._choose_current(limit)
        tmp_path = os.path.join(current, "%x.log.compacting" % target_id)
        target = nel.MappedLog.create(tmp_path, target_id, limit)
        fsync_dir(current)
        new_locs = []
        ledgers_map: dict = {}
        limiter, by_bytes = limiter
        batch = max(1, int(limiter.rate // 10))
        try:
            for p in plans:
                out = np.zeros(len(p.locs), dtype=np.uint64)
                cum = np.cumsum(p.sizes.astype(np.int64) + 4)
                i = 0
                while i < len(p.locs):
                    if self.stop.is_set():
                        raise _Abandoned()
                    if by_bytes:
                        # a batch of about a tenth of a second's bytes
                        base = int(cum[i - 1]) if i else 0
                        j = int(np.searchsorted(cum, base + limiter.rate / 10, side="right"))
                        j = min(len(p.locs), max(j, i + 1))
                    else:
                        j = min(len(p.locs), i + batch)
                    n, locs = target.copy_entries(p.mapped, p.locs[i:j])
                    if n != j - i:
                        raise CorruptedDataError(
                            f"compaction target {tmp_path} ran out of room ({limit} bytes)")
                    out[i:j] = locs
                    # write back as we go: a seal that flushed the whole target at once
                    # would stall the journal's fdatasync behind it
                    target.flush()
                    limiter.acquire(int(p.sizes[i:j].sum(dtype=np.int64)) + 4 * (j - i)
                                    if by_bytes else j - i)
                    self.stats["compacted_entries"] += j - i
                    self.stats["compacted_bytes"] += int(p.sizes[i:j].sum(dtype=np.int64))
                    failpoints.hit("compaction.during_copy")
                    i = j
                new_locs.append(out)
                for (s, l), n in zip(zip(p.scopes.tolist(), p.lids.tolist()), (p.sizes + 4).tolist()):
                    ledgers_map[(s, l)] = ledgers_map.get((s, l), 0) + n
            target.seal(ledgers_map)                       # step 1: sealed and fsynced
        except BaseException:
            target.close()
            fileio.unlink(tmp_path)
            raise
        failpoints.hit("compaction.after_write")
        sources = [p.log_id for p in plans]
        manifest = os.path.join(current, "%x.compaction" % target_id)
        write_manifest(manifest, target_id, sources)       # step 2: the commit point
        failpoints.hit("compaction.after_manifest")
        try:
            self._finish(current, target_id, sources, manifest,
                         [(p.scopes, p.lids, p.eids, locs) for p, locs in zip(plans, new_locs)])
        except BaseException:
            # past the commit point: finish_pending rolls it forward before GC takes a log
            self.unfinished.append((current, manifest))
            raise
        freed = sum(p.file_bytes for p in plans) - os.path.getsize(os.path.join(current, "%x.log" % target_id))
        self.stats["compactions"] += 1
        self.stats["compacted_logs"] += len(plans)
        self.stats["reclaimed_bytes"] += max(0, freed)
        log.info("compacted %s into entry log %x (%d bytes given back)",
                 ", ".join(map(_name, sources)), target_id, freed)
        return max(0, freed)

    def _choose_current(self, need_bytes: int) -> str:
        if self.disks is not None:
            return os.path.join(self.disks.choose_dir(need_bytes), "current")
        return self.storage.current_dirs[0]

    # -- steps 3-6, shared with recovery ----------------------------------------------------------

    def _finish(self, current: str, target_id: int, sources: list[int], manifest: str,
                moved: list) -> None:
        el = self.entry_logger
        st = self.storage
        tmp_path = os.path.join(current, "%x.log.compacting" % target_id)
        path = os.path.join(current, "%x.log" % target_id)
        if os.path.exists(tmp_path):
            fileio.replace(tmp_path, path)                 # step 3
        with st.lock:
            el.register(target_id, current)
        failpoints.hit("compaction.after_rename")
        src = np.array(sorted(sources), dtype=np.uint64)
        touched = []
        for scopes, lids, eids, locs in moved:             # step 4
            order, starts, ends = group_by_ledger(scopes, lids)
            for a, b in zip(starts.tolist(), ends.tolist()):
                sel = order[a:b]
                key = (int(scopes[sel[0]]), int(lids[sel[0]]))
                with st.lock:                              # drop_ledger's: deleted, or not
                    idx = self.ledgers.get(key)
                    if idx is not None and not idx.deleted and \
                            idx.replace_locations(eids[sel], locs[sel], src):
                        touched.append(idx)
        with st.lock:
            el.flush()                                     # what the index may point at is durable
            for idx in touched:
                if not idx.deleted:                        # deleted since: its file is gone
                    idx.flush(False)
        # fsync outside the storage lock: memtable flushes (and so adds) go on meanwhile
        for path in sorted({idx.path for idx in touched}):
            _fsync_file(path)
        failpoints.hit("compaction.after_index_flush")
        dirs = set()
        named = st.segments_in_use() if any(map(is_segment, sources)) else set()
        for s in sources:                                  # step 5
            if is_segment(s):
                d = self._delete_segment(s, named)
                if d is not None:
                    dirs.add(d)
                continue
            with st.lock:
                d = el.dir_of(s)
                spath = el.path_of(s)
                el.unregister(s)
            if fileio.unlink(spath):
                dirs.add(d or os.path.dirname(spath))
        for d in dirs:
            fsync_dir(d)
        failpoints.hit("compaction.after_delete_sources")
        fileio.unlink(manifest)                            # step 6
        fsync_dir(current)

    def _delete_segment(self, log_id: int, named: set) -> str | None:
        """Step 5 for a segment source: its ``.seg`` and ``.seg.map`` go, unless an index
        location still names it (then it stays for GC). Returns the directory to sync."""
        segment = log_id & ~SEGMENT_LOG
        if segment in named:
            # entries the plan's scan did not reach (past a record that fails its crc):
            # never delete what an index names; GC frees the segment once nothing does
            self.bad_logs.add(log_id)
            log.warning("journal segment %d still holds indexed entries after its compaction; "
                        "it is kept", segment)
            return None
        with self.storage.lock:
            stem = (self.entry_logger.segment_files or {}).get(segment)
            self.entry_logger.drop_segment(segment)
        if stem is None:
            return None
        # the journal keeps it for reuse, or deletes it
        gone = (self.retire_segment or journal_files.delete_segment)(stem)
        if gone:
            self.stats["segments_deleted"] = self.stats.get("segments_deleted", 0) + 1
        return os.path.dirname(stem)

    def _roll_forward(self, current: str, manifest: str) -> int:
        """Steps 3-6 again for a compaction past its commit point (its manifest written, not
        yet removed), from what its target holds. Returns the target's id."""
        target_id, sources = read_manifest(manifest)
        tpath = os.path.join(current, "%x.log" % target_id)
        tmp_path = tpath + ".compacting"
        if not os.path.exists(tmp_path) and not os.path.exists(tpath):
            raise CorruptedDataError(
                f"compaction manifest {manifest} names target log {target_id:x}, which is gone")
        readable = tmp_path if os.path.exists(tmp_path) else tpath
        m = nel.MappedLog.open_existing(readable, target_id)
        try:
            locs, _sizes, scopes, lids, eids = m.entry_table()
        finally:
            m.close()
        self._finish(current, target_id, sources, manifest, [(scopes, lids, eids, locs)])
        return target_id

    def finish_pending(self) -> list:
        """Roll forward the compactions whose _finish failed in this process (a full disk,
        an I/O error): GC calls it before it looks at any log, so a target its manifest still
        names is never collected (a restart would find the manifest and no target)."""
        done = []
        while self.unfinished:
            current, manifest = self.unfinished[0]
            if os.path.exists(manifest):      # else it failed after its last step's unlink
                done.append(self._roll_forward(current, manifest))
            self.unfinished.pop(0)
        return done

    # -- start-up ---------------------------------------------------------------------------------

    def recover(self) -> dict:
        """Finish or undo compactions a crash interrupted, and seal logs a crash left unsealed.
        Runs after the index files are loaded and before the journal is replayed."""
        report = {"rolled_forward": [], "discarded": [], "sealed": []}
        el = self.entry_logger
        for current in self.storage.current_dirs:
            names = sorted(os.listdir(current))
            manifests = {n for n in names if n.endswith(".compaction")}
            for name in sorted(manifests):
                path = os.path.join(current, name)
                report["rolled_forward"].append(self._roll_forward(current, path))
            for name in names:
                if name.endswith(".log.compacting"):
                    target = name[:-len(".log.compacting")]
                    if f"{target}.compaction" in manifests:
                        continue
                    fileio.unlink(os.path.join(current, name))
                    report["discarded"].append(name)
                elif name.endswith(".tmp") and name[:-4].endswith(".compaction"):
                    fileio.unlink(os.path.join(current, name))
            if report["discarded"]:
                fsync_dir(current)
        for log_id in el.log_ids():
            path = el.path_of(log_id)
            with open(path, "rb") as f:
                head = f.read(nel.HEADER_SIZE)
            if not head.strip(b"\0"):
                # created, then killed before its header reached the page cache: appends
                # only follow a written header, so it never held an entry
                fileio.unlink(path)
                el.forget(log_id)
                report["discarded"].append(os.path.basename(path))
                fsync_dir(os.path.dirname(path))
                continue
            try:
                m = nel.MappedLog.open_existing(path, log_id)
            except CorruptedDataError as exc:
                # one damaged log must not keep every ledger from being served: its
                # entries are refused on read, the scrub and the shell's check report it
                log.error("entry log %s is damaged and left as it is: %s", path, exc)
                report.setdefault("damaged", []).append(log_id)
                continue
            try:
                sealed = m.sealed
            finally:
                m.close()
            if sealed:
                continue
            m = nel.MappedLog.open_writable(path, log_id)
            try:
                m.seal(m.scanned_ledgers())
                report["sealed"].append(log_id)
            except OSError as exc:
                if not no_space(exc):
                    raise
                # a full disk: the log stays unsealed (read by a scan) until a start with
                # room; the bookie starts read-only meanwhile (disks.py)
                log.warning("entry log %s left unsealed: %s", path, exc)
                report.setdefault("unsealed", []).append(log_id)
            finally:
                m.close()
        return report


def _name(log_id: int) -> str:
    return ("journal segment %d" % (log_id & ~SEGMENT_LOG) if is_segment(log_id)
            else "entry log %x" % log_id)


class _Abandoned(Exception):
    """The bookie is closing: the transaction stops before its commit point."""


def _fsync_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:          # the ledger was deleted meanwhile
        return
    try:
        fileio.sync(fd, path, os.fstat(fd).st_size)
    finally:
        os.close(fd)
