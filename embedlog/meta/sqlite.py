"""SQLite metadata driver: the default for embedded use and the local harness.

One database file (WAL mode) shared by any number of processes on one host. Every
thread gets its own connection; writes that read before they write (CAS, id
generation, registration) run in ``BEGIN IMMEDIATE`` so the check and the write see
the same state. Schema (all tables WITHOUT ROWID)::

    meta_kv(key TEXT PK, value BLOB, version INT)      LAYOUT, INSTANCEID, SCHEMA_VERSION
    ledgers(name TEXT PK, data BLOB, version INT)      name = LedgerId.qualified_name
    idgen(scope TEXT PK, next_id INT)                  scope = 16 lowercase hex digits
    bookies(bookie_id TEXT, read_only INT, info BLOB, owner TEXT, expires_at REAL,
            PK(bookie_id, read_only))
    cookies(bookie_id TEXT PK, data BLOB, version INT)
    underreplicated(name TEXT PK, missing TEXT (JSON list), ctime_ms INT)
    consumer_groups(group_id TEXT PK, data BLOB, version INT)   made at the first write

Ledger rows are keyed by the 32-hex-digit qualified name, so text order is
(scope id, ledger id) order for ids that use all 64 bits (SQLite integers are signed).
Versions start at 0 and grow by one per write, like a znode's.

Liveness: a registration row carries ``expires_at`` (wall clock, seconds); a daemon
thread of the registering store pushes it forward every ``heartbeat_interval_s``;
listings ignore expired rows, so a SIGKILLed bookie drops out within ``expiry_s``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from embedlog._native.format import LedgerId
from embedlog.errors import (BadVersionError, LedgerExistsError, MetadataError,
                             NoSuchLedgerError, TimeoutError)
from embedlog.meta._common import (SCOPE0_LIMIT, PollingWatch, StoreBase, check_bookie_id,
                                   check_layout, check_scope, coerce_ledger_id, deleted_id_message,
                                   decentralised_ledger_id, decode_bookie, decode_underreplicated,
                                   encode_bookie_info, layout_record, log, merge_missing,
                                   owner_is_dead_local_process, owner_token)
from embedlog.meta.api import (BookieRegistration, ConsumerGroupStore, CookieStore, check_group_id, DeletionRecord, LayoutExistsError,
                               LayoutManager, LedgerIdGenerator, LedgerManager,
                               LedgerMetadata, MetadataStore, RegistrationClient,
                               RegistrationManager, UnderreplicationManager, Versioned)
from embedlog.proc import process_state

SCHEMA_VERSION = 1
LAYOUT_NAME = "sqlite"
_PAGE = 1000                    # rows per iteration query: no long read transactions

_GROUPS_TABLE = ("CREATE TABLE IF NOT EXISTS consumer_groups (group_id TEXT PRIMARY KEY,"
                 " data BLOB NOT NULL, version INTEGER NOT NULL) WITHOUT ROWID")
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta_kv (key TEXT PRIMARY KEY, value BLOB NOT NULL,"
    " version INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS ledgers (name TEXT PRIMARY KEY, data BLOB NOT NULL,"
    " version INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS idgen (scope TEXT PRIMARY KEY, next_id INTEGER NOT NULL)"
    " WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS bookies (bookie_id TEXT NOT NULL, read_only INTEGER NOT NULL,"
    " info BLOB NOT NULL, owner TEXT NOT NULL, expires_at REAL NOT NULL,"
    " PRIMARY KEY (bookie_id, read_only)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS cookies (bookie_id TEXT PRIMARY KEY, data BLOB NOT NULL,"
    " version INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS underreplicated (name TEXT PRIMARY KEY, missing TEXT NOT NULL,"
    " ctime_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS deleted_ledgers (name TEXT PRIMARY KEY,"
    " deleted_at_ms INTEGER NOT NULL, ctime_ms INTEGER) WITHOUT ROWID",
    _GROUPS_TABLE,
)
# stores made before deletion records kept the deleted ledger's ctime gain the column at
# their first deletion (NULL in older rows: read as -1, not known)
_DELETION_CTIME = "ALTER TABLE deleted_ledgers ADD COLUMN ctime_ms INTEGER"


# One writer at a time per database file within this process. SQLite's busy handler
# sleeps and polls, with no queue: twenty threads of one process writing at once starved
# some past the busy timeout ("database is locked"). Threads now queue here, and the busy
# timeout bounds only the wait for other processes (each writer ahead is bounded by it).
_writers: dict = {}
_writers_guard = threading.Lock()


def _writer_lock(path: str) -> threading.Lock:
    with _writers_guard:
        lock = _writers.get(path)
        if lock is None:
            lock = _writers[path] = threading.Lock()
        return lock


def _forget_writer_locks() -> None:
    # a forked child has only the forking thread: a lock another thread held stays held
    global _writers_guard
    _writers.clear()
    _writers_guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_writer_locks)


def _scope_hex(scope_id: int) -> str:
    return f"{scope_id:016x}"


# In WAL mode SQLite's write lock is a POSIX lock on byte 120 of the -shm file
# (UNIX_SHM_BASE + WAL_WRITE_LOCK in its os_unix.c). Its holder is read from /proc/locks:
# opening the file to ask with F_GETLK would, on close, drop this process's own locks on it.
_SHM_WRITE_LOCK = 120


def write_lock_holder(path: str) -> int | None:
    """The pid of the process holding the write lock of the SQLite file at ``path`` (WAL
    mode), or None."""
    try:
        st = os.stat(path + "-shm")
        with open("/proc/locks") as f:
            table = f.read().splitlines()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table:      # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 120 120"
        f = line.split()
        if len(f) == 8 and f[1] == "POSIX" and f[3] == "WRITE" and f[5] == where \
                and int(f[6]) <= _SHM_WRITE_LOCK and (f[7] == "EOF" or int(f[7]) >= _SHM_WRITE_LOCK):
            return int(f[4])
    return None


def _held_by(path: str | None) -> str:
    """', held by process N' (and whether it is stopped) for a "database is locked" error, so
    an operator finds who holds every writer back; '' when that cannot be told."""
    pid = write_lock_holder(path) if path else None
    if pid is None:
        return ""
    if process_state(pid) in ("T", "t"):
        # SQLite has no lease: a writer stopped mid-transaction holds every other one back
        return (f", held by process {pid}, which is stopped (SIGSTOP, Ctrl-Z or a debugger): "
                f"every writer waits until it runs again or exits")
    return f", held by process {pid}"


@contextmanager
def _wrapped(what: str, path: str | None = None):
    """sqlite3 errors become embedlog errors; a lock held past the busy timeout is a
    TimeoutError (naming the process that holds it), anything else (a corrupt file, a full
    disk) a MetadataError."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            raise TimeoutError(f"sqlite metadata: {what}: {exc}{_held_by(path)}") from exc
        raise MetadataError(f"sqlite metadata: {what}: {exc}") from exc
    except sqlite3.Error as exc:
        raise MetadataError(f"sqlite metadata: {what}: {exc}") from exc


class SqliteMetadataStore(StoreBase, MetadataStore, LedgerManager, LedgerIdGenerator,
                          RegistrationManager, RegistrationClient, LayoutManager,
                          CookieStore, UnderreplicationManager, ConsumerGroupStore):
    """The SQLite driver. ``SqliteMetadataStore("/abs/dir/meta.db")`` creates the file if
    needed (its directory must exist).

    Options: ``timeout_s`` (busy timeout for a database another process has locked, default 5;
    threads of this process queue for the write lock in turn),
    ``heartbeat_interval_s`` (1), ``expiry_s`` (5, must exceed the heartbeat interval),
    ``poll_interval_s`` (watch polling, 0.2), ``synchronous`` ("FULL": every commit is
    fsynced; "NORMAL" trades the last commits on power loss for speed).
    """

    def __init__(self, path: str, *, timeout_s: float = 5.0, heartbeat_interval_s: float = 1.0,
                 expiry_s: float = 5.0, poll_interval_s: float = 0.2,
                 synchronous: str = "FULL", uri: str | None = None, create: bool = True):
        if expiry_s <= heartbeat_interval_s:
            raise MetadataError(f"expiry_s ({expiry_s}) must exceed heartbeat_interval_s "
                                f"({heartbeat_interval_s})")
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA", "OFF"):
            raise MetadataError(f"unknown sqlite synchronous mode {synchronous!r}")
        path = os.path.abspath(path)
        self.path = path
        self._write_key = os.path.realpath(path)    # one lock per file, however named
        self.uri = uri or f"sqlite://{path}"
        if not create and not os.path.isfile(path):
            raise MetadataError(f"no metadata store at {self.uri}: {path} does not exist "
                                f"(a bookie, `embedlog cluster up` or `embedlog metadata format` "
                                f"makes one)")
        if not os.path.isdir(os.path.dirname(path)):
            raise MetadataError(f"sqlite metadata: directory {os.path.dirname(path)} does not exist")
        self._timeout_s = float(timeout_s)
        self._heartbeat_interval_s = float(heartbeat_interval_s)
        self._expiry_s = float(expiry_s)
        self._poll_interval_s = float(poll_interval_s)
        self._synchronous = synchronous.upper()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._closed = False
        self._in_use = 0                     # calls inside a connection right now
        self._in_use_cv = threading.Condition()
        self._owner = owner_token()
        self._registered: dict[tuple[str, bool], bytes] = {}
        self._reg_lock = threading.Lock()
        self._heartbeat: threading.Thread | None = None
        self._stop = threading.Event()
        self._watches: list[PollingWatch] = []
        self._bind_managers()
        try:
            if create:
                if not os.path.exists(path):
                    # ledger passwords live here: the file (and the -wal and -shm files SQLite
                    # makes with its mode) is this user's only
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
                self._init_schema()
            else:
                self._check_schema()
        except BaseException:
            self.close()
            raise

    # ---- connections -------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        with _wrapped(f"open {self.path}"):
            # check_same_thread=False only so close() may close it from another thread
            conn = sqlite3.connect(self.path, timeout=self._timeout_s, isolation_level=None,
                                   check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout_s * 1000)}")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
        self._local.conn, self._local.pid = conn, os.getpid()
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    @contextmanager
    def _using(self):
        """Count a call inside a connection: close() waits for them, as closing a
        connection another thread is using crashes the sqlite3 module."""
        with self._in_use_cv:
            if self._closed:
                raise MetadataError(f"metadata store {self.uri} is closed")
            self._in_use += 1
        try:
            yield
        finally:
            with self._in_use_cv:
                self._in_use -= 1
                self._in_use_cv.notify_all()

    @contextmanager
    def _write(self, what: str):
        """BEGIN IMMEDIATE ... COMMIT: takes the write lock first, so what we read inside is
        what we overwrite. An exception rolls back."""
        with self._using(), _writer_lock(self._write_key):
            conn = self._conn()
            with _wrapped(what, self.path):
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")

    def _query(self, what: str, sql: str, args: tuple = ()) -> list:
        with self._using(), _wrapped(what, self.path):
            return self._conn().execute(sql, args).fetchall()

    def _set_wal(self) -> None:
        # WAL lets readers in other processes run beside the one writer. Switching a
        # fresh file to WAL can fail with SQLITE_BUSY at once, without the busy handler,
        # while another process does the same: retry until the busy timeout is spent.
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                with _wrapped(f"open {self.path}"):
                    mode = self._conn().execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        if mode.lower() != "wal":
            raise MetadataError(f"sqlite metadata: cannot use WAL on {self.path} ({mode})")

    def _init_schema(self) -> None:
        self._set_wal()
        with self._write("create schema") as c:
            for stmt in _SCHEMA:
                c.execute(stmt)
            c.execute("INSERT OR IGNORE INTO meta_kv VALUES ('SCHEMA_VERSION', ?, 0)",
                      (str(SCHEMA_VERSION).encode(),))
            c.execute("INSERT OR IGNORE INTO meta_kv VALUES ('INSTANCEID', ?, 0)",
                      (str(uuid.uuid4()).encode(),))
            c.execute("INSERT OR IGNORE INTO meta_kv VALUES ('LAYOUT', ?, 0)",
                      (layout_record(LAYOUT_NAME),))
            rows = dict(c.execute("SELECT key, value FROM meta_kv WHERE key IN "
                                  "('SCHEMA_VERSION', 'INSTANCEID', 'LAYOUT')").fetchall())
        self._check_rows(rows)

    def _check_schema(self) -> None:
        """create=False: an initialised store (schema, instance id), read without writing."""
        try:
            rows = dict(self._query("read schema", "SELECT key, value FROM meta_kv WHERE key IN "
                                    "('SCHEMA_VERSION', 'INSTANCEID', 'LAYOUT')"))
        except MetadataError as exc:
            raise MetadataError(f"no metadata store at {self.uri}: {self.path} is not an "
                                f"initialised embedlog store ({exc})") from None
        if "INSTANCEID" not in rows or "SCHEMA_VERSION" not in rows:
            raise MetadataError(f"no metadata store at {self.uri}: {self.path} is not initialised")
        self._check_rows(rows)

    def _check_rows(self, rows: dict) -> None:
        try:
            schema = int(rows["SCHEMA_VERSION"])
        except (ValueError, TypeError):
            raise MetadataError(f"sqlite metadata: corrupted schema version in {self.path}") from None
        if schema != SCHEMA_VERSION:
            raise MetadataError(f"sqlite metadata: unknown schema version {schema} in {self.path}")
        self.instance_id = bytes(rows["INSTANCEID"]).decode()
        check_layout(rows.get("LAYOUT"), LAYOUT_NAME, self.path)

    # ---- LedgerManager -------------------------------------------------------------

    def create_ledger_metadata(self, metadata: LedgerMetadata) -> Versioned:
        name = metadata.ledger_id.qualified_name
        data = metadata.to_bytes()
        try:
            with self._write(f"create ledger {name}") as c:
                gone = c.execute("SELECT deleted_at_ms FROM deleted_ledgers WHERE name=?",
                                 (name,)).fetchone()
                if gone is not None:
                    raise LedgerExistsError(deleted_id_message(metadata.ledger_id, gone[0]))
                c.execute("INSERT INTO ledgers VALUES (?, ?, 0)", (name, data))
        except MetadataError as exc:
            if isinstance(exc.__cause__, sqlite3.IntegrityError):
                raise LedgerExistsError(f"ledger {metadata.ledger_id} already exists") from None
            raise
        return Versioned(metadata, 0)

    def read_ledger_metadata(self, ledger_id) -> Versioned:
        lid = coerce_ledger_id(ledger_id)
        rows = self._query(f"read ledger {lid}", "SELECT data, version FROM ledgers WHERE name=?",
                           (lid.qualified_name,))
        if not rows:
            raise NoSuchLedgerError(f"no ledger {lid}")
        metadata = LedgerMetadata.from_bytes(bytes(rows[0][0]))
        if metadata.ledger_id != lid:
            raise MetadataError(f"corrupted ledger metadata: row {lid} holds {metadata.ledger_id}")
        return Versioned(metadata, rows[0][1])

    def write_ledger_metadata(self, metadata: LedgerMetadata, version: Any) -> Versioned:
        lid = metadata.ledger_id
        with self._write(f"write ledger {lid}") as c:
            row = c.execute("SELECT version, data FROM ledgers WHERE name=?",
                            (lid.qualified_name,)).fetchone()
            if row is None:
                raise NoSuchLedgerError(f"no ledger {lid}")
            if row[0] != version:
                raise BadVersionError(f"ledger {lid}: version {version!r} is stale (now {row[0]})")
            # versions count from 0 again for a new ledger under a deleted one's id: the
            # stored one must be the same ledger (its ctime), or a stale writer of the
            # deleted one would change the new one's metadata
            if LedgerMetadata.from_bytes(bytes(row[1])).ctime_ms != metadata.ctime_ms:
                raise BadVersionError(f"ledger {lid}: the stored metadata is of another ledger "
                                      "of that id (deleted and created again)")
            c.execute("UPDATE ledgers SET data=?, version=? WHERE name=?",
                      (metadata.to_bytes(), row[0] + 1, lid.qualified_name))
        return Versioned(metadata, row[0] + 1)

    def remove_ledger_metadata(self, ledger_id, version: Any = None) -> None:
        lid = coerce_ledger_id(ledger_id)
        with self._write(f"remove ledger {lid}") as c:
            row = c.execute("SELECT version FROM ledgers WHERE name=?",
                            (lid.qualified_name,)).fetchone()
            if row is None:
                raise NoSuchLedgerError(f"no ledger {lid}")
            if version is not None and row[0] != version:
                raise BadVersionError(f"ledger {lid}: version {version!r} is stale (now {row[0]})")
            data = c.execute("SELECT data FROM ledgers WHERE name=?",
                             (lid.qualified_name,)).fetchone()[0]
            try:
                ctime_ms = LedgerMetadata.from_bytes(bytes(data)).ctime_ms
            except MetadataError:         # unreadable metadata: a record without the ctime
                ctime_ms = -1
            c.execute("DELETE FROM ledgers WHERE name=?", (lid.qualified_name,))
            columns = [r[1] for r in c.execute("PRAGMA table_info(deleted_ledgers)")]
            if "ctime_ms" not in columns:
                c.execute(_DELETION_CTIME)
            c.execute("INSERT OR REPLACE INTO deleted_ledgers (name, deleted_at_ms, ctime_ms) "
                      "VALUES (?, ?, ?)", (lid.qualified_name, int(time.time() * 1000), ctime_ms))

    def ledger_deletion(self, ledger_id) -> DeletionRecord | None:
        lid = coerce_ledger_id(ledger_id)
        rows = self._query(f"read deletion of {lid}", "SELECT * FROM deleted_ledgers WHERE name=?",
                           (lid.qualified_name,))
        if not rows:
            return None
        row = rows[0]
        ctime_ms = row[2] if len(row) > 2 and row[2] is not None else -1
        return DeletionRecord(int(row[1]), int(ctime_ms))

    def purge_deletions(self, before_ms: int) -> int:
        with self._write("purge deletion records") as c:
            return c.execute("DELETE FROM deleted_ledgers WHERE deleted_at_ms < ?",
                             (int(before_ms),)).rowcount

    def iterate_ledgers(self, scope_id: int | None = 0) -> Iterator[LedgerId]:
        # Keyset pages: each page is its own short read, so concurrent writers are never
        # blocked; ids created or deleted meanwhile may or may not appear, never twice.
        if scope_id is None:
            after, upper = "", "g"
        else:
            check_scope(scope_id)
            after = _scope_hex(scope_id)            # sorts before every name of the scope
            upper = after + "g"                     # 'g' > any hex digit
        while True:
            rows = self._query("iterate ledgers",
                               "SELECT name FROM ledgers WHERE name > ? AND name < ? "
                               "ORDER BY name LIMIT ?", (after, upper, _PAGE))
            for (name,) in rows:
                yield LedgerId.parse(name)
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    # ---- LedgerIdGenerator ---------------------------------------------------------

    def generate_ledger_id(self, scope_id: int | None = 0) -> LedgerId:
        if scope_id is None:
            return decentralised_ledger_id()
        check_scope(scope_id)
        scope = _scope_hex(scope_id)
        with self._write(f"generate ledger id in scope {scope_id}") as c:
            row = c.execute("SELECT next_id FROM idgen WHERE scope=?", (scope,)).fetchone()
            candidate = row[0] if row else 0
            # skip ids a caller created with an explicit ledger id; one index walk
            while True:
                if candidate >= SCOPE0_LIMIT:       # SQLite counters are signed 64-bit
                    raise MetadataError(f"ledger ids of scope {scope_id} are exhausted")
                taken = [int(n[16:], 16) for (n,) in c.execute(
                    "SELECT name FROM ledgers WHERE name >= ? AND name < ? ORDER BY name LIMIT ?",
                    (scope + f"{candidate:016x}", scope + "g", _PAGE))]
                for t in taken:
                    if t != candidate:
                        break
                    candidate += 1
                else:
                    if len(taken) == _PAGE:
                        continue
                break
            c.execute("INSERT OR REPLACE INTO idgen VALUES (?, ?)", (scope, candidate + 1))
        return LedgerId(scope_id, candidate)

    def ledger_id_high_water_mark(self) -> int:
        """Every scope-0 id the generator has handed out is below this (its next id)."""
        rows = self._query("read the ledger id generator", "SELECT next_id FROM idgen WHERE scope=?",
                           (_scope_hex(0),))
        return int(rows[0][0]) if rows else 0

    def reserve_ledger_ids(self, scope_id: int, through: int) -> None:
        """Never generate ids up to ``through`` in this scope (a bookie holds their data)."""
        check_scope(scope_id)
        if through >= SCOPE0_LIMIT - 1:
            return
        scope = _scope_hex(scope_id)
        with self._write(f"reserve ledger ids of scope {scope_id}") as c:
            row = c.execute("SELECT next_id FROM idgen WHERE scope=?", (scope,)).fetchone()
            if row is None or row[0] <= through:
                c.execute("INSERT OR REPLACE INTO idgen VALUES (?, ?)", (scope, through + 1))

    # ---- RegistrationManager -------------------------------------------------------

    def register_bookie(self, bookie_id: str, read_only: bool, info: dict | None = None) -> None:
        """Register (or move between read-write and read-only). If another live process
        holds the id, wait for its row to expire, as BookKeeper waits for an old
        ephemeral znode; MetadataError if it is still refreshed after that."""
        check_bookie_id(bookie_id)
        read_only = bool(read_only)
        data = encode_bookie_info(info)
        began = time.monotonic()
        deadline = began + self._expiry_s + self._heartbeat_interval_s
        waited_for = None                   # the other owner whose row we wait on
        while True:
            with self._write(f"register bookie {bookie_id}") as c:
                now = time.time()
                others = [owner for owner, expires_at in c.execute(
                    "SELECT owner, expires_at FROM bookies WHERE bookie_id=?", (bookie_id,))
                    if owner != self._owner and expires_at > now
                    and not owner_is_dead_local_process(owner)]
                if not others:
                    c.execute("DELETE FROM bookies WHERE bookie_id=?", (bookie_id,))
                    c.execute("INSERT INTO bookies VALUES (?, ?, ?, ?, ?)",
                              (bookie_id, int(read_only), data, self._owner, now + self._expiry_s))
                    break
            if waited_for is None:
                waited_for = others[0]
                log.warning("bookie %s: its registration in %s is held by %s (a process on "
                            "another host, or one that stopped refreshing it?); waiting up to "
                            "%.1f s for it to expire", bookie_id, self.uri, waited_for,
                            deadline - began)
            if time.monotonic() > deadline:
                raise MetadataError(f"bookie {bookie_id} is registered by another live "
                                    f"process ({others[0]})")
            self._stop.wait(min(0.1, self._heartbeat_interval_s))
        if waited_for is not None:
            log.warning("bookie %s: registered after %.1f s waiting for %s", bookie_id,
                        time.monotonic() - began, waited_for)
        with self._reg_lock:
            self._registered.pop((bookie_id, not read_only), None)
            self._registered[(bookie_id, read_only)] = data
            if self._heartbeat is None:
                self._heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                                   name="embedlog-sqlite-heartbeat")
                self._heartbeat.start()

    def unregister_bookie(self, bookie_id: str, read_only: bool) -> None:
        with self._reg_lock:
            self._registered.pop((bookie_id, bool(read_only)), None)
        with self._write(f"unregister bookie {bookie_id}") as c:
            c.execute("DELETE FROM bookies WHERE bookie_id=? AND read_only=?",
                      (bookie_id, int(bool(read_only))))

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_interval_s):
            try:
                self._refresh_registrations()
            except Exception as exc:   # a locked or busy database: try again next beat
                log.warning("sqlite metadata heartbeat failed: %s", exc)

    def _refresh_registrations(self) -> None:
        with self._reg_lock:
            if not self._registered:
                return
        with self._write("refresh registrations") as c:
            # what we hold, read under the write lock: an unregister_bookie that got the
            # lock first has already forgotten its id (it does so before deleting the row)
            with self._reg_lock:
                mine = dict(self._registered)
            now = time.time()
            for (bookie_id, read_only), data in mine.items():
                row = c.execute("SELECT owner FROM bookies WHERE bookie_id=? AND read_only=?",
                                (bookie_id, int(read_only))).fetchone()
                if row is None and c.execute(
                        "SELECT 1 FROM bookies WHERE bookie_id=? AND read_only=? AND owner=?",
                        (bookie_id, int(not read_only), self._owner)).fetchone():
                    # our register_bookie moved it to the other state and has committed,
                    # but not yet updated _registered: re-creating the old row would list
                    # the bookie in both states until that row expired
                    continue
                if row is None:
                    # lost (e.g. this process stalled past the expiry and the row was
                    # cleaned): re-create it, as a bookie re-registers on a new session
                    c.execute("INSERT INTO bookies VALUES (?, ?, ?, ?, ?)",
                              (bookie_id, int(read_only), data, self._owner, now + self._expiry_s))
                elif row[0] == self._owner:
                    c.execute("UPDATE bookies SET expires_at=? WHERE bookie_id=? AND read_only=?",
                              (now + self._expiry_s, bookie_id, int(read_only)))
                else:
                    log.warning("bookie %s was taken over by %s; no longer refreshing it",
                                bookie_id, row[0])
                    with self._reg_lock:
                        self._registered.pop((bookie_id, read_only), None)
            # drop rows that expired long ago so the table does not grow with dead bookies
            c.execute("DELETE FROM bookies WHERE expires_at < ?", (now - 10 * self._expiry_s,))

    # ---- RegistrationClient --------------------------------------------------------

    def get_all_bookies(self) -> list[BookieRegistration]:
        # Both states in one SELECT, split here: a move between writable and read-only
        # is one transaction, and one statement sees it all or not at all. Two queries
        # could straddle it and show the bookie in both states (or in neither).
        rows = self._query("list bookies",
                           "SELECT bookie_id, read_only, info FROM bookies WHERE expires_at > ? "
                           "ORDER BY bookie_id", (time.time(),))
        regs = [decode_bookie(b, bool(ro), bytes(info)) for b, ro, info in rows]
        return [r for r in regs if not r.read_only] + [r for r in regs if r.read_only]

    def watch_bookies(self, callback: Callable[[list[BookieRegistration]], None]) -> Callable[[], None]:
        """Polls every ``poll_interval_s``: SQLite has no change notification across processes."""
        watch = PollingWatch(self.get_all_bookies, callback, self._poll_interval_s)
        self._watches.append(watch)
        return watch.cancel

    # ---- LayoutManager -------------------------------------------------------------

    def read_layout(self) -> bytes | None:
        rows = self._query("read layout", "SELECT value FROM meta_kv WHERE key='LAYOUT'")
        return bytes(rows[0][0]) if rows else None

    def create_layout(self, layout: bytes) -> None:
        with self._write("create layout") as c:
            if c.execute("SELECT 1 FROM meta_kv WHERE key='LAYOUT'").fetchone():
                raise LayoutExistsError(f"a layout is already stored in {self.path}")
            c.execute("INSERT INTO meta_kv VALUES ('LAYOUT', ?, 0)", (bytes(layout),))

    def delete_layout(self) -> None:
        with self._write("delete layout") as c:
            c.execute("DELETE FROM meta_kv WHERE key='LAYOUT'")

    # ---- CookieStore ---------------------------------------------------------------

    def read_cookie(self, bookie_id: str) -> Versioned | None:
        rows = self._query("read cookie", "SELECT data, version FROM cookies WHERE bookie_id=?",
                           (bookie_id,))
        return Versioned(bytes(rows[0][0]), rows[0][1]) if rows else None

    def write_cookie(self, bookie_id: str, data: bytes, version: Any = None) -> Versioned:
        check_bookie_id(bookie_id)
        with self._write(f"write cookie {bookie_id}") as c:
            row = c.execute("SELECT version FROM cookies WHERE bookie_id=?", (bookie_id,)).fetchone()
            current = None if row is None else row[0]
            if current != version:
                raise BadVersionError(f"cookie of {bookie_id}: expected version {version!r}, "
                                      f"found {current!r}")
            new = 0 if row is None else row[0] + 1
            c.execute("INSERT OR REPLACE INTO cookies VALUES (?, ?, ?)", (bookie_id, bytes(data), new))
        return Versioned(bytes(data), new)

    def remove_cookie(self, bookie_id: str, version: Any = None) -> None:
        with self._write(f"remove cookie {bookie_id}") as c:
            row = c.execute("SELECT version FROM cookies WHERE bookie_id=?", (bookie_id,)).fetchone()
            if row is None:
                raise MetadataError(f"no cookie for bookie {bookie_id}")
            if version is not None and row[0] != version:
                raise BadVersionError(f"cookie of {bookie_id}: version {version!r} is stale")
            c.execute("DELETE FROM cookies WHERE bookie_id=?", (bookie_id,))

    def list_cookies(self) -> list[str]:
        return [r[0] for r in self._query("list cookies",
                                          "SELECT bookie_id FROM cookies ORDER BY bookie_id")]

    # ---- ConsumerGroupStore ---------------------------------------------------------
    # a store made before groups (opened with create=False) gains the table at its first
    # group write; until then it has no groups

    def _group_rows(self, what: str, sql: str, args: tuple = ()) -> list:
        try:
            return self._query(what, sql, args)
        except MetadataError as exc:
            if "no such table" in str(exc):
                return []
            raise

    def read_group(self, group_id: str) -> Versioned | None:
        rows = self._group_rows("read group", "SELECT data, version FROM consumer_groups "
                                "WHERE group_id=?", (check_group_id(group_id),))
        return Versioned(bytes(rows[0][0]), rows[0][1]) if rows else None

    def write_group(self, group_id: str, data: bytes, version: Any = None) -> Versioned:
        check_group_id(group_id)
        with self._write(f"write group {group_id}") as c:
            c.execute(_GROUPS_TABLE)
            row = c.execute("SELECT version FROM consumer_groups WHERE group_id=?",
                            (group_id,)).fetchone()
            current = None if row is None else row[0]
            if current != version:
                raise BadVersionError(f"group {group_id}: expected version {version!r}, "
                                      f"found {current!r}")
            new = 0 if row is None else row[0] + 1
            c.execute("INSERT OR REPLACE INTO consumer_groups VALUES (?, ?, ?)",
                      (group_id, bytes(data), new))
        return Versioned(bytes(data), new)

    def remove_group(self, group_id: str, version: Any = None) -> bool:
        check_group_id(group_id)
        with self._write(f"remove group {group_id}") as c:
            c.execute(_GROUPS_TABLE)
            row = c.execute("SELECT version FROM consumer_groups WHERE group_id=?",
                            (group_id,)).fetchone()
            if row is None:
                return False
            if version is not None and row[0] != version:
                raise BadVersionError(f"group {group_id}: version {version!r} is stale")
            c.execute("DELETE FROM consumer_groups WHERE group_id=?", (group_id,))
        return True

    def list_groups(self) -> list[str]:
        return [r[0] for r in self._group_rows(
            "list groups", "SELECT group_id FROM consumer_groups ORDER BY group_id")]

    # ---- UnderreplicationManager ---------------------------------------------------

    def mark_ledger_underreplicated(self, ledger_id, missing_bookies: list[str]) -> None:
        lid = coerce_ledger_id(ledger_id)
        with self._write(f"mark {lid} under-replicated") as c:
            row = c.execute("SELECT missing FROM underreplicated WHERE name=?",
                            (lid.qualified_name,)).fetchone()
            old = decode_underreplicated(row[0], lid.qualified_name, bare_list=True) if row else []
            missing = merge_missing(old, list(missing_bookies))
            c.execute("INSERT OR REPLACE INTO underreplicated VALUES (?, ?, ?)",
                      (lid.qualified_name, json.dumps(missing), int(time.time() * 1000)))

    def mark_ledger_replicated(self, ledger_id) -> None:
        lid = coerce_ledger_id(ledger_id)
        with self._write(f"mark {lid} replicated") as c:
            c.execute("DELETE FROM underreplicated WHERE name=?", (lid.qualified_name,))

    def list_underreplicated(self) -> dict[LedgerId, list[str]]:
        rows = self._query("list under-replicated",
                           "SELECT name, missing FROM underreplicated ORDER BY name")
        try:
            return {LedgerId.parse(n): decode_underreplicated(m, n, bare_list=True)
                    for n, m in rows}
        except ValueError as exc:
            raise MetadataError(f"corrupted under-replication record: {exc}") from exc

    # ---- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Stops the heartbeat and the watches and removes this store's registrations
        (a closed ZooKeeper session drops its ephemeral znodes the same way)."""
        if self._closed:
            return
        self._stop.set()
        for watch in self._watches:
            watch.cancel()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5 + self._timeout_s)
        with self._reg_lock:
            mine, self._registered = list(self._registered), {}
        if mine:
            try:
                with self._write("unregister on close") as c:
                    c.execute("DELETE FROM bookies WHERE owner=?", (self._owner,))
            except Exception as exc:       # the rows expire on their own
                log.warning("sqlite metadata: could not unregister on close: %s", exc)
        with self._in_use_cv:
            self._closed = True
            self._in_use_cv.wait_for(lambda: self._in_use == 0, 5 + self._timeout_s)
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def __repr__(self) -> str:
        return f"SqliteMetadataStore({self.path!r})"
