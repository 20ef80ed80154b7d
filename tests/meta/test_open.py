"""Choosing a driver by URI, and the failures that must be quick and clear."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from embedlog._native.format import LedgerId
from embedlog.harness import servers
from embedlog.errors import MetadataError
from embedlog.meta import open_metadata_store, parse_metadata_uri
from embedlog.meta.api import LedgerMetadata
from embedlog.meta.sqlite import SqliteMetadataStore


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("uri", ["mysql://h/x", "zk+weird://127.0.0.1:2181/l", "ledgers", "", "file:///x"])
def test_unknown_scheme(uri):
    started = time.monotonic()
    with pytest.raises(MetadataError) as info:
        open_metadata_store(uri)
    assert time.monotonic() - started < 1
    if "://" in uri:
        assert uri.split("://")[0] in str(info.value)


@pytest.mark.parametrize("scheme", ["zk+hierarchical", "zk+flat", "etcd"])
def test_unreachable_server_fails_quickly(scheme):
    started = time.monotonic()
    with pytest.raises(MetadataError):
        open_metadata_store(f"{scheme}://127.0.0.1:{closed_port()}/ledgers", timeout_s=1.5)
    assert time.monotonic() - started < 5


def test_sqlite_uri_errors(tmp_path):
    with pytest.raises(MetadataError, match="does not exist"):
        open_metadata_store(f"sqlite://{tmp_path}/missing/meta.db")
    with pytest.raises(MetadataError):
        open_metadata_store("sqlite://somehost/x.db")
    with pytest.raises(MetadataError):
        open_metadata_store("sqlite://")
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"not a database" * 400)
    with pytest.raises(MetadataError):
        open_metadata_store(f"sqlite://{bad}")


def test_bookkeeper_format_is_a_zookeeper_one(tmp_path):
    with pytest.raises(MetadataError, match="BookKeeper's format is a ZooKeeper one"):
        open_metadata_store(f"sqlite://{tmp_path}/m.db?metadata_format=bookkeeper")
    with open_metadata_store(f"sqlite://{tmp_path}/m.db", metadata_format="embedlog"):
        pass


def test_parse_uri_and_query_options(tmp_path):
    assert parse_metadata_uri("zk+hierarchical://a:1;b:2/ledgers") == (
        "zk+hierarchical", "a:1,b:2", "/ledgers", {})
    with open_metadata_store(f"sqlite://{tmp_path}/m.db?expiry_s=3&heartbeat_interval_s=0.5") as s:
        assert isinstance(s, SqliteMetadataStore)
        assert s._expiry_s == 3 and s._heartbeat_interval_s == 0.5
    with pytest.raises(MetadataError, match="expiry_s"):
        open_metadata_store(f"sqlite://{tmp_path}/m.db", expiry_s=0.5, heartbeat_interval_s=1)


def test_sqlite_direct_construction_and_file(tmp_path):
    path = os.path.join(tmp_path, "meta.db")
    with SqliteMetadataStore(path) as store:
        assert store.uri == f"sqlite://{path}"
        store.create_ledger_metadata(LedgerMetadata(LedgerId(0, 1), 1, 1, 1))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT name FROM ledgers").fetchall() == [("0" * 31 + "1",)]
    conn.close()


def test_sqlite_unknown_schema_version_refused(tmp_path):
    path = os.path.join(tmp_path, "meta.db")
    SqliteMetadataStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta_kv SET value=? WHERE key='SCHEMA_VERSION'", (b"7",))
    with pytest.raises(MetadataError, match="schema version 7"):
        SqliteMetadataStore(path)


def test_sqlite_generator_skips_explicitly_created_ids(tmp_path):
    with SqliteMetadataStore(os.path.join(tmp_path, "meta.db")) as store:
        for i in (0, 1, 2, 4):
            store.create_ledger_metadata(LedgerMetadata(LedgerId(0, i), 1, 1, 1))
        assert [store.generate_ledger_id().ledger_id for _ in range(3)] == [3, 5, 6]


def test_sqlite_closed_store_refuses(tmp_path):
    store = SqliteMetadataStore(os.path.join(tmp_path, "meta.db"))
    store.close()
    with pytest.raises(MetadataError, match="closed"):
        store.read_ledger_metadata(1)


def test_sqlite_threads_of_one_process_queue_for_the_write_lock(tmp_path):
    """Twenty threads writing at once through two stores on one file, with a busy timeout
    of 50 ms: SQLite's busy handler alone (sleep and poll, no queue) left most of them
    "database is locked"; they queue in the process instead and every write is made."""
    import threading
    stores = [SqliteMetadataStore(str(tmp_path / "m.db"), timeout_s=0.05),
              SqliteMetadataStore(str(tmp_path / "." / "m.db"), timeout_s=0.05)]
    ids, errors = [], []

    def work(k):
        try:
            for _ in range(50):
                ids.append(stores[k % 2].generate_ledger_id())
        except Exception as exc:          # TimeoutError("... database is locked") before
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(set(ids)) == len(ids) == 1000
    for s in stores:
        s.close()


def test_sqlite_a_locked_database_names_the_process_holding_it(tmp_path):
    """A process that holds SQLite's write lock and is stopped (SIGSTOP, Ctrl-Z) holds every
    writer of the store back: SQLite has no lease. A write that times out says which process
    holds the lock and that it is stopped; once it exits the write goes through."""
    path = str(tmp_path / "meta.db")
    store = SqliteMetadataStore(path, timeout_s=0.3)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(120)", path],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match=f"held by process {holder.pid}$"):
            store.generate_ledger_id()
        servers.suspend(holder.pid)
        with pytest.raises(TimeoutError, match=f"held by process {holder.pid}, which is stopped"):
            store.generate_ledger_id()
    finally:
        holder.kill()
        holder.wait(30)
    assert store.generate_ledger_id() == 0
    store.close()


def test_sqlite_deletion_records_of_an_older_store_keep_working(tmp_path):
    """A store made before deletion records kept the deleted ledger's ctime: its records
    read with the ctime unknown (-1), and its first deletion adds the column."""
    path = str(tmp_path / "m.db")
    SqliteMetadataStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE deleted_ledgers")
        conn.execute("CREATE TABLE deleted_ledgers (name TEXT PRIMARY KEY,"
                     " deleted_at_ms INTEGER NOT NULL) WITHOUT ROWID")
        conn.execute("INSERT INTO deleted_ledgers VALUES (?, ?)",
                     (LedgerId(0, 7).qualified_name, 1234))
    conn.close()
    with SqliteMetadataStore(path) as store:
        old = store.ledger_deletion(7)
        assert (old.deleted_at_ms, old.ctime_ms) == (1234, -1)
        store.create_ledger_metadata(LedgerMetadata(LedgerId(0, 8), 1, 1, 1, ctime_ms=555))
        store.remove_ledger_metadata(8)
        assert store.ledger_deletion(8).ctime_ms == 555
        assert store.ledger_deletion(7).ctime_ms == -1
