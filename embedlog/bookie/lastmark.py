"""The LastLogMark: how far the journal is in ledger storage, and the newest journal file.

``lastMark`` (in every ledger directory's current/)::

    last_mark    := journal_id:u64 offset:u64 crc32c:u32      # 20 bytes
    journal_head := journal_id:u64 crc32c:u32                 # 12 bytes, file journalHead

Everything in the journal before (journal id, offset) is in entry logs and index files,
so replay starts there (docs/FORMATS.md, "LastLogMark").
"""
from __future__ import annotations

import logging
import os
import struct
import threading

from embedlog._native.format import crc32c as nj_crc
from embedlog.fileio import atomic_write

log = logging.getLogger("embedlog.bookie")
_MARK = struct.Struct(">QQ")


class LastLogMark:
    """(journal id, offset): everything before it is in ledger storage.

    Stored as ``lastMark`` in each ledger directory: id:u64 offset:u64 crc32c:u32,
    written to a temporary file, fsynced and renamed, so a crash leaves the old
    mark or the new one, never a torn one. The largest mark over all directories wins.

    A damaged lastMark (a short file, a bad checksum) is set aside as ``lastMark.damaged``
    and the others decide; when no directory holds a good one, replay starts at the
    oldest journal (a full replay: replaying what is already stored is harmless). Either
    way the fallback is logged as an error and reported in ``damaged``.

    ``journalHead`` beside it names the newest journal file (id:u64 crc32c:u32), written
    when a journal file is created, so a newest journal that went missing is noticed.
    """

    def __init__(self, directories: list[str]):
        self.directories = directories
        self.persisted = (0, 0)
        self.damaged: list[str] = []      # what read() set aside
        # checkpoints from the sync thread and from close() may meet here: one at a time,
        # so they neither share lastMark.tmp nor move the mark backwards
        self._lock = threading.Lock()

    def read(self, set_aside: bool = True) -> tuple[int, int]:
        """The newest good mark; a damaged one is renamed ``.damaged`` (unless not
        ``set_aside``: a read-only view of a directory writes nothing)."""
        best, good = (0, 0), 0
        for d in self.directories:
            path = os.path.join(d, "lastMark")
            try:
                data = open(path, "rb").read()
            except FileNotFoundError:
                continue
            if len(data) != 20 or nj_crc(data[:16]) != struct.unpack(">I", data[16:])[0]:
                self.damaged.append(f"{path} ({len(data)} bytes, offset 0: "
                                    f"{'short' if len(data) != 20 else 'bad checksum'})")
                if set_aside:
                    os.replace(path, path + ".damaged")
                continue
            good += 1
            best = max(best, _MARK.unpack(data[:16]))
        if self.damaged:
            log.error("damaged LastLogMark: %s; replaying from %s", "; ".join(self.damaged),
                      f"the best good mark {best}" if good else "the oldest journal (full replay)")
        self.persisted = best
        return best

    def persist(self, mark: tuple[int, int]) -> bool:
        """Write ``mark`` unless it would move the mark backwards; True if written."""
        with self._lock:
            return self._persist(mark)

    def _persist(self, mark: tuple[int, int]) -> bool:
        if mark <= self.persisted:
            return False
        data = _MARK.pack(*mark)
        data += struct.pack(">I", nj_crc(data))
        for d in self.directories:
            atomic_write(os.path.join(d, "lastMark"), data)
        self.persisted = mark
        return True

    def write_head(self, journal_id: int) -> None:
        data = struct.pack(">Q", journal_id)
        for d in self.directories:
            atomic_write(os.path.join(d, "journalHead"), data + struct.pack(">I", nj_crc(data)))

    def read_head(self) -> int | None:
        """The newest journal file any directory recorded (None: not recorded)."""
        best = None
        for d in self.directories:
            try:
                data = open(os.path.join(d, "journalHead"), "rb").read()
            except FileNotFoundError:
                continue
            if len(data) == 12 and nj_crc(data[:8]) == struct.unpack(">I", data[8:])[0]:
                best = max(best or 0, struct.unpack(">Q", data[:8])[0])
        return best
