"""Every configuration key of a bookie, in one place.

Keys keep BookKeeper's names in snake_case with BookKeeper's defaults unless
noted. Each key says its unit and what it trades; "SAFETY" marks keys that
trade durability for speed. docs/CONFIGURATION.md is generated from this table
(`embedlog config show`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from embedlog._native.wire_sizes import FRAME_HEADERS_BYTES, MAX_FRAME_BYTES
from embedlog.errors import ConfigError


def _key(default, doc, minimum=None, maximum=None):
    return field(default=default, metadata={"doc": doc, "min": minimum, "max": maximum})


@dataclass
class BookieConfig:
    # -- journal -------------------------------------------------------------
    journal_max_group_wait_ms: float = _key(
        2.0, "ms an add may wait for others to share its fdatasync (BookKeeper "
        "journalMaxGroupWaitMSec). Higher: bigger groups, more latency.", 0, 10_000)
    journal_buffered_writes_threshold: int = _key(
        512 * 1024, "bytes pending that flush a group at once (journalBufferedWritesThreshold).",
        1, 1 << 31)
    journal_buffered_entries_threshold: int = _key(
        0, "entries pending that flush a group at once; 0 = off (journalBufferedEntriesThreshold).",
        0, 1 << 31)
    journal_flush_when_queue_empty: bool = _key(
        True, "flush as soon as no other add is waiting, so a lone writer never waits for "
        "the group timer. BookKeeper's default is false; embedlog's is true because an "
        "embedded writer is often alone (journalFlushWhenQueueEmpty).")
    journal_sync_data: bool = _key(
        True, "SAFETY: fdatasync before acknowledging. False acknowledges after write(2) "
        "and syncs every journal_page_cache_flush_interval_ms: a power loss may lose acknowledged adds.")
    enable_busy_wait: bool = _key(
        False, "spin instead of sleeping while the journal writes and fdatasyncs a group of up "
        "to 64 KiB (BookKeeper's enableBusyWait): a thread of the journal's own does the I/O while "
        "the group's leader spins, and spins 0.2 ms after each group waiting for the next before "
        "it sleeps; only while the disk's recent fdatasyncs take under 80 us (through slower ones "
        "the leader syncs in its own call: spinning then costs more than it saves). Where code "
        "runs slowly after a sleep (this project's VMs), a lone durable "
        "append was 26-46% faster for about twice its CPU (docs/PERFORMANCE.md). Off by "
        "default, as in BookKeeper: the spinning takes cores from the rest of the process.")
    journal_page_cache_flush_interval_ms: int = _key(
        1000, "with journal_sync_data=False, how often the journal is synced anyway.", 1, 3_600_000)
    journal_max_size_mb: int = _key(
        2048, "MiB after which a new journal file starts (journalMaxSizeMB).", 1, 1 << 20)
    journal_max_backups: int = _key(
        5, "journal files older than the LastLogMark kept for manual recovery (journalMaxBackups).",
        0, 1000)
    journal_reuse_files: bool = _key(
        True, "a journal file trimmed after a checkpoint (in layout 2: a journal segment garbage "
        "collection frees) is kept (eight, or as many as one trim "
        "frees up to sixteen) and reused for a later journal: renamed, given a new header and overwritten, so no zeros are written to "
        "preallocate it (journalReuseFiles). Kept only while the journal's file system stays below "
        "disk_usage_warn_threshold with room for a whole journal besides; deleted first when it runs short. Its previous records stay behind the new tail, "
        "unreadable as current ones (salted checksums); replay takes a bad last record in such a "
        "file as a torn write only if it is the newest journal, as RocksDB does with recycled logs "
        "(docs/FORMATS.md, \"A bad last record\").")
    journal_pre_alloc_size_mb: int = _key(
        16, "MiB of zeros written ahead of the journal tail, so the common fdatasync only "
        "flushes data (journalPreAllocSizeMB); a new file gets at most 4 MiB of them at once. "
        "Written only while groups are small (a moving mean under 64 KiB) or buffered: large "
        "O_DIRECT groups extend the file instead, since zeros would double what they write "
        "(docs/FORMATS.md, Preallocation).", 1, 1024)
    journal_remove_pages_from_page_cache: bool = _key(
        True, "drop the journal's synced pages from the page cache (journalRemoveFromPageCache): "
        "the journal is read only by replay, so its pages would only push entry-log pages, which "
        "readers use, out of the cache. Buffered writes only: O_DIRECT ones (journal_direct_writes) "
        "leave none there.")
    journal_direct_writes: bool = _key(
        True, "write groups and preallocation zeros with O_DIRECT in whole 4 KiB blocks (the "
        "block the last group ended in is written again, unchanged), so they bypass the page "
        "cache: no copy into it, no dirty pages for fdatasync to write back, nothing to drop. "
        "Falls back to buffered writes where the file system refuses O_DIRECT (tmpfs). "
        "Not in BookKeeper.")
    journal_max_memory_size_mb: int = _key(
        128, "MiB of journal records framed but not yet taken by a group commit; an add "
        "that finds more waits for the group in flight to finish, so a writer faster than "
        "the disk is pushed back instead of growing memory (journalMaxMemorySizeMb). One "
        "batch larger than this is still taken whole.", 1, 1 << 20)
    journal_allow_missing_files: bool = _key(
        False, "SAFETY: start although a journal file replay needs is missing (the one the "
        "LastLogMark points into, one between two others, the newest one recorded), "
        "accepting the loss of whatever it held; the missing files are reported in "
        "replay_report['missing_files']. By default the bookie refuses to start and names them.")
    journal_skip_corrupt_records: bool = _key(
        False, "SAFETY: on replay, step over a corrupt journal record in the middle (and "
        "report it) instead of refusing to start. A torn tail is always repaired, and so is a "
        "power loss inside the newest journal's last group (docs/FORMATS.md).")
    # -- ledger storage --------------------------------------------------------
    storage_layout: int = _key(
        2, "layout of a new bookie directory (current/LAYOUT records it; an existing directory "
        "keeps its own): 2 keeps the journal's files as the storage of the entries they hold "
        "(each entry written once, index locations point into them); 1 copies every entry "
        "into entry logs at each memtable flush (BookKeeper's layout).", 1, 2)
    skip_list_size_limit: int = _key(
        64 * 1024 * 1024, "bytes of entries the memtable holds before it is flushed to "
        "entry logs (skipListSizeLimit). Memory used is about this.", 1 << 16, 1 << 34)
    entry_log_size_limit: int = _key(
        1024 * 1024 * 1024, "bytes after which a new entry log starts (logSizeLimit); "
        "at most 2^31 because locations hold a 32-bit offset.", 1 << 16, (1 << 31) - 1)
    entry_log_page_cache_bytes: int = _key(
        64 * 1024 * 1024, "bytes of the newest entry-log writes left in the page cache: a "
        "memtable flush starts the writeback of what it wrote, and older written pages are "
        "dropped once on disk (posix_fadvise DONTNEED), so readers of recent entries find them "
        "cached (with the memtable's, the newest 128 MiB by default) and steady writing reuses "
        "pages instead of growing the cache (a new page cost 15x a reused one per byte copied "
        "on the VM measured, docs/PERFORMANCE.md). 0 leaves every page to the kernel. Not in "
        "BookKeeper.", 0, 1 << 40)
    page_limit: int = _key(
        8192, "index pages (8 KiB each) cached in memory across all ledgers (pageLimit).",
        16, 1 << 30)
    flush_interval_ms: int = _key(
        10_000, "ms between checkpoints that flush entry logs and index and move the "
        "LastLogMark (flushInterval). Lower: faster restart, more syncs.", 0, 86_400_000)
    max_entry_size_bytes: int = _key(
        MAX_FRAME_BYTES, "largest payload accepted (BookKeeper's frame limit, "
        "nettyMaxFrameSizeBytes, is 5 MiB).", 1, 1 << 30)
    # -- directories (docs/FORMATS.md, "Bookie directory") ---------------------------------
    journal_directory: str = _key(
        "", "journal directory (journalDirectory); empty: <dir>/journal. On a disk of its own, "
        "the journal's fdatasync never queues behind entry-log and index writes.")
    ledger_directories: str = _key(
        "", "comma-separated ledger directories (ledgerDirectories), each with its own current/ "
        "(entry logs, index files, lastMark); empty: <dir> itself. New entry logs and index "
        "files go to the writable one with the most free space.")
    allow_storage_expansion: bool = _key(
        False, "let a bookie start with ledger directories its cookie does not list "
        "(allowStorageExpansion); they must be empty. A listed directory may never go missing.")
    # -- garbage collection and compaction (embedlog/bookie/gc.py, compaction.py) -----------
    gc_wait_time_ms: int = _key(
        600_000, "ms between garbage-collection cycles (gcWaitTime; BookKeeper's code default, "
        "its conf file says 1000). 0: no background cycles (Bookie.gc.run_once() only).",
        0, 86_400_000)
    deleted_ledger_retention_ms: int = _key(
        7 * 86_400_000, "ms a deleted ledger is remembered (embedlog/bookie/tombstones.py): "
        "adds, recovery adds and fences to it fail with LedgerFencedError instead of creating "
        "it again (BookKeeper's recently fenced-and-deleted ledgers). A ledger id cannot be "
        "reused this long after its deletion.", 0, 1 << 42)
    deleted_ledgers_max: int = _key(
        100_000, "deleted ledgers remembered at most (about 100 bytes each); the oldest are "
        "forgotten first.", 0, 1 << 31)
    gc_metadata_op_rate_limit: int = _key(
        1000, "metadata reads per second GC makes to confirm that a ledger it is about to "
        "delete is gone (gcMetadataOpRateLimit).", 1, 1_000_000)
    gc_missing_ledger_wait_time_ms: int = _key(
        3_600_000, "on a ZooKeeper root in BookKeeper's format, where Java clients delete a "
        "ledger by removing its znode and leave no deletion record: ms between the two GC "
        "reads that must both find the znode absent before its data goes (with INSTANCEID "
        "and the id generator checked: embedlog/bookie/absence.py). 0: never, only an "
        "operator's confirmation frees such a ledger. Not in BookKeeper, whose GC deletes on "
        "one absence (named after gcOverreplicatedLedgerWaitTime).", 0, 30 * 86_400_000)
    minor_compaction_threshold: float = _key(
        0.2, "entry logs with less than this fraction live are rewritten by minor compaction "
        "(minorCompactionThreshold); 0 disables it.", 0.0, 1.0)
    minor_compaction_interval_s: int = _key(
        3600, "s between minor compactions (minorCompactionInterval); 0 disables them.",
        0, 1 << 31)
    major_compaction_threshold: float = _key(
        0.8, "entry logs with less than this fraction live are rewritten by major compaction "
        "(majorCompactionThreshold); 0 disables it. Higher: more space back, more rewriting.",
        0.0, 1.0)
    major_compaction_interval_s: int = _key(
        86_400, "s between major compactions (majorCompactionInterval); 0 disables them.",
        0, 1 << 31)
    compaction_rate_by_entries: int = _key(
        1000, "entries per second compaction may rewrite (compactionRateByEntries); bounds the "
        "I/O it takes from adds.", 1, 1 << 31)
    compaction_rate_by_bytes: int = _key(
        1_000_000, "bytes per second compaction may rewrite when is_throttle_by_bytes "
        "(compactionRateByBytes).", 1, 1 << 40)
    is_throttle_by_bytes: bool = _key(
        False, "throttle compaction by compaction_rate_by_bytes instead of by entries "
        "(isThrottleByBytes).")
    is_force_gc_allow_when_no_space: bool = _key(
        False, "keep minor compaction running when the disks are full (isForceGCAllowWhenNoSpace); "
        "by default it stops at disk_usage_threshold and major compaction at "
        "disk_usage_warn_threshold, as a rewrite needs free space first.")
    # -- disks (embedlog/bookie/disks.py) ----------------------------------------------------
    disk_usage_threshold: float = _key(
        0.95, "fraction of a disk used at which it is full (diskUsageThreshold): the bookie "
        "turns read-only (adds fail with ReadOnlyBookieError, reads go on).", 0.0, 1.0)
    disk_usage_warn_threshold: float = _key(
        0.90, "fraction used at which a disk is in warning (diskUsageWarnThreshold): major "
        "compaction stops there.", 0.0, 1.0)
    disk_usage_lwm_threshold: float = _key(
        0.95, "a full disk is writable again once its usage is below this (diskUsageLwmThreshold); "
        "lower than disk_usage_threshold gives hysteresis.", 0.0, 1.0)
    disk_check_interval_ms: int = _key(
        10_000, "ms between disk-usage checks (diskCheckInterval); 0: no background checks.",
        0, 86_400_000)
    read_only_mode_on_any_disk_full_enabled: bool = _key(
        True, "turn read-only when any ledger directory (or the journal's) is full "
        "(readOnlyModeOnAnyDiskFullEnabled); false: only when all ledger directories are, "
        "new files then go to those with room.")
    # -- bookie process (`embedlog bookie serve`; an embedded log ignores these) -----------
    metadata_service_uri: str = _key(
        "", "metadata service URI (metadataServiceUri), e.g. zk+hierarchical://h:2181/ledgers; "
        "empty: the directory's own sqlite:///DIR/meta.db.")
    listening_interface: str = _key(
        "127.0.0.1", "address the bookie binds (listeningInterface; BookKeeper takes an "
        "interface name, embedlog an address or host name).")
    bookie_port: int = _key(3181, "port of the wire protocol (bookiePort); 0 = any free port.",
                            0, 65535)
    advertised_address: str = _key(
        "", "HOST:PORT clients should use (advertisedAddress); empty: the listening address.")
    # -- connections and resource limits (docs/SECURITY.md) -------------------------
    max_frame_size_bytes: int = _key(
        MAX_FRAME_BYTES + FRAME_HEADERS_BYTES, "largest frame a bookie reads; a longer one gets EBADREQ and "
        "the connection is closed (nettyMaxFrameSizeBytes, plus room for headers).",
        1 << 16, 1 << 30)
    max_connections: int = _key(
        1024, "connections a bookie serves at once; one more takes the slot of the least "
        "recently used idle connection (nothing in flight, no request for a second), or is "
        "answered ETOOMANYREQUESTS and closed when none is idle.", 1, 1 << 20)
    max_in_flight_requests_per_connection: int = _key(
        1000, "requests of one connection read but not yet answered (adds waiting for the "
        "journal, fencing reads); at the limit the bookie stops reading that connection "
        "(back-pressure) for up to max_throttle_time_ms, then answers ETOOMANYREQUESTS.",
        1, 1 << 24)
    max_in_flight_bytes_per_connection: int = _key(
        64 * 1024 * 1024, "bytes of request frames of one connection not yet answered; "
        "the same back-pressure, then ETOOMANYREQUESTS.", 1 << 16, 1 << 40)
    max_in_flight_requests: int = _key(
        10_000, "requests not yet answered across all connections (maxAddsInProgressLimit "
        "and maxReadsInProgressLimit in one).", 1, 1 << 24)
    max_in_flight_bytes: int = _key(
        256 * 1024 * 1024, "bytes of request frames not yet answered across all "
        "connections, and of frames still arriving as their bytes come (those together at "
        "most half of it, one remote address at most an eighth or a frame).", 1 << 16, 1 << 40)
    max_long_polls: int = _key(
        2000, "long polls (reads waiting for the LAC to pass the reader's) waiting at once "
        "across all connections; one more is answered at once with the LAC and no entry, as "
        "at its timeout. A waiting long poll holds none of the in-flight limits, so it never "
        "holds back an add (BookKeeper counts reads apart from adds).", 0, 1 << 24)
    max_long_polls_per_connection: int = _key(
        1000, "long polls of one connection waiting at once; one more is answered at once "
        "with the LAC and no entry.", 0, 1 << 24)
    max_throttle_time_ms: int = _key(
        10_000, "ms a connection is held back at an in-flight limit before its requests are "
        "refused with ETOOMANYREQUESTS (dbStorage_maxThrottleTimeMs).", 0, 3_600_000)
    max_connections_per_address: int = _key(
        128, "connections one remote address may hold at once; one more takes the slot of "
        "that address's least recently used idle connection, or is answered ETOOMANYREQUESTS "
        "and closed, so one host cannot take every connection.", 1, 1 << 20)
    frame_read_timeout_ms: int = _key(
        30_000, "ms a frame may take to arrive once its first byte has: a connection that "
        "trickles a partial frame is closed after this (it held a buffer for ever).",
        100, 3_600_000)
    connection_idle_timeout_ms: int = _key(
        600_000, "ms after which a connection with nothing in flight and no request is told "
        "to go away (GOAWAY) and closed; clients reconnect on their next request. 0 = never.",
        0, 86_400_000)
    http_server_enabled: bool = _key(
        False, "run the admin HTTP server (health, bookie info, ledgers, autorecovery, "
        "Prometheus metrics, status page) in the bookie process (httpServerEnabled). It has "
        "no authentication: bind it to loopback or a management network.")
    http_server_host: str = _key("127.0.0.1", "address the admin HTTP server binds (httpServerHost).")
    http_server_port: int = _key(
        8080, "port of the admin HTTP server (httpServerPort); 0 = any free port (the bookie's "
        "registration names the one taken).", 0, 65535)
    auto_recovery_daemon_enabled: bool = _key(
        False, "run the auditor election and a replication worker in the bookie process "
        "(autoRecoveryDaemonEnabled).")

    @classmethod
    def keys(cls):
        return {f.name: f for f in fields(cls)}

    @classmethod
    def from_dict(cls, values: dict) -> "BookieConfig":
        known = cls.keys()
        for key in values:
            if key not in known:
                raise ConfigError(f"unknown configuration key {key!r}")
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self):
        for name, f in self.keys().items():
            value = getattr(self, name)
            want = type(f.default)
            if want is bool:
                if not isinstance(value, bool):
                    raise ConfigError(f"{name} must be true or false, got {value!r}")
                continue
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
                setattr(self, name, value)
            if not isinstance(value, want) or isinstance(value, bool):
                raise ConfigError(f"{name} must be {want.__name__}, got {value!r}")
            lo, hi = f.metadata["min"], f.metadata["max"]
            # "not >=": NaN compares false both ways and must not pass as in range
            if lo is not None and not value >= lo or hi is not None and not value <= hi:
                raise ConfigError(f"{name}={value!r} is outside [{lo}, {hi}]")

    def as_dict(self):
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "BookieConfig":
        return BookieConfig.from_dict({**self.as_dict(), **changes})
