"""A Bookie: one bookie's storage, free of any transport.

Directory layout (docs/FORMATS.md)::

    <dir>/LOCK                     flock'd by the one process that has it open
    <dir>/journal/<hex id>.txn     journal files (or config journal_dir)
    <dir>/current/lastMark         LastLogMark
    <dir>/current/<hex id>.log     entry logs
    <dir>/current/ledgers/...      index files of scope-0 ledgers
    <dir>/current/ledgers-scoped/  index files of scope != 0 ledgers

An add is framed into the journal buffer and copied into the memtable under
one lock, then waits (without the lock) for the group commit that makes it
durable. The memtable is flushed, sorted, into entry logs when full; a
checkpoint (every flush_interval_ms, on close, and in the background after
replay) syncs entry logs and index, persists the LastLogMark and trims old
journals. What the bookie knows of each ledger, and the checks a request meets, are its
LedgerDescriptors' (descriptors.py); this module journals the changes they make.
"""
from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import uuid

from embedlog._native import journal_format as jformat, journal_kernels as jkernels
from embedlog._native.reader import LedgerReader
from embedlog._native.format import MAX_ENTRY_ID, LedgerId, parse_entry_header
from embedlog.bookie import cookies, disks, gc, layout
from embedlog.fileio import atomic_write, no_space as _no_space, private_dir
from embedlog.bookie.tombstones import DeletedLedgers
from embedlog.bookie.checkpoint import Checkpointer
from embedlog.bookie.descriptors import LedgerDescriptors
from embedlog.bookie.journal import Journal
from embedlog.bookie.lastmark import LastLogMark
from embedlog.bookie.replay import prefetch, replay_bookie
from embedlog.bookie.ledger_storage import SortedLedgerStorage
from embedlog.config import BookieConfig
from embedlog.errors import (CorruptedDataError, DirectoryLockedError, EmbedlogError,
                             IllegalOpError, LedgerFencedError, MetadataError, NoSuchEntryError,
                             NoSuchLedgerError, ReadOnlyBookieError, TimeoutError)

log = logging.getLogger("embedlog.bookie")
_IDS = struct.Struct(">QQ")
_IDS_I64 = struct.Struct(">QQq")


# The highest entry id a bounded ledger (every ledger but a stream's) takes. An index file
# puts entry e's location at byte 1024 + 8 e whatever the ledger holds below it, so one add
# at 2^40 - 1 (MAX_ENTRY_ID, what the index addresses) made an 8 TiB sparse file, from
# anyone who reaches the bookie with a default ledger's empty password. Up to 2^32 - 1 a
# file is at most 32 GiB, what a dense ledger that long needs anyway, beside at least
# 256 GiB of entries: a ledger that long rolls over. A stream's positions are its one
# ledger's entry ids and must grow for its whole life; its adds carry a term (a bounded
# ledger refuses one), and those keep the index's whole range.
MAX_BOUNDED_ENTRY_ID = (1 << 32) - 1
LAST_LAC_TRIES = 64          # entries below a damaged last one read for the LAC they carry


def _check_entry_id(eid: int, top: int = MAX_BOUNDED_ENTRY_ID) -> None:
    """Entry ids a bookie takes: 0 .. ``top`` (MAX_BOUNDED_ENTRY_ID for a bounded ledger,
    MAX_ENTRY_ID, what its index addresses, for a stream's)."""
    if eid < 0:
        raise IllegalOpError(f"entry ids are not negative, got {eid}")
    if eid > top:
        if top == MAX_BOUNDED_ENTRY_ID:
            raise IllegalOpError(
                f"entry id {eid} is over {top}, the highest a bookie takes for a bounded "
                f"ledger (2^32 - 1: its index file holds 8 bytes for every id below an "
                f"entry's; a stream's ids go up to {MAX_ENTRY_ID}): roll over to a new ledger")
        raise IllegalOpError(f"entry id {eid} is over {MAX_ENTRY_ID}, the highest a bookie's "
                             f"index addresses (2^40 - 1): roll over to a new ledger")


class Bookie:
    def __init__(self, directory: str, config: BookieConfig | None = None, journal_dir: str | None = None,
                 metadata=None):
        """``metadata``: the metadata store (embedlog.meta.api) the bookie belongs to; its
        cookie and garbage collection use it. Without one, GC never deletes ledgers."""
        self.metadata = metadata
        self.config = config or BookieConfig()
        self.config.validate()
        self.directory = os.path.abspath(directory)
        private_dir(self.directory)
        self._lock_fd = self._lock_directory()
        try:
            self._start(journal_dir)
        except BaseException:
            # a bookie that cannot start leaves nothing held: the next try must not see a lock
            if getattr(self, "_stop_prefetch", None) is not None:
                self._stop_prefetch.set()
            for service in (getattr(self, "gc", None), getattr(self, "disks", None),
                            getattr(self, "checkpointer", None)):
                if service is not None:
                    service.stop()
            journal = getattr(self, "journal", None)
            if journal is not None and journal.started:
                journal.close()
            storage = getattr(self, "storage", None)
            if storage is not None:
                storage.close()
            os.close(self._lock_fd)
            raise

    def _start(self, journal_dir) -> None:
        self.current = os.path.join(self.directory, "current")
        # ledger directories (each with its current/) and the journal's: bookie/disks.py
        self.ledger_dirs, self.journal_dir = disks.resolve_dirs(self.directory, self.config, journal_dir)
        self.ledger_currents = [os.path.join(d, "current") for d in self.ledger_dirs]
        for d in [self.journal_dir] + self.ledger_dirs:
            private_dir(d)
        for d in [self.current] + self.ledger_currents:
            private_dir(d, tighten=True)
        self.bookie_id = self._identity()
        self.cookie = cookies.check_and_stamp(self.bookie_id, self.ledger_dirs, self.journal_dir,
                                              self.metadata, self.config.allow_storage_expansion,
                                              home=self.directory)
        gc.check_config(self.config)
        self.disks = disks.DiskMonitor(self.ledger_dirs, self.journal_dir, self.config)
        self._lock = threading.Lock()
        self.cv = threading.Condition(self._lock)
        limit = self.config.entry_log_size_limit
        self.storage = SortedLedgerStorage(
            self.ledger_currents, self.config, self.cv, self._lock,
            choose_current=lambda: os.path.join(self.disks.choose_dir(limit), "current"))
        self.ledgers = self.storage.ledgers          # (scope, lid) -> LedgerIndex
        self.layout = layout.open_layout(self.ledger_currents, self.journal_dir,
                                         self.config.storage_layout)
        if self.layout == 2:
            # every journal and segment file is readable storage from the start (replay,
            # and the reads of entries whose locations point into them)
            layout.use_segments(self.storage, self.journal_dir)
        self.mark = LastLogMark(self.ledger_currents)
        # the journal replay will read comes into the page cache meanwhile (replay.py)
        self._stop_prefetch = prefetch(self.journal_dir, self.mark.read())
        self.deleted = DeletedLedgers(self.ledger_currents[0], self.config.deleted_ledger_retention_ms,
                                      self.config.deleted_ledgers_max)
        self.descriptors = LedgerDescriptors(self.storage, self.deleted, self.metadata,
                                             self.bookie_id, self.config.max_entry_size_bytes)
        self.stats = {"adds": 0, "add_bytes": 0, "reads": 0, "checkpoints": 0}
        self._closed = False
        # read-only mode, with its reasons: "operator" (--read-only, SIGUSR1, the admin API)
        # and "disk" (bookie/disks.py: full at disk_usage_threshold); the bookie is read-only
        # while any reason holds, and each reason is lifted only by its own source
        self._read_only_reasons: set = set()
        self._read_only_lock = threading.Lock()
        self.read_only_listeners: list = []    # callables(read_only: bool, reasons: frozenset)
        self._load_ledgers()
        self.gc = gc.GarbageCollector(self, self.metadata, self.disks)
        self.compaction_report = self.gc.recover()     # before replay: its locations are newer
        self._restore_unindexed()                      # every log is sealed now
        self.journal = Journal(self.journal_dir, self.config, self.cv, self._lock)
        self.descriptors.journal = self.journal
        if self.layout == 2:
            self.journal.files.segments = True
            self.journal.files.on_segment = self.storage.entry_logger.add_segment
            self.storage.wait_journal = self.journal.wait_written
            self.storage.segment_starts = self.journal.segment_starts
        # the flusher runs during replay: a full memtable goes to the entry logs in the
        # background while replay fills the other one (as adds do)
        self.storage.start()
        try:
            self.replay_report = replay_bookie(self)
        finally:
            self._stop_prefetch.set()
        self.storage.settle_rebuilt()
        self.journal.start(self.mark)
        self.journal.on_failure = self._journal_failed
        self.checkpointer = Checkpointer(self)
        # the checkpoint after replay runs in the background, as in BookKeeper: the replayed
        # entries are served from the memtable and the mark stays until that checkpoint has
        # made them durable elsewhere. On a full disk it fails there, counted and retried,
        # and the bookie starts anyway (read-only: the disk monitor below)
        self.checkpointer.request(flush_active=True)
        self._reserve_held_ids()
        self.storage.on_flushed = self.checkpointer.request
        self.checkpointer.start()
        self.disks.listeners.append(self._disks_changed)
        self.storage.on_flush_error = self.disks.check
        self.disks.give_back = self.journal.give_back_spares
        self.disks.start()
        self.gc.start()

    # -- start-up ---------------------------------------------------------------

    def _reserve_held_ids(self) -> None:
        """Tell the store's id generator which ledger ids this bookie holds data of, so it
        never hands them out again, even after the metadata went back in time (drivers
        whose generator cannot be moved — ZooKeeper's sequential nodes, etcd's buckets —
        rely on the incarnation check alone)."""
        reserve = getattr(getattr(self.metadata, "id_generator", None), "reserve_ledger_ids", None)
        if reserve is None:
            return
        top: dict[int, int] = {}
        for scope, lid in list(self.ledgers) + list(self.deleted.keys()):
            if lid > top.get(scope, -1):
                top[scope] = lid
        for scope, lid in top.items():
            try:
                reserve(scope, lid)
            except EmbedlogError as exc:
                log.warning("bookie %s: could not reserve ledger ids through %d of scope %d: %s",
                            self.bookie_id, lid, scope, exc)

    def _lock_directory(self) -> int:
        fd = os.open(os.path.join(self.directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryLockedError(
                f"{self.directory} is open in another process (its LOCK file is held); "
                "close that process first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _identity(self) -> str:
        """The bookie id: a stable name kept in current/BOOKIE_ID, independent of its address
        (clients find the address through the bookie's registration, as in BookKeeper's BP-41)."""
        path = os.path.join(self.current, "BOOKIE_ID")
        try:
            raw = open(path, "rb").read()
        except FileNotFoundError:
            raw = None
        if raw is not None:
            try:
                ident = raw.decode("ascii").strip()
            except UnicodeDecodeError as exc:
                raise CorruptedDataError(f"{path} offset {exc.start}: not a bookie id "
                                         f"({raw[:40]!r}); restore it or remove the directory") from None
            if not ident or not all(c.isalnum() or c in "-_.:" for c in ident):
                raise CorruptedDataError(f"{path} offset 0: not a bookie id ({raw[:40]!r})")
            return ident
        ident = "bookie-" + uuid.uuid4().hex[:12]
        atomic_write(path, (ident + "\n").encode())
        return ident

    def _load_ledgers(self) -> None:
        for key, idx in self.storage.load_indexes():
            self.descriptors.load(key, idx)

    def _restore_unindexed(self) -> None:
        """Ledgers whose index file is missing or cut get what the entry logs hold of them
        (ledger_storage.restore_unindexed); a missing file is looked for only for a ledger
        that was not deleted here and that the metadata store (if any) lists."""
        def wanted(key):
            if key in self.deleted:
                return False
            try:
                return self.descriptors.facts(key) is not None or self.metadata is None
            except NoSuchLedgerError:
                return False
            except EmbedlogError:
                return True            # the store cannot tell now: keep the entries
        self.storage.restore_unindexed(wanted)
        for key in self.storage.rebuilt:
            self.descriptors.seen(key, self.ledgers[key].last_entry_id())

    def _disks_changed(self, full: bool) -> None:
        """The disk monitor's word (any thread; the journal's failure listener holds cv)."""
        self.set_read_only("disk", full)
        if not full:
            # the checkpoint reason would otherwise wait for the flusher's next retry and
            # the next interval's checkpoint (seconds) after the disk reason is gone
            self.checkpointer.room_back()

    def _journal_failed(self, exc, lost) -> None:
        """A group the disk refused (cv held): its entries are taken back (descriptors)."""
        self.descriptors.take_back(lost)
        self.disks.check(exc)

    # -- what the metadata store says of a ledger (checked once, then cached) ----------

    def needs_ledger_facts(self, ledger_id, kind: str = "create",
                           ctime_ms: int | None = None) -> bool:
        """True when a request for this ledger must wait for ``fetch_ledger_facts`` first
        (the server runs that off its event loop): LedgerDescriptors.needs_facts, ``kind``
        "create" (an add, WRITE_LAC, a trim), "fence" (a fencing or term-carrying read) or
        "read"; ``ctime_ms``: the ctime of metadata the caller read just now."""
        return self.descriptors.needs_facts(self._key(ledger_id), kind, ctime_ms)

    def fetch_ledger_facts(self, ledger_id, kind: str = "create"):
        """Read the ledger's metadata (blocking): see LedgerDescriptors.fetch_facts. None
        for a ledger this bookie deleted whose metadata is gone (the request is then
        refused as one for a deleted ledger), and for a read ("read" ``kind``) while the
        store cannot answer if facts were read before: reads go on through a metadata
        outage on what was read before, never on nothing (after a restart, or a watch
        that dropped them, the data held may be another incarnation's: the read fails)."""
        key = ledger_id if isinstance(ledger_id, tuple) else self._key(ledger_id)
        try:
            return self.descriptors.fetch_facts(key)
        except NoSuchLedgerError:
            if key in self.deleted:
                return None
            raise
        except (MetadataError, TimeoutError) as exc:
            if kind != "read" or not self.descriptors.read_before(key):
                raise
            log.debug("bookie %s: ledger %r: metadata unreadable (%s); read on what was read "
                      "before", self.bookie_id, LedgerId(*key), exc)
            return None

    # -- read-only mode ------------------------------------------------------------------

    READ_ONLY_REASONS = ("operator", "disk", "checkpoint")

    @property
    def read_only(self) -> bool:
        """True while any reason holds: adds are refused (ReadOnlyBookieError), reads go on."""
        return bool(self._read_only_reasons)

    @read_only.setter
    def read_only(self, flag: bool) -> None:
        # assigning is the operator's switch; the disks' reason stays as the disks left it
        self.set_read_only("operator", flag)

    @property
    def read_only_reasons(self) -> frozenset:
        return frozenset(self._read_only_reasons)

    def set_read_only(self, reason: str, flag: bool) -> bool:
        """Set or lift one reason for read-only mode ("operator", "disk" or "checkpoint");
        returns whether the bookie is read-only now. ``read_only_listeners`` hear every
        change of the reasons, in order, with the state after it (a served bookie
        re-registers then)."""
        if reason not in self.READ_ONLY_REASONS:
            raise IllegalOpError(f"unknown read-only reason {reason!r}; known: "
                                 f"{', '.join(self.READ_ONLY_REASONS)}")
        with self._read_only_lock:
            before = frozenset(self._read_only_reasons)
            if flag:
                self._read_only_reasons.add(reason)
            else:
                self._read_only_reasons.discard(reason)
            after = frozenset(self._read_only_reasons)
            if after != before:
                for listener in list(self.read_only_listeners):
                    listener(bool(after), after)
        return bool(after)

    @property
    def closed(self) -> bool:
        return self._closed

    def _ensure_open(self):
        if self._closed:
            raise EmbedlogError("bookie is closed")

    def _ensure_writable(self, high_priority: bool = False):
        self._ensure_open()
        # BookKeeper's read-only bookie still takes high-priority adds (a recovery's) while
        # its disks have room: here, when the operator alone made it read-only
        if self.read_only and not (high_priority and self._read_only_reasons == {"operator"}):
            raise ReadOnlyBookieError(f"bookie {self.bookie_id} is read-only")

    # -- adds ---------------------------------------------------------------------------

    def add_payloads(self, ledger_id, master_key: bytes, first_entry_id: int, lac: int,
                     length: int, digest: int, mac_key, payloads) -> tuple[int, int]:
        """Encode and journal payloads as entries first_entry_id, ...; the embedded fast path.
        ``ledger_id``: a LedgerId, an int, or the (scope, ledger id) key a writer keeps.
        ``payloads``: a list of bytes-like objects or a packed batch (journal_kernels.add_payloads).

        Returns (journal seq to wait for, ledger length after the last entry). An error
        raised after part of the batch was framed carries ``entries_framed`` (how many).
        """
        key = ledger_id if type(ledger_id) is tuple else self._key(ledger_id)
        total = jkernels.payload_count(payloads)
        if not 0 <= first_entry_id <= MAX_BOUNDED_ENTRY_ID - max(total, 1) + 1:
            _check_entry_id(first_entry_id)
            _check_entry_id(first_entry_id + max(total, 1) - 1)
        d = self.descriptors
        with self._lock:            # cv's lock, taken bare: make_room's wait is cv's
            if self._closed or self._read_only_reasons:
                self._ensure_writable()
            if self.storage.damaged:
                d.refuse_damaged(key)
            idx = d.check_key(key, master_key, True)
            if idx.fenced:
                raise LedgerFencedError(f"ledger {LedgerId(*key)} is fenced")
            self.journal.make_room()
            done = 0
            start_length = length
            try:
                while True:
                    n, length = jkernels.add_payloads(
                        self.journal.buffer, self.storage.active, key[0], key[1],
                        first_entry_id + done, lac, length, digest, mac_key, payloads, done,
                        self.config.max_entry_size_bytes)
                    done += n
                    if done >= total:
                        break
                    self.storage.make_room(self.journal.note_appended())
            except BaseException as exc:
                if done:
                    # entries first_entry_id .. +done-1 are framed and will be journalled:
                    # the caller must never give those ids to other entries
                    exc.entries_framed = done
                    self.journal.note_appended()
                    d.seen(key, first_entry_id + done - 1)
                raise
            seq = self.journal.note_appended()
            if total:
                d.seen(key, first_entry_id + total - 1)
            self.stats["adds"] += total
            self.stats["add_bytes"] += length - start_length
        return seq, length

    def add_entries(self, entries: list, master_key: bytes, recovery: bool = False,
                    term: int = 0, truncate: bool = False, ledger=None,
                    high_priority: bool = False) -> int:
        """Journal and store encoded entries (wire path); returns the seq to wait for.

        ``term`` is checked and adopted (unbounded ledgers; 0 for bounded ones). With
        ``truncate`` the last entry is a stream's truncating no-op: every entry above it
        is forgotten, durably (a TRUNCATE journal record follows it). With ``ledger``
        ((scope, ledger id)) every entry must belong to that ledger. ``high_priority`` (a
        BookKeeper client's recovery add) is taken on a bookie the operator made read-only."""
        d = self.descriptors
        with self.cv:
            self._ensure_writable(high_priority)
            # the per-entry checks run in one C pass (LedgerDescriptors.check_entries), which
            # stops at each ledger's first entry for its key, fence and term checks here
            checked = {}
            runs = {}                  # (scope, lid) -> [highest entry id, highest LAC]
            pos = nbytes = 0
            while True:
                pos, key, k = d.check_entries(entries, pos, ledger, checked, runs)
                nbytes += k
                if key is None:
                    break
                if not recovery:
                    d.refuse_damaged(key)
                # a writer's add of an entry id the bookie holds may come from a new ledger
                # of a reused id (LedgerDescriptors.check_key)
                eid = parse_entry_header(entries[pos - 1])[3]
                if not term:
                    _check_entry_id(eid)       # before check_key journals a new ledger's key
                first = None if recovery else eid
                idx = d.check_key(key, master_key, True, first_entry=first)
                if idx.fenced and not recovery:
                    raise LedgerFencedError(f"ledger {LedgerId(*key)} is fenced")
                d.check_term(idx, key, term)
                checked[key] = idx
            if truncate and len(checked) != 1:
                raise IllegalOpError("a truncating add carries entries of one ledger")
            if not term:
                for top, _lac in runs.values():
                    _check_entry_id(top)      # nothing of the batch is framed yet
            self.journal.make_room()
            done = 0
            while done < len(entries):
                done += jkernels.add_encoded_entries(self.journal.buffer, self.storage.active, entries, done)
                if done < len(entries):
                    self.storage.make_room(self.journal.note_appended())
            self.stats["add_bytes"] += nbytes
            for key, (top, top_lac) in runs.items():
                d.seen(key, top)
                d.note_lac(key, top_lac)
            if truncate:
                _v, scope, lid, eid, _lac, _len, _d = parse_entry_header(entries[-1])
                self.journal.add_record(jformat.TRUNCATE, _IDS_I64.pack(scope, lid, eid))
                d.truncate((scope, lid), eid)         # its own entry, seen above, is the last
            self.stats["adds"] += len(entries)
            return self.journal.note_appended()

    def check_term(self, ledger_id, master_key: bytes, term: int) -> int:
        """A stream's recovery read or LAC read: check the key, adopt the term (journalled);
        returns the seq to wait for before answering."""
        key = self._key(ledger_id)
        with self.cv:
            self._ensure_open()
            idx = self.descriptors.check_key(key, master_key, True, fencing=True)
            self.descriptors.check_term(idx, key, term)
            return self.journal.appended_seq

    def trim(self, ledger_id, master_key: bytes, term: int, first_kept: int) -> int:
        """Stream retention: forget entries below ``first_kept`` (journalled)."""
        key = self._key(ledger_id)
        with self.cv:
            self._ensure_open()
            idx = self.descriptors.check_key(key, master_key, False)
            self.descriptors.check_term(idx, key, term)
            seq = self.journal.add_record(jformat.TRIM, _IDS_I64.pack(*key, first_kept))
            self.storage.erase(key, 0, first_kept - 1)
            return seq

    def add_entry(self, entry: bytes, master_key: bytes, recovery: bool = False) -> None:
        """Add one encoded entry and return once it is durable."""
        self.wait_durable(self.add_entries([entry], master_key, recovery))

    def wait_durable(self, seq: int, timeout: float | None = None) -> None:
        self.journal.wait_durable(seq, timeout)

    def wait_all_durable(self, timeout: float | None = None) -> None:
        """Wait until everything journalled so far is durable (raises if the journal failed)."""
        with self.cv:
            self.journal.wait_durable_locked(self.journal.appended_seq, timeout)

    def on_durable(self, seq: int, callback) -> None:
        with self.cv:
            self.journal.on_durable(seq, callback)

    def sync_if_idle(self, seq: int) -> bool:
        """Journal.sync_if_idle: ``seq`` made durable in this thread if the journal is idle."""
        with self.cv:
            return self.journal.sync_if_idle(seq)

    # -- ledger state (bookie/descriptors.py; changes journalled here) ----------------------

    def fence(self, ledger_id, master_key: bytes) -> int:
        """Fence a ledger (journalled); returns the seq to wait for before answering."""
        key = self._key(ledger_id)
        with self.cv:
            self._ensure_open()
            self.descriptors.check_key(key, master_key, True, fencing=True)
            if not self.descriptors.fence(key):
                return self.journal.appended_seq
            return self.journal.add_record(jformat.FENCE, _IDS.pack(*key))

    def is_fenced(self, ledger_id) -> bool:
        key = self._key(ledger_id)
        with self.cv:
            return self.descriptors.index(key).fenced

    def set_explicit_lac(self, ledger_id, lac: int, master_key: bytes,
                         body: bytes | None = None, term: int = 0) -> int:
        """Raise the explicit LAC (journalled); the seq to wait for. ``body``: a BookKeeper
        client's WRITE_LAC body, kept in the index header (``sync_ledger_header`` makes it
        durable) for ``explicit_lac_body``. ``term`` is checked as an add's is."""
        key = self._key(ledger_id)
        with self.cv:
            self._ensure_open()
            idx = self.descriptors.check_key(key, master_key, True)
            self.descriptors.check_term(idx, key, term)
            if self.descriptors.raise_explicit_lac(key, lac, body):
                return self.journal.add_record(jformat.EXPLICIT_LAC, _IDS_I64.pack(*key, lac))
            return self.journal.appended_seq

    def explicit_lac_body(self, ledger_id) -> bytes | None:
        """The WRITE_LAC body for a BookKeeper reader's READ_LAC (LedgerDescriptors.lac_body):
        the last one kept (across restarts too), or one made for a higher explicit LAC."""
        key = self._key(ledger_id)
        with self.cv:
            return self.descriptors.lac_body(key)

    def sync_ledger_header(self, ledger_id) -> None:
        """Write and sync the ledger's index header now (blocking: off the event loop). The
        journal keeps the explicit LAC's value only; BookKeeper journals its whole body, so
        a WRITE_LAC answered after this survives a crash as BookKeeper's does."""
        key = self._key(ledger_id)
        with self.cv:
            idx = self.descriptors.index(key)
        with self.storage.lock:           # as a checkpoint's index flush
            idx.flush_header()

    def get_explicit_lac(self, ledger_id) -> int:
        key = self._key(ledger_id)
        with self.cv:
            return self.descriptors.index(key).explicit_lac

    def read_last_entry_id(self, ledger_id) -> int:
        key = self._key(ledger_id)
        with self.cv:
            self.descriptors.index(key)
            return self.descriptors.last_entry_id(key)

    def last_recoverable_entry(self, ledger_id) -> int:
        """Where recovery closes a ledger whose only bookie this is: from the LAC on, the
        last entry before the first one missing (BookKeeper's recovery reads forward from
        LAC + 1 and stops at the first entry it cannot read). Entries past a hole (an add
        whose journal group failed while a later group succeeded) were never acknowledged."""
        lac, last = self.last_add_confirmed(ledger_id)
        key = self._key(ledger_id)
        with self.cv:
            while lac < last and self.storage.holds(key, lac + 1):
                lac += 1
        return lac

    def last_add_confirmed(self, ledger_id) -> tuple[int, int]:
        """(LAC, last entry id) as this bookie knows them: the highest LAC carried by an
        entry or set explicitly, and its highest entry."""
        key = self._key(ledger_id)
        d = self.descriptors
        with self.cv:
            idx = d.index(key)
            last = d.last_entry_id(key)
            known = d.lac(key)
            lac = max(-1 if known is None else known, idx.explicit_lac)
            if last >= 0 and known is None:
                # the first look since start: the LAC the last entry carries
                lac = max(lac, self._carried_lac(key, last))
                d.set_lac(key, lac)
            return lac, last

    def carried_lac(self, ledger_id, last: int) -> int:
        """The LAC entry ``last`` carries, or a lower bound if it is damaged (_carried_lac)."""
        key = self._key(ledger_id)
        with self.cv:
            return self._carried_lac(key, last)

    def _carried_lac(self, key, last: int) -> int:
        """(cv held) The LAC the entry ``last`` carries; if it is damaged, the one the
        nearest readable entry below it carries, among the LAST_LAC_TRIES below it, else -1:
        a lower bound (readers see less, never an unconfirmed entry; a recovery still reads
        ``last`` and fails on it). Before, one damaged last entry made the ledger unopenable."""
        reader = self._wire_reader(key)
        for eid in range(last, max(last - LAST_LAC_TRIES, -1), -1):
            try:
                return parse_entry_header(reader.encoded_entry(eid))[4]
            except NoSuchEntryError:
                continue                  # a hole (an ensemble's other bookies hold it)
            except CorruptedDataError as exc:
                log.error("ledger %r: entry %d is damaged (%s); its LAC is taken from an "
                          "entry below it", LedgerId(*key), eid, exc)
        return -1

    def term_of(self, ledger_id) -> int:
        key = self._key(ledger_id)
        with self.cv:
            return self.descriptors.index(key).term

    def master_key_of(self, ledger_id):
        key = self._key(ledger_id)
        with self.cv:
            idx = self.ledgers.get(key)
            return None if idx is None else idx.master_key

    def delete_ledger(self, ledger_id) -> None:
        """Forget a ledger: index file, memtable entries (journalled, so replay agrees)."""
        key = self._key(ledger_id)
        with self.cv:
            self._ensure_open()
            if key not in self.ledgers:
                raise NoSuchLedgerError(f"bookie has no ledger {LedgerId(*key)}")
            self.journal.add_record(jformat.DELETE_LEDGER, _IDS.pack(*key))
            self.descriptors.delete(key)
            seq = self.journal.appended_seq
        self.wait_durable(seq)

    def delete_ledgers_if(self, pairs) -> int:
        """Garbage collection: delete each (key, index) pair's ledger only if the bookie still
        holds that very index (a ledger re-created since GC looked is kept). Journalled like
        delete_ledger; returns how many were deleted, once durable."""
        done = 0
        with self.cv:
            self._ensure_open()
            for key, idx in pairs:
                if self.ledgers.get(key) is idx:
                    self.journal.add_record(jformat.DELETE_LEDGER, _IDS.pack(*key))
                    self.descriptors.delete(key)
                    done += 1
            seq = self.journal.appended_seq
        self.wait_durable(seq)
        return done

    def list_ledgers(self, scope_id: int | None = None) -> list:
        with self.cv:
            keys = list(self.ledgers.keys())
        return [LedgerId(s, l) for s, l in keys if scope_id is None or s == scope_id]

    def has_ledger(self, ledger_id) -> bool:
        with self.cv:
            return self._key(ledger_id) in self.ledgers

    def was_deleted(self, ledger_id) -> bool:
        """Whether this bookie deleted the ledger (and refuses to create it again)."""
        return self._key(ledger_id) in self.deleted

    # -- reads ------------------------------------------------------------------------------

    @staticmethod
    def _key(ledger_id):
        lid = LedgerId.coerce(ledger_id)
        return (lid.scope_id, lid.ledger_id)

    def _wire_reader(self, key) -> LedgerReader:
        """A reader of entries as stored, at any id held (the wire checks no digest and
        recovery reads past the LAC): reader.pyx's one lookup, with its retries."""
        idx = self.descriptors.index(key)
        st = self.storage
        return LedgerReader(st.mt_a, st.mt_b, st.entry_logger, idx, key[0], key[1], 0, None,
                            MAX_ENTRY_ID)

    def read_entry(self, ledger_id, entry_id: int) -> bytes:
        """The encoded entry as stored (the wire read path; the client checks the digest)."""
        self.stats["reads"] += 1
        return self._wire_reader(self._key(ledger_id)).encoded_entry(entry_id)

    def read_entries(self, ledger_id, first: int, count: int, max_bytes: int) -> tuple[int, bytearray]:
        """(k, framed entries) from ``first`` on, as stored: LedgerReader.encoded_run."""
        k, out = self._wire_reader(self._key(ledger_id)).encoded_run(first, count, max_bytes)
        self.stats["reads"] += k
        return k, out

    def reader(self, ledger_id, digest: int, mac_key, lac: int) -> LedgerReader:
        """A lock-free reader of one ledger (see embedlog._native.reader); NoSuchLedgerError
        if the bookie does not hold it."""
        key = self._key(ledger_id)
        with self.cv:
            idx = self.descriptors.index(key)
            st = self.storage
            return LedgerReader(st.mt_a, st.mt_b, st.entry_logger, idx, key[0], key[1],
                                digest, mac_key, lac)

    def read_payload(self, ledger_id, entry_id: int, digest: int, mac_key) -> bytes:
        """The payload of one entry, its digest checked."""
        return self.reader(ledger_id, digest, mac_key, entry_id).read_entry(entry_id)

    def read_payloads(self, ledger_id, first: int, last: int, digest: int, mac_key) -> list:
        """Payloads of first..last (inclusive), digests checked."""
        return self.reader(ledger_id, digest, mac_key, last).read_batch(first, last)

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self) -> tuple[int, int]:
        """Flush, sync entry logs and index, persist the LastLogMark, trim old journals
        (bookie/checkpoint.py); returns the new mark."""
        return self.checkpointer.checkpoint()

    # -- statistics and shutdown ------------------------------------------------------------------

    def statistics(self) -> dict:
        with self.cv:
            out = dict(self.stats)
            out.update(self.storage.stats)
            out["journal"] = dict(self.journal.stats)
            out["layout"] = self.layout
            st = self.storage
            out["memtable_bytes"] = st.mt_a.size_bytes + st.mt_b.size_bytes
            out["memtable_entries"] = st.mt_a.count + st.mt_b.count
            out["memtable_allocated_bytes"] = st.mt_a.allocated_bytes + st.mt_b.allocated_bytes
            out["index_pages_cached"] = st.index_cache.loaded
            out["index_bytes_written"] = st.index_cache.bytes_written
            out["ledgers"] = len(self.ledgers)
            out["damaged_ledgers"] = {LedgerId(*k).qualified_name: dict(v)
                                      for k, v in st.damaged.items()}
            # ids the metadata store now gives another ledger than the one held (kept)
            foreign = self.descriptors.foreign()
            out["foreign_ledgers"] = len(foreign)
            out["foreign_ledger_ids"] = [
                {"ledger_id": LedgerId(*k).qualified_name, "held_ctime_ms": held,
                 "listed_ctime_ms": listed} for k, (held, listed) in sorted(foreign.items())[:100]]
            out["last_log_mark"] = self.mark.persisted
            out["checkpoint_failures"] = self.checkpointer.failures
            out["checkpoint_last_error"] = self.checkpointer.last_error
            out["replay"] = {k: v for k, v in self.replay_report.items()}
            out["gc"] = dict(self.gc.stats)
        out["disks"] = self.disks.snapshot()
        return out

    def close(self) -> None:
        if self._closed:
            return
        self.gc.stop()             # before the storage closes under a compaction
        self.disks.stop()
        # its thread ends (after any checkpoint it is running) before the last one, so none
        # runs once the directory is unlocked
        self.checkpointer.stop()
        try:
            self.checkpoint()
        except (OSError, EmbedlogError) as exc:
            if not _no_space(exc):
                raise
            # a full disk: the journal still holds everything the mark has not passed
            log.error("bookie %s: no room for the closing checkpoint (%s); the next start "
                      "replays the journal", self.bookie_id, exc)
        finally:
            with self.cv:
                self._closed = True
                self.cv.notify_all()
            self.journal.close()
            self.storage.close()
            os.close(self._lock_fd)

    def __enter__(self):
        return self

    def __repr__(self) -> str:
        state = "read-only" if self.read_only else "writable"
        return f"Bookie({self.bookie_id!r}, {self.directory!r}, {state})"

    def __exit__(self, *exc):
        self.close()
