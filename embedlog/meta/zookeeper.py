"""ZooKeeper metadata driver (kazoo), with BookKeeper's znode layouts.

embedlog's own tree under the root is zktree.py's (its docstring draws it); the bookies'
registrations (ephemeral znodes, their listing and watch) are zkbookies.py's.

A root is in one of two formats (``metadata_format``): embedlog's own (zktree.py; its
LAYOUT starts ``embedlog-layout``) or BookKeeper's, shared with Java clients and bookies
(embedlog/meta/bookkeeper/tree.py has that tree: BookKeeper's records in BookKeeper's
encodings, embedlog's deletion and under-replication records under ``embedlog/``, scope 0
only). "auto", the default, takes the format recorded in LAYOUT (a root with an INSTANCEID
and no LAYOUT, as BookKeeper and Pulsar leave one, is BookKeeper's), and formats a new
root in embedlog's; "bookkeeper" formats a new root as BookKeeper's ``initnewcluster`` does.
Opening a root recorded in the other format than the one asked for is a MetadataError.

Versions are znode versions. Every call waits at most ``timeout_s``: kazoo's blocking
calls wait for the session to resolve, which can take the whole session timeout.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

from kazoo.client import KazooClient, KazooState
from kazoo.protocol.states import EventType
from kazoo.exceptions import (BadVersionError as KzBadVersion, ConnectionClosedError,
                              ConnectionLoss, KazooException, NoNodeError, NodeExistsError,
                              NotEmptyError, OperationTimeoutError, SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError

from embedlog._native.format import LedgerId
from embedlog.errors import (BadVersionError, LedgerExistsError, MetadataError,
                             NoSuchLedgerError, TimeoutError)
from embedlog.meta._common import (LAYOUT_MAGIC, PollingWatch, StoreBase, check_bookie_id,
                                   check_scope, coerce_ledger_id, decentralised_ledger_id,
                                   group_key, group_of_key,
                                   decode_underreplicated, deleted_id_message, merge_missing,
                                   recorded_layout)
from embedlog.meta.api import (ConsumerGroupStore, CookieStore, DeletionRecord, LayoutExistsError, LayoutManager,
                               LedgerIdGenerator, LedgerManager, LedgerMetadata, MetadataStore,
                               UnderreplicationManager, Versioned)
from embedlog.meta.bookkeeper import idgen as bkidgen
from embedlog.meta.bookkeeper import layout as bklayout
from embedlog.meta.bookkeeper import ledger_metadata as bkledger
from embedlog.meta.bookkeeper import replication as bkreplication
from embedlog.meta.bookkeeper.tree import BookKeeperTree
from embedlog.meta.zkbookies import ZkRegistrations
from embedlog.meta.zktree import (LEAF, SCOPE_LEVELS, SCOPED_LEDGER, SHORT_ID_LIMIT, EmbedlogTree,
                                  split_digits)

LAYOUTS = ("flat", "hierarchical", "longhierarchical")
FORMATS = ("auto", "embedlog", "bookkeeper")
_RETRIES = 50                            # bound on optimistic retry loops

_TRANSIENT = (KazooTimeoutError, ConnectionLoss, OperationTimeoutError)


class ZkMetadataStore(StoreBase, MetadataStore, LedgerManager, LedgerIdGenerator,
                      ZkRegistrations, LayoutManager, CookieStore, UnderreplicationManager,
                      ConsumerGroupStore):
    """``ZkMetadataStore("127.0.0.1:2181", "/ledgers", layout="hierarchical")``.

    Options: ``timeout_s`` (connect and per-call bound, default 5), ``session_timeout_s``
    (ZooKeeper session, 10: how long a dead bookie's ephemeral znode outlives it),
    ``poll_interval_s`` (safety-net poll of watches, 1), ``metadata_format`` ("auto",
    "embedlog" or "bookkeeper": the module docstring). ``layout=None`` takes the layout the
    root records (else hierarchical), as BookKeeper's ``zk://`` and ``zk+null://`` do.
    ``.metadata_format`` says which format the open root is in.
    """

    def __init__(self, hosts: str, root: str = "/ledgers", *, layout: str | None = "hierarchical",
                 timeout_s: float = 5.0, session_timeout_s: float = 10.0,
                 poll_interval_s: float = 1.0, uri: str | None = None, create: bool = True,
                 metadata_format: str = "auto"):
        if layout is not None and layout not in LAYOUTS:
            raise MetadataError(f"unknown ZooKeeper ledger layout {layout!r}; known: {LAYOUTS}")
        if metadata_format not in FORMATS:
            raise MetadataError(f"unknown metadata format {metadata_format!r}; known: {FORMATS}")
        root = "/" + root.strip("/")
        if root == "/":
            raise MetadataError("the ZooKeeper ledgers root cannot be '/'")
        self._explicit_layout = layout is not None
        self.layout, self.root, self.hosts = layout or "hierarchical", root, hosts
        self.uri = uri or f"zk+{self.layout}://{hosts.replace(',', ';')}{root}"
        self._wanted_format = metadata_format
        self._tree: EmbedlogTree | BookKeeperTree = EmbedlogTree(root, self.layout)
        self._timeout_s = float(timeout_s)
        self._session_timeout_s = float(session_timeout_s)
        self._poll_interval_s = float(poll_interval_s)
        self._ensured: set = set()          # parent znodes known to exist
        self._watches: list[PollingWatch] = []
        ZkRegistrations.__init__(self)
        self._closed = False
        self._bind_managers()
        self._zk = KazooClient(hosts=hosts, timeout=float(session_timeout_s))
        try:
            self._zk.start(timeout=self._timeout_s)
        except KazooTimeoutError:
            self._shutdown_client()
            raise MetadataError(f"ZooKeeper at {hosts} not reachable within {self._timeout_s}s") from None
        except Exception as exc:
            self._shutdown_client()
            raise MetadataError(f"ZooKeeper at {hosts}: {exc}") from exc
        self._zk.add_listener(self._on_state)
        try:
            self._choose_tree()
            if create:
                self._init_tree()
            else:
                self._check_tree()
        except BaseException:
            self.close()
            raise

    # ---- plumbing ------------------------------------------------------------------

    def _shutdown_client(self) -> None:
        try:
            self._zk.stop()
            self._zk.close()
        except Exception:
            pass

    @contextmanager
    def _errors(self, what: str):
        """Kazoo's errors the caller did not handle become embedlog errors."""
        try:
            yield
        except (NoNodeError, NodeExistsError, KzBadVersion, NotEmptyError):
            raise
        except _TRANSIENT as exc:
            raise TimeoutError(f"zookeeper {self.hosts}: {what}: no answer within "
                               f"{self._timeout_s}s ({type(exc).__name__})") from exc
        except (SessionExpiredError, ConnectionClosedError) as exc:
            raise MetadataError(f"zookeeper {self.hosts}: {what}: session gone "
                                f"({type(exc).__name__})") from exc
        except KazooException as exc:
            raise MetadataError(f"zookeeper {self.hosts}: {what}: {exc!r}") from exc

    def _wait(self, async_result, what: str):
        with self._errors(what):
            return async_result.get(timeout=self._timeout_s)

    def _get(self, path: str, watch=None):
        return self._wait(self._zk.get_async(path, watch=watch), f"get {path}")

    def _children(self, path: str, watch=None) -> list[str]:
        return self._wait(self._zk.get_children_async(path, watch=watch), f"list {path}")

    def _create(self, path: str, value: bytes = b"", *, ephemeral=False, sequence=False,
                makepath=True) -> str:
        return self._wait(self._zk.create_async(path, value, ephemeral=ephemeral,
                                                sequence=sequence, makepath=makepath),
                          f"create {path}")

    def _set(self, path: str, value: bytes, version: int = -1):
        return self._wait(self._zk.set_async(path, value, version=version), f"set {path}")

    def _delete(self, path: str, version: int = -1) -> None:
        self._wait(self._zk.delete_async(path, version=version), f"delete {path}")

    def _exists(self, path: str, watch=None):
        return self._wait(self._zk.exists_async(path, watch=watch), f"exists {path}")

    def _ensure(self, path: str) -> None:
        self._wait(self._zk.ensure_path_async(path), f"ensure {path}")

    def _commit(self, txn, what: str) -> list:
        """A failed kazoo transaction returns its errors in the result list instead of
        raising: raise the first real one (the rest are RolledBackError)."""
        results = self._wait(txn.commit_async(), what)
        for r in results:
            if isinstance(r, Exception) and type(r).__name__ != "RolledBackError":
                raise r
        for r in results:
            if isinstance(r, Exception):
                raise MetadataError(f"zookeeper {what}: transaction rolled back")
        return results

    def _p(self, *parts: str) -> str:
        return "/".join((self.root,) + parts)

    @property
    def metadata_format(self) -> str:
        """"embedlog" or "bookkeeper": the format of this root."""
        return self._tree.name

    def _choose_tree(self) -> None:
        """The format recorded in LAYOUT (and its layout, when the URI named none); a root
        with an INSTANCEID and no LAYOUT is BookKeeper's (BookKeeper writes LAYOUT lazily,
        and Pulsar's `initialize-cluster-metadata` leaves a root so; embedlog writes both in
        one transaction); on a new root, the format asked for ("auto": embedlog's)."""
        # INSTANCEID before LAYOUT: embedlog writes both at once, so LAYOUT read second is
        # there whenever its INSTANCEID was (read the other way, a root formatted between
        # the two reads looked like BookKeeper's)
        has_instance = self._exists(self._p("INSTANCEID")) is not None
        stored = self.read_layout()
        found = ("bookkeeper" if bklayout.is_bookkeeper_layout(stored) else
                 "embedlog" if stored is not None and stored.startswith(LAYOUT_MAGIC) else None)
        if stored is None and has_instance:
            found = "bookkeeper"
        wanted = self._wanted_format
        if found and wanted != "auto" and found != wanted:
            raise MetadataError(f"zookeeper {self.hosts}{self.root} holds metadata in "
                                f"{found}'s format, not {wanted}'s (metadata_format={wanted!r})")
        fmt = found or ("embedlog" if wanted == "auto" else wanted)
        if fmt == "bookkeeper":
            if stored is not None and found and not self._explicit_layout:
                self.layout = bklayout.parse_layout(stored).ledger_layout
            self._tree = BookKeeperTree(self.root, self.layout)
        elif found and not self._explicit_layout:
            self.layout = recorded_layout(stored) or self.layout
            self._tree = EmbedlogTree(self.root, self.layout)

    def _init_tree(self) -> None:
        for sub in self._tree.format_dirs():
            self._ensure(self._p(sub))
        if self._tree.name == "embedlog":
            # both in one transaction: a root with an INSTANCEID and no LAYOUT is BookKeeper's
            txn = self._zk.transaction()
            txn.create(self._p("INSTANCEID"), str(uuid.uuid4()).encode())
            txn.create(self._p("LAYOUT"), self._tree.layout_record())
            try:
                self._commit(txn, f"format {self.root}")
            except NodeExistsError:
                pass
        else:
            # INSTANCEID before LAYOUT, as BookKeeper's initnewcluster: a root with a layout
            # is a formatted one
            try:
                self._create(self._p("INSTANCEID"), str(uuid.uuid4()).encode(),
                             makepath=False)
            except NodeExistsError:
                pass
            self._write_missing_layout()
        self.instance_id = self._get(self._p("INSTANCEID"))[0].decode()
        stored = self.read_layout()
        if self._tree.name == "embedlog" and bklayout.is_bookkeeper_layout(stored):
            # another process formatted the root for BookKeeper meanwhile
            raise MetadataError(f"zookeeper {self.hosts}{self.root} holds metadata in "
                                f"bookkeeper's format, not embedlog's")
        self._tree.check_layout(stored, f"zookeeper {self.hosts}{self.root}",
                                self._explicit_layout)

    def _check_tree(self) -> None:
        """create=False: an initialised store (layout, instance id), read without writing,
        but for BookKeeper's LAYOUT on a BookKeeper root without one, written as
        BookKeeper's own clients and bookies write it."""
        try:
            self.instance_id = self._get(self._p("INSTANCEID"))[0].decode()
        except NoNodeError:
            raise MetadataError(f"no metadata store at {self.uri}: {self.root}/INSTANCEID does not "
                                f"exist (`embedlog metadata format`, `embedlog cluster up` or "
                                f"BookKeeper's `initnewcluster` makes one)") from None
        if self._tree.name == "bookkeeper":
            self._write_missing_layout()
        self._tree.check_layout(self.read_layout(), f"zookeeper {self.hosts}{self.root}",
                                self._explicit_layout)

    def _write_missing_layout(self) -> None:
        try:
            self._create(self._p("LAYOUT"), self._tree.layout_record(), makepath=False)
        except NodeExistsError:
            pass

    # ---- paths ---------------------------------------------------------------------

    def ledger_path(self, ledger_id) -> str:
        """The znode of a ledger under this layout (public for tools and tests)."""
        return self._tree.ledger_path(coerce_ledger_id(ledger_id))

    # ---- LedgerManager -------------------------------------------------------------

    def _deleted_path(self, lid: LedgerId) -> str:
        qn = lid.qualified_name
        return f"{self._tree.deleted_base()}/{qn[-2:]}/{qn}"

    def _ensure_parent(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent not in self._ensured:          # transactions cannot make parents
            self._ensure(parent)
            self._ensured.add(parent)

    def create_ledger_metadata(self, metadata: LedgerMetadata) -> Versioned:
        lid = metadata.ledger_id
        if isinstance(self._tree, BookKeeperTree) and bkledger.ctoken_of(metadata) is None:
            # BookKeeper's creator token: a create that finds the znode it made itself
            # (a retry after a lost answer) knows it by this token
            metadata = bkledger.with_ctoken(metadata, secrets.randbelow(1 << 63))
        data = self._tree.encode_ledger(metadata)        # MetadataError if it cannot be kept
        path, gone = self.ledger_path(lid), self._deleted_path(lid)
        self._ensure_parent(path)
        self._ensure_parent(gone)
        # creating and deleting the deletion record in the same transaction fails it
        # when a record exists: a deleted id is not created again while it is kept
        txn = self._zk.transaction()
        txn.create(path, data)
        txn.create(gone, b"")
        txn.delete(gone)
        try:
            self._commit(txn, f"create ledger {lid}")
        except NodeExistsError:
            at = self.ledger_deleted_at(lid)
            if at is not None:
                raise LedgerExistsError(deleted_id_message(lid, at)) from None
            if self._created_by(lid, metadata):
                return Versioned(metadata, 0)
            raise LedgerExistsError(f"ledger {lid} already exists") from None
        except NoNodeError:                      # a parent removed meanwhile: make it again
            self._ensured.clear()
            return self.create_ledger_metadata(metadata)
        return Versioned(metadata, 0)

    def _created_by(self, lid: LedgerId, metadata: LedgerMetadata) -> bool:
        """Whether the znode of ``lid`` is the one ``metadata`` created (same creator token,
        and never written since)."""
        token = bkledger.ctoken_of(metadata)
        if token is None:
            return False
        try:
            found = self.read_ledger_metadata(lid)
        except (NoSuchLedgerError, MetadataError):
            return False
        return found.version == 0 and bkledger.ctoken_of(found.value) == token

    def ledger_deletion(self, ledger_id) -> DeletionRecord | None:
        lid = coerce_ledger_id(ledger_id)
        try:
            data, _stat = self._get(self._deleted_path(lid))
        except NoNodeError:
            return None
        return DeletionRecord.decode(lid, data)

    def purge_deletions(self, before_ms: int) -> int:
        gone = 0
        base = self._tree.deleted_base()
        for part in self._listdir(base):
            for name in self._listdir(f"{base}/{part}"):
                path = f"{base}/{part}/{name}"
                try:
                    data, stat = self._get(path)
                    if DeletionRecord.decode(name, data).deleted_at_ms < before_ms:
                        self._delete(path, stat.version)
                        gone += 1
                except (NoNodeError, KzBadVersion, MetadataError):
                    continue
        return gone

    watches_ledgers = True

    def watch_epoch(self) -> int | None:
        """This client's session id (kept across reconnections; a new one after expiry)."""
        client_id = self._zk.client_id
        return None if client_id is None else client_id[0]

    def read_ledger_metadata(self, ledger_id, watch=None) -> Versioned:
        """``watch``: called once (kazoo's thread): ``watch(True)`` when the znode next
        changes or goes, ``watch(False)`` when the connection drops first (kazoo forgets its
        watches then: what was read is no longer watched)."""
        lid = coerce_ledger_id(ledger_id)
        try:
            data, stat = self._get(self.ledger_path(lid), None if watch is None else (
                lambda event: watch(event.type != EventType.NONE)))
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {lid}") from None
        metadata = self._tree.decode_ledger(lid, data, stat.ctime)
        if metadata.ledger_id != lid:
            raise MetadataError(f"corrupted ledger metadata: znode of {lid} holds {metadata.ledger_id}")
        return Versioned(metadata, stat.version)

    def write_ledger_metadata(self, metadata: LedgerMetadata, version: Any) -> Versioned:
        lid = metadata.ledger_id
        if not isinstance(version, int):
            raise BadVersionError(f"ledger {lid}: version {version!r} is not a znode version")
        # znode versions count from 0 again for a ledger created under a deleted one's id:
        # a write at a version of the deleted ledger must not land on the new one (its ctime
        # tells them apart; a writer changes a ledger's metadata a few times in its life)
        current = self.read_ledger_metadata(lid)
        if current.version == version and current.value.ctime_ms != metadata.ctime_ms:
            raise BadVersionError(f"ledger {lid}: the stored metadata is of another ledger of "
                                  "that id (deleted and created again)")
        try:
            stat = self._set(self.ledger_path(lid), self._tree.encode_ledger(metadata), version)
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {lid}") from None
        except KzBadVersion:
            raise BadVersionError(f"ledger {lid}: version {version} is stale") from None
        return Versioned(metadata, stat.version)

    def remove_ledger_metadata(self, ledger_id, version: Any = None) -> None:
        lid = coerce_ledger_id(ledger_id)
        gone = self._deleted_path(lid)
        self._ensure_parent(gone)
        # the record names the ledger deleted (its ctime): the znode is read first and
        # deleted at the version read, so the ctime is that of the znode that goes
        read_version, ctime_ms = self._version_and_ctime(lid)
        txn = self._zk.transaction()
        txn.delete(self.ledger_path(lid), read_version if version is None else version)
        at_ms = int(time.time() * 1000)
        txn.create(gone, DeletionRecord(at_ms, ctime_ms).encode().encode())
        try:
            self._commit(txn, f"remove ledger {lid}")
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {lid}") from None
        except KzBadVersion:
            if version is None:            # rewritten between the read and the delete
                return self.remove_ledger_metadata(ledger_id, version)
            raise BadVersionError(f"ledger {lid}: version {version} is stale") from None
        except NodeExistsError:        # a stale record of an earlier life of this id
            self._delete(gone)
            self.remove_ledger_metadata(ledger_id, version)

    def _version_and_ctime(self, lid: LedgerId) -> tuple[int, int]:
        try:
            data, stat = self._get(self.ledger_path(lid))
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {lid}") from None
        try:
            return stat.version, self._tree.decode_ledger(lid, data, stat.ctime).ctime_ms
        except MetadataError:              # unreadable metadata: a record without the ctime
            return stat.version, -1

    def _listdir(self, path: str) -> list[str]:
        # a directory removed while we walk is simply empty
        try:
            return self._children(path)
        except NoNodeError:
            return []

    def _walk(self, base: str, widths: tuple, leaf_width: int,
              prefix: tuple) -> Iterator[tuple[tuple, list[int]]]:
        """(levels, sorted leaf numbers) of every leaf directory under ``base``, in order.

        Children whose names do not fit the tree (LAYOUT, available, ...) are skipped:
        fixed-width digit names sort as their numbers do."""
        if not widths:
            digits = "".join(prefix)
            nums = []
            for name in self._listdir(base):
                m = LEAF.match(name)
                if m and len(m.group(1)) == leaf_width:
                    nums.append(int(digits + m.group(1)))
            if nums:
                yield prefix, sorted(nums)
            return
        width = widths[0]
        names = sorted(c for c in self._listdir(base) if len(c) == width and c.isdigit())
        for name in names:
            yield from self._walk(f"{base}/{name}", widths[1:], leaf_width, prefix + (name,))

    def _scope0_partitions(self) -> Iterator[tuple[tuple, list[LedgerId]]]:
        if self.layout == "flat":
            nums = sorted(int(m.group(1)) for m in map(LEAF.match, self._listdir(self.root)) if m)
            yield ("flat",), [LedgerId(0, n) for n in nums]
            return
        for widths, leaf in self._tree.partition_trees():
            for levels, nums in self._walk(self.root, widths, leaf, ()):
                yield levels, [LedgerId(0, n) for n in nums]

    def _scoped_partitions(self, scope_id: int | None) -> Iterator[tuple[tuple, list[LedgerId]]]:
        base = self._p("scoped")
        if scope_id is None:
            scopes = (int("".join(levels)) for levels, _ in
                      self._walk_dirs(base, SCOPE_LEVELS, ()))
        else:
            scopes = iter([scope_id])
        for scope in scopes:
            scope_path = "/".join([base] + split_digits(f"{scope:020d}", SCOPE_LEVELS))
            for levels, nums in self._walk(scope_path, *SCOPED_LEDGER, ()):
                yield (f"{scope:020d}",) + levels, [LedgerId(scope, n) for n in nums]

    def _walk_dirs(self, base: str, widths: tuple, prefix: tuple) -> Iterator[tuple[tuple, None]]:
        if not widths:
            yield prefix, None
            return
        for name in sorted(c for c in self._listdir(base) if len(c) == widths[0] and c.isdigit()):
            yield from self._walk_dirs(f"{base}/{name}", widths[1:], prefix + (name,))

    def ledger_partitions(self, scope_id: int | None = None) -> Iterator[tuple[Any, list[LedgerId]]]:
        """One leaf directory at a time, ascending: (level1, level2) for ids in the 2-4-4
        tree, the four upper levels for the 3-4-4-4-4 tree, and (scope, four levels) for
        scope != 0. Flat has one partition. Each is listed with one getChildren."""
        if scope_id is None or scope_id == 0:
            yield from self._scope0_partitions()
        if not self._tree.has_scoped_tree():
            return                       # BookKeeper's format: scope 0 is all there is
        if scope_id is None or scope_id != 0:
            if scope_id is not None:
                check_scope(scope_id)
            yield from self._scoped_partitions(scope_id)

    def iterate_ledgers(self, scope_id: int | None = 0) -> Iterator[LedgerId]:
        for _, ids in self.ledger_partitions(scope_id):
            yield from ids

    # ---- what confirms a deletion without a record (bookie/absence.py) --------------

    def sync_reads(self) -> int:
        """ZooKeeper's sync: the server this session reads from catches up with the leader,
        so a read after it sees every znode created before. Returns the session's id, for
        ``check_session`` after those reads."""
        session = self._session_id()
        self._wait(self._zk.sync_async(self.root), f"sync {self.root}")
        return session

    def check_session(self, session: int) -> None:
        """MetadataError unless this store is still on ``session``, connected: reads made
        across a lost session (or a new one) prove nothing."""
        now = self._session_id()
        if now != session:
            raise MetadataError(f"zookeeper {self.hosts}: the session changed during the "
                                f"check ({session:#x} -> {now:#x})")

    def _session_id(self) -> int:
        client_id = self._zk.client_id
        if self._zk.state != KazooState.CONNECTED or client_id is None:
            raise MetadataError(f"zookeeper {self.hosts}: not connected ({self._zk.state})")
        return client_id[0]

    def read_instance_id(self) -> str:
        """INSTANCEID as stored now (``instance_id`` is the one read at open)."""
        try:
            return self._get(self._p("INSTANCEID"))[0].decode("utf-8", "replace")
        except NoNodeError:
            raise MetadataError(f"zookeeper {self.hosts}{self.root}: INSTANCEID is gone") from None

    def ledger_id_high_water_mark(self) -> int:
        """Every scope-0 id this root's generator has handed out is below this, read from
        the Stat of its znodes (meta/bookkeeper/idgen.py) without writing."""
        short = self._exists(self._p("idgen"))
        long = self._p("idgen-long")
        long_stat = self._exists(long)
        top = None
        if long_stat is not None:
            hobs = [int(c[4:]) for c in self._listdir(long) if c.startswith("HOB-") and c[4:].isdigit()]
            stat = self._exists(f"{long}/HOB-{max(hobs):010d}") if hobs else None
            if stat is not None:
                top = (max(hobs), stat.cversion, stat.numChildren)
        return bkidgen.high_water_mark(
            None if short is None else (short.cversion, short.numChildren),
            long_stat is not None, top)

    # ---- LedgerIdGenerator ---------------------------------------------------------

    def generate_ledger_id(self, scope_id: int | None = 0) -> LedgerId:
        self._tree.check_scope(scope_id)
        if scope_id is None:
            return decentralised_ledger_id()
        if scope_id == 0:
            short, long = self._p("idgen"), self._p("idgen-long")
        else:
            short = self._p("idgen-scoped", f"{scope_id:020d}")
            long = self._p("idgen-scoped-long", f"{scope_id:020d}")
        return LedgerId(scope_id, self._sequential_id(short, long))

    def _sequence_number(self, parent: str) -> int | None:
        """An ephemeral-sequential ID- node's counter, or None once past 31 bits (ZooKeeper
        formats the parent's signed int counter, so it turns negative on overflow)."""
        path = self._create(parent + "/ID-", ephemeral=True, sequence=True)
        # the node only carried the counter: drop it without waiting (BookKeeper does too)
        self._zk.delete_async(path)
        n = int(path.rsplit("ID-", 1)[1])
        return n if 0 <= n < SHORT_ID_LIMIT else None

    def _sequential_id(self, short: str, long: str) -> int:
        # BookKeeper's LongZkLedgerIdGenerator: 31-bit ids from idgen/ until its counter
        # overflows; then idgen-long/ exists and ids are HOB-<high 32 bits> + a counter.
        if self._exists(long) is None:
            n = self._sequence_number(short)
            if n is not None:
                return n
            self._ensure(long)
        for _ in range(_RETRIES):
            hobs = [int(c[4:]) for c in self._listdir(long)
                    if c.startswith("HOB-") and c[4:].isdigit()]
            if not hobs:
                self._create_quietly(f"{long}/HOB-{1:010d}")
                continue
            high = max(hobs)
            low = self._sequence_number(f"{long}/HOB-{high:010d}")
            if low is not None:
                return (high << 32) | low
            if high + 1 >= 1 << 31:
                raise MetadataError(f"ledger ids under {long} are exhausted")
            self._create_quietly(f"{long}/HOB-{high + 1:010d}")
        raise MetadataError(f"could not generate a ledger id under {long}")

    def _create_quietly(self, path: str) -> None:
        try:
            self._create(path)
        except NodeExistsError:          # another generator won the race: fine
            pass

    # ---- LayoutManager -------------------------------------------------------------

    def read_layout(self) -> bytes | None:
        try:
            return self._get(self._p("LAYOUT"))[0]
        except NoNodeError:
            return None

    def create_layout(self, layout: bytes) -> None:
        try:
            self._create(self._p("LAYOUT"), bytes(layout), makepath=False)
        except NodeExistsError:
            raise LayoutExistsError(f"a layout is already stored at {self.root}/LAYOUT") from None

    def delete_layout(self) -> None:
        try:
            self._delete(self._p("LAYOUT"))
        except NoNodeError:
            pass

    # ---- CookieStore ---------------------------------------------------------------

    def read_cookie(self, bookie_id: str) -> Versioned | None:
        try:
            data, stat = self._get(self._tree.cookie_path(check_bookie_id(bookie_id)))
        except NoNodeError:
            return None
        return Versioned(self._tree.decode_cookie(bookie_id, data), stat.version)

    def write_cookie(self, bookie_id: str, data: bytes, version: Any = None) -> Versioned:
        path = self._tree.cookie_path(check_bookie_id(bookie_id))
        stored = self._tree.encode_cookie(bookie_id, data)      # BookKeeper's on its root
        try:
            if version is None:
                self._create(path, stored)
                return Versioned(bytes(data), 0)
            stat = self._set(path, stored, version)
            return Versioned(bytes(data), stat.version)
        except NodeExistsError:
            raise BadVersionError(f"cookie of {bookie_id} exists; pass its version") from None
        except (NoNodeError, KzBadVersion):
            raise BadVersionError(f"cookie of {bookie_id}: version {version!r} is stale") from None

    def remove_cookie(self, bookie_id: str, version: Any = None) -> None:
        try:
            self._delete(self._tree.cookie_path(check_bookie_id(bookie_id)),
                         -1 if version is None else version)
        except NoNodeError:
            raise MetadataError(f"no cookie for bookie {bookie_id}") from None
        except KzBadVersion:
            raise BadVersionError(f"cookie of {bookie_id}: version {version!r} is stale") from None

    def list_cookies(self) -> list[str]:
        return sorted(name for d in self._tree.cookie_dirs() for name in self._listdir(d))

    # ---- ConsumerGroupStore ---------------------------------------------------------

    def read_group(self, group_id: str) -> Versioned | None:
        try:
            data, stat = self._get(f"{self._tree.groups_base()}/{group_key(group_id)}")
        except NoNodeError:
            return None
        return Versioned(bytes(data), stat.version)

    def write_group(self, group_id: str, data: bytes, version: Any = None) -> Versioned:
        path = f"{self._tree.groups_base()}/{group_key(group_id)}"
        try:
            if version is None:
                self._create(path, bytes(data))
                return Versioned(bytes(data), 0)
            return Versioned(bytes(data), self._set(path, bytes(data), version).version)
        except NodeExistsError:
            raise BadVersionError(f"group {group_id} exists; pass its version") from None
        except (NoNodeError, KzBadVersion):
            raise BadVersionError(f"group {group_id}: version {version!r} is stale") from None

    def remove_group(self, group_id: str, version: Any = None) -> bool:
        try:
            self._delete(f"{self._tree.groups_base()}/{group_key(group_id)}",
                         -1 if version is None else version)
        except NoNodeError:
            return False
        except KzBadVersion:
            raise BadVersionError(f"group {group_id}: version {version!r} is stale") from None
        return True

    def list_groups(self) -> list[str]:
        return sorted(group_of_key(n) for n in self._listdir(self._tree.groups_base()))

    # ---- UnderreplicationManager ---------------------------------------------------

    def _ur_path(self, lid: LedgerId) -> str:
        return f"{self._tree.underreplication_base()}/urL{lid.qualified_name}"

    def mark_ledger_underreplicated(self, ledger_id, missing_bookies: list[str]) -> None:
        lid = coerce_ledger_id(ledger_id)
        path = self._ur_path(lid)
        for _ in range(_RETRIES):          # optimistic merge: read, merge, CAS
            try:
                data, stat = self._get(path)
            except NoNodeError:
                record = {"missing": list(missing_bookies), "ctime_ms": int(time.time() * 1000)}
                try:
                    self._create(path, json.dumps(record).encode())
                    return
                except NodeExistsError:
                    continue
            missing = decode_underreplicated(data, path)       # MetadataError if damaged
            record = json.loads(data)
            record["missing"] = merge_missing(missing, list(missing_bookies))
            try:
                self._set(path, json.dumps(record).encode(), stat.version)
                return
            except (KzBadVersion, NoNodeError):
                continue
        raise BadVersionError(f"could not mark {lid} under-replicated: too much contention")

    def mark_ledger_replicated(self, ledger_id) -> None:
        try:
            self._delete(self._ur_path(coerce_ledger_id(ledger_id)))
        except NoNodeError:
            pass

    def list_underreplicated(self) -> dict[LedgerId, list[str]]:
        base = self._tree.underreplication_base()
        out = {}
        for name in sorted(self._listdir(base)):
            if not name.startswith("urL"):
                continue
            try:
                data, _ = self._get(f"{base}/{name}")
                out[LedgerId.parse(name[3:])] = decode_underreplicated(data, name)
            except NoNodeError:
                continue
            except (ValueError, KeyError, TypeError) as exc:
                raise MetadataError(f"corrupted under-replication record {name}: {exc}") from exc
        return out

    # ---- BookKeeper's auditor and its marks (a BookKeeper root only) -------------------

    def bookkeeper_auditor(self) -> str | None:
        """The bookie BookKeeper's auditor election elected (None: none, or not a
        BookKeeper root)."""
        if self._tree.name != "bookkeeper":
            return None
        base = self._p(*bkreplication.ELECTION)
        vote = bkreplication.auditor_of(self._listdir(base))
        if vote is None:
            return None
        try:
            return bkreplication.vote_bookie(self._get(f"{base}/{vote}")[0])
        except NoNodeError:                      # the auditor left meanwhile
            return self.bookkeeper_auditor()

    def bookkeeper_underreplicated(self) -> dict[LedgerId, list[str]]:
        """The ledgers BookKeeper's auditor marked under-replicated, with the bookies they
        miss ({} on an embedlog root)."""
        if self._tree.name != "bookkeeper":
            return {}
        out: dict[LedgerId, list[str]] = {}

        def walk(path: str, depth: int) -> None:
            for name in sorted(self._listdir(path)):
                if depth < 4:
                    if bkreplication.is_group(name):
                        walk(f"{path}/{name}", depth + 1)
                    continue
                ledger = bkreplication.leaf_ledger(name)
                if ledger is None:
                    continue
                try:
                    data, _ = self._get(f"{path}/{name}")
                except NoNodeError:              # replicated meanwhile
                    continue
                out[LedgerId(0, ledger)] = bkreplication.missing_replicas(data)
        walk(self._p(*bkreplication.LEDGERS), 0)
        return out

    # ---- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Ends the session: ZooKeeper drops this store's ephemeral registrations."""
        if self._closed:
            return
        self._closed = True
        for watch in self._watches:
            watch.cancel()
        self._shutdown_client()

    def __repr__(self) -> str:
        return (f"ZkMetadataStore({self.hosts!r}, {self.root!r}, layout={self.layout!r}, "
                f"metadata_format={self.metadata_format!r})")
