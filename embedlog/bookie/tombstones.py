"""Ledgers this bookie deleted, remembered so that they are never created again by an add.

BookKeeper's bookies keep a set of recently fenced-and-deleted ledgers: a
writer that has not yet learnt that its ledger was recovered and deleted would
otherwise re-create the ledger on its next add, get an acknowledgement, and lose the entry
to the next garbage collection. embedlog remembers every ledger it deletes (by the API, by
garbage collection, by replay of a journalled delete) for ``deleted_ledger_retention_ms``
and refuses adds, recovery adds and fences to it with LedgerFencedError.

File ``current/deleted-ledgers`` of the first ledger directory (docs/FORMATS.md)::

    file    := magic "ELDL" version:u32(=1) count:u32 record*count crc32c:u32   # big-endian
    record  := scope:u64 ledger:u64 deleted_at_ms:i64

It is rewritten atomically at a checkpoint when something changed. Deletes made since are
in the journal and come back by replay. A damaged file is set aside (``.damaged``) with an
error in the log: losing it weakens this protection, it loses no data.
"""
from __future__ import annotations

import collections
import logging
import os
import struct
import threading
import time

from embedlog._native.format import crc32c
from embedlog.fileio import atomic_write

log = logging.getLogger("embedlog.bookie")
MAGIC = b"ELDL"
_HEAD = struct.Struct(">4sII")
_RECORD = struct.Struct(">QQq")
_CRC = struct.Struct(">I")


class DeletedLedgers:
    def __init__(self, directory: str, retention_ms: int, max_count: int):
        self.path = os.path.join(directory, "deleted-ledgers")
        self.retention_ms = retention_ms
        self.max_count = max_count
        self._deleted: collections.OrderedDict = collections.OrderedDict()  # key -> ms, oldest first
        self._dirty = False
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        try:
            data = open(self.path, "rb").read()
        except FileNotFoundError:
            return
        try:
            magic, version, count = _HEAD.unpack_from(data)
            end = _HEAD.size + count * _RECORD.size
            if magic != MAGIC or version != 1 or len(data) != end + _CRC.size:
                raise ValueError(f"bad header or size (version {version}, {count} records, "
                                 f"{len(data)} bytes)")
            if _CRC.unpack_from(data, end)[0] != crc32c(data[:end]):
                raise ValueError(f"checksum mismatch at offset {end}")
        except (struct.error, ValueError) as exc:
            os.replace(self.path, self.path + ".damaged")
            log.error("%s is damaged (%s): set aside as %s.damaged; ledgers deleted before "
                      "it was written are no longer remembered", self.path, exc, self.path)
            return
        for k in range(count):
            scope, ledger, ms = _RECORD.unpack_from(data, _HEAD.size + k * _RECORD.size)
            self._deleted[(scope, ledger)] = ms

    def add(self, key, now_ms: int | None = None) -> None:
        with self._lock:
            self._deleted.pop(key, None)
            self._deleted[key] = int(time.time() * 1000) if now_ms is None else now_ms
            self._dirty = True
            while len(self._deleted) > self.max_count:
                self._deleted.popitem(last=False)

    def deleted_at(self, key) -> int | None:
        """When (ms) this bookie deleted the ledger, if it remembers it within retention."""
        with self._lock:
            ms = self._deleted.get(key)
        return ms if ms is not None and time.time() * 1000 - ms < self.retention_ms else None

    def keys(self) -> list:
        """The ledgers remembered as deleted (within their retention or not)."""
        with self._lock:
            return list(self._deleted)

    def __contains__(self, key) -> bool:
        return self.deleted_at(key) is not None

    def __len__(self) -> int:
        return len(self._deleted)

    def persist(self) -> None:
        """Write the file if something changed (a checkpoint calls this before moving the mark)."""
        with self._lock:
            if not self._dirty:
                return
            horizon = time.time() * 1000 - self.retention_ms
            while self._deleted and next(iter(self._deleted.values())) < horizon:
                self._deleted.popitem(last=False)
            body = b"".join(_RECORD.pack(s, l, ms) for (s, l), ms in self._deleted.items())
            self._dirty = False
        data = _HEAD.pack(MAGIC, 1, len(body) // _RECORD.size) + body
        atomic_write(self.path, data + _CRC.pack(crc32c(data)))
