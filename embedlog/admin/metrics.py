"""Prometheus metrics of one bookie process (prometheus_client, one registry per bookie:
no module-level singletons, so two bookies can share a process).

Figures BookKeeper operators watch, with BookKeeper's stat beside each (docs/OPERATIONS.md):

    embedlog_bookie_request_latency_seconds{op}    histogram, request in -> reply out, on
                                                   every protocol (embedlog's, BookKeeper's
                                                   v2 and v3: Java and Pulsar traffic too)
                                                   (ADD_ENTRY_REQUEST, READ_ENTRY_REQUEST);
                                                   long-poll reads are left out (they wait
                                                   on purpose)
    embedlog_bookie_requests_total{op,status}      requests answered
    embedlog_bookie_add_entries_total, _add_bytes_total, _read_entries_total
                                                   add / read rates: rate() of these
    embedlog_bookie_written_entries_total          entries clients wrote, each replica 1/Qw:
                                                   sum(rate()) is the cluster's write rate
    embedlog_journal_fsync_latency_seconds         histogram per fdatasync (JOURNAL_SYNC)
    embedlog_journal_group_entries{trigger}        histogram of records per group commit, by
                                                   what flushed it (queue_empty, time, bytes,
                                                   entries: JOURNAL_FLUSH_* counters)
    embedlog_journal_group_bytes{trigger}          histogram of bytes per group commit
    embedlog_journal_groups_total{trigger}, _fsyncs_total, _bytes_written_total, ...
    embedlog_memtable_bytes / _entries             memtable size (SKIP_LIST_* / write cache)
    embedlog_compaction_progress_ratio             0..1 of the compaction under way (0 until
                                                   the bookie reports compaction figures)
    embedlog_compactions_total{kind}, embedlog_compaction_reclaimed_bytes_total,
    embedlog_gc_cycles_total, embedlog_gc_ledgers_deleted_total
    embedlog_disk_total_bytes, _free_bytes, _usage_ratio, embedlog_journal_dir_bytes,
    embedlog_entry_log_bytes, embedlog_index_bytes
    embedlog_underreplicated_ledgers               ledgers marked under-replicated in metadata
    embedlog_server_throttled_total, _rejected_requests_total, _refused_connections_total,
    embedlog_server_in_flight_requests / _bytes    the resource limits (docs/SECURITY.md)
    embedlog_autorecovery_*                        audits, fragments re-replicated, auditor
    embedlog_bookie_statistic{key}                 every other figure of Bookie.statistics()
                                                   (so new ones appear without a change here)
"""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from embedlog._native.format import LedgerId
from embedlog.errors import EmbedlogError, NoSuchLedgerError
from embedlog.net.server import ServerObserver

LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GROUP_ENTRY_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
GROUP_BYTE_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20)
TRIGGERS = ("queue_empty", "time", "bytes", "entries")
TIMED_OPS = ("add", "read", "read_lac", "write_lac")
DISK_CACHE_S = 10.0                # directory walks (index files) at most this often
# figures of Bookie.statistics() exported under their own names (the rest: _statistic{key})
_MAPPED = {"adds", "add_bytes", "reads", "ledgers", "journal", "memtable_bytes", "memtable_entries",
           "memtable_allocated_bytes", "memtable_flushes", "entry_log_rolls", "throttled_adds",
           "checkpoints", "index_pages_cached", "replay", "last_log_mark"}


def _dir_bytes(path: str, recursive: bool, suffix: str | None = None) -> tuple[int, int]:
    """(bytes, files) under ``path``; missing or vanishing files count as nothing."""
    total = files = 0
    stack = [path]
    while stack:
        top = stack.pop()
        try:
            it = os.scandir(top)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        if recursive:
                            stack.append(e.path)
                    elif suffix is None or e.name.endswith(suffix):
                        total += e.stat(follow_symlinks=False).st_size
                        files += 1
                except OSError:
                    continue
    return total, files


class DiskFigures:
    """Disk usage of a bookie's directories, cached (walking index files is not free)."""

    def __init__(self, bookie):
        self.bookie = bookie
        self._lock = threading.Lock()
        self._at = -1e9
        self._figures: dict = {}

    def get(self) -> dict:
        with self._lock:
            if time.monotonic() - self._at < DISK_CACHE_S:
                return dict(self._figures)
        b = self.bookie
        usage = shutil.disk_usage(b.directory)
        journal_bytes, journal_files = _dir_bytes(b.journal_dir, False)
        log_bytes, logs = _dir_bytes(b.current, False, ".log")
        index_bytes = sum(_dir_bytes(os.path.join(b.current, d), True)[0]
                          for d in ("ledgers", "ledgers-scoped"))
        figures = {"total_bytes": usage.total, "free_bytes": usage.free,
                   "used_bytes": usage.total - usage.free,
                   "usage_ratio": (usage.total - usage.free) / usage.total if usage.total else 0.0,
                   "journal_bytes": journal_bytes, "journal_files": journal_files,
                   "entry_log_bytes": log_bytes, "entry_logs": logs, "index_bytes": index_bytes}
        with self._lock:
            self._figures, self._at = figures, time.monotonic()
        return dict(figures)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "_"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = v
        elif isinstance(v, bool):
            out[name] = int(v)
    return out


def compaction_progress(stats: dict) -> float:
    """0..1 from whatever compaction figure the bookie reports (none yet: 0)."""
    for k, v in _flatten(stats).items():
        if ("compaction" in k or k.startswith("gc_")) and k.endswith("progress"):
            return float(max(0.0, min(1.0, v)))
    return 0.0


class WrittenEntries:
    """Entries clients wrote, as one bookie can count them: each add this bookie stores of a
    ledger with write quorum Qw counts 1/Qw, so the sum over the cluster's bookies is what
    clients wrote, not one count per replica (adding up the bookies' add counters counts
    every entry Qw times). Recovery adds (re-replication, recovery write-back) are left out.

    Qw comes from the ledger's metadata, read once per ledger on a worker thread, never on
    the server's event loop; adds of a ledger whose Qw is not known yet wait in ``_pending``
    and are counted when it is. A ledger gone from the metadata counts its adds once each."""

    MAX_LEDGERS = 100_000          # Qw remembered for at most this many ledgers

    def __init__(self, meta):
        self.meta = meta
        self.total = 0.0
        self._quorum: dict = {}
        self._pending: dict = {}
        self._lock = threading.Lock()
        self._worker = None

    def add(self, key, count: int) -> None:
        with self._lock:
            q = self._quorum.get(key)
            if q:
                self.total += count / q
                return
            asked = key in self._pending
            self._pending[key] = self._pending.get(key, 0) + count
        if not asked:
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(1, "embedlog-written-entries")
            self._worker.submit(self._look_up, key)

    def _look_up(self, key) -> None:
        try:
            q = self.meta.ledger_manager.read_ledger_metadata(LedgerId(*key)).value.write_quorum
        except NoSuchLedgerError:
            q = 1
        except EmbedlogError:
            with self._lock:             # asked again with the next add
                count = self._pending.pop(key, 0)
                self.total += count      # rather than lose them: an upper bound
            return
        with self._lock:
            if len(self._quorum) >= self.MAX_LEDGERS:
                self._quorum.clear()
            self._quorum[key] = q
            self.total += self._pending.pop(key, 0) / q

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)


class BookieMetrics(ServerObserver):
    """The registry of one bookie: live histograms plus figures read at scrape time. As its
    BookieServer's observer (``server.observers``) it times every answered request."""

    def __init__(self, bookie):
        self.bookie = bookie
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_latency = Histogram(
            "embedlog_bookie_request_latency_seconds", "Bookie requests, arrival to reply, by operation",
            ["op"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.requests = Counter("embedlog_bookie_requests", "Requests answered, by operation and status",
                                ["op", "status"], registry=r)
        self.fsync_latency = Histogram(
            "embedlog_journal_fsync_latency_seconds", "Journal fdatasync latency (one per group commit)",
            buckets=LATENCY_BUCKETS_S, registry=r)
        self.group_entries = Histogram(
            "embedlog_journal_group_entries", "Journal records per group commit, by the trigger that "
            "flushed it", ["trigger"], buckets=GROUP_ENTRY_BUCKETS, registry=r)
        self.group_bytes = Histogram(
            "embedlog_journal_group_bytes", "Journal bytes per group commit, by trigger",
            ["trigger"], buckets=GROUP_BYTE_BUCKETS, registry=r)
        # each labelled child looked up once: labels() took a lock and built a key on every
        # call, four times per request answered (a third of a lone add's metrics work)
        self._latency_of = {op: self.request_latency.labels(op) for op in TIMED_OPS}
        self._requests_of: dict = {}
        self._group_of = {t: (self.group_entries.labels(t), self.group_bytes.labels(t))
                          for t in TRIGGERS}
        self.disk = DiskFigures(bookie)
        self.server = None            # the BookieServer, for its connection figures
        self.underreplicated = None   # () -> int, set by the admin server (cached metadata read)
        self.group_lags = None        # () -> [dict] | None, the same for consumer groups' lag
        self.autorecovery = None      # the AutoRecovery, when this process runs one
        self.written: WrittenEntries | None = None
        self.registry.register(_Snapshot(self))
        journal = getattr(bookie, "journal", None)
        if journal is not None:
            journal.group_observer = self.on_group

    def on_group(self, trigger: str, records: int, nbytes: int, fsync_s) -> None:
        entries, nbytes_hist = self._group_of[trigger]
        entries.observe(records)
        nbytes_hist.observe(nbytes)
        if fsync_s is not None:
            self.fsync_latency.observe(fsync_s)

    def observe_request(self, op: str, status: int, seconds: float, requests: int = 1) -> None:
        latency = self._latency_of[op]
        for _ in range(requests):
            latency.observe(seconds)
        count = self._requests_of.get((op, status))
        if count is None:
            count = self._requests_of[op, status] = self.requests.labels(op, str(status))
        count.inc(requests)

    def request_done(self, op: str, status: int, seconds: float | None, key=None,
                     entries: int = 0, requests: int = 1) -> None:
        """Requests answered, on any protocol (net/server.py's ServerObserver)."""
        if op in TIMED_OPS and seconds is not None:
            self.observe_request(op, status, seconds, requests)
        if entries and key is not None and self.written is not None and status == 0:
            self.written.add(key, entries)

    def count_written_entries(self, meta) -> "BookieMetrics":
        """Count the entries clients wrote (WrittenEntries), with ``meta`` for write quorums."""
        self.written = WrittenEntries(meta)
        return self

    def bookie_info(self) -> dict:
        return {} if self.written is None else {"written_entries": round(self.written.total, 3)}

    def watch(self, server) -> "BookieMetrics":
        """Observe ``server`` (its requests, and its connection figures at scrape time)."""
        self.server = server
        server.observers.append(self)
        return self

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Snapshot:
    """Figures read when Prometheus scrapes: the bookie's counters, disk, metadata."""

    def __init__(self, metrics: BookieMetrics):
        self.m = metrics

    def describe(self):
        return []

    def collect(self):
        m = self.m
        s = m.bookie.statistics()
        j = s.get("journal", {})

        def counter(name, doc, value):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            return c

        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            return g

        yield counter("embedlog_bookie_add_entries", "Entries added to this bookie", s.get("adds", 0))
        yield counter("embedlog_bookie_add_bytes", "Bytes of entries added", s.get("add_bytes", 0))
        yield counter("embedlog_bookie_read_entries", "Entries read from this bookie", s.get("reads", 0))
        yield gauge("embedlog_bookie_ledgers", "Ledgers this bookie holds", s.get("ledgers", 0))
        yield gauge("embedlog_bookie_read_only", "1 when the bookie refuses adds",
                    int(bool(m.bookie.read_only)))
        if m.written is not None:
            yield counter("embedlog_bookie_written_entries", "Entries clients wrote, each replica "
                          "counting 1/Qw: sum() over bookies is the cluster's write rate",
                          m.written.total)
        groups = CounterMetricFamily("embedlog_journal_groups", "Group commits by trigger",
                                     labels=["trigger"])
        for t in TRIGGERS:
            groups.add_metric([t], j.get(t, 0))
        yield groups
        yield counter("embedlog_journal_fsyncs", "Journal fdatasyncs", j.get("fsyncs", 0))
        yield counter("embedlog_journal_memory_throttled", "Adds that waited for a group commit at "
                      "journal_max_memory_size_mb", j.get("memory_throttled", 0))
        yield counter("embedlog_journal_fsync_seconds", "Time spent in journal fdatasync",
                      j.get("fsync_time_s", 0.0))
        yield counter("embedlog_journal_bytes_written", "Journal bytes written", j.get("bytes_written", 0))
        yield counter("embedlog_journal_records_written", "Journal records written",
                      j.get("records_written", 0))
        yield gauge("embedlog_memtable_bytes", "Bytes of entries in the memtables", s.get("memtable_bytes", 0))
        yield gauge("embedlog_memtable_entries", "Entries in the memtables", s.get("memtable_entries", 0))
        yield gauge("embedlog_memtable_allocated_bytes", "Memory the memtables hold",
                    s.get("memtable_allocated_bytes", 0))
        yield counter("embedlog_memtable_flushes", "Memtables flushed to entry logs",
                      s.get("memtable_flushes", 0))
        yield counter("embedlog_entry_log_rolls", "Entry logs started", s.get("entry_log_rolls", 0))
        yield counter("embedlog_bookie_throttled_adds", "Adds that waited for memtable room",
                      s.get("throttled_adds", 0))
        yield counter("embedlog_bookie_checkpoints", "Checkpoints (LastLogMark moves)", s.get("checkpoints", 0))
        yield gauge("embedlog_index_pages_cached", "Index pages in memory", s.get("index_pages_cached", 0))
        yield gauge("embedlog_compaction_progress_ratio", "Progress of the compaction under way (0..1)",
                    compaction_progress(s))
        gc = s.get("gc") if isinstance(s.get("gc"), dict) else {}
        yield counter("embedlog_gc_cycles", "Garbage collection cycles", gc.get("cycles", 0))
        yield counter("embedlog_gc_ledgers_deleted", "Ledgers whose data GC dropped",
                      gc.get("ledgers_deleted", 0))
        yield gauge("embedlog_gc_missing_ledgers", "Ledgers held here that the metadata store "
                    "lacks without a deletion record (kept; an operator decides)",
                    gc.get("missing_ledgers", 0))
        kinds = CounterMetricFamily("embedlog_compactions", "Compactions by kind", labels=["kind"])
        kinds.add_metric(["major"], gc.get("major_compactions", 0))
        kinds.add_metric(["minor"], gc.get("minor_compactions", 0))
        yield kinds
        yield counter("embedlog_compaction_reclaimed_bytes", "Bytes of entry logs compaction reclaimed",
                      gc.get("reclaimed_bytes", 0))
        other = GaugeMetricFamily("embedlog_bookie_statistic",
                                  "Other figures of Bookie.statistics() (GC, compaction, ...)",
                                  labels=["key"])
        for k, v in _flatten({k: v for k, v in s.items() if k not in _MAPPED}).items():
            other.add_metric([k], v)
        yield other
        d = m.disk.get()
        yield gauge("embedlog_disk_total_bytes", "Size of the bookie directory's file system", d["total_bytes"])
        yield gauge("embedlog_disk_free_bytes", "Free bytes there", d["free_bytes"])
        yield gauge("embedlog_disk_usage_ratio", "Used / size of that file system", d["usage_ratio"])
        yield gauge("embedlog_journal_dir_bytes", "Bytes of journal files", d["journal_bytes"])
        yield gauge("embedlog_entry_log_bytes", "Bytes of entry logs", d["entry_log_bytes"])
        yield gauge("embedlog_index_bytes", "Bytes of ledger index files", d["index_bytes"])
        if m.server is not None:
            st = m.server.stats
            yield counter("embedlog_server_connections", "Connections accepted", st.get("connections", 0))
            yield counter("embedlog_server_bad_frames", "Malformed frames", st.get("bad_frames", 0))
            yield counter("embedlog_server_errors", "Requests answered with an error", st.get("errors", 0))
            yield counter("embedlog_server_auth_failures", "Requests refused before authentication",
                          st.get("auth_failures", 0))
            yield counter("embedlog_server_refused_connections", "Connections refused at max_connections",
                          st.get("refused_connections", 0))
            yield counter("embedlog_server_throttled", "Times a connection was held back at an in-flight limit",
                          st.get("throttled", 0))
            yield counter("embedlog_server_rejected_requests", "Requests refused with ETOOMANYREQUESTS",
                          st.get("rejected_requests", 0))
            yield counter("embedlog_server_idle_closed", "Idle connections sent GOAWAY", st.get("idle_closed", 0))
            yield gauge("embedlog_server_in_flight_requests", "Requests read and not yet answered",
                        m.server.in_flight_requests)
            yield gauge("embedlog_server_in_flight_bytes", "Bytes of requests read and not yet answered",
                        m.server.in_flight_bytes)
            yield gauge("embedlog_server_open_connections", "Connections open", m.server.open_connections)
        if m.underreplicated is not None:
            count = m.underreplicated()
            if count is not None:
                yield gauge("embedlog_underreplicated_ledgers",
                            "Ledgers marked under-replicated in the metadata store", count)
        if m.group_lags is not None:
            rows = m.group_lags()
            if rows is not None:
                lag = GaugeMetricFamily(
                    "embedlog_consumer_group_lag", "Consumer group lag: the stream's end position "
                    "(LAC + 1) - the group's committed position (every bookie reports the "
                    "cluster's groups: take max() over instances, not sum())", labels=["group", "stream"])
                committed = GaugeMetricFamily(
                    "embedlog_consumer_group_committed_position", "A consumer group's committed "
                    "position (the next position it reads)", labels=["group", "stream"])
                end = GaugeMetricFamily("embedlog_consumer_group_end_position", "The end position "
                                        "(LAC + 1) of a stream a consumer group reads",
                                        labels=["group", "stream"])
                for r in rows:
                    lag.add_metric([r["group"], r["stream"]], r["lag"])
                    committed.add_metric([r["group"], r["stream"]], r["committed"])
                    end.add_metric([r["group"], r["stream"]], r["end"])
                yield lag
                yield committed
                yield end
        ar = m.autorecovery
        yield gauge("embedlog_autorecovery_enabled", "1 when this process runs autorecovery", int(ar is not None))
        if ar is not None:
            yield gauge("embedlog_autorecovery_is_auditor", "1 when this process is the elected auditor",
                        int(bool(ar.is_auditor)))
            for k, v in ar.stats.items():
                yield counter(f"embedlog_autorecovery_{k}", f"Autorecovery: {k.replace('_', ' ')}", v)
