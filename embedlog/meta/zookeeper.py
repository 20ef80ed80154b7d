"""ZooKeeper metadata driver (kazoo), with BookKeeper's znode layouts.

Under the root (``/ledgers`` by default; docs/METADATA.md has the full tree)::

    LAYOUT, INSTANCEID
    available/<bookie>            ephemeral, read-write bookies
    available/readonly/<bookie>   ephemeral, read-only bookies
    cookies/<bookie>
    idgen/ID-<seq>                ephemeral-sequential, scope 0 ids below 2^31 - 1
    idgen-long/HOB-%010d/ID-<seq> BookKeeper's high-order-bit extension past 31 bits
    idgen-scoped/%020d/...        the same pair per scope != 0 (and idgen-scoped-long/)
    underreplication/ledgers/urL<qualified name>
    deleted/<last 2 hex digits>/<qualified name>   deletion records: deleted_at_ms as text
    <ledger znodes>               by layout, scope 0:
        flat              L%010d
        hierarchical      %010d split 2-4-4 (00/0000/L0001) below 2^31 - 1, else
                          %019d split 3-4-4-4-4 (000/0000/0000/0000/L0001)
        longhierarchical  %019d split 3-4-4-4-4
    scoped/<scope %020d as 4-4-4-4-4>/<ledger %020d as 4-4-4-4>/L<last 4>
                          scope != 0 ("LongLongHierarchical"), every layout

Versions are znode versions. Every call waits at most ``timeout_s``: kazoo's blocking
calls wait for the session to resolve, which can take the whole session timeout.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (BadVersionError as KzBadVersion, ConnectionClosedError,
                              ConnectionLoss, KazooException, NoNodeError, NodeExistsError,
                              NotEmptyError, OperationTimeoutError, SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError

from embedlog._native.format import LedgerId
from embedlog.errors import (BadVersionError, LedgerExistsError, MetadataError,
                             NoSuchLedgerError, TimeoutError)
from embedlog.meta._common import (PollingWatch, StoreBase, check_bookie_id, check_layout,
                                   check_scope, coerce_ledger_id, decentralised_ledger_id,
                                   deleted_id_message,
                                   decode_bookie, decode_underreplicated, encode_bookie_info,
                                   layout_record, log,
                                   merge_missing)
from embedlog.meta.api import (BookieRegistration, CookieStore, LayoutExistsError,
                               LayoutManager, LedgerIdGenerator, LedgerManager,
                               LedgerMetadata, MetadataStore, RegistrationClient,
                               RegistrationManager, UnderreplicationManager, Versioned)

LAYOUTS = ("flat", "hierarchical", "longhierarchical")
SHORT_ID_LIMIT = (1 << 31) - 1          # Integer.MAX_VALUE: the hierarchical switch point
_RETRIES = 50                            # bound on optimistic retry loops
_SNAPSHOT_RETRIES = 10                   # bound on re-listing the bookies (_all_bookies)

# (level widths, leaf width) of each hierarchical tree
_LEGACY = ((2, 4), 4)
_LONG = ((3, 4, 4, 4), 4)
_SCOPED_LEDGER = ((4, 4, 4, 4), 4)
_SCOPE_LEVELS = (4, 4, 4, 4, 4)
_LEAF = re.compile(r"L(\d+)\Z")

_TRANSIENT = (KazooTimeoutError, ConnectionLoss, OperationTimeoutError)


def _split(digits: str, widths) -> list[str]:
    out, i = [], 0
    for w in widths:
        out.append(digits[i:i + w])
        i += w
    return out


class ZkMetadataStore(StoreBase, MetadataStore, LedgerManager, LedgerIdGenerator,
                      RegistrationManager, RegistrationClient, LayoutManager,
                      CookieStore, UnderreplicationManager):
    """``ZkMetadataStore("127.0.0.1:2181", "/ledgers", layout="hierarchical")``.

    Options: ``timeout_s`` (connect and per-call bound, default 5), ``session_timeout_s``
    (ZooKeeper session, 10: how long a dead bookie's ephemeral znode outlives it),
    ``poll_interval_s`` (safety-net poll of watches, 1).
    """

    def __init__(self, hosts: str, root: str = "/ledgers", *, layout: str = "hierarchical",
                 timeout_s: float = 5.0, session_timeout_s: float = 10.0,
                 poll_interval_s: float = 1.0, uri: str | None = None, create: bool = True):
        if layout not in LAYOUTS:
            raise MetadataError(f"unknown ZooKeeper ledger layout {layout!r}; known: {LAYOUTS}")
        root = "/" + root.strip("/")
        if root == "/":
            raise MetadataError("the ZooKeeper ledgers root cannot be '/'")
        self.layout, self.root, self.hosts = layout, root, hosts
        self.uri = uri or f"zk+{layout}://{hosts.replace(',', ';')}{root}"
        self._timeout_s = float(timeout_s)
        self._session_timeout_s = float(session_timeout_s)
        self._poll_interval_s = float(poll_interval_s)
        self._registered: dict[tuple[str, bool], bytes] = {}
        self._reg_lock = threading.Lock()
        self._ensured: set = set()          # parent znodes known to exist
        self._watches: list[PollingWatch] = []
        self._session_lost = False
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

    def _init_tree(self) -> None:
        for sub in ("available/readonly", "cookies", "idgen", "underreplication/ledgers"):
            self._ensure(self._p(sub))
        try:
            self._create(self._p("LAYOUT"), layout_record(self.layout), makepath=False)
        except NodeExistsError:
            pass
        try:
            self._create(self._p("INSTANCEID"), str(uuid.uuid4()).encode(),
                         makepath=False)
        except NodeExistsError:
            pass
        self.instance_id = self._get(self._p("INSTANCEID"))[0].decode()
        check_layout(self.read_layout(), self.layout, f"zookeeper {self.hosts}{self.root}")

    def _check_tree(self) -> None:
        """create=False: an initialised store (layout, instance id), read without writing."""
        try:
            self.instance_id = self._get(self._p("INSTANCEID"))[0].decode()
        except NoNodeError:
            raise MetadataError(f"no metadata store at {self.uri}: {self.root}/INSTANCEID does not "
                                f"exist (a bookie, `embedlog cluster up` or `embedlog metadata "
                                f"format` makes one)") from None
        check_layout(self.read_layout(), self.layout, f"zookeeper {self.hosts}{self.root}")

    # ---- paths ---------------------------------------------------------------------

    def ledger_path(self, ledger_id) -> str:
        """The znode of a ledger under this layout (public for tools and tests)."""
        lid = coerce_ledger_id(ledger_id)
        n = lid.ledger_id
        if lid.scope_id:
            scope = _split(f"{lid.scope_id:020d}", _SCOPE_LEVELS)
            levels = _split(f"{n:020d}", _SCOPED_LEDGER[0] + (4,))
            return self._p("scoped", *scope, *levels[:-1], "L" + levels[-1])
        if self.layout == "flat":
            return self._p(f"L{n:010d}")
        if self.layout == "hierarchical" and n < SHORT_ID_LIMIT:
            levels = _split(f"{n:010d}", (2, 4, 4))
        else:
            levels = _split(f"{n:019d}", (3, 4, 4, 4, 4))
        return self._p(*levels[:-1], "L" + levels[-1])

    # ---- LedgerManager -------------------------------------------------------------

    def _deleted_path(self, lid: LedgerId) -> str:
        qn = lid.qualified_name
        return self._p("deleted", qn[-2:], qn)

    def _ensure_parent(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent not in self._ensured:          # transactions cannot make parents
            self._ensure(parent)
            self._ensured.add(parent)

    def create_ledger_metadata(self, metadata: LedgerMetadata) -> Versioned:
        lid = metadata.ledger_id
        path, gone = self.ledger_path(lid), self._deleted_path(lid)
        self._ensure_parent(path)
        self._ensure_parent(gone)
        # creating and deleting the deletion record in the same transaction fails it
        # when a record exists: a deleted id is not created again while it is kept
        txn = self._zk.transaction()
        txn.create(path, metadata.to_bytes())
        txn.create(gone, b"")
        txn.delete(gone)
        try:
            self._commit(txn, f"create ledger {lid}")
        except NodeExistsError:
            at = self.ledger_deleted_at(lid)
            if at is not None:
                raise LedgerExistsError(deleted_id_message(lid, at)) from None
            raise LedgerExistsError(f"ledger {lid} already exists") from None
        except NoNodeError:                      # a parent removed meanwhile: make it again
            self._ensured.clear()
            return self.create_ledger_metadata(metadata)
        return Versioned(metadata, 0)

    def ledger_deleted_at(self, ledger_id) -> int | None:
        lid = coerce_ledger_id(ledger_id)
        try:
            data, _stat = self._get(self._deleted_path(lid))
        except NoNodeError:
            return None
        try:
            return int(data)
        except ValueError:
            raise MetadataError(f"corrupted deletion record of ledger {lid}: {data[:40]!r}") from None

    def purge_deletions(self, before_ms: int) -> int:
        gone = 0
        for part in self._listdir(self._p("deleted")):
            for name in self._listdir(self._p("deleted", part)):
                path = self._p("deleted", part, name)
                try:
                    data, stat = self._get(path)
                    if int(data) < before_ms:
                        self._delete(path, stat.version)
                        gone += 1
                except (NoNodeError, KzBadVersion, ValueError):
                    continue
        return gone

    def read_ledger_metadata(self, ledger_id) -> Versioned:
        lid = coerce_ledger_id(ledger_id)
        try:
            data, stat = self._get(self.ledger_path(lid))
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {lid}") from None
        metadata = LedgerMetadata.from_bytes(data)
        if metadata.ledger_id != lid:
            raise MetadataError(f"corrupted ledger metadata: znode of {lid} holds {metadata.ledger_id}")
        return Versioned(metadata, stat.version)

    def write_ledger_metadata(self, metadata: LedgerMetadata, version: Any) -> Versioned:
        lid = metadata.ledger_id
        if not isinstance(version, int):
            raise BadVersionError(f"ledger {lid}: version {version!r} is not a znode version")
        try:
            stat = self._set(self.ledger_path(lid), metadata.to_bytes(), version)
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {lid}") from None
        except KzBadVersion:
            raise BadVersionError(f"ledger {lid}: version {version} is stale") from None
        return Versioned(metadata, stat.version)

    def remove_ledger_metadata(self, ledger_id, version: Any = None) -> None:
        lid = coerce_ledger_id(ledger_id)
        gone = self._deleted_path(lid)
        self._ensure_parent(gone)
        txn = self._zk.transaction()
        txn.delete(self.ledger_path(lid), -1 if version is None else version)
        txn.create(gone, str(int(time.time() * 1000)).encode())
        try:
            self._commit(txn, f"remove ledger {lid}")
        except NoNodeError:
            raise NoSuchLedgerError(f"no ledger {lid}") from None
        except KzBadVersion:
            raise BadVersionError(f"ledger {lid}: version {version} is stale") from None
        except NodeExistsError:        # a stale record of an earlier life of this id
            self._delete(gone)
            self.remove_ledger_metadata(ledger_id, version)

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
                m = _LEAF.match(name)
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
            nums = sorted(int(m.group(1)) for m in map(_LEAF.match, self._listdir(self.root)) if m)
            yield ("flat",), [LedgerId(0, n) for n in nums]
            return
        trees = [_LONG] if self.layout == "longhierarchical" else [_LEGACY, _LONG]
        for widths, leaf in trees:
            for levels, nums in self._walk(self.root, widths, leaf, ()):
                yield levels, [LedgerId(0, n) for n in nums]

    def _scoped_partitions(self, scope_id: int | None) -> Iterator[tuple[tuple, list[LedgerId]]]:
        base = self._p("scoped")
        if scope_id is None:
            scopes = (int("".join(levels)) for levels, _ in
                      self._walk_dirs(base, _SCOPE_LEVELS, ()))
        else:
            scopes = iter([scope_id])
        for scope in scopes:
            scope_path = "/".join([base] + _split(f"{scope:020d}", _SCOPE_LEVELS))
            for levels, nums in self._walk(scope_path, *_SCOPED_LEDGER, ()):
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
        if scope_id is None or scope_id != 0:
            if scope_id is not None:
                check_scope(scope_id)
            yield from self._scoped_partitions(scope_id)

    def iterate_ledgers(self, scope_id: int | None = 0) -> Iterator[LedgerId]:
        for _, ids in self.ledger_partitions(scope_id):
            yield from ids

    # ---- LedgerIdGenerator ---------------------------------------------------------

    def generate_ledger_id(self, scope_id: int | None = 0) -> LedgerId:
        if scope_id is None:
            return decentralised_ledger_id()
        check_scope(scope_id)
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

    # ---- RegistrationManager -------------------------------------------------------

    def _reg_path(self, bookie_id: str, read_only: bool) -> str:
        return self._p("available", "readonly", bookie_id) if read_only else self._p("available", bookie_id)

    def _owned(self, path: str):
        """(stat, mine) of a registration znode, or (None, False)."""
        try:
            stat = self._exists(path)
        except NoNodeError:
            stat = None
        if stat is None:
            return None, False
        return stat, stat.ephemeralOwner == self._zk.client_id[0]

    def register_bookie(self, bookie_id: str, read_only: bool, info: dict | None = None) -> None:
        """Ephemeral znode under available/ (or available/readonly/); moving between the
        two is one transaction. If another session holds the id, wait for its znode to
        expire as BookKeeper does, then MetadataError."""
        check_bookie_id(bookie_id)
        read_only = bool(read_only)
        data = encode_bookie_info(info)
        self._register(bookie_id, read_only, data)
        with self._reg_lock:
            self._registered.pop((bookie_id, not read_only), None)
            self._registered[(bookie_id, read_only)] = data

    def _register(self, bookie_id: str, read_only: bool, data: bytes) -> None:
        path, other = self._reg_path(bookie_id, read_only), self._reg_path(bookie_id, not read_only)
        deadline = time.monotonic() + self._session_timeout_s + self._timeout_s
        while True:
            stat, mine = self._owned(path)
            ostat, omine = self._owned(other)
            if (stat is None or mine) and (ostat is None or omine):
                txn = self._zk.transaction()
                if stat is None:
                    txn.create(path, data, ephemeral=True)
                else:
                    txn.set_data(path, data)
                if ostat is not None:
                    txn.delete(other, version=ostat.version)
                try:
                    self._commit(txn, f"register {bookie_id}")
                    return
                except (NodeExistsError, NoNodeError, KzBadVersion):
                    pass                    # raced with another registrant: look again
            if time.monotonic() > deadline:
                raise MetadataError(f"bookie {bookie_id} is registered by another live "
                                    f"ZooKeeper session")
            time.sleep(0.1)                 # bounded by the deadline above

    def unregister_bookie(self, bookie_id: str, read_only: bool) -> None:
        with self._reg_lock:
            self._registered.pop((bookie_id, bool(read_only)), None)
        try:
            self._delete(self._reg_path(bookie_id, bool(read_only)))
        except NoNodeError:
            pass

    def _on_state(self, state) -> None:
        # Runs in kazoo's thread: no blocking calls here. A lost session took our
        # ephemeral znodes; register them again once a new session is up.
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost and not self._closed:
            self._session_lost = False
            threading.Thread(target=self._reregister, daemon=True,
                             name="embedlog-zk-reregister").start()

    def _reregister(self) -> None:
        with self._reg_lock:
            mine = dict(self._registered)
        for (bookie_id, read_only), data in mine.items():
            try:
                self._register(bookie_id, read_only, data)
            except Exception as exc:
                log.error("could not re-register bookie %s after session loss: %s", bookie_id, exc)

    # ---- RegistrationClient --------------------------------------------------------

    def _parent(self, read_only: bool) -> str:
        return self._p("available", "readonly") if read_only else self._p("available")

    def _send_reads(self, read_only: bool, names: list[str]) -> list:
        # every read is sent before any answer is awaited: one round trip, not one per bookie
        parent = self._parent(read_only)
        return [(read_only, name, self._zk.get_async(f"{parent}/{name}")) for name in sorted(names)
                if read_only or name != "readonly"]

    def _collect(self, pending: list) -> list[BookieRegistration]:
        out = []
        for read_only, name, result in pending:
            try:
                data, _ = self._wait(result, f"get {self._parent(read_only)}/{name}")
            except NoNodeError:          # went away between the listing and the read
                continue
            out.append(decode_bookie(name, read_only, data))
        return out

    def _all_bookies(self, watch=None) -> list[BookieRegistration]:
        """Writable and read-only bookies as of one moment. ZooKeeper reads one znode at
        a time, so a move between the two states (one transaction) that commits between
        the two listings would show the bookie in both, or in neither. A parent's
        cversion counts the creates and deletes of its children: if neither parent's
        changed from its listing until after both listings and all reads (one session's
        requests are answered in order), nothing was created or deleted in between and
        the lists are those of one moment. Otherwise list again, a bounded number of times."""
        parents = (self._parent(False), self._parent(True))
        for _ in range(_SNAPSHOT_RETRIES):
            listings = [self._zk.get_children_async(p, watch=watch, include_data=True)
                        for p in parents]
            (wnames, wstat), (rnames, rstat) = [self._wait(r, f"list {p}")
                                                for r, p in zip(listings, parents)]
            reads = self._send_reads(False, wnames) + self._send_reads(True, rnames)
            checks = [self._zk.exists_async(p) for p in parents]      # answered after the reads
            bookies = self._collect(reads)
            after = [self._wait(r, f"exists {p}") for r, p in zip(checks, parents)]
            if None not in after and (after[0].cversion, after[1].cversion) == \
                    (wstat.cversion, rstat.cversion):
                return bookies
        raise MetadataError(f"zookeeper {self.hosts}: bookie registrations under "
                            f"{parents[0]} kept changing; no consistent listing in "
                            f"{_SNAPSHOT_RETRIES} tries")

    def get_all_bookies(self) -> list[BookieRegistration]:
        with self._errors("list bookies"):
            try:
                return self._all_bookies()
            except NoNodeError as exc:
                raise MetadataError(f"zookeeper: {self.root}/available or "
                                    "available/readonly is missing") from exc

    def watch_bookies(self, callback: Callable[[list[BookieRegistration]], None]) -> Callable[[], None]:
        """Child watches on available/ and available/readonly/ wake a listing thread; a
        watch is re-armed on every listing, and a slow poll covers any gap."""
        watch: PollingWatch | None = None

        def fired(_event):
            if watch is not None:
                watch.kick()

        watch = PollingWatch(lambda: self._all_bookies(watch=fired), callback,
                             self._poll_interval_s, name="embedlog-zk-watch")
        self._watches.append(watch)
        return watch.cancel

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
            data, stat = self._get(self._p("cookies", check_bookie_id(bookie_id)))
        except NoNodeError:
            return None
        return Versioned(data, stat.version)

    def write_cookie(self, bookie_id: str, data: bytes, version: Any = None) -> Versioned:
        path = self._p("cookies", check_bookie_id(bookie_id))
        try:
            if version is None:
                self._create(path, bytes(data))
                return Versioned(bytes(data), 0)
            stat = self._set(path, bytes(data), version)
            return Versioned(bytes(data), stat.version)
        except NodeExistsError:
            raise BadVersionError(f"cookie of {bookie_id} exists; pass its version") from None
        except (NoNodeError, KzBadVersion):
            raise BadVersionError(f"cookie of {bookie_id}: version {version!r} is stale") from None

    def remove_cookie(self, bookie_id: str, version: Any = None) -> None:
        try:
            self._delete(self._p("cookies", check_bookie_id(bookie_id)),
                         -1 if version is None else version)
        except NoNodeError:
            raise MetadataError(f"no cookie for bookie {bookie_id}") from None
        except KzBadVersion:
            raise BadVersionError(f"cookie of {bookie_id}: version {version!r} is stale") from None

    def list_cookies(self) -> list[str]:
        return sorted(self._listdir(self._p("cookies")))

    # ---- UnderreplicationManager ---------------------------------------------------

    def _ur_path(self, lid: LedgerId) -> str:
        return self._p("underreplication", "ledgers", "urL" + lid.qualified_name)

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
        base = self._p("underreplication", "ledgers")
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
        return f"ZkMetadataStore({self.hosts!r}, {self.root!r}, layout={self.layout!r})"
