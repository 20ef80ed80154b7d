"""Ledger and journal directories: where they are, how full, and read-only mode.

A bookie has one journal directory and one or more ledger directories (BookKeeper's
journalDirectory and ledgerDirectories); each ledger directory holds a ``current/``
with entry logs, index files and a copy of the LastLogMark.

``DiskMonitor`` (BookKeeper's LedgerDirsMonitor) measures each directory's filesystem
every ``disk_check_interval_ms``:

| state    | when                                     | consequence                            |
| -------- | ---------------------------------------- | -------------------------------------- |
| ok       | usage < disk_usage_warn_threshold         | -                                      |
| warn     | usage >= disk_usage_warn_threshold        | major compaction stops                 |
| full     | usage >= disk_usage_threshold             | no new files there; minor compaction   |
|          |                                          | stops; the bookie turns read-only      |
| writable | a full disk's usage < disk_usage_lwm_threshold | it takes new files again; the bookie |
|          |                                          | turns writable when no disk is full    |
| no space | a write of the bookie's failed with ENOSPC | full at once, whatever its usage; writable |
|          |                                          | again only below the low-water mark and |
|          |                                          | with ``room_bytes`` more free than then |

The last row is the hysteresis that matters on a small disk: usage alone flapped (the
bookie's own trimming freed a little, it turned writable, the next add failed again).
While full, the checker looks every FULL_CHECK_S, so the state ends soon after the space
comes back. Before a directory on the journal's file system counts as short of room, what
the bookie keeps only to go faster is given back (``give_back``: the journal's files kept
for reuse).

Read-only mode is announced to ``listeners`` (callables taking ``full: bool``); the
bookie holds it as its "disk" reason for read-only mode (Bookie.set_read_only), beside an
operator's, and ``embedlog bookie serve`` re-registers the bookie when the state changes.
"""
from __future__ import annotations

import logging
import os
import threading

from embedlog.errors import ConfigError
from embedlog.fileio import no_space

log = logging.getLogger("embedlog.bookie.disks")
FULL_CHECK_S = 0.2


def disk_usage(path: str) -> tuple[float, int]:
    """(fraction of the filesystem used, bytes still usable) of the filesystem holding ``path``.

    Usage counts what an unprivileged writer cannot use (f_bavail), as BookKeeper's
    1 - usableSpace/totalSpace does."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    usable = st.f_bavail * st.f_frsize
    if total <= 0:
        return 0.0, usable
    return 1.0 - usable / total, usable


def resolve_dirs(home: str, config, journal_dir: str | None = None) -> tuple[list[str], str]:
    """(ledger directories, journal directory), absolute, from the configuration.

    ``ledger_directories`` empty means the bookie's own directory; ``journal_dir`` (an
    argument) wins over ``journal_directory``, which defaults to ``<home>/journal``."""
    raw = [p.strip() for p in config.ledger_directories.split(",") if p.strip()]
    ledger_dirs = [os.path.abspath(p) for p in raw] or [os.path.abspath(home)]
    if len(set(ledger_dirs)) != len(ledger_dirs):
        raise ConfigError(f"ledger_directories names a directory twice: {config.ledger_directories!r}")
    journal = os.path.abspath(journal_dir or config.journal_directory or os.path.join(home, "journal"))
    return ledger_dirs, journal


class DiskMonitor:
    """Disk usage of the ledger and journal directories, and the read-only decision."""

    def __init__(self, ledger_dirs: list[str], journal_dir: str, config, usage_fn=None):
        self.ledger_dirs = list(ledger_dirs)
        self.journal_dir = journal_dir
        self.config = config
        self.usage_fn = usage_fn or disk_usage
        self.full_dirs: set[str] = set()          # ledger dirs (and the journal's) now full
        self.usage: dict[str, float] = {}
        self.usable_bytes: dict[str, int] = {}
        self.full = False                         # read-only demanded by the disks
        # dir -> usable bytes when one of the bookie's writes there failed for lack of space
        self.no_space_at: dict[str, int] = {}
        # what the bookie writes first when it takes adds again: a journal preallocation and
        # an entry log's allocation chunk (entrylog.pyx ALLOC_CHUNK)
        self.room_bytes = (config.journal_pre_alloc_size_mb << 20) + (8 << 20)
        self.listeners: list = []
        # () -> bytes freed: what the bookie keeps only to go faster (the journal's files
        # kept for reuse), given back before a disk it shares with the journal counts as short
        self.give_back = None
        self.checks = 0
        self._turn = 0
        self.stats = {"checks": 0, "read_only_flips": 0, "writable_flips": 0, "check_errors": 0}
        self._cv = threading.Condition()
        self._notify_lock = threading.Lock()      # listeners hear each change once, in order
        self._delivered = False
        self._stop = threading.Event()
        self._wake = threading.Event()            # stop, or turned full: check more often
        self._thread: threading.Thread | None = None

    # -- measuring ----------------------------------------------------------------------

    def _measure(self, path: str) -> tuple[float, int]:
        usage, usable = self.usage_fn(path)
        self.usage[path] = usage
        self.usable_bytes[path] = usable
        return usage, usable

    def check(self, exc: BaseException | None = None) -> bool:
        """Measure every directory now, update the state, tell listeners if read-only mode
        changed. Returns True if the bookie should be read-only.

        ``exc``: a write of the bookie's that failed; a full disk (ENOSPC, EDQUOT) makes the
        directories without room for ``room_bytes`` full at once, whatever their usage."""
        cfg = self.config
        with self._cv:
            measured = self._measure_all()
            gave_back = False
            if self.give_back is not None and self._pressed(measured, exc):
                gave_back = self.give_back() > 0
                if gave_back:
                    measured = self._measure_all()
            if no_space(exc) and not (gave_back and not self._pressed(measured, None)):
                short = [d for d, (_u, free) in measured.items() if free < self.room_bytes]
                for d in short or list(measured):
                    if d not in self.no_space_at:
                        log.warning("%s: no space left (%s)", d, exc)
                    self.no_space_at[d] = min(measured[d][1], self.no_space_at.get(d, 1 << 62))
            for d, (usage, usable) in measured.items():
                if d in self.no_space_at:
                    if usage < cfg.disk_usage_lwm_threshold and \
                            usable >= self.no_space_at[d] + self.room_bytes:
                        del self.no_space_at[d]
                    else:
                        self.full_dirs.add(d)
                        continue
                if d in self.full_dirs:
                    if usage < cfg.disk_usage_lwm_threshold:
                        self.full_dirs.discard(d)
                        log.warning("%s is writable again (%.1f%% used)", d, usage * 100)
                elif usage >= cfg.disk_usage_threshold:
                    self.full_dirs.add(d)
                    log.warning("%s is full (%.1f%% used)", d, usage * 100)
            full_ledger = [d for d in self.ledger_dirs if d in self.full_dirs]
            if cfg.read_only_mode_on_any_disk_full_enabled:
                full = bool(full_ledger)
            else:
                full = len(full_ledger) == len(self.ledger_dirs)
            full = full or self.journal_dir in self.full_dirs
            if full != self.full:
                self.full = full
                self.stats["read_only_flips" if full else "writable_flips"] += 1
                if full:
                    self._wake.set()          # the checker's wait was the long one
            self.checks += 1
            self.stats["checks"] = self.checks
            self._cv.notify_all()
        # checks run in several threads (the checker, a failed flush, a failed checkpoint):
        # deliver the state as it is now, so the last word is always the current one
        with self._notify_lock:
            full = self.full
            if full != self._delivered:
                self._delivered = full
                for listener in list(self.listeners):
                    listener(full)
        return self.full

    def _measure_all(self) -> dict:
        measured = {}
        for d in self.ledger_dirs + [self.journal_dir]:
            try:
                measured[d] = self._measure(d)
            except OSError:
                self.stats["check_errors"] += 1
                log.exception("cannot measure the disk of %s", d)
                measured[d] = (1.0, 0)          # a directory we cannot stat takes nothing new
        return measured

    def _pressed(self, measured: dict, exc) -> bool:
        """Whether a directory on the journal's file system is short of room: a write
        there was refused, or it is at disk_usage_warn_threshold, or has less than
        room_bytes usable."""
        try:
            dev = os.stat(self.journal_dir).st_dev
        except OSError:
            return False
        for d, (usage, usable) in measured.items():
            try:
                if os.stat(d).st_dev != dev:
                    continue
            except OSError:
                continue
            if (no_space(exc) or d in self.no_space_at or usable < self.room_bytes
                    or usage >= self.config.disk_usage_warn_threshold):
                return True
        return False

    def pressure(self) -> str:
        """'full', 'warn' or 'ok': the worst of the ledger directories (last measured)."""
        cfg = self.config
        worst = max((self.usage.get(d, 0.0) for d in self.ledger_dirs), default=0.0)
        if any(d in self.full_dirs for d in self.ledger_dirs) or worst >= cfg.disk_usage_threshold:
            return "full"
        if worst >= cfg.disk_usage_warn_threshold:
            return "warn"
        return "ok"

    def choose_dir(self, need_bytes: int = 0) -> str:
        """The ledger directory for a new file: among the writable ones with room for
        ``need_bytes``, the one with the most usable space (measured now), taking turns
        between those within 1% of it (directories sharing a filesystem); if none is
        writable, the one with the most usable space anyway (the write then fails cleanly)."""
        if len(self.ledger_dirs) == 1:
            return self.ledger_dirs[0]
        measured = []
        for d in self.ledger_dirs:
            try:
                usage, usable = self._measure(d)
            except OSError:
                continue
            measured.append((d, usage, usable))
        if not measured:
            return self.ledger_dirs[0]
        ok = [(d, u) for d, usage, u in measured
              if d not in self.full_dirs and usage < self.config.disk_usage_threshold
              and u >= need_bytes]
        pool = ok or [(d, u) for d, _usage, u in measured]
        best = max(u for _d, u in pool)
        ties = [d for d, u in pool if u >= best * 0.99]
        self._turn += 1
        return ties[self._turn % len(ties)]

    # -- the checker thread -----------------------------------------------------------------

    def start(self) -> None:
        self.check()
        interval_s = self.config.disk_check_interval_ms / 1000.0
        if interval_s <= 0:
            return
        t = threading.Thread(target=self._loop, args=(interval_s,), name="embedlog-disk-check",
                             daemon=True)
        t.start()
        self._thread = t                    # once started: stop() joins only a started thread

    def _loop(self, interval_s: float) -> None:
        # while full, a statvfs every FULL_CHECK_S: the bookie is writable again within a
        # second of the space coming back, not an interval (10 s by default) later
        while True:
            self._wake.wait(min(interval_s, FULL_CHECK_S) if self.full else interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception:                       # keep checking: a listener failed
                self.stats["check_errors"] += 1
                log.exception("disk check failed")

    def wait_checked(self, after: int, timeout_s: float) -> bool:
        """Wait until more than ``after`` checks have run (tests); False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: self.checks > after, timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def snapshot(self) -> dict:
        with self._cv:
            return {"read_only": self.full, "full_dirs": sorted(self.full_dirs),
                    "no_space_at": dict(self.no_space_at),
                    "usage": dict(self.usage), "usable_bytes": dict(self.usable_bytes),
                    **self.stats}

