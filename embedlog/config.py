"""Every configuration key of a bookie, in one place.

Keys keep BookKeeper's names in snake_case with BookKeeper's defaults unless
noted. Each key says its unit and what it trades; "SAFETY" marks keys that
trade durability for speed. docs/CONFIGURATION.md is generated from this table
(`embedlog config show`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

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
    journal_page_cache_flush_interval_ms: int = _key(
        1000, "with journal_sync_data=False, how often the journal is synced anyway.", 1, 3_600_000)
    journal_max_size_mb: int = _key(
        2048, "MiB after which a new journal file starts (journalMaxSizeMB).", 1, 1 << 20)
    journal_max_backups: int = _key(
        5, "journal files older than the LastLogMark kept for manual recovery (journalMaxBackups).",
        0, 1000)
    journal_pre_alloc_size_mb: int = _key(
        16, "MiB of zeros written ahead of the journal tail, so the common fdatasync only "
        "flushes data (journalPreAllocSizeMB).", 1, 1024)
    journal_skip_corrupt_records: bool = _key(
        False, "SAFETY: on replay, step over a corrupt journal record in the middle (and "
        "report it) instead of refusing to start. A torn tail is always repaired.")
    # -- ledger storage --------------------------------------------------------
    skip_list_size_limit: int = _key(
        64 * 1024 * 1024, "bytes of entries the memtable holds before it is flushed to "
        "entry logs (skipListSizeLimit). Memory used is about this.", 1 << 16, 1 << 34)
    entry_log_size_limit: int = _key(
        1024 * 1024 * 1024, "bytes after which a new entry log starts (logSizeLimit); "
        "at most 2^31 because locations hold a 32-bit offset.", 1 << 16, (1 << 31) - 1)
    page_limit: int = _key(
        8192, "index pages (8 KiB each) cached in memory across all ledgers (pageLimit).",
        16, 1 << 30)
    flush_interval_ms: int = _key(
        10_000, "ms between checkpoints that flush entry logs and index and move the "
        "LastLogMark (flushInterval). Lower: faster restart, more syncs.", 0, 86_400_000)
    max_entry_size_bytes: int = _key(
        5 * 1024 * 1024, "largest payload accepted (BookKeeper's frame limit, "
        "nettyMaxFrameSizeBytes, is 5 MiB).", 1, 1 << 30)

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
            if lo is not None and value < lo or hi is not None and value > hi:
                raise ConfigError(f"{name}={value!r} is outside [{lo}, {hi}]")

    def as_dict(self):
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "BookieConfig":
        return BookieConfig.from_dict({**self.as_dict(), **changes})
