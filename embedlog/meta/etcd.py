"""etcd metadata driver (the ``etcd3`` module of cslab-etcd3), with seed 002's key layout.

Keys under the prefix P (the URI path, e.g. ``/ledgers``; BookKeeper's etcd proposal
calls it the "scope", which is unrelated to the ledger scope id)::

    P/LAYOUT, P/INSTANCEID
    P/IDGEN/%03d                              id counter of one bucket (scope 0)
    P/IDGEN-scoped/%020d/%03d                 the same per scope != 0
    P/cookies/<bookie>
    P/available/readwrite/<bookie>            under this store's lease
    P/available/readonly/<bookie>             under this store's lease
    P/ledgers/%019d                           scope 0; zero-padded so keys sort by id
    P/ledgers-scoped/%020d/%020d              scope != 0 (scope, ledger)
    P/underreplication/<qualified name>
    P/deleted-ledgers/<qualified name>        deletion records: "deleted_at_ms ctime_ms" as text
    P/groups/<percent-encoded group id>       consumer groups' records (client/group.py)

Versions are the key's mod revision: global and never reused, so a stale version from
before a delete and re-create cannot succeed (a znode version can). A missing key's mod
revision also compares as 0, so every compare-and-set and CAS delete also requires the
key to exist: version 0 of a missing ledger or cookie is "absent", as on the other drivers. Ranges end at the
prefix with its last byte incremented (etcd's own prefix rule); the seed's
``ledgers_end/`` sentinel would also catch keys like ``P/ledgersX``.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import etcd3
from etcd3 import exceptions as etcd_errors
from etcd3 import transactions as tx

from embedlog._native.format import LedgerId
from embedlog.errors import (BadVersionError, LedgerExistsError, MetadataError,
                             NoSuchLedgerError, TimeoutError)
from embedlog.meta._common import (PollingWatch, StoreBase, check_bookie_id, check_layout,
                                   group_key, group_of_key,
                                   check_scope, coerce_ledger_id, decentralised_ledger_id,
                                   deleted_id_message, decode_bookie, decode_underreplicated, encode_bookie_info,
                                   layout_record, log,
                                   merge_missing)
from embedlog.meta.api import (BookieRegistration, ConsumerGroupStore, CookieStore, DeletionRecord, LayoutExistsError,
                               LayoutManager, LedgerIdGenerator, LedgerManager,
                               LedgerMetadata, MetadataStore, RegistrationClient,
                               RegistrationManager, UnderreplicationManager, Versioned)

LAYOUT_NAME = "etcd"
ID_BUCKETS_MAX = 128            # the bucket sits in bits 56-62: scope-0 ids stay below 2^63
BUCKET_SHIFT = 56
_PAGE = 1000
_RETRIES = 100                  # bound on optimistic CAS loops


def _range_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class EtcdMetadataStore(StoreBase, MetadataStore, LedgerManager, LedgerIdGenerator,
                        RegistrationManager, RegistrationClient, LayoutManager,
                        CookieStore, UnderreplicationManager, ConsumerGroupStore):
    """``EtcdMetadataStore("127.0.0.1:2379", "/ledgers")``.

    Options: ``timeout_s`` (per call and at connect, default 5), ``lease_ttl_s``
    (registration lease, 5: how long a dead bookie stays listed), ``id_buckets``
    (1..128, default 128), ``poll_interval_s`` (safety-net poll of watches, 1).
    """

    def __init__(self, endpoint: str, prefix: str = "/ledgers", *, timeout_s: float = 5.0,
                 lease_ttl_s: int = 5, id_buckets: int = ID_BUCKETS_MAX,
                 poll_interval_s: float = 1.0, uri: str | None = None, create: bool = True):
        if "," in endpoint:
            raise MetadataError(f"one etcd endpoint per URI, got {endpoint!r}")
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            host, port = endpoint, "2379"
        if not 1 <= int(id_buckets) <= ID_BUCKETS_MAX:
            raise MetadataError(f"id_buckets must be 1..{ID_BUCKETS_MAX}, got {id_buckets}")
        self.endpoint = f"{host}:{port}"
        self.prefix = "/" + prefix.strip("/")
        if self.prefix == "/":
            raise MetadataError("the etcd key prefix cannot be empty")
        self.uri = uri or f"etcd://{self.endpoint}{self.prefix}"
        self._timeout_s = float(timeout_s)
        self._lease_ttl_s = max(1, int(round(float(lease_ttl_s))))
        self._buckets = int(id_buckets)
        self._next_bucket = random.randrange(self._buckets)   # BookKeeper: random start
        self._bucket_cache: dict[str, tuple[int, int]] = {}    # key -> (value, mod revision)
        self._poll_interval_s = float(poll_interval_s)
        self._lock = threading.Lock()
        self._lease = None
        self._registered: dict[tuple[str, bool], bytes] = {}
        self._keepalive: threading.Thread | None = None
        self._stop = threading.Event()
        self._watches: list[tuple[PollingWatch, Any]] = []
        self._closed = False
        self._bind_managers()
        self._etcd = etcd3.client(host=host, port=int(port), timeout=self._timeout_s)
        try:
            if create:
                self._init_keys()
            else:
                self._check_keys()
        except (TimeoutError, MetadataError) as exc:
            self._etcd.close()
            raise MetadataError(f"etcd at {self.endpoint}: {exc}") from exc

    # ---- plumbing ------------------------------------------------------------------

    @contextmanager
    def _errors(self, what: str):
        started = time.monotonic()
        try:
            yield
        except (etcd_errors.ConnectionTimeoutError, etcd_errors.ConnectionFailedError,
                etcd_errors.NoServerAvailableError) as exc:
            waited = time.monotonic() - started
            # a refused connection fails at once: say how long it took, not the timeout
            why = (f"no answer within {self._timeout_s}s" if waited >= self._timeout_s * 0.9
                   else f"cannot reach it (after {waited:.1f}s)")
            raise TimeoutError(f"etcd {self.endpoint}: {what}: {why} ({type(exc).__name__})") from exc
        except (etcd_errors.Etcd3Exception, ValueError) as exc:
            raise MetadataError(f"etcd {self.endpoint}: {what}: {exc!r}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("grpc"):
                raise MetadataError(f"etcd {self.endpoint}: {what}: {exc!r}") from exc
            raise

    def _k(self, *parts: str) -> str:
        return "/".join((self.prefix,) + parts)

    def _get(self, key: str):
        with self._errors(f"get {key}"):
            return self._etcd.get(key)

    def _txn(self, what: str, compare, success, failure=()):
        with self._errors(what):
            return self._etcd.transaction(compare=list(compare), success=list(success),
                                          failure=list(failure))

    def _create(self, key: str, value: bytes, lease=None):
        """Put if absent: (created, (value, meta) now stored)."""
        ok, responses = self._txn(f"create {key}", [tx.Version(key) == 0],
                                  [tx.Put(key, value, lease), tx.Get(key)], [tx.Get(key)])
        kvs = responses[-1]
        return ok, (kvs[0] if kvs else (None, None))

    def _cas(self, key: str, value: bytes, version: int, what: str):
        """Put if the key exists at mod revision ``version``: new revision, or raise
        (absent, stale)."""
        ok, responses = self._txn(what, [tx.Version(key) > 0, tx.Mod(key) == version],
                                  [tx.Put(key, value), tx.Get(key)], [tx.Get(key)])
        kvs = responses[-1]
        if ok:
            return kvs[0][1].mod_revision
        raise (BadVersionError if kvs else NoSuchLedgerError)(what)

    def _delete(self, key: str, version: int | None, what: str) -> bool:
        """Delete (CAS when ``version`` is given); False if the key was absent."""
        compare = [tx.Version(key) > 0] + ([tx.Mod(key) == version] if version is not None else [])
        ok, responses = self._txn(what, compare, [tx.Delete(key)], [tx.Get(key)])
        if ok:
            return True
        if responses and responses[-1] and version is not None:
            raise BadVersionError(f"{what}: version {version!r} is stale")
        return False

    def _init_keys(self) -> None:
        self._create(self._k("LAYOUT"), layout_record(LAYOUT_NAME))
        _, (value, _) = self._create(self._k("INSTANCEID"), str(uuid.uuid4()).encode())
        self.instance_id = value.decode()
        check_layout(self.read_layout(), LAYOUT_NAME, f"etcd {self.endpoint}{self.prefix}")

    def _check_keys(self) -> None:
        """create=False: an initialised store (layout, instance id), read without writing."""
        value, _ = self._get(self._k("INSTANCEID"))
        if value is None:
            raise MetadataError(f"no metadata store at {self.uri}: {self.prefix}/INSTANCEID does "
                                f"not exist (a bookie, `embedlog cluster up` or `embedlog metadata "
                                f"format` makes one)")
        self.instance_id = value.decode()
        check_layout(self.read_layout(), LAYOUT_NAME, f"etcd {self.endpoint}{self.prefix}")

    # ---- LedgerManager -------------------------------------------------------------

    def ledger_key(self, ledger_id) -> str:
        """The key of a ledger (public for tools and tests)."""
        lid = coerce_ledger_id(ledger_id)
        if lid.scope_id:
            return self._k("ledgers-scoped", f"{lid.scope_id:020d}", f"{lid.ledger_id:020d}")
        return self._k("ledgers", f"{lid.ledger_id:019d}")

    def _deleted_key(self, lid: LedgerId) -> str:
        return self._k("deleted-ledgers", lid.qualified_name)

    def create_ledger_metadata(self, metadata: LedgerMetadata) -> Versioned:
        lid = metadata.ledger_id
        key, gone = self.ledger_key(lid), self._deleted_key(lid)
        ok, responses = self._txn(f"create ledger {lid}", [tx.Version(key) == 0, tx.Version(gone) == 0],
                                  [tx.Put(key, metadata.to_bytes()), tx.Get(key)], [tx.Get(gone)])
        if not ok:
            kvs = responses[-1]
            if kvs:
                raise LedgerExistsError(deleted_id_message(
                    lid, DeletionRecord.decode(lid, kvs[0][0]).deleted_at_ms))
            raise LedgerExistsError(f"ledger {lid} already exists")
        return Versioned(metadata, responses[-1][0][1].mod_revision)

    def ledger_deletion(self, ledger_id) -> DeletionRecord | None:
        lid = coerce_ledger_id(ledger_id)
        value, meta = self._get(self._deleted_key(lid))
        return None if meta is None else DeletionRecord.decode(lid, value)

    def purge_deletions(self, before_ms: int) -> int:
        prefix = self._k("deleted-ledgers", "").encode()
        gone = 0
        for key in list(self._scan_keys(prefix, _range_end(prefix))):
            value, meta = self._get(key.decode())
            try:
                old = meta is not None and DeletionRecord.decode(key, value).deleted_at_ms < before_ms
            except MetadataError:
                continue
            try:
                if old and self._delete(key.decode(), meta.mod_revision, "purge deletion record"):
                    gone += 1
            except BadVersionError:
                continue                 # rewritten meanwhile (the id was deleted again)
        return gone

    def read_ledger_metadata(self, ledger_id) -> Versioned:
        lid = coerce_ledger_id(ledger_id)
        value, meta = self._get(self.ledger_key(lid))
        if meta is None:
            raise NoSuchLedgerError(f"no ledger {lid}")
        metadata = LedgerMetadata.from_bytes(value)
        if metadata.ledger_id != lid:
            raise MetadataError(f"corrupted ledger metadata: key of {lid} holds {metadata.ledger_id}")
        return Versioned(metadata, meta.mod_revision)

    def write_ledger_metadata(self, metadata: LedgerMetadata, version: Any) -> Versioned:
        lid = metadata.ledger_id
        if not isinstance(version, int):
            raise BadVersionError(f"ledger {lid}: version {version!r} is not a mod revision")
        try:
            rev = self._cas(self.ledger_key(lid), metadata.to_bytes(), version, f"write ledger {lid}")
        except NoSuchLedgerError:
            raise NoSuchLedgerError(f"no ledger {lid}") from None
        except BadVersionError:
            raise BadVersionError(f"ledger {lid}: version {version} is stale") from None
        return Versioned(metadata, rev)

    def remove_ledger_metadata(self, ledger_id, version: Any = None) -> None:
        lid = coerce_ledger_id(ledger_id)
        key = self.ledger_key(lid)
        # the record names the ledger deleted (its ctime): the key is read first and
        # deleted at the revision read, so the ctime is that of the value that goes
        value, meta = self._get(key)
        if meta is None:
            raise NoSuchLedgerError(f"no ledger {lid}")
        try:
            ctime_ms = LedgerMetadata.from_bytes(value).ctime_ms
        except MetadataError:                 # unreadable metadata: a record without it
            ctime_ms = -1
        record = DeletionRecord(int(time.time() * 1000), ctime_ms).encode()
        compare = [tx.Version(key) > 0, tx.Mod(key) == (meta.mod_revision if version is None
                                                        else version)]
        ok, responses = self._txn(f"remove ledger {lid}", compare,
                                  [tx.Delete(key), tx.Put(self._deleted_key(lid), record)],
                                  [tx.Get(key)])
        if ok:
            return
        if responses and responses[-1]:
            if version is None:               # rewritten between the read and the delete
                return self.remove_ledger_metadata(ledger_id, version)
            raise BadVersionError(f"remove ledger {lid}: version {version!r} is stale")
        raise NoSuchLedgerError(f"no ledger {lid}")

    def _scan_keys(self, start: bytes, end: bytes) -> Iterator[bytes]:
        # One short range read per page, so concurrent writes are never held up and
        # every page sees current data. etcd returns keys in byte order without being
        # asked; asking (sort_order) makes etcd 3.4 read the whole range for every page.
        while True:
            with self._errors("iterate ledgers"):
                resp = self._etcd.get_range_response(start, end, limit=_PAGE, keys_only=True)
            for kv in resp.kvs:
                yield kv.key
            if len(resp.kvs) < _PAGE:
                return
            start = resp.kvs[-1].key + b"\0"

    def iterate_ledgers(self, scope_id: int | None = 0) -> Iterator[LedgerId]:
        if scope_id is None or scope_id == 0:
            prefix = self._k("ledgers", "").encode()
            for key in self._scan_keys(prefix, _range_end(prefix)):
                tail = key[len(prefix):]
                if len(tail) == 19 and tail.isdigit():
                    yield LedgerId(0, int(tail))
        if scope_id is None or scope_id != 0:
            if scope_id is None:
                prefix = self._k("ledgers-scoped", "").encode()
            else:
                prefix = self._k("ledgers-scoped", f"{check_scope(scope_id):020d}", "").encode()
            base = len(self._k("ledgers-scoped", "").encode())
            for key in self._scan_keys(prefix, _range_end(prefix)):
                scope, _, ledger = key[base:].partition(b"/")
                if len(scope) == 20 and len(ledger) == 20 and scope.isdigit() and ledger.isdigit():
                    yield LedgerId(int(scope), int(ledger))

    # ---- LedgerIdGenerator ---------------------------------------------------------

    def generate_ledger_id(self, scope_id: int | None = 0) -> LedgerId:
        """(bucket << 56) | counter: the counter of IDGEN/<bucket> is raised by one in a
        transaction conditioned on its mod revision (the seed's "get, increment, update
        with a txn"); buckets are taken round-robin so concurrent generators rarely meet."""
        if scope_id is None:
            return decentralised_ledger_id()
        check_scope(scope_id)
        with self._lock:
            bucket = self._next_bucket
            self._next_bucket = (bucket + 1) % self._buckets
        if scope_id == 0:
            key = self._k("IDGEN", f"{bucket:03d}")
        else:
            key = self._k("IDGEN-scoped", f"{scope_id:020d}", f"{bucket:03d}")
        value, mod = self._bucket_cache.get(key, (0, 0))
        for _ in range(_RETRIES):
            nxt = value + 1
            if nxt >= 1 << BUCKET_SHIFT:
                raise MetadataError(f"ledger ids of bucket {key} are exhausted")
            compare = [tx.Mod(key) == mod] if mod else [tx.Version(key) == 0]
            ok, responses = self._txn(f"generate id at {key}", compare,
                                      [tx.Put(key, str(nxt).encode()), tx.Get(key)], [tx.Get(key)])
            kvs = responses[-1]
            if ok:
                self._bucket_cache[key] = (nxt, kvs[0][1].mod_revision)
                return LedgerId(scope_id, (bucket << BUCKET_SHIFT) | nxt)
            # another generator moved the counter: start from what is stored
            try:
                value, mod = (int(kvs[0][0]), kvs[0][1].mod_revision) if kvs else (0, 0)
            except ValueError:
                raise MetadataError(f"corrupted id counter at {key}: {kvs[0][0][:40]!r}") from None
        raise BadVersionError(f"could not generate a ledger id at {key}: too much contention")

    # ---- RegistrationManager -------------------------------------------------------

    def _reg_key(self, bookie_id: str, read_only: bool) -> str:
        return self._k("available", "readonly" if read_only else "readwrite", bookie_id)

    def _current_lease(self):
        with self._lock:
            if self._lease is None:
                with self._errors("grant lease"):
                    self._lease = self._etcd.lease(self._lease_ttl_s)
            if self._keepalive is None:
                self._keepalive = threading.Thread(target=self._keepalive_loop, daemon=True,
                                                   name="embedlog-etcd-keepalive")
                self._keepalive.start()
            return self._lease

    def register_bookie(self, bookie_id: str, read_only: bool, info: dict | None = None) -> None:
        """Put under this store's lease (moving between readwrite and readonly in one
        transaction). If another live lease holds the id, wait for it to expire, then
        MetadataError."""
        check_bookie_id(bookie_id)
        read_only = bool(read_only)
        data = encode_bookie_info(info)
        self._register(bookie_id, read_only, data)
        with self._lock:
            self._registered.pop((bookie_id, not read_only), None)
            self._registered[(bookie_id, read_only)] = data

    def _register(self, bookie_id: str, read_only: bool, data: bytes) -> None:
        key, other = self._reg_key(bookie_id, read_only), self._reg_key(bookie_id, not read_only)
        began = time.monotonic()
        deadline = began + self._lease_ttl_s + self._timeout_s
        waited_for = None                   # (key, lease id) of the registration we wait on
        while True:
            lease = self._current_lease()
            _, meta = self._get(key)
            _, ometa = self._get(other)
            foreign = next(((k, m) for k, m in ((key, meta), (other, ometa))
                            if m is not None and m.lease_id != lease.id), None)
            if foreign is not None and waited_for is None:
                # a restart after a SIGKILL: the old lease holds the key until etcd expires it
                waited_for = (foreign[0], foreign[1].lease_id)
                log.warning("bookie %s: registration %s is held by etcd lease %x (a previous "
                            "run's, not yet expired?); waiting up to %.1f s for it to go",
                            bookie_id, waited_for[0], waited_for[1], deadline - began)
            if foreign is None:
                compare = [tx.Mod(key) == meta.mod_revision] if meta else [tx.Version(key) == 0]
                success = [tx.Put(key, data, lease)]
                if ometa is not None:
                    compare.append(tx.Mod(other) == ometa.mod_revision)
                    success.append(tx.Delete(other))
                ok, _ = self._txn(f"register {bookie_id}", compare, success)
                if ok:
                    if waited_for is not None:
                        log.warning("bookie %s: registered after %.1f s waiting for %s of lease %x",
                                    bookie_id, time.monotonic() - began, *waited_for)
                    return
            if time.monotonic() > deadline:
                where = f" ({waited_for[0]}, lease {waited_for[1]:x})" if waited_for else ""
                raise MetadataError(f"bookie {bookie_id} is registered under another live etcd "
                                    f"lease{where}")
            self._stop.wait(0.1)            # bounded by the deadline above

    def unregister_bookie(self, bookie_id: str, read_only: bool) -> None:
        with self._lock:
            self._registered.pop((bookie_id, bool(read_only)), None)
        with self._errors(f"unregister {bookie_id}"):
            self._etcd.delete(self._reg_key(bookie_id, bool(read_only)))

    def _keepalive_loop(self) -> None:
        # etcd3 has no automatic keep-alive: refresh at a third of the TTL so two missed
        # beats still leave the lease alive; a lease that expired anyway (a long stall)
        # is replaced and the registrations are put again, as after a ZooKeeper session loss.
        while not self._stop.wait(self._lease_ttl_s / 3):
            try:
                lease = self._lease
                if lease is not None:
                    with self._errors("refresh lease"):
                        ttl = [r.TTL for r in self._etcd.refresh_lease(lease.id)]
                    if ttl and ttl[-1] > 0:
                        continue
                    log.warning("etcd lease %x expired; registering again", lease.id)
                    with self._lock:
                        if self._lease is lease:
                            self._lease = None
                with self._lock:
                    mine = dict(self._registered)
                for (bookie_id, read_only), data in mine.items():
                    self._register(bookie_id, read_only, data)    # grants a new lease
            except Exception as exc:       # etcd unreachable: try again next beat
                log.warning("etcd lease keep-alive failed: %s", exc)

    # ---- RegistrationClient --------------------------------------------------------

    def get_all_bookies(self) -> list[BookieRegistration]:
        # One range read over available/ is one revision: a move between readwrite/ and
        # readonly/ (one transaction) is seen whole or not at all, where two reads could
        # straddle it and show the bookie in both states. Only keys of the form
        # <state>/<bookie id> count; anything else under the prefix (a parent key such as
        # BookKeeper's, a deeper path) is not a registration.
        prefix = self._k("available", "")
        with self._errors("list bookies"):
            items = list(self._etcd.get_prefix(prefix, sort_order="ascend", sort_target="key"))
        regs: dict[bool, list[BookieRegistration]] = {False: [], True: []}
        for value, meta in items:
            state, _, bookie_id = meta.key.decode()[len(prefix):].partition("/")
            if state in ("readwrite", "readonly") and bookie_id and "/" not in bookie_id:
                read_only = state == "readonly"
                regs[read_only].append(decode_bookie(bookie_id, read_only, value))
        return regs[False] + regs[True]

    def watch_bookies(self, callback: Callable[[list[BookieRegistration]], None]) -> Callable[[], None]:
        """An etcd prefix watch on available/ wakes a listing thread; a slow poll covers
        a broken watch stream."""
        watch = PollingWatch(self.get_all_bookies, callback,
                             self._poll_interval_s, name="embedlog-etcd-watch")
        with self._errors("watch bookies"):
            watch_id = self._etcd.add_watch_prefix_callback(self._k("available", ""),
                                                            lambda _resp: watch.kick())
        self._watches.append((watch, watch_id))

        def cancel():
            watch.cancel()
            try:
                self._etcd.cancel_watch(watch_id)
            except Exception as exc:    # the store may be closing
                log.debug("cancel etcd watch: %s", exc)
        return cancel

    # ---- LayoutManager -------------------------------------------------------------

    def read_layout(self) -> bytes | None:
        return self._get(self._k("LAYOUT"))[0]

    def create_layout(self, layout: bytes) -> None:
        ok, _ = self._create(self._k("LAYOUT"), bytes(layout))
        if not ok:
            raise LayoutExistsError(f"a layout is already stored at {self.prefix}/LAYOUT")

    def delete_layout(self) -> None:
        self._delete(self._k("LAYOUT"), None, "delete layout")

    # ---- CookieStore ---------------------------------------------------------------

    def read_cookie(self, bookie_id: str) -> Versioned | None:
        value, meta = self._get(self._k("cookies", check_bookie_id(bookie_id)))
        return None if meta is None else Versioned(value, meta.mod_revision)

    def write_cookie(self, bookie_id: str, data: bytes, version: Any = None) -> Versioned:
        key = self._k("cookies", check_bookie_id(bookie_id))
        if version is None:
            ok, (_, meta) = self._create(key, bytes(data))
            if not ok:
                raise BadVersionError(f"cookie of {bookie_id} exists; pass its version")
            return Versioned(bytes(data), meta.mod_revision)
        try:
            return Versioned(bytes(data), self._cas(key, bytes(data), version, f"cookie {bookie_id}"))
        except (BadVersionError, NoSuchLedgerError):
            raise BadVersionError(f"cookie of {bookie_id}: version {version!r} is stale") from None

    def remove_cookie(self, bookie_id: str, version: Any = None) -> None:
        if not self._delete(self._k("cookies", check_bookie_id(bookie_id)), version,
                            f"remove cookie {bookie_id}"):
            raise MetadataError(f"no cookie for bookie {bookie_id}")

    def list_cookies(self) -> list[str]:
        prefix = self._k("cookies", "")
        with self._errors("list cookies"):
            items = list(self._etcd.get_prefix(prefix, keys_only=True))
        return sorted(meta.key.decode()[len(prefix):] for _, meta in items)

    # ---- ConsumerGroupStore ---------------------------------------------------------

    def read_group(self, group_id: str) -> Versioned | None:
        value, meta = self._get(self._k("groups", group_key(group_id)))
        return None if meta is None else Versioned(bytes(value), meta.mod_revision)

    def write_group(self, group_id: str, data: bytes, version: Any = None) -> Versioned:
        key = self._k("groups", group_key(group_id))
        if version is None:
            ok, (_, meta) = self._create(key, bytes(data))
            if not ok:
                raise BadVersionError(f"group {group_id} exists; pass its version")
            return Versioned(bytes(data), meta.mod_revision)
        try:
            return Versioned(bytes(data), self._cas(key, bytes(data), version, f"group {group_id}"))
        except (BadVersionError, NoSuchLedgerError):
            raise BadVersionError(f"group {group_id}: version {version!r} is stale") from None

    def remove_group(self, group_id: str, version: Any = None) -> bool:
        return self._delete(self._k("groups", group_key(group_id)), version,
                            f"remove group {group_id}")

    def list_groups(self) -> list[str]:
        prefix = self._k("groups", "")
        with self._errors("list groups"):
            items = list(self._etcd.get_prefix(prefix, keys_only=True))
        return sorted(group_of_key(meta.key.decode()[len(prefix):]) for _, meta in items)

    # ---- UnderreplicationManager ---------------------------------------------------

    def mark_ledger_underreplicated(self, ledger_id, missing_bookies: list[str]) -> None:
        lid = coerce_ledger_id(ledger_id)
        key = self._k("underreplication", lid.qualified_name)
        for _ in range(_RETRIES):            # optimistic merge: read, merge, CAS
            value, meta = self._get(key)
            if meta is None:
                record = {"missing": list(missing_bookies), "ctime_ms": int(time.time() * 1000)}
                if self._create(key, json.dumps(record).encode())[0]:
                    return
                continue
            missing = decode_underreplicated(value, key)       # MetadataError if damaged
            record = json.loads(value)
            record["missing"] = merge_missing(missing, list(missing_bookies))
            try:
                self._cas(key, json.dumps(record).encode(), meta.mod_revision, f"mark {lid}")
                return
            except (BadVersionError, NoSuchLedgerError):
                continue
        raise BadVersionError(f"could not mark {lid} under-replicated: too much contention")

    def mark_ledger_replicated(self, ledger_id) -> None:
        lid = coerce_ledger_id(ledger_id)
        self._delete(self._k("underreplication", lid.qualified_name), None, f"replicated {lid}")

    def list_underreplicated(self) -> dict[LedgerId, list[str]]:
        prefix = self._k("underreplication", "")
        with self._errors("list under-replicated"):
            items = list(self._etcd.get_prefix(prefix, sort_order="ascend", sort_target="key"))
        try:
            return {LedgerId.parse(meta.key.decode()[len(prefix):]):
                    decode_underreplicated(value, meta.key.decode()) for value, meta in items}
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataError(f"corrupted under-replication record: {exc}") from exc

    # ---- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Revokes the lease, so this store's registrations vanish at once."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for watch, watch_id in self._watches:
            watch.cancel()
            try:
                self._etcd.cancel_watch(watch_id)
            except Exception:
                pass
        if self._keepalive is not None:
            self._keepalive.join(timeout=self._timeout_s + 1)
        if self._lease is not None:
            try:
                self._lease.revoke()
            except Exception as exc:        # it expires on its own
                log.warning("etcd: could not revoke lease: %s", exc)
        self._etcd.close()

    def __repr__(self) -> str:
        return f"EtcdMetadataStore({self.endpoint!r}, {self.prefix!r})"
