"""What a bookie knows of each ledger it holds, and the checks a request meets before it
touches one: BookKeeper's HandleFactory and its LedgerDescriptors (master key, fence,
explicit LAC), with the bookie's master-key cache and what the metadata store says.

Per ledger, keyed (scope, ledger id):

- its LedgerIndex (``storage.ledgers``), whose header keeps the master key, the fence, the
  term, the explicit LAC (with a BookKeeper client's WRITE_LAC body) and the incarnation;
- the highest entry id seen, the highest LAC an entry carried, and the lowest entry a
  failed journal group took back (an embedded writer acknowledges nothing from there on);
- its ``LedgerFacts``, read from the metadata store once and cached.

A ledger id can come back: its ledger deleted and a new one created under the same id (an
explicit id, BookKeeper's createLedgerAdv, a metadata store restored from an older backup).
The index header keeps the incarnation of the data held (the metadata's ctime when it was
first adopted), and a ledger whose metadata names another incarnation is *foreign* here:
every request for it is answered as by a bookie that does not hold it (reads, LAC reads,
fences: NoSuchLedgerError; adds, explicit LACs, terms, trims: LedgerExistsError, which a
writer answers by replacing this bookie). The old data is kept (a restored store may be the
reason the ids came back) and reported; ``foreign()`` lists it, and garbage collection
halts deletion while any is held (bookie/rollback.py).

So facts must not outlive the ledger they describe. Stores that can (ZooKeeper) arm a watch
with each read, which drops the facts when the ledger's metadata changes or goes; a dropped
connection takes the watches (the facts stay, unwatched), and so does a lost session
(``epoch``). Where no watch guards them (SQLite, etcd, or a watch gone), a fence or a read
trusts facts at most ``FACTS_RECHECK_S`` old (the server's requests and the embedded
open_ledger ask ``needs_facts``), and a writer's add of an entry id the bookie already holds
or to a fenced ledger (rare for a ledger's own writer; what a new ledger's writer usually
does first) reads facts that old again. Other adds never wait for the store, so writes go
on through a metadata outage as on BookKeeper's bookies. A request of any kind for a held
ledger whose facts are missing (none read since start, or dropped by a watch) reads the
metadata first, and fails while the store cannot answer: a restarted bookie must not serve
an earlier incarnation's entries to a reader of the new ledger (their digests check: same
id, and CRC digests take no password). Reads go on through an outage only on facts read
before. The incarnation is journalled (INCARNATION) as it is adopted, so an index the
journal rebuilds after a crash, before its header reached disk, keeps it.

Every method is called with the bookie's lock held, except the facts' (their own lock:
the server fetches facts off its event loop while others hold the bookie's). The changes
a client asks for are journalled by the bookie; replay makes the same changes through the
same methods (bookie/replay.py).
"""
from __future__ import annotations

import collections
import logging
import struct
import threading
import time

from embedlog._native import bkencode, journal_format as jformat, journal_kernels as jkernels
from embedlog._native.format import (DIGEST_CODES, LedgerId, mac_key as derive_mac,
                                     master_key as derive_key)
from embedlog._native.index import MAX_LAC_BODY
from embedlog.errors import (CorruptedDataError, IllegalOpError, MetadataError,
                             InvalidTermError, LedgerExistsError, LedgerFencedError,
                             NoSuchLedgerError, UnauthorizedAccessError)

log = logging.getLogger("embedlog.bookie")
_IDS = struct.Struct(">QQ")
_IDS_U64 = struct.Struct(">QQQ")
_IDS_I64 = struct.Struct(">QQq")
_LAC_HEAD = struct.Struct(">qq")      # a WRITE_LAC body begins: ledger id, LAC
FACTS_MAX = 100_000          # ledgers whose metadata facts are cached
NO_LEDGER_END = 2**63 - 1    # past any entry id: a truncation erases up to here
FACTS_RECHECK_S = 1.0        # a fence or a read trusts unwatched facts at most this old
_MAC = DIGEST_CODES["mac"]
CREATE, FENCE, READ = "create", "fence", "read"    # what a request does, for needs_facts


def _lac_body_says(body, key, lac: int) -> bool:
    """A WRITE_LAC body of this ledger and LAC, within the index header's room for one."""
    return (16 <= len(body) <= MAX_LAC_BODY and key[0] == 0
            and _LAC_HEAD.unpack_from(body) == (key[1], lac))


class LedgerFacts:
    """What the metadata store says of a ledger that the bookie checks requests against;
    ``ctime_ms`` tells one incarnation of a ledger id from another. ``fetched_s`` (monotonic)
    and ``watched`` (a store watch drops these facts when the metadata changes, ``epoch``
    the store session it lives in) say how far they may be trusted; ``tried_s``: when a
    writer's add last tried to read them again (check_key: once a second at most)."""
    __slots__ = ("master_key", "digest", "unbounded", "ctime_ms", "fetched_s", "watched", "epoch",
                 "mac_key", "tried_s")

    def __init__(self, master_key: bytes, digest: int, unbounded: bool, ctime_ms: int = -1,
                 fetched_s: float = 0.0, watched: bool = False, epoch=None,
                 mac_key: bytes | None = None):
        self.master_key, self.digest, self.unbounded = master_key, digest, unbounded
        self.ctime_ms, self.fetched_s, self.watched, self.epoch = ctime_ms, fetched_s, watched, epoch
        self.mac_key = mac_key          # a MAC ledger's digest key (for WRITE_LAC bodies)
        self.tried_s = fetched_s


class LedgerDescriptors:
    def __init__(self, storage, deleted, metadata, bookie_id: str, max_entry_size_bytes: int,
                 keep_files: bool = False):
        """``deleted``: the DeletedLedgers memory (bookie/tombstones.py); ``metadata``: the
        store facts are read from (None: no checks against it). ``keep_files``: a read-only
        view (bookie/snapshot.py), whose deletes forget a ledger and leave its files to the
        writer. ``journal`` is set once the bookie has one: first keys and terms are
        journalled as they are adopted."""
        self.storage = storage
        self.ledgers = storage.ledgers               # (scope, lid) -> LedgerIndex
        self.deleted = deleted
        self.metadata = metadata
        self.bookie_id = bookie_id
        self.max_entry_size_bytes = max_entry_size_bytes
        self.journal = None
        self._keep_files = keep_files
        self._last_entry: dict = {}                  # key -> highest entry id seen
        self._lacs: dict = {}                        # key -> highest LAC carried by an entry
        # key -> lowest entry a failed group took back; changed only here, read by writers
        self.lost_adds: dict = {}
        self._facts: collections.OrderedDict = collections.OrderedDict()   # key -> LedgerFacts
        self._facts_lock = threading.Lock()
        self._absent: dict = {}                      # deleted key -> when its metadata was gone
        self._foreign: dict = {}                     # key -> (held incarnation, listed one)
        lm = getattr(metadata, "ledger_manager", None)
        self._watches = bool(getattr(lm, "watches_ledgers", False))

    # -- the ledgers held -----------------------------------------------------------------

    def load(self, key, idx) -> None:
        """An index file read at start-up."""
        self.ledgers[key] = idx
        self._last_entry[key] = idx.last_entry_id()

    def index(self, key):
        """The ledger's index; NoSuchLedgerError if this bookie does not hold it, or holds
        another incarnation of its id than the metadata store lists."""
        idx = self.ledgers.get(key)
        if idx is None:
            raise NoSuchLedgerError(f"bookie has no ledger {LedgerId(*key)}")
        if self._other_incarnation(key, idx):
            raise NoSuchLedgerError(self._foreign_message(key, idx))
        return idx

    def _other_incarnation(self, key, idx) -> bool:
        """The cached facts name another incarnation than the data held (no I/O)."""
        facts = self._facts.get(key)
        if facts is None or facts.ctime_ms < 0 or idx.incarnation < 0 or \
                idx.incarnation == facts.ctime_ms:
            if self._foreign:            # the store lists the held ledger again
                self._foreign.pop(key, None)
            return False
        if key not in self._foreign:
            self._foreign[key] = (idx.incarnation, facts.ctime_ms)
            log.error("bookie %s holds an earlier ledger %r (created at %d ms) than the one "
                      "the metadata store lists under its id (created at %d ms): it answers "
                      "for the new ledger as a bookie that does not hold it and keeps the old "
                      "data; ledger deletion halts on this bookie until an operator resumes it "
                      "(`embedlog bookie deletion-halt BOOKIE_ID`)", self.bookie_id,
                      LedgerId(*key), idx.incarnation, facts.ctime_ms)
        return True

    def _foreign_message(self, key, idx) -> str:
        return (f"bookie {self.bookie_id} holds data of an earlier ledger {LedgerId(*key)} "
                f"(created at {idx.incarnation} ms) than the one the metadata store lists "
                f"(created at {self._facts[key].ctime_ms} ms; the old one deleted and its id "
                "used again, or the store restored from an older backup): it holds nothing of "
                "the new one and takes no adds for it")

    def foreign(self) -> dict:
        """Ledgers held here whose id the metadata store now gives another ledger:
        key -> (incarnation held, incarnation listed), both ctimes in ms."""
        return dict(self._foreign)

    def known(self, key):
        """The ledger's index, created (in memory) if new."""
        if key not in self.ledgers:
            self._last_entry[key] = -1
        return self.storage.known(key)

    def seen(self, key, eid: int) -> None:
        if eid > self._last_entry.get(key, -1):
            self._last_entry[key] = eid

    def last_entry_id(self, key) -> int:
        return self._last_entry.get(key, -1)

    def note_lac(self, key, lac: int) -> None:
        """An entry carried ``lac``."""
        if lac > self._lacs.get(key, -1):
            self._lacs[key] = lac

    def set_lac(self, key, lac: int) -> None:
        """The LAC found at the first look since start (the last entry's, or the explicit one)."""
        self._lacs[key] = lac

    def lac(self, key) -> int | None:
        """The highest LAC known for the ledger, or None before one is known since start."""
        return self._lacs.get(key)

    # -- the checks a request meets ----------------------------------------------------------

    def check_key(self, key, master_key: bytes, create: bool, fencing: bool = False,
                  first_entry: int | None = None):
        """The ledger's index after checking the master key (adopted on first use, journalled).
        A ledger id whose metadata names another incarnation than this bookie held or
        deleted is refused: NoSuchLedgerError for a fence (``fencing``), as a bookie that
        never saw it answers, LedgerExistsError for the rest (a writer replaces the bookie).
        ``first_entry``: a writer's add from that entry id on; one the bookie already holds
        (a new ledger's writer starts again where the old one wrote), or one to a fenced
        ledger (the old one was recovered before it was deleted), re-reads facts that no
        watch guards and are over FACTS_RECHECK_S old before trusting them, trying once a
        second at most (inline: both are rare for a ledger's own writer, and a stale
        writer's in-flight adds to its fenced ledger must not each read the store)."""
        idx = self.ledgers.get(key)
        if idx is None or idx.master_key is None:
            if not create:
                raise NoSuchLedgerError(f"bookie has no ledger {LedgerId(*key)}")
            gone_ms = self.deleted.deleted_at(key)
            if gone_ms is not None:
                facts = self._deleted_ledger_facts(key)
                if facts is not None and facts.ctime_ms > gone_ms:
                    # a new ledger under the id of one deleted here: not this bookie's to hold
                    # while it remembers the deletion; a writer replaces it
                    error = NoSuchLedgerError if fencing else LedgerExistsError
                    raise error(f"ledger {LedgerId(*key)} was deleted from bookie "
                                f"{self.bookie_id} at {gone_ms} ms; the metadata store lists "
                                f"a newer ledger of that id (created at {facts.ctime_ms} ms), "
                                "which this bookie does not take")
                # a writer that missed the recovery and deletion of its ledger: never bring
                # the ledger back (its entry would be acknowledged, then collected)
                raise LedgerFencedError(f"ledger {LedgerId(*key)} was deleted from bookie "
                                        f"{self.bookie_id}; it is not created again")
            facts = self.facts(key)
            if facts is not None and facts.master_key != bytes(master_key):
                # squatting: a ledger is created here only with the key its password gives
                raise UnauthorizedAccessError(f"wrong master key for ledger {LedgerId(*key)} "
                                              f"(not the one its metadata's password gives)")
            idx = self.set_master_key(key, bytes(master_key))
            self.journal.add_record(jformat.LEDGER_KEY, _IDS.pack(*key) + bytes(master_key))
            if facts is not None and facts.ctime_ms >= 0:
                self._adopt_incarnation(key, facts.ctime_ms)
            return idx
        if first_entry is not None and (first_entry <= self._last_entry.get(key, -1)
                                        or idx.fenced) and self._stale_unwatched(key):
            self._reread(key)
        facts = self._facts.get(key)
        if facts is None or facts.ctime_ms != idx.incarnation or self._foreign:
            self._check_incarnation(key, idx, fencing)      # all but a writer's every add
        if idx.master_key != master_key:
            raise UnauthorizedAccessError(f"wrong master key for ledger {LedgerId(*key)}")
        return idx

    def refuse_damaged(self, key) -> None:
        """A ledger whose index was rebuilt from the entry logs takes no new adds here (its
        fence state was lost with the file); its fence, recovery adds and reads go on."""
        damage = self.storage.damaged.get(key)
        if damage is not None:
            raise CorruptedDataError(
                f"ledger {LedgerId(*key)} on bookie {self.bookie_id}: its index file "
                f"{damage['file']} was damaged ({damage['error']}); it was rebuilt from the "
                "entry logs for reading and recovery, and this bookie takes no more writes to it")

    def _stale_unwatched(self, key) -> bool:
        """Facts no watch guards, read over FACTS_RECHECK_S ago."""
        facts = self._facts.get(key)
        return (facts is not None and not facts.watched
                and time.monotonic() - facts.fetched_s > FACTS_RECHECK_S)

    def _reread(self, key) -> None:
        """Read stale facts again for a writer's add, or refuse it if that was tried under
        FACTS_RECHECK_S ago and failed (the store cannot answer: a retryable error)."""
        facts = self._facts[key]
        now = time.monotonic()
        if now - facts.tried_s <= FACTS_RECHECK_S:
            raise MetadataError(f"bookie {self.bookie_id}: the metadata of ledger "
                                f"{LedgerId(*key)} could not be read to check this add; "
                                "try again")
        facts.tried_s = now
        self.fetch_facts(key)

    def _check_incarnation(self, key, idx, fencing: bool = False) -> None:
        """The data this bookie holds for a ledger id belongs to the ledger the metadata store
        lists under it now. After the id came back (module doc) a new ledger's adds and
        recovery must never land in, or read from, the old one's data."""
        facts = self.facts(key)
        if facts is None or facts.ctime_ms < 0:
            return
        if idx.incarnation == facts.ctime_ms:      # (check_key decides it inline when cached)
            if self._foreign:            # the store lists the held ledger again
                self._foreign.pop(key, None)
        elif idx.incarnation < 0:      # an index from before incarnations, or rebuilt
            self._adopt_incarnation(key, facts.ctime_ms)
        elif self._other_incarnation(key, idx):
            raise (NoSuchLedgerError if fencing else LedgerExistsError)(
                self._foreign_message(key, idx))

    def check_term(self, idx, key, term: int) -> None:
        """Unbounded ledgers: a lower term is refused, a higher one adopted (journalled).
        A bounded ledger refuses any term (one ADD with term 5 would fail its writer for ever)."""
        if term:
            facts = self.facts(key)
            if facts is not None and not facts.unbounded:
                raise IllegalOpError(f"ledger {LedgerId(*key)} is bounded: it takes no term "
                                     f"(the request has term {term})")
        if term < idx.term:
            raise InvalidTermError(f"ledger {LedgerId(*key)} is at term {idx.term} on bookie "
                                   f"{self.bookie_id}; the request has term {term}")
        if self.raise_term(key, term):
            self.journal.add_record(jformat.TERM, _IDS_U64.pack(*key, term))

    def check_entries(self, entries: list, start: int, ledger, checked, runs: dict) -> tuple:
        """check_entry (and the header, ledger and entry id checks before it) over
        entries[start:] in one C pass, up to the first entry of a ledger not in ``checked``;
        ``runs`` gets each ledger's highest entry id and LAC. Returns (index to go on from,
        that ledger or None, bytes checked): journal_kernels.check_encoded_entries."""
        return jkernels.check_encoded_entries(entries, start, ledger, self._facts, checked, runs,
                                              self.max_entry_size_bytes)

    # -- changes (journalled by the bookie, or replayed) ------------------------------------

    def _adopt_incarnation(self, key, ctime_ms: int) -> None:
        """The data held is this incarnation's from now on, journalled: an index replayed
        before its header reached disk keeps it (a journal without it, from before the
        record, leaves it unknown, adopted again at the next check)."""
        if self.journal is not None:      # first: set, it is never journalled again
            self.journal.add_record(jformat.INCARNATION, _IDS_I64.pack(*key, ctime_ms))
        self.set_incarnation(key, ctime_ms)

    def set_incarnation(self, key, ctime_ms: int) -> None:
        idx = self.known(key)
        idx.incarnation = ctime_ms
        idx.header_dirty = True

    def set_master_key(self, key, master_key: bytes):
        idx = self.known(key)
        idx.master_key = master_key
        idx.header_dirty = True
        return idx

    def fence(self, key) -> bool:
        """Fence the ledger; False if it already was."""
        idx = self.known(key)
        if idx.fenced:
            return False
        idx.fenced = True
        idx.header_dirty = True
        return True

    def raise_explicit_lac(self, key, lac: int, body: bytes | None = None) -> bool:
        """Raise the explicit LAC to ``lac``; False if it was not lower. ``body``: the
        BookKeeper client's WRITE_LAC body for it (ledger id, LAC, digest), kept in the
        index header for READ_LAC when it is 16 to MAX_LAC_BODY bytes and says this LAC."""
        idx = self.known(key)
        if body is not None and lac >= idx.explicit_lac and _lac_body_says(body, key, lac):
            idx.lac_body = bytes(body)
            idx.header_dirty = True
        if lac <= idx.explicit_lac:
            return False
        idx.explicit_lac = lac
        idx.header_dirty = True
        return True

    def lac_body(self, key) -> bytes | None:
        """The body READ_LAC answers a BookKeeper reader with: the last WRITE_LAC body kept,
        or, when a writer on embedlog's protocol (whose WRITE_LAC carries no body) raised the
        explicit LAC past it, one made here in the ledger's digest type, as a BookKeeper
        writer would have sent it. None without either (or before the facts are read)."""
        idx = self.index(key)
        body, lac = idx.lac_body, idx.explicit_lac
        if lac < 0 or key[0] != 0 or (body is not None and _LAC_HEAD.unpack_from(body)[1] >= lac):
            return body
        facts = self._facts.get(key)
        if facts is None or (facts.digest == _MAC and facts.mac_key is None):
            return body
        return bkencode.lac_body(key[1], lac, facts.digest, facts.mac_key)

    def raise_term(self, key, term: int) -> bool:
        """Adopt ``term``; False if the ledger's was not lower."""
        idx = self.known(key)
        if term <= idx.term:
            return False
        idx.term = term
        idx.header_dirty = True
        return True

    def truncate(self, key, last_kept: int) -> None:
        """Forget every entry above ``last_kept`` (a stream's truncating add)."""
        if key not in self.ledgers:
            return
        self.storage.erase(key, last_kept + 1, NO_LEDGER_END)
        self._last_entry[key] = min(self._last_entry.get(key, -1), last_kept)
        if self._lacs.get(key, -1) > last_kept:
            self._lacs[key] = last_kept

    def delete(self, key) -> None:
        """Forget the ledger: its state, its memtable entries, its index file (unless
        ``keep_files``: a view's writer deletes those), and remember it was deleted."""
        self._last_entry.pop(key, None)
        self._lacs.pop(key, None)
        self.lost_adds.pop(key, None)
        self._foreign.pop(key, None)
        self._facts.pop(key, None)
        if self._keep_files:
            self.storage.forget_ledger(key)
            return
        self.deleted.add(key)
        self.storage.drop_ledger(key)

    def take_back(self, lost) -> None:
        """A journal group the disk refused: its entries ((scope, lid, eid)), already in the
        memtable, are erased again (they were never durable, so nothing may count or serve
        them), and each ledger remembers the lowest one lost."""
        touched = set()
        for scope, lid, eid in lost:
            key = (scope, lid)
            if key in self.ledgers:
                self.storage.erase(key, eid, eid)
                touched.add(key)
            if eid < self.lost_adds.get(key, eid + 1):
                self.lost_adds[key] = eid
        for key in touched:
            idx = self.ledgers.get(key)
            last = idx.last_entry_id() if idx is not None else -1
            for mt in (self.storage.mt_a, self.storage.mt_b):
                last = max(last, mt.last_entry_id(*key))
            self._last_entry[key] = last
            self._lacs.pop(key, None)

    # -- what the metadata store says of a ledger (checked once, then cached) --------------

    def _deleted_ledger_facts(self, key) -> LedgerFacts | None:
        """The facts of a ledger id this bookie deleted, or None while its metadata is gone
        (known from a read at most FACTS_RECHECK_S old, so a zombie writer's adds cost one
        metadata read a second at most)."""
        if self.metadata is None:
            return None
        facts = self._facts.get(key)
        if facts is not None or self._absent_known(key):
            return facts
        try:
            return self.fetch_facts(key)
        except NoSuchLedgerError:
            return None

    def _absent_known(self, key) -> bool:
        seen = self._absent.get(key)
        if seen is None:
            return False
        if time.monotonic() - seen <= FACTS_RECHECK_S:
            return True
        self._absent.pop(key, None)
        return False

    def needs_facts(self, key, kind: str = CREATE, ctime_ms: int | None = None) -> bool:
        """True when a request for this ledger must wait for ``fetch_facts`` first (the
        server runs it off its event loop). ``kind``: CREATE (an add, WRITE_LAC, a trim:
        anything that may create the ledger here), FENCE (a fencing or term-carrying read)
        or READ. The facts are read again when missing or untrustworthy: never looked up
        since start or dropped by a watch (CREATE and FENCE; READ for a ledger held here),
        their session gone (any kind, for a ledger held here), older than FACTS_RECHECK_S
        and unwatched (FENCE and READ, for a ledger held here: one metadata read a second
        at most, per ledger read; adds check theirs in check_key), or naming another ledger
        than the metadata the caller just read (``ctime_ms``: its ctime)."""
        if self.metadata is None:
            return False
        facts = self._facts.get(key)
        held = key in self.ledgers
        if ctime_ms is not None and held and facts is not None and facts.ctime_ms != ctime_ms:
            return True
        if facts is None:
            if kind != READ and self._absent_known(key):
                return False                 # deleted here, and its metadata still gone
            return kind != READ or held      # held data, of an incarnation not yet checked
        if facts.watched and facts.epoch != self._epoch():
            return kind != READ or held      # the session, and its watches, are gone
        return kind != CREATE and held and self._stale_unwatched(key)

    def _epoch(self):
        return self.metadata.ledger_manager.watch_epoch() if self._watches else None

    def fetch_facts(self, key) -> LedgerFacts:
        """Read the ledger's metadata (blocking): the master key its password gives, its
        digest type, whether it is unbounded, its incarnation. With a store that watches,
        the read arms a watch that drops these facts on the metadata's next change.
        NoSuchLedgerError if it has none."""
        lm = self.metadata.ledger_manager
        lid = LedgerId(*key)
        fetched = time.monotonic()
        try:
            if self._watches:
                epoch = lm.watch_epoch()
                md = lm.read_ledger_metadata(lid, watch=lambda changed: self._watched(key, changed)).value
            else:
                epoch = None
                md = lm.read_ledger_metadata(lid).value
        except NoSuchLedgerError:
            if key in self.deleted:
                with self._facts_lock:
                    self._absent[key] = fetched
            raise
        digest = int(md.digest_type)
        facts = LedgerFacts(derive_key(md.password), digest, md.unbounded,
                            int(md.ctime_ms), fetched, self._watches, epoch,
                            derive_mac(md.password) if digest == _MAC else None)
        with self._facts_lock:            # not the bookie's lock: callers may hold that one
            self._facts[key] = facts
            self._facts.move_to_end(key)
            self._absent.pop(key, None)
            while len(self._facts) > FACTS_MAX:
                self._facts.popitem(last=False)
        return facts

    def _watched(self, key, changed: bool) -> None:
        """A watch fired (the store's thread): the ledger's metadata changed or went (the
        facts go), or the connection dropped and took the watch (the facts stay, unwatched:
        the rules for stores without watches apply until they are read again)."""
        with self._facts_lock:
            if not changed:
                facts = self._facts.get(key)
                if facts is not None:
                    facts.watched = False
                return
            self._facts.pop(key, None)

    def read_before(self, key) -> bool:
        """Facts of this ledger are cached (of any age, watched or not)."""
        return key in self._facts

    def facts(self, key) -> LedgerFacts | None:
        """The cached facts of a ledger (fetched now if missing); None without a store."""
        if self.metadata is None:
            return None
        facts = self._facts.get(key)
        return facts if facts is not None else self.fetch_facts(key)
