"""A read-only view of a bookie directory another process may be writing
(``embedlog.open(path, read_only=True)``).

It takes no LOCK and writes nothing. It reads what the writer's own restart would: the
ledger index files and entry logs as they are, and the journal from the LastLogMark to its
end, replayed into memory. So it sees every add the writer had made durable when the view
was taken (and perhaps adds journalled but not yet synced: a reader sees an OPEN ledger's
entries only up to its LAC anyway). A checkpoint the writer runs meanwhile (its mark moves,
old journals are removed) or a journal record being written makes the load start over.
"""
from __future__ import annotations

import collections
import mmap
import os
import threading

from embedlog._native import journal as nj
from embedlog._native import memtable as nmt
from embedlog.bookie import disks
from embedlog.bookie.bookie import Bookie
from embedlog.bookie.journal import journal_ids
from embedlog.bookie.lastmark import LastLogMark
from embedlog.bookie.ledger_storage import SortedLedgerStorage
from embedlog.bookie.replay import apply_record
from embedlog.config import BookieConfig
from embedlog.errors import CorruptedDataError, EmbedlogError, JournalCorruptedError

_ATTEMPTS = 20                 # loads tried while the writer checkpoints under us
_UNBOUNDED = 1 << 62           # the view's memtables hold the whole journal tail


class _NoJournal:
    appended_seq = 0
    stats: dict = {}


class BookieSnapshot(Bookie):
    """The reads of a Bookie over a view taken when it is made; every add is refused."""

    def __init__(self, directory: str, config: BookieConfig | None = None,
                 journal_dir: str | None = None):
        self.metadata = None
        self.config = config or BookieConfig()
        self.config.validate()
        self.directory = os.path.abspath(directory)
        for attempt in range(_ATTEMPTS):
            try:
                self._load(journal_dir)
                return
            except (EmbedlogError, OSError):
                self.close()
                if attempt == _ATTEMPTS - 1:
                    raise

    def _load(self, journal_dir) -> None:
        self._closed = False
        self.current = os.path.join(self.directory, "current")
        self.ledger_dirs, self.journal_dir = disks.resolve_dirs(self.directory, self.config,
                                                                journal_dir)
        self.ledger_currents = [os.path.join(d, "current") for d in self.ledger_dirs]
        try:
            with open(os.path.join(self.current, "BOOKIE_ID")) as f:
                self.bookie_id = f.read().strip()
        except FileNotFoundError:
            raise CorruptedDataError(f"{self.directory} holds no log (no current/BOOKIE_ID)") from None
        self._lock = threading.Lock()
        self.cv = threading.Condition(self._lock)
        self.storage = st = SortedLedgerStorage(self.ledger_currents, self.config, self.cv, self._lock)
        st.mt_a = st.active = nmt.MemTable(_UNBOUNDED)
        st.mt_b = nmt.MemTable(_UNBOUNDED)

        def refuse_rebuild(key, path, current, error):
            raise error                # a damaged index file is the writer's to set aside
        st._rebuild_index = refuse_rebuild
        self.ledgers = st.ledgers
        self.last_entry, self.lacs, self.lost_adds = {}, {}, {}
        self.deleted: set = set()
        self._facts = collections.OrderedDict()
        self._facts_lock = threading.Lock()
        self.stats = {"adds": 0, "add_bytes": 0, "reads": 0, "checkpoints": 0}
        self._read_only_reasons = {"snapshot"}
        self._read_only_lock = threading.Lock()
        self.read_only_listeners: list = []
        self.journal = _NoJournal()
        # the mark first: what the index and entry logs lack from then on is in the journal
        self.mark = LastLogMark(self.ledger_currents)
        self.mark.read(set_aside=False)
        self._load_ledgers()
        self._replay()

    def _replay(self) -> None:
        mark_id, mark_off = self.mark.persisted
        ids = [i for i in journal_ids(self.journal_dir) if i >= mark_id]
        if mark_id and (not ids or ids[0] != mark_id):
            raise JournalCorruptedError(f"journal {mark_id:x}.txn is gone (a checkpoint trimmed it)")
        storage, seen, refused = self.storage, {}, []
        for file_id in ids:
            path = os.path.join(self.journal_dir, "%x.txn" % file_id)
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < nj.HEADER_SIZE:
                    continue
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                if nj.check_file_header(mm[:nj.HEADER_SIZE]) != file_id:
                    raise JournalCorruptedError(f"journal {path}: header names another file")
                start = max(nj.HEADER_SIZE, mark_off) if file_id == mark_id else nj.HEADER_SIZE
                records, _end, status, _ = nj.scan(
                    mm, start, self.config.max_entry_size_bytes + 4096, False)
                if status == "corrupt":
                    raise JournalCorruptedError(f"journal {path}: a bad record before good ones")
                i = 0
                while i < len(records):        # a torn tail: where the writer is, not read
                    if records[i][1] in nj.ENTRY_TYPES:
                        i = nj.replay_entries(mm, records, i, storage.active, seen, refused)
                        for key, eid in seen.items():
                            self._known(key)
                            self._seen(key, eid)
                        seen.clear()
                        refused.clear()
                        continue
                    _off, rtype, body_start, body_len = records[i]
                    apply_record(self, rtype, mm[body_start:body_start + body_len])
                    i += 1
            finally:
                mm.close()

    def _delete_locked(self, key) -> None:
        # the writer deleted it: forget it here, leave its files to the writer
        self.last_entry.pop(key, None)
        self.lacs.pop(key, None)
        self.ledgers.pop(key, None)
        self.storage.mt_a.drop_ledger(*key)
        self.storage.mt_b.drop_ledger(*key)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        storage = getattr(self, "storage", None)
        if storage is not None:
            storage.entry_logger.close()

    def __repr__(self) -> str:
        return f"BookieSnapshot({self.bookie_id!r}, {self.directory!r})"
