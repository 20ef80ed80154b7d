"""Soak: write and delete ledgers for a while with garbage collection and compaction running;
print disk usage, live data and throughput over time.

    python tools/gc_soak.py --duration-s 720 [--dir D] [--alternate-s 60] [--storage-layout 1|2]

Writers append ``--entry-bytes`` entries in batches (append_many) to ledgers of
``--ledger-entries`` entries, then close them; a deleter keeps about ``--retain-mb`` of
live data by deleting closed ledgers at random (random deletes leave entry logs partly
live, which is what compaction is for). GC runs every ``--gc-wait-ms`` with minor and
major compaction on short intervals.

With ``--alternate-s N`` compaction is switched off and on every N seconds (a window each),
so write throughput with and without compaction is measured in the same run, on the same
disk state; the summary compares windows in which compaction rewrote data with windows in
which it was off (leaving out the first window, the warm-up of an empty bookie). Every ``--report-s`` a line shows: elapsed time, MB written and MB/s in
the interval, live ledgers and MB, MB the bookie takes on disk (entry logs, index, journal),
entry logs (layout 2: and journal segments), whether compaction is on, and MB compacted /
given back by GC since the start.
At the end, every live ledger is read back and checked, and one more GC cycle (a forced
major compaction) must leave no file that holds only deleted ledgers (positive deletion):
every entry log and segment left has live data, each segment left is named by the index, and
no compaction file (``.compacting``, ``.compaction``) is left.

Half the deletes remove the ledger's metadata only, as another BookKeeper client's deletion
does: the bookie's GC finds those ledgers gone and drops them itself.

With ``--kill-cycles N`` the soak runs N times in a child process on the same directory,
each armed to die by SIGKILL at a random GC or compaction failure point (embedlog.failpoints,
on its 1st to 5th hit) or to end after ``--duration-s``; after each, this process reopens
the directory, reads back every closed ledger not deleted, checks that no ledger whose
deletion returned is still held once GC has run, and makes the same positive-deletion check.

``--storage-layout`` picks the layout of a new directory (default: the engine's, layout 2:
the journal's files are the entries' storage, GC deletes a segment no index names and
compaction copies a mostly dead one into an entry log); ``--journal-mb`` is the journal
file size, so in layout 2 the segment size.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import embedlog  # noqa: E402
from embedlog import LedgerId  # noqa: E402
from embedlog.config import BookieConfig  # noqa: E402
from embedlog.errors import NoSuchLedgerError  # noqa: E402

# where --kill-cycles kills the child: garbage collection and compaction (embedlog/failpoints.py)
KILL_POINTS = ("gc.before_delete_ledger", "gc.after_delete_ledger", "gc.before_delete_log",
               "gc.before_delete_segment", "compaction.during_copy", "compaction.after_write",
               "compaction.after_manifest", "compaction.after_rename",
               "compaction.after_index_flush", "compaction.after_delete_sources")


def entry(q: str, e: int, n: int) -> bytes:
    seed = hashlib.blake2b(f"{q}/{e}".encode(), digest_size=32).digest()
    return (seed * (n // 32 + 1))[:n]


def disk_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


class Soak:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.closed: list[tuple[str, int]] = []        # (qualified name, entries)
        self.live_bytes = 0
        self.live_ledgers = 0
        self.written_bytes = 0
        self.written_entries = 0
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        # a child's word to the --kill-cycles parent: one write(2) a line, so a line is whole
        # even when SIGKILL comes next, and never split by another thread's print
        self.notes = (os.open(args.notes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                      if args.notes else -1)

    def note(self, line: str) -> None:
        """What is closed, what is being deleted, what is deleted (--kill-cycles)."""
        if self.notes >= 0:
            os.write(self.notes, (line + "\n").encode())

    def writer(self, log, seed: int) -> None:
        a = self.args
        rnd = random.Random(seed)
        try:
            while not self.stop.is_set():
                w = log.create_ledger()
                q = w.ledger_id.qualified_name
                with self.lock:
                    self.live_ledgers += 1
                e = 0
                while e < a.ledger_entries and not self.stop.is_set():
                    n = min(a.batch, a.ledger_entries - e)
                    w.append_many([entry(q, e + i, a.entry_bytes) for i in range(n)])
                    e += n
                    with self.lock:
                        self.written_bytes += n * a.entry_bytes
                        self.written_entries += n
                        self.live_bytes += n * a.entry_bytes
                w.close()
                self.note(f"CLOSED {q} {e}")
                with self.lock:
                    self.closed.append((q, e))
                rnd.random()
        except BaseException as exc:          # reported at the end
            self.errors.append(exc)
            self.stop.set()

    def deleter(self, log, seed: int) -> None:
        rnd = random.Random(seed)
        retain = self.args.retain_mb << 20
        try:
            while not self.stop.wait(0.05):
                while True:
                    with self.lock:
                        if self.live_bytes <= retain or not self.closed:
                            break
                        q, n = self.closed.pop(rnd.randrange(len(self.closed)))
                        self.live_bytes -= n * self.args.entry_bytes
                        self.live_ledgers -= 1
                    self.note(f"DELETING {q}")
                    if rnd.random() < 0.5:
                        log.delete_ledger(LedgerId.parse(q))
                    else:              # metadata only: the bookie's GC drops the ledger
                        log.metadata.ledger_manager.remove_ledger_metadata(LedgerId.parse(q))
                    self.note(f"DELETED {q}")
        except BaseException as exc:
            self.errors.append(exc)
            self.stop.set()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None, help="bookie directory (default: a new temporary one)")
    p.add_argument("--duration-s", type=float, default=600)
    p.add_argument("--report-s", type=float, default=30)
    p.add_argument("--alternate-s", type=float, default=60,
                   help="switch compaction off/on every N s (0: always on)")
    p.add_argument("--no-compaction", action="store_true", help="compaction off all the time")
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--entry-bytes", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64, help="entries per append_many")
    p.add_argument("--ledger-entries", type=int, default=1024)
    p.add_argument("--retain-mb", type=int, default=512, help="live data kept (MiB)")
    p.add_argument("--entry-log-mb", type=int, default=64)
    p.add_argument("--gc-wait-ms", type=int, default=2000)
    p.add_argument("--minor-interval-s", type=int, default=10)
    p.add_argument("--major-interval-s", type=int, default=30)
    p.add_argument("--compaction-rate-mb", type=float, default=16,
                   help="compaction_rate_by_bytes in MiB/s (is_throttle_by_bytes)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--storage-layout", type=int, choices=(1, 2), default=BookieConfig().storage_layout,
                   help="layout of a new directory (default: the engine's, %(default)s)")
    p.add_argument("--journal-mb", type=int, default=64,
                   help="journal_max_size_mb (layout 2: the segment size)")
    p.add_argument("--kill-cycles", type=int, default=0,
                   help="run as N children, each SIGKILLed at a random GC or compaction "
                        "failure point (or ending after --duration-s), checked after each")
    p.add_argument("--kill-points", default=",".join(KILL_POINTS),
                   help="the failure points --kill-cycles picks from, comma-separated")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--state", default=None, help=argparse.SUPPRESS)   # a child's closed ledgers
    p.add_argument("--notes", default=None, help=argparse.SUPPRESS)   # what a child did
    a = p.parse_args(argv)
    unknown = set(a.kill_points.split(",")) - set(KILL_POINTS)
    if unknown:
        p.error(f"--kill-points: not GC or compaction points: {', '.join(sorted(unknown))}")

    own = a.dir is None and not a.child
    path = a.dir or tempfile.mkdtemp(prefix="embedlog-gc-soak-")
    config = dict(entry_log_size_limit=a.entry_log_mb << 20, skip_list_size_limit=16 << 20,
                  journal_max_size_mb=a.journal_mb, journal_pre_alloc_size_mb=min(16, a.journal_mb),
                  journal_max_backups=1, flush_interval_ms=2000,
                  gc_wait_time_ms=a.gc_wait_ms, minor_compaction_interval_s=a.minor_interval_s,
                  major_compaction_interval_s=a.major_interval_s, is_throttle_by_bytes=True,
                  compaction_rate_by_bytes=int(a.compaction_rate_mb * (1 << 20)),
                  disk_check_interval_ms=1000, storage_layout=a.storage_layout)
    print(f"# gc soak: {a.duration_s:.0f} s in {path}, layout {a.storage_layout}; {a.writers} writers, {a.entry_bytes}-byte "
          f"entries in batches of {a.batch}, ledgers of {a.ledger_entries} entries, "
          f"~{a.retain_mb} MiB kept live (random deletes), entry logs {a.entry_log_mb} MiB, "
          f"journals {a.journal_mb} MiB, "
          f"GC every {a.gc_wait_ms} ms, minor/major compaction every {a.minor_interval_s}/"
          f"{a.major_interval_s} s at 0.2/0.8, rate {a.compaction_rate_mb} MiB/s, "
          f"compaction {'off' if a.no_compaction else ('alternating every %g s' % a.alternate_s if a.alternate_s else 'on')}",
          flush=True)
    if a.kill_cycles:
        try:
            return kill_cycles(a, path, config)
        finally:
            if own:
                shutil.rmtree(path, ignore_errors=True)
    soak = Soak(a)
    if a.state:
        with open(a.state) as f:
            soak.closed = [tuple(x) for x in json.load(f)]
        soak.live_ledgers = len(soak.closed)
        soak.live_bytes = sum(n for _q, n in soak.closed) * a.entry_bytes
    windows = []           # (compaction on?, seconds, bytes written, bytes compacted)
    try:
        with embedlog.open(path, **config) as log:
            gc = log.bookie.gc
            if log.bookie.layout != a.storage_layout:
                raise SystemExit(f"{path} holds layout {log.bookie.layout}, not {a.storage_layout}")
            gc.compaction_enabled = not a.no_compaction
            threads = [threading.Thread(target=soak.writer, args=(log, a.seed + i), daemon=True)
                       for i in range(a.writers)]
            threads.append(threading.Thread(target=soak.deleter, args=(log, a.seed + 1000), daemon=True))
            for t in threads:
                t.start()
            t0 = time.monotonic()
            header = ("  t_s  MB_written  MB/s  live_ledgers  live_MB  disk_MB  logs  segs  "
                      "compaction  compacted_MB  gc_freed_MB")
            print(header, flush=True)
            last_t, last_w = t0, 0
            win_start, win_w, win_c = t0, 0, 0
            next_report = t0 + a.report_s
            next_switch = t0 + a.alternate_s if a.alternate_s and not a.no_compaction else None
            while not soak.stop.is_set():
                now = time.monotonic()
                if now - t0 >= a.duration_s:
                    break
                soak.stop.wait(min(next_report, next_switch or next_report, t0 + a.duration_s) - now)
                now = time.monotonic()
                st = gc.stats
                with soak.lock:
                    written = soak.written_bytes
                if next_switch is not None and now >= next_switch:
                    windows.append((gc.compaction_enabled, now - win_start, written - win_w,
                                    st["compacted_bytes"] - win_c))
                    gc.compaction_enabled = not gc.compaction_enabled
                    win_start, win_w, win_c = now, written, st["compacted_bytes"]
                    next_switch += a.alternate_s
                if now >= next_report:
                    with soak.lock:
                        live_mb = soak.live_bytes / 2**20
                        live_n = soak.live_ledgers
                    logs = len(log.bookie.storage.entry_logger.log_ids())
                    segs = sum(n.endswith(".seg") for n in os.listdir(log.bookie.journal_dir))
                    freed = freed_bytes(st)
                    print(f"{now - t0:5.0f}  {written / 2**20:10.0f}  "
                          f"{(written - last_w) / 2**20 / (now - last_t):4.1f}  {live_n:12d}  "
                          f"{live_mn(live_mb):>7}  {disk_bytes(path) / 2**20:7.0f}  {logs:4d}  {segs:4d}  "
                          f"{'on' if gc.compaction_enabled else 'off':>10}  "
                          f"{st['compacted_bytes'] / 2**20:12.0f}  {freed / 2**20:11.0f}", flush=True)
                    last_t, last_w = now, written
                    next_report += a.report_s
            soak.stop.set()
            for t in threads:
                t.join(timeout=60)
            if soak.errors:
                raise soak.errors[0]
            with soak.lock:
                windows.append((gc.compaction_enabled, time.monotonic() - win_start,
                                soak.written_bytes - win_w, gc.stats["compacted_bytes"] - win_c))
            elapsed = time.monotonic() - t0
            st = dict(gc.stats)
            # every live ledger reads back whole
            checked = 0
            for q, n in soak.closed:
                r = log.open_ledger(LedgerId.parse(q))
                for first in range(0, n, 4096):
                    last = min(n, first + 4096) - 1
                    got = r.read_batch(first, last)
                    if got != [entry(q, e, a.entry_bytes) for e in range(first, last + 1)]:
                        raise SystemExit(f"ledger {q} entries {first}..{last} read back wrong")
                checked += n
            left = positive_deletion(log)
        print(f"# {elapsed:.0f} s, {soak.written_bytes / 2**20:.0f} MiB written "
              f"({soak.written_bytes / 2**20 / elapsed:.1f} MiB/s, {soak.written_entries / elapsed:,.0f} "
              f"entries/s); GC: {st['ledgers_deleted']} ledgers deleted by GC, "
              f"{st['entry_logs_deleted']} entry logs deleted whole "
              f"({st['entry_log_bytes_deleted'] / 2**20:.0f} MiB), "
              f"{st.get('segments_deleted', 0)} segments deleted whole "
              f"({st.get('segment_bytes_deleted', 0) / 2**20:.0f} MiB), {st['compactions']} compactions of "
              f"{st['compacted_logs']} logs ({st['compacted_bytes'] / 2**20:.0f} MiB rewritten, "
              f"{st['reclaimed_bytes'] / 2**20:.0f} MiB given back); {checked:,} live entries read "
              f"back and checked; after a forced major compaction {left}", flush=True)
        steady = windows[1:]           # the first window is the warm-up (empty bookie)
        on = [w for w in steady if w[0] and w[3] > 0]
        off = [w for w in steady if not w[0]]
        if on and off:
            rate_on = sum(w[2] for w in on) / sum(w[1] for w in on) / 2**20
            rate_off = sum(w[2] for w in off) / sum(w[1] for w in off) / 2**20
            print(f"# write throughput: {rate_on:.1f} MiB/s in {len(on)} windows with compaction "
                  f"rewriting ({sum(w[3] for w in on) / 2**20:.0f} MiB), {rate_off:.1f} MiB/s in "
                  f"{len(off)} windows with compaction off: {100 * (rate_on / rate_off - 1):+.1f}%",
                  flush=True)
        return 0
    finally:
        if own:
            shutil.rmtree(path, ignore_errors=True)


def freed_bytes(st: dict) -> int:
    """Bytes GC gave back: compaction's, entry logs and (layout 2) segments deleted whole."""
    return st["reclaimed_bytes"] + st["entry_log_bytes_deleted"] + st.get("segment_bytes_deleted", 0)


def positive_deletion(log, freed: bool = True) -> str:
    """One more GC cycle with a forced major compaction, at rest: every file left holds live
    data (a file of deleted ledgers only is a leak), and each segment left is one the index
    names; with ``freed``, GC gave something back in this process. Raises SystemExit if not;
    returns what is left."""
    b = log.bookie
    b.gc.compaction_enabled = True     # --alternate-s may have left it off
    b.checkpoint()                     # the mark passes the last journal: its files are segments
    b.gc.run_once(force_major=True)
    st = b.gc.stats
    if freed and not freed_bytes(st):
        raise SystemExit("GC gave nothing back")
    usages = b.gc.usages()
    dead = {i: u for i, u in usages.items() if u <= 0}
    if dead:
        raise SystemExit(f"files holding only deleted ledgers left after GC (log id: usage): {dead}")
    segs = {i & 0x7FFFFFFF for i in usages if i >> 31}
    unnamed = segs - b.storage.segments_in_use()
    if unnamed:
        raise SystemExit(f"segments no index names left after GC: {sorted(unnamed)}")
    # a compaction a crash interrupted is finished or undone at start: none of its files stay
    # (compaction off, and a cycle to wait out one the GC thread may be running)
    b.gc.compaction_enabled = False
    b.gc.run_once()
    stale = sorted(n for c in b.ledger_currents for n in os.listdir(c)
                   if n.endswith((".compacting", ".compaction")))
    if stale:
        raise SystemExit(f"compaction files left: {stale}")
    return (f"{sum(not i >> 31 for i in usages)} entry logs and {len(segs)} segments left, "
            f"each with live data")


def kill_cycles(a, path: str, config: dict) -> int:
    """--kill-cycles: the soak in children SIGKILLed at failure points, checked after each."""
    rnd = random.Random(a.seed)
    talk = tempfile.mkdtemp(prefix="embedlog-gc-soak-cycles-")   # not the log's: it holds a log only
    try:
        return _kill_cycles(a, path, config, rnd, os.path.join(talk, "state.json"),
                            os.path.join(talk, "notes"))
    finally:
        shutil.rmtree(talk, ignore_errors=True)


def _kill_cycles(a, path: str, config: dict, rnd, state: str, notes: str) -> int:
    live: dict[str, int] = {}                  # closed, not deleted: must read back
    deleted: set[str] = set()                  # its deletion returned: never held again
    passed = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
              if k not in ("dir", "kill_cycles", "kill_points", "child", "state", "notes", "seed")
              and not isinstance(v, bool)]
    passed += [f"--{k.replace('_', '-')}" for k, v in vars(a).items()
               if isinstance(v, bool) and v and k not in ("child",)]
    for cycle in range(1, a.kill_cycles + 1):
        point, hit = rnd.choice(a.kill_points.split(",")), rnd.randint(1, 5)
        with open(state, "w") as f:
            json.dump(sorted(live.items()), f)
        with open(notes, "w"):
            pass
        env = {**os.environ, "EMBEDLOG_FAILPOINTS": f"{point}=crash:{hit}"}
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--dir", path,
                                "--state", state, "--notes", notes, f"--seed={a.seed + cycle}",
                                *passed],
                               capture_output=True, text=True, env=env,
                               timeout=a.duration_s + 600)
        if child.returncode not in (0, -9):
            raise SystemExit(f"cycle {cycle}: the child exited {child.returncode}:\n"
                             f"{child.stdout[-3000:]}{child.stderr[-3000:]}")
        deleting = set()
        with open(notes) as f:
            said = f.read().splitlines()
        for line in said:
            word, *rest = line.split()
            if word == "CLOSED":
                live[rest[0]] = int(rest[1])
            elif word == "DELETING":
                deleting.add(rest[0])
                live.pop(rest[0], None)
            elif word == "DELETED":
                deleting.discard(rest[0])
                deleted.add(rest[0])
        with embedlog.open(path, **config) as log:
            for q in deleting:                 # killed mid-delete: either state, not both
                try:
                    r = log.open_ledger(LedgerId.parse(q))
                except NoSuchLedgerError:
                    deleted.add(q)
                else:
                    live[q] = r.last_add_confirmed + 1
            for q, n in live.items():
                r = log.open_ledger(LedgerId.parse(q))
                for first in range(0, n, 4096):
                    last = min(n, first + 4096) - 1
                    if r.read_batch(first, last) != [entry(q, e, a.entry_bytes) for e in range(first, last + 1)]:
                        raise SystemExit(f"cycle {cycle} ({point}): ledger {q} entries "
                                         f"{first}..{last} read back wrong")
            left = positive_deletion(log, freed=False)
            held = sorted(q for q in deleted if log.bookie.has_ledger(LedgerId.parse(q)))
            if held:
                raise SystemExit(f"cycle {cycle} ({point}): deleted ledgers still held after GC: {held}")
        how = "killed there" if child.returncode == -9 else "not reached"
        print(f"cycle {cycle}/{a.kill_cycles}: {point} (hit {hit}) {how}; {len(live)} live ledgers "
              f"read back, deleted ones dropped; {left}", flush=True)
    return 0


def live_mn(mb: float) -> str:
    return f"{mb:.0f}"


if __name__ == "__main__":
    sys.exit(main())
