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

import os
import threading

from embedlog._native import memtable as nmt
from embedlog.bookie import disks, layout
from embedlog.bookie.bookie import Bookie
from embedlog.bookie.descriptors import LedgerDescriptors
from embedlog.bookie.lastmark import LastLogMark
from embedlog.bookie.ledger_storage import SortedLedgerStorage
from embedlog.bookie.replay import replay_bookie
from embedlog.config import BookieConfig
from embedlog.errors import CorruptedDataError, EmbedlogError

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
        # a damaged index file is the writer's to set aside
        self.storage = st = SortedLedgerStorage(self.ledger_currents, self.config, self.cv,
                                                self._lock, rebuild_damaged=False)
        st.mt_a = st.active = nmt.MemTable(_UNBOUNDED)
        st.mt_b = nmt.MemTable(_UNBOUNDED)
        if layout.read_layout(self.ledger_currents) == 2:
            layout.use_segments(st, self.journal_dir)
        self.ledgers = st.ledgers
        self.deleted: set = set()
        # the writer deleted what replay deletes: forget it here, leave its files to the writer
        self.descriptors = LedgerDescriptors(st, self.deleted, None, self.bookie_id,
                                             self.config.max_entry_size_bytes, keep_files=True)
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
        # the writer's own restart replay, reading only: its memtables are unbounded, so it
        # never flushes, and a bad last record is where the writer is
        replay_bookie(self, live=True)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        storage = getattr(self, "storage", None)
        if storage is not None:
            storage.entry_logger.close()

    def __repr__(self) -> str:
        return f"BookieSnapshot({self.bookie_id!r}, {self.directory!r})"
