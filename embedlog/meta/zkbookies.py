"""The bookies' registrations in ZooKeeper: an ephemeral znode each under available/ (or
available/readonly/), written again when a lost session's znodes are gone, and the
listing and watch of them as of one moment. ZkMetadataStore (meta/zookeeper.py) is a
ZkRegistrations."""
from __future__ import annotations

import threading
import time
from typing import Callable

from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError as KzBadVersion, NoNodeError, NodeExistsError

from embedlog.errors import MetadataError
from embedlog.meta._common import PollingWatch, check_bookie_id, log
from embedlog.meta.api import BookieRegistration, RegistrationClient, RegistrationManager

_SNAPSHOT_RETRIES = 10                   # bound on re-listing the bookies (_all_bookies)


class ZkRegistrations(RegistrationManager, RegistrationClient):
    """RegistrationManager and RegistrationClient of a ZkMetadataStore, whose session
    (``_zk``, ``_wait``, ``_errors``, ``_commit``, ``_exists``, ``_delete``), tree and root
    (``_tree``, ``_p``, ``hosts``, ``root``) and timeouts these use."""

    def __init__(self):
        self._registered: dict[tuple[str, bool], bytes] = {}
        self._reg_lock = threading.Lock()
        self._session_lost = False

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
        data = self._tree.encode_registration(bookie_id, info)
        self._register(bookie_id, read_only, data)
        with self._reg_lock:
            self._registered.pop((bookie_id, not read_only), None)
            self._registered[(bookie_id, read_only)] = data

    def _register(self, bookie_id: str, read_only: bool, data: bytes) -> None:
        path, other = self._reg_path(bookie_id, read_only), self._reg_path(bookie_id, not read_only)
        began = time.monotonic()
        deadline = began + self._session_timeout_s + self._timeout_s
        waited_for = None                   # (path, session) of the znode we wait on
        while True:
            stat, mine = self._owned(path)
            ostat, omine = self._owned(other)
            foreign = ((path, stat) if stat is not None and not mine else
                       (other, ostat) if ostat is not None and not omine else None)
            if foreign is not None and waited_for is None:
                # a restart after a SIGKILL: the old session's znode stays until ZooKeeper
                # expires that session; say so now, not only when the wait fails
                waited_for = (foreign[0], foreign[1].ephemeralOwner)
                log.warning("bookie %s: registration znode %s is held by ZooKeeper session "
                            "0x%x (a previous run's, not yet expired?); waiting up to %.1f s "
                            "for it to go", bookie_id, waited_for[0], waited_for[1],
                            deadline - began)
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
                    if waited_for is not None:
                        log.warning("bookie %s: registered after %.1f s waiting for %s of "
                                    "session 0x%x", bookie_id, time.monotonic() - began,
                                    *waited_for)
                    return
                except (NodeExistsError, NoNodeError, KzBadVersion):
                    pass                    # raced with another registrant: look again
            if time.monotonic() > deadline:
                where = f" ({waited_for[0]}, session 0x{waited_for[1]:x})" if waited_for else ""
                raise MetadataError(f"bookie {bookie_id} is registered by another live "
                                    f"ZooKeeper session{where}")
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
        if state == KazooState.SUSPENDED and not self._closed:
            self._suspended_at = time.monotonic()
            threading.Thread(target=self._revive_if_refused, daemon=True,
                             name="embedlog-zk-revive").start()

    def _revive_if_refused(self) -> None:
        """A session cut off for longer than its timeout is gone on any server, yet kazoo
        keeps offering it: a server restored from an older backup refuses every client that
        saw a later transaction (its zxid) without ever saying the session expired, so the
        bookie would stay unregistered and mute. Past the timeout, say so and start a new
        session (registrations follow, as after any lost session)."""
        since = getattr(self, "_suspended_at", None)
        deadline = since + 1.5 * self._session_timeout_s
        with self._reg_lock:
            mine = sorted({bookie_id for bookie_id, _ in self._registered})
        if mine:                                 # said at once, not at the next GC cycle
            log.warning("ZooKeeper at %s: connection lost; bookie %s stays registered only while "
                        "its session lives (%.0f s timeout). If no server takes the session "
                        "back within %.0f s, a new session is started and it registers again",
                        self.hosts, ", ".join(mine), self._session_timeout_s,
                        1.5 * self._session_timeout_s)
        while not self._closed and self._zk.state != KazooState.CONNECTED:
            if time.monotonic() >= deadline:
                if getattr(self, "_suspended_at", None) != since:
                    return                       # a later suspension has its own watchdog
                log.error("ZooKeeper at %s has not taken this session back for %.0f s, longer "
                          "than its %.0f s timeout (a server restored from an older backup "
                          "refuses clients that saw later transactions): starting a new session",
                          self.hosts, time.monotonic() - since, self._session_timeout_s)
                try:
                    self._zk.restart()
                except Exception as exc:
                    log.error("ZooKeeper at %s: a new session could not start: %s", self.hosts, exc)
                return
            time.sleep(0.2)              # a watchdog's poll, bounded by the deadline above

    def _reregister(self) -> None:
        with self._reg_lock:
            mine = dict(self._registered)
        for (bookie_id, read_only), data in mine.items():
            try:
                self._register(bookie_id, read_only, data)
                log.warning("bookie %s registered again after its ZooKeeper session was lost",
                            bookie_id)
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
            out.append(self._tree.decode_registration(name, read_only, data))
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
