#!/usr/bin/env python
"""Side by side with BookKeeper's Java client: the same Java bookies written
by embedlog's Python client and by BookKeeper's own client.

    python benchmarks/vs_bookkeeper.py [--rounds 3] [--adds 50000] [--warmup 10000]
                                       [--sizes 100,1024] [--quorums 1/1/1,3/2/2]
                                       [--outstanding 1000] [--clients java,embedlog]
                                       [--version 4.17.2] [--ledger-storage sorted] [--out FILE]

Three Java bookies of one BookKeeper version (embedlog.harness.peers.bookkeeper.BookKeeperCluster:
the published jars, a root BookieShell formatted, journalSyncData on: every add is fsynced
by its bookies before they answer) and two writers, one at a time:

- ``java``: BookKeeper's client in its own JVM (embedlog/harness/peers/java/BkDriver.java
  ``bench``; the bookkeeper-benchmark jar with BenchThroughputLatency is not published on
  Maven Central):
  ``appendAsync`` under a Semaphore of ``--outstanding`` permits, v3 protocol;
- ``embedlog``: embedlog's Python client in this process (its v3 codec,
  embedlog/net/bookkeeper.py, picked because the bookies' registrations say protocol
  "bookkeeper"; metadata read and written in BookKeeper's format), ``append_async`` with
  ``max_pending_adds = --outstanding`` as the window (append_async blocks at the bound).

Each cell: a new ledger of E/Qw/Qa with digest CRC32C and an empty password, ``--warmup``
adds waited for before the clock starts, then ``--adds`` adds of ``--sizes`` bytes (built
before the clock) timed until the last is acknowledged. Latency of an add: from the moment it holds a
slot of the window to its completion callback (Java: stamped after the Semaphore's
``acquire()``, just before ``appendAsync``, completed at ``whenComplete``; embedlog: stamped
as ``append_async`` returns, having taken its slot, completed at a done-callback on its
future), p50 and p99 over the timed adds. Until 2026-11-29 embedlog's stamp came before the
call, so its latency also held the wait for a slot, which Java's never did. CPU: the writer's process over the timed
adds (Java: every JVM thread, JIT and GC included; embedlog: this process, the caller's
thread and the client's loop), as µs per add; the progress lines on stderr also split
embedlog's into the caller's thread and the loop thread (their CPU clocks). BookKeeper's
client limits itself to 5,000 requests/s by default (ClientConfiguration's throttle):
BkDriver's bench turns that off, so the window is the only bound on both sides. A JVM's start-up and the ledger's create and
close are outside the clock on both sides.

Rounds are interleaved (every cell once per round, the two clients of a cell one after the
other, which one goes first alternating by round) so a neighbour's load hits both alike;
the table shows the median over rounds and the ratio embedlog / java of the medians (above
1.0: embedlog adds faster; for latency java's / embedlog's, above 1.0: embedlog's is lower).

``--compare bookies`` turns it around: the SAME writer, BookKeeper's Java
client (BkDriver bench, v3), against Java bookies and against embedlog bookies::

    python benchmarks/vs_bookkeeper.py --compare bookies [--bookie-counts 1,3] ...

For each count N of ``--bookie-counts``: one ZooKeeper, a root BookieShell formatted with N
Java bookies on it, and a second root BookieShell formatted with N embedlog bookies on it
(``LocalCluster`` with the root's metadata URI, as in docs/BOOKKEEPER.md; no autorecovery),
so the Java client's ensemble is all of one kind. Same journal settings on both kinds: the
journal fdatasynced before an add is answered (journalSyncData / journal_sync_data), group
commit waiting at most 2 ms (journalMaxGroupWaitMSec / journal_max_group_wait_ms), flush when
the queue empties off as BookKeeper's default (``--flush-when-queue-empty`` turns it on for
both), 4 MiB journal preallocation; every directory under the same temp dir (the same
disk). A quorum whose E is larger than N is skipped. Rounds interleave the two kinds per cell
(which goes first alternating), and the clusters of one N run while the other N's are down;
before the first round each kind takes an unrecorded 1/1/1 bench of ``--warmup`` adds (the
Java bookies' JIT).
Bookie CPU: utime + stime of every bookie process of the ensemble's cluster (and its
children) from /proc/PID/stat, read when BkDriver prints "clock start" (warm-up acknowledged)
and "clock stop" (last timed add acknowledged), as µs per timed add; the ratio columns are
embedlog bookie / Java bookie (rate) and Java / embedlog (p99, CPU): above 1.0 embedlog's is
better.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

CLIENTS = ("java", "embedlog")
DIGEST = "CRC32C"
PASSWORD = b""
ANSWER_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Row:
    client: str                  # java, embedlog
    quorum: tuple                # (E, Qw, Qa)
    size: int
    adds: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_s: float
    outstanding: int
    round: int = 0
    thread_cpu_s: dict = dataclasses.field(default_factory=dict)   # embedlog: caller, loop
    bookies: int = 3             # --compare bookies: bookies in the cluster written to
    bookie_cpu_s: float = float("nan")   # --compare bookies: the bookies' CPU, timed adds

    @property
    def bookie_cpu_us_per_add(self) -> float:
        return self.bookie_cpu_s * 1e6 / self.adds

    @property
    def rate(self) -> float:
        return self.adds / self.seconds

    @property
    def cpu_us_per_add(self) -> float:
        return self.cpu_s * 1e6 / self.adds

    @property
    def cell(self) -> tuple:
        return (self.quorum, self.size)


def _pct(sorted_s: list, q: float) -> float:
    """BkDriver's percentile (the ceil(q*n)-th smallest), in ms."""
    i = min(len(sorted_s) - 1, max(0, math.ceil(q * len(sorted_s)) - 1))
    return sorted_s[i] * 1e3


def java_cell(bk, quorum: tuple, size: int, adds: int, warmup: int, outstanding: int) -> Row:
    """BookKeeper's client in a fresh JVM (BkDriver bench)."""
    e, qw, qa = quorum
    res = bk.java_client("bench", ensemble=e, write_quorum=qw, ack_quorum=qa, digest=DIGEST,
                         size=size, count=adds, warmup=warmup, outstanding=outstanding,
                         timeout=ANSWER_TIMEOUT_S + adds / 1000)
    b = res.bench
    if b is None:
        raise RuntimeError(f"BkDriver bench printed no result: {res.lines[-5:]}")
    return Row("java", quorum, size, b["adds"], b["seconds"], b["p50_ms"], b["p99_ms"],
               b.get("cpu_s", float("nan")), outstanding)


class _Stamps:
    """Each add's completion time by index, and the first failure: what BkDriver keeps (a
    long per add), so neither side holds an object per add past its completion (50,000
    futures kept alive made this process's collector walk them all, and its p99 doubled)."""
    __slots__ = ("done", "left", "all_done", "failed", "first_error")

    def __init__(self, adds: int):
        self.done = [0.0] * adds
        self.left = adds
        self.all_done = threading.Event()   # every callback ran (a future's result() can
        self.failed = 0                     # return before its callbacks do)
        self.first_error = None

    def callback(self, i: int):
        def stamp(fut, done=self.done, clock=time.perf_counter):
            done[i] = clock()
            if fut.exception() is not None:
                self.failed += 1
                self.first_error = self.first_error or fut.exception()
            self.left -= 1                  # callbacks run on the client's one loop thread
            if self.left == 0:
                self.all_done.set()
        return stamp


def _thread_clocks() -> dict:
    """CPU clocks of this thread (the caller's) and of the client's loop thread."""
    clocks = {"caller": time.pthread_getcpuclockid(threading.get_ident())}
    for t in threading.enumerate():
        if t.name == "embedlog-client" and t.ident is not None:
            clocks["loop"] = time.pthread_getcpuclockid(t.ident)
    return clocks


def embedlog_cell(client, quorum: tuple, size: int, adds: int, warmup: int) -> Row:
    """embedlog's client (this process); its window is the client's max_pending_adds."""
    data = b"x" * size
    outstanding = client.context.config.max_pending_adds
    w = client.create_ledger(*quorum, digest=DIGEST.lower(), password=PASSWORD)
    try:
        if warmup:
            futs = [w.append_async(data) for _ in range(warmup)]
            futs[-1].result(ANSWER_TIMEOUT_S)           # acknowledged in order: all are
            del futs
        sent = [0.0] * adds
        stamps = _Stamps(adds)
        on_done = stamps.callback
        clock = time.perf_counter
        append = w.append_async
        clocks = _thread_clocks()
        thread0 = {k: time.clock_gettime(c) for k, c in clocks.items()}
        cpu0 = time.process_time()
        t0 = clock()
        for i in range(adds):
            f = append(data)
            sent[i] = clock()       # after the call took its slot, as BkDriver stamps after acquire()
            f.add_done_callback(on_done(i))
        f.result(ANSWER_TIMEOUT_S)
        elapsed = clock() - t0
        if not stamps.all_done.wait(ANSWER_TIMEOUT_S):
            raise RuntimeError(f"{stamps.left} adds' callbacks never ran")
        cpu = time.process_time() - cpu0
        threads = {k: time.clock_gettime(c) - thread0[k] for k, c in clocks.items()}
        if stamps.failed:
            raise RuntimeError(f"{stamps.failed} adds failed, the first: {stamps.first_error!r}")
    finally:
        w.close()
    lat = sorted(d - s for s, d in zip(sent, stamps.done))
    return Row("embedlog", quorum, size, adds, elapsed, _pct(lat, 0.50), _pct(lat, 0.99), cpu,
               outstanding, thread_cpu_s=threads)


def run(bk, client, *, rounds: int, adds: int, warmup: int, sizes, quorums, outstanding: int,
        clients=CLIENTS, log=None) -> list:
    """Every (quorum, size) cell for each client, ``rounds`` times, interleaved."""
    rows = []
    for r in range(rounds):
        for quorum in quorums:
            for size in sizes:
                order = list(clients) if r % 2 == 0 else list(reversed(clients))
                for who in order:
                    if who == "java":
                        row = java_cell(bk, quorum, size, adds, warmup, outstanding)
                    else:
                        row = embedlog_cell(client, quorum, size, adds, warmup)
                    row.round = r
                    rows.append(row)
                    if log is not None:
                        log(f"round {r + 1}/{rounds} {who:8} {_q(quorum)} {size:5d} B: "
                            f"{row.rate:>9,.0f} adds/s  p50 {row.p50_ms:7.2f} ms  "
                            f"p99 {row.p99_ms:7.2f} ms  cpu {row.cpu_us_per_add:6.1f} µs/add"
                            + "".join(f" ({k} {v * 1e6 / row.adds:.1f})"
                                      for k, v in row.thread_cpu_s.items())
                            + f"  load {os.getloadavg()[0]:.1f}")
    return rows


# -- --compare bookies: one Java client, Java bookies vs embedlog bookies --------

BOOKIE_KINDS = ("java", "embedlog")      # which bookies; the writer is BookKeeper's client
_TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list:
    """``pid`` and its descendants (their /proc/PID/task/TID/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def process_cpu_s(pids) -> float:
    """utime + stime of these processes and their children (every thread), in seconds."""
    ticks = 0
    for pid in pids:
        for p in _tree(pid):
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])   # fields 14 and 15 of stat(5)
        # a dead process's CPU is lost: none die during a cell
    return ticks / _TICK


def bookie_cell(root, pids, kind: str, n: int, quorum: tuple, size: int, adds: int,
                warmup: int, outstanding: int) -> Row:
    """BkDriver bench on ``root`` (a BookKeeperCluster whose root holds only ``kind``
    bookies, their processes ``pids``); the bookies' CPU between its clock lines."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    e, qw, qa = quorum
    proc = root.java_client_popen("bench", ensemble=e, write_quorum=qw, ack_quorum=qa,
                                  digest=DIGEST, size=size, count=adds, warmup=warmup,
                                  outstanding=outstanding)
    err: list = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    drain.start()
    watchdog = threading.Timer(ANSWER_TIMEOUT_S + adds / 1000, proc.kill)
    watchdog.start()
    res = DriverResult()
    cpu0 = cpu1 = None
    try:
        for line in proc.stdout:
            if line.startswith("clock start"):
                cpu0 = process_cpu_s(pids)
            elif line.startswith("clock stop"):
                cpu1 = process_cpu_s(pids)
            res.feed(line)
        proc.wait(timeout=30)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    drain.join(5)
    b = res.bench
    if proc.returncode != 0 or b is None or cpu0 is None or cpu1 is None:
        raise RuntimeError(f"BkDriver bench on {kind} bookies failed ({proc.returncode}): "
                           f"{res.lines[-5:]} {''.join(err)[-2000:]}")
    return Row(kind, quorum, size, b["adds"], b["seconds"], b["p50_ms"], b["p99_ms"],
               b.get("cpu_s", float("nan")), outstanding, bookies=n, bookie_cpu_s=cpu1 - cpu0)


def journal_settings(flush_when_queue_empty: bool) -> tuple:
    """(Java bookie_config, embedlog bookie_config): the same journal on both kinds."""
    java = {"journalSyncData": "true", "journalMaxGroupWaitMSec": "2",
            "journalFlushWhenQueueEmpty": str(flush_when_queue_empty).lower(),
            "journalBufferedWritesThreshold": str(512 * 1024), "journalPreAllocSizeMB": "4"}
    emb = {"journal_sync_data": "true", "journal_max_group_wait_ms": "2",
           "journal_flush_when_queue_empty": str(flush_when_queue_empty).lower(),
           "journal_buffered_writes_threshold": str(512 * 1024),
           "journal_pre_alloc_size_mb": "4",
           # as BookKeeperCluster sets the Java bookies: a shared disk over 95 % full (this
           # machine's /tmp) must not turn a bookie read-only mid-run
           "disk_usage_threshold": "0.99", "disk_usage_warn_threshold": "0.98",
           "disk_usage_lwm_threshold": "0.98"}
    return java, emb


class BookieSetups:
    """For one count N: a root with N Java bookies and a root with N embedlog bookies, one
    ZooKeeper (``zk_hosts``); ``sides[kind] = (root cluster, bookie pids)``."""

    def __init__(self, version: str, n: int, zk_hosts: str, *, ledger_storage: str = "sorted",
                 flush_when_queue_empty: bool = False, tag: str = ""):
        from embedlog.harness.peers.bookkeeper import BookKeeperCluster
        from embedlog.harness.cluster import LocalCluster
        java_conf, emb_conf = journal_settings(flush_when_queue_empty)
        self.n = n
        self.retries = []           # (kind, quorum, size, error) of cells run again
        self._closers = []
        try:
            jbk = BookKeeperCluster(version, bookies=n, zk_hosts=zk_hosts,
                                    root=f"/vsjava{tag}{n}", ledger_storage=ledger_storage,
                                    bookie_config=java_conf)
            self._closers.append(jbk.close)
            ebk = BookKeeperCluster(version, bookies=0, zk_hosts=zk_hosts,
                                    root=f"/vsembedlog{tag}{n}")
            self._closers.append(ebk.close)
            ebk.driver_command()[1]()        # the driver's jar, before any clock
            lc = LocalCluster(bookies=n, metadata=ebk.metadata_uri, proxies=False,
                              autorecovery=False, bookie_config=emb_conf)
            self._closers.append(lc.close)
            self.sides = {"java": (jbk, [jbk.pid(i) for i in range(n)]),
                          "embedlog": (ebk, [lc.pid(i) for i in range(n)])}
            self.lc = lc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()


def _bookie_cell_retrying(st, kind, quorum, size, adds, warmup, outstanding, log, tries=3):
    """bookie_cell, again (up to ``tries`` times, 5 s apart) when the Java client found too
    few bookies registered: on a loaded machine a bookie's ZooKeeper session may lapse and
    its registration be remade. Retries are counted in ``st.retries`` and logged."""
    root, pids = st.sides[kind]
    for attempt in range(tries):
        waited = wait_registered(root, st.n)
        if waited > 0.5 and log is not None:
            log(f"waited {waited:.1f} s for {st.n} {kind} bookies to be registered")
        try:
            return bookie_cell(root, pids, kind, st.n, quorum, size, adds, warmup, outstanding)
        except RuntimeError as exc:
            if "NotEnoughBookies" not in str(exc) or attempt == tries - 1:
                raise
            st.retries.append((kind, quorum, size, str(exc).splitlines()[0][:200]))
            if log is not None:
                log(f"retrying {kind} {_q(quorum)} {size} B: {str(exc)[:300]}")
                if kind == "embedlog":
                    for i in range(st.n):
                        log(f"embedlog bookie {i} log tail: "
                            f"{_tail(st.lc._b(i).log_path)}")
            time.sleep(5)


def wait_registered(root, n: int, timeout: float = 60.0) -> float:
    """Until ``n`` writable bookies are registered on ``root``'s root (what the Java client
    picks its ensembles from); the seconds it took."""
    zk = root._zk_client()
    t0 = time.monotonic()
    while True:
        found = [c for c in zk.get_children(f"{root.root}/available") if c != "readonly"]
        if len(found) >= n:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{len(found)} of {n} bookies registered on {root.root} "
                               f"after {timeout:.0f} s")
        time.sleep(0.1)


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError as exc:
        return repr(exc)


def run_bookies(setups, *, rounds: int, adds: int, warmup: int, sizes, quorums,
                outstanding: int, kinds=BOOKIE_KINDS, prime: int = 0, log=None) -> list:
    """Every (quorum, size) cell that fits each BookieSetups' N, for each bookie kind,
    ``rounds`` times, interleaved (the two kinds of a cell back to back, alternating);
    first, unrecorded, a 1/1/1 bench of ``prime`` adds on each kind."""
    rows = []
    for st in setups:       # the Java bookies' JIT and both kinds' caches, off the record
        for kind in kinds:
            if prime:
                _bookie_cell_retrying(st, kind, (1, 1, 1), max(sizes), prime, 0, outstanding,
                                      log)
    for r in range(rounds):
        for st in setups:
            for quorum in quorums:
                if quorum[0] > st.n:
                    continue
                for size in sizes:
                    order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
                    for kind in order:
                        row = _bookie_cell_retrying(st, kind, quorum, size, adds, warmup,
                                                    outstanding, log)
                        row.round = r
                        rows.append(row)
                        if log is not None:
                            log(f"round {r + 1}/{rounds} N={st.n} {kind:8} bookies "
                                f"{_q(quorum)} {size:5d} B: {row.rate:>9,.0f} adds/s  "
                                f"p50 {row.p50_ms:7.2f} ms  p99 {row.p99_ms:7.2f} ms  "
                                f"bookie cpu {row.bookie_cpu_us_per_add:6.1f} µs/add  "
                                f"client cpu {row.cpu_us_per_add:6.1f}  "
                                f"load {os.getloadavg()[0]:.1f}")
    return rows


def bookie_table(rows: list) -> str:
    """Median over rounds per kind and cell (N, quorum, size), ratios of the medians."""
    cells = sorted({(r.bookies, r.quorum, r.size) for r in rows},
                   key=lambda c: (c[0], c[1][0], c[2]))
    head = ("| bookies | E/Qw/Qa | entry | Java bookies adds/s | embedlog bookies adds/s | "
            "rate emb/java | Java p50 / p99 (ms) | embedlog p50 / p99 (ms) | p99 java/emb | "
            "Java bookie CPU µs/add | embedlog bookie CPU µs/add | CPU java/emb |\n"
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    lines = []
    for cell in cells:
        fig = {}
        for k in BOOKIE_KINDS:
            rs = [r for r in rows if (r.bookies, r.quorum, r.size) == cell and r.client == k]
            if rs:
                fig[k] = (_med(rs, "rate"), _med(rs, "p50_ms"), _med(rs, "p99_ms"),
                          _med(rs, "bookie_cpu_us_per_add"), [r.rate for r in rs])
        j, e = fig.get("java"), fig.get("embedlog")

        def rate(f):
            if f is None:
                return "-"
            spread = f" ({min(f[4]):,.0f}-{max(f[4]):,.0f})" if len(f[4]) > 1 else ""
            return f"{f[0]:,.0f}{spread}"

        def ratio(a, b):
            return f"{a / b:.2f}" if b else "-"

        both = j is not None and e is not None
        lines.append(
            f"| {cell[0]} | {_q(cell[1])} | {cell[2]} B | {rate(j)} | {rate(e)} | "
            + (f"**{ratio(e[0], j[0])}**" if both else "-") + " | "
            + (f"{j[1]:.2f} / {j[2]:.2f}" if j else "-") + " | "
            + (f"{e[1]:.2f} / {e[2]:.2f}" if e else "-") + " | "
            + (ratio(j[2], e[2]) if both else "-") + " | "
            + (f"{j[3]:.1f}" if j else "-") + " | " + (f"{e[3]:.1f}" if e else "-") + " | "
            + (ratio(j[3], e[3]) if both else "-") + " |")
    return head + "\n".join(lines) + "\n"


def describe_bookies(rows: list, *, command: str, seconds: float, loads: tuple, version: str,
                     ledger_storage: str, adds: int, warmup: int, outstanding: int,
                     rounds: int, flush_when_queue_empty: bool) -> str:
    load0, load1 = loads
    return (
        f"Command: `{command}` ({seconds:.0f} s)\n\n"
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at start "
        f"{' '.join(f'{x:.2f}' for x in load0)}, at end {' '.join(f'{x:.2f}' for x in load1)}\n"
        f"- machine: nproc {os.cpu_count()}, {platform.machine()}, Linux {platform.release()}, "
        f"Python {platform.python_version()}; embedlog at {_git_rev()}\n"
        f"- writer: BookKeeper {version}'s Java client (BkDriver bench, v3), window "
        f"{outstanding:,}, digest {DIGEST}, empty password; {adds:,} timed adds per cell after "
        f"{warmup:,} warm-up adds; Java bookies {version} ({ledger_storage} ledger storage) vs "
        f"embedlog bookies, each kind alone on its own root; journal fdatasynced per group "
        f"commit on both, group wait 2 ms, flush when the queue empties "
        f"{'on' if flush_when_queue_empty else 'off'}; dirs under {tempfile.gettempdir()}; "
        f"{rounds} interleaved round{'s' if rounds > 1 else ''} (median; the range of rates "
        f"in brackets)\n\n" + bookie_table(rows))


def _q(quorum: tuple) -> str:
    return "/".join(map(str, quorum))


def _med(rows: list, attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in rows)


def table(rows: list) -> str:
    """Median over rounds per client and cell, ratios of the medians."""
    cells = sorted({r.cell for r in rows}, key=lambda c: (c[0][0], c[1]))
    head = ("| E/Qw/Qa | entry | java adds/s | embedlog adds/s | ratio | java p50 / p99 (ms) | "
            "embedlog p50 / p99 (ms) | java CPU µs/add | embedlog CPU µs/add |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    lines = []
    for cell in cells:
        by = {c: [r for r in rows if r.cell == cell and r.client == c] for c in CLIENTS}
        fig = {}
        for c, rs in by.items():
            if rs:
                fig[c] = (_med(rs, "rate"), _med(rs, "p50_ms"), _med(rs, "p99_ms"),
                          _med(rs, "cpu_us_per_add"), [r.rate for r in rs])
        j, e = fig.get("java"), fig.get("embedlog")

        def rate(f):
            if f is None:
                return "-"
            spread = f" ({min(f[4]):,.0f}-{max(f[4]):,.0f})" if len(f[4]) > 1 else ""
            return f"{f[0]:,.0f}{spread}"

        ratio = f"{e[0] / j[0]:.2f}" if j and e else "-"
        lines.append(
            f"| {_q(cell[0])} | {cell[1]} B | {rate(j)} | {rate(e)} | {ratio} | "
            + (f"{j[1]:.2f} / {j[2]:.2f}" if j else "-") + " | "
            + (f"{e[1]:.2f} / {e[2]:.2f}" if e else "-") + " | "
            + (f"{j[3]:.1f}" if j else "-") + " | " + (f"{e[3]:.1f}" if e else "-") + " |")
    return head + "\n".join(lines) + "\n"


def _git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def describe(rows: list, *, command: str, seconds: float, loads: tuple, version: str,
             ledger_storage: str, adds: int, warmup: int, outstanding: int, rounds: int) -> str:
    """The report: how it was run, on what, under which load, and the table."""
    load0, load1 = loads
    return (
        f"Command: `{command}` ({seconds:.0f} s)\n\n"
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at start "
        f"{' '.join(f'{x:.2f}' for x in load0)}, at end {' '.join(f'{x:.2f}' for x in load1)}\n"
        f"- machine: nproc {os.cpu_count()}, {platform.machine()}, Linux {platform.release()}, "
        f"Python {platform.python_version()}; embedlog at {_git_rev()}\n"
        f"- three Java bookies of BookKeeper {version} ({ledger_storage} ledger storage, journal "
        f"fsynced before each answer) on loopback; {adds:,} timed adds per cell after "
        f"{warmup:,} warm-up adds, window {outstanding:,} outstanding adds, digest {DIGEST}, "
        f"empty password, {rounds} interleaved round{'s' if rounds > 1 else ''} (median; the "
        f"range of rates in brackets)\n\n" + table(rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--adds", type=int, default=50_000, help="timed adds per cell")
    ap.add_argument("--warmup", type=int, default=10_000, help="adds before the clock starts")
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--quorums", default="1/1/1,3/2/2")
    ap.add_argument("--outstanding", type=int, default=1000,
                    help="adds in flight at most, both clients")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--version", default="4.17.2")
    ap.add_argument("--ledger-storage", default="sorted", help="sorted, db or interleaved")
    ap.add_argument("--out", default="", help="also write the report to this file")
    ap.add_argument("--compare", default="clients", choices=("clients", "bookies"),
                    help="clients: embedlog's vs Java's client on Java bookies; "
                         "bookies: Java's client on Java vs embedlog bookies")
    ap.add_argument("--bookie-counts", default="1,3", help="--compare bookies: bookies a side")
    ap.add_argument("--flush-when-queue-empty", action="store_true",
                    help="--compare bookies: both kinds flush their journal when no add waits")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    quorums = [tuple(int(x) for x in q.split("/")) for q in args.quorums.split(",")]
    clients = [c for c in args.clients.split(",") if c]
    if any(c not in CLIENTS for c in clients):
        ap.error(f"--clients takes {', '.join(CLIENTS)}")

    if args.compare == "bookies":
        return main_bookies(args, sizes, quorums, argv)

    from embedlog import Client
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster

    load0 = os.getloadavg()
    t_start = time.monotonic()
    say = functools.partial(print, file=sys.stderr, flush=True)
    with BookKeeperCluster(args.version, bookies=3, ledger_storage=args.ledger_storage) as bk:
        bk.driver_command()[1]()        # the driver's classpath and jar, before the clock
        client = Client(bk.metadata_uri, max_pending_adds=args.outstanding,
                        add_timeout_s=60, read_timeout_s=60)
        try:
            rows = run(bk, client, rounds=args.rounds, adds=args.adds, warmup=args.warmup,
                       sizes=sizes, quorums=quorums, outstanding=args.outstanding,
                       clients=clients, log=say)
        finally:
            client.close()
    load1 = os.getloadavg()
    argline = " ".join(argv if argv is not None else sys.argv[1:])
    report = describe(rows, command=f"python benchmarks/vs_bookkeeper.py {argline}".strip(),
                      seconds=time.monotonic() - t_start, loads=(load0, load1),
                      version=args.version, ledger_storage=args.ledger_storage, adds=args.adds,
                      warmup=args.warmup, outstanding=args.outstanding, rounds=args.rounds)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return 0


def main_bookies(args, sizes, quorums, argv) -> int:
    from embedlog.harness.servers import ZooKeeperServer
    load0 = os.getloadavg()
    t_start = time.monotonic()
    say = functools.partial(print, file=sys.stderr, flush=True)
    rows, retries = [], []
    zk = ZooKeeperServer()
    try:
        for n in (int(x) for x in args.bookie_counts.split(",")):
            fits = [q for q in quorums if q[0] <= n]
            if not fits:
                continue
            st = BookieSetups(args.version, n, zk.hosts, ledger_storage=args.ledger_storage,
                              flush_when_queue_empty=args.flush_when_queue_empty)
            try:
                rows += run_bookies([st], rounds=args.rounds, adds=args.adds,
                                    warmup=args.warmup, sizes=sizes, quorums=fits,
                                    outstanding=args.outstanding, prime=args.warmup,
                                    log=say)
            finally:
                retries += st.retries
                st.close()
    finally:
        zk.stop()
    load1 = os.getloadavg()
    argline = " ".join(argv if argv is not None else sys.argv[1:])
    report = describe_bookies(
        rows, command=f"python benchmarks/vs_bookkeeper.py {argline}".strip(),
        seconds=time.monotonic() - t_start, loads=(load0, load1), version=args.version,
        ledger_storage=args.ledger_storage, adds=args.adds, warmup=args.warmup,
        outstanding=args.outstanding, rounds=args.rounds,
        flush_when_queue_empty=args.flush_when_queue_empty)
    if retries:
        report += (f"\n{len(retries)} cell(s) run again after the Java client found too few "
                   f"bookies registered: " + "; ".join(f"{k} {_q(q)} {s} B" for k, q, s, _ in
                                                        retries) + "\n")
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
