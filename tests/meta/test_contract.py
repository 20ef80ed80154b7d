"""One contract, every driver: SQLite, ZooKeeper (flat, hierarchical, longhierarchical), etcd.

Each test runs against a real server (or file) in its own namespace; concurrency is
between real processes where the property is about processes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from embedlog._native.format import LedgerId
from embedlog.errors import (BadVersionError, LedgerExistsError, MetadataError,
                             NoSuchLedgerError)
from embedlog.harness import servers
from embedlog.meta.api import LayoutExistsError, LedgerMetadata, LedgerState
from meta_workers import cas_increments, child_env, create_race, generate_ids, wait_until

from conftest import LIVENESS_BOUND_S

WORKERS = str(Path(__file__).with_name("meta_workers.py"))


def md(ledger, scope=0, **kw) -> LedgerMetadata:
    return LedgerMetadata(LedgerId(scope, ledger), 3, 2, 2, **kw)


def raw_put_ledger(backend, store, lid: LedgerId, data: bytes) -> None:
    """Overwrite a ledger's stored bytes with the server's own client, behind the driver."""
    if backend.family == "sqlite":
        with sqlite3.connect(store.path) as conn:
            conn.execute("UPDATE ledgers SET data=? WHERE name=?", (data, lid.qualified_name))
    elif backend.family == "zk":
        from kazoo.client import KazooClient
        zk = KazooClient(backend.server.hosts)
        zk.start(timeout=5)
        try:
            zk.set(store.ledger_path(lid), data)
        finally:
            zk.stop()
            zk.close()
    else:
        import etcd3
        host, port = backend.server.endpoint.split(":")
        client = etcd3.client(host, int(port), timeout=5)
        try:
            client.put(store.ledger_key(lid), data)
        finally:
            client.close()


def drain_until(q: queue.Queue, done, timeout_s: float) -> list:
    """Everything put on ``q`` until ``done(items)`` holds or the time is up."""
    items, deadline = [], time.monotonic() + timeout_s
    while not done(items):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            items.append(q.get(timeout=left))
        except queue.Empty:
            break
    return items


# ---- ledger metadata: create, read, CAS, delete -------------------------------------

def test_create_read_cas_delete(backend):
    store = backend.open()
    created = store.create_ledger_metadata(md(7, custom_metadata={"app": b"\x00\xff"}))
    read = store.read_ledger_metadata(LedgerId(0, 7))
    assert read.value == created.value and read.version == created.version
    assert store.read_ledger_metadata(7).value.custom_metadata == {"app": b"\x00\xff"}

    with pytest.raises(LedgerExistsError):
        store.create_ledger_metadata(md(7))

    closed = read.value.with_(state=LedgerState.CLOSED, last_entry_id=9, length=900,
                              fragments=((0, ("b1:1", "b2:1", "b3:1")),))
    v2 = store.write_ledger_metadata(closed, read.version)
    assert v2.version != read.version
    # the stale version loses and changes nothing
    with pytest.raises(BadVersionError):
        store.write_ledger_metadata(read.value.with_(length=1), read.version)
    again = store.read_ledger_metadata(7)
    assert again.value == closed and again.version == v2.version
    # reread and retry wins
    v3 = store.write_ledger_metadata(again.value.with_(term=4), again.version)
    assert store.read_ledger_metadata(7).value.term == 4

    with pytest.raises(BadVersionError):
        store.remove_ledger_metadata(7, version=v2.version)
    store.remove_ledger_metadata(7, version=v3.version)
    with pytest.raises(NoSuchLedgerError):
        store.read_ledger_metadata(7)
    with pytest.raises(NoSuchLedgerError):
        store.write_ledger_metadata(closed, v3.version)
    with pytest.raises(NoSuchLedgerError):
        store.remove_ledger_metadata(7)


@pytest.mark.parametrize("version", [0, 1, 5])
def test_a_version_of_a_missing_ledger_or_cookie_is_absent(backend, version):
    """Versions are opaque, so code may hold one for a ledger that is gone: version 0 of a
    missing key must not create or delete it (etcd compared only the mod revision, which
    is 0 for a missing key)."""
    store = backend.open()
    with pytest.raises(NoSuchLedgerError):
        store.write_ledger_metadata(md(41), version)
    with pytest.raises(NoSuchLedgerError):
        store.read_ledger_metadata(41)
    with pytest.raises(NoSuchLedgerError):
        store.remove_ledger_metadata(41, version)
    with pytest.raises(BadVersionError):
        store.write_cookie("bookie-missing", b"c", version)
    assert store.read_cookie("bookie-missing") is None
    with pytest.raises(MetadataError):
        store.remove_cookie("bookie-missing", version)
    assert store.ledger_deleted_at(41) is None


def test_deletion_leaves_a_record_and_the_id_is_not_reused(backend):
    store = backend.open()
    store.create_ledger_metadata(md(43))
    before = int(time.time() * 1000)
    store.remove_ledger_metadata(43)
    at = store.ledger_deleted_at(LedgerId(0, 43))
    assert at is not None and before - 1000 <= at <= int(time.time() * 1000) + 1000
    with pytest.raises(LedgerExistsError, match="was deleted"):
        store.create_ledger_metadata(md(43))
    with pytest.raises(NoSuchLedgerError):
        store.read_ledger_metadata(43)
    store.create_ledger_metadata(md(44, scope=9))
    store.remove_ledger_metadata(LedgerId(9, 44))
    assert store.ledger_deleted_at(LedgerId(9, 44)) is not None
    assert store.ledger_deleted_at(LedgerId(0, 44)) is None
    assert store.purge_deletions(before - 60_000) == 0          # none that old
    assert store.purge_deletions(int(time.time() * 1000) + 60_000) >= 2
    assert store.ledger_deleted_at(43) is None
    store.create_ledger_metadata(md(43))                          # the id is free again
    assert store.read_ledger_metadata(43).value.ledger_id == LedgerId(0, 43)


def test_a_deletion_record_names_the_ledger_deleted(backend):
    """The record keeps the deleted ledger's ctime: a bookie holding another ledger of the
    id (a store restored from an older backup gave the id out again) keeps its data."""
    store = backend.open()
    first = md(45).with_(ctime_ms=1_700_000_000_123)
    store.create_ledger_metadata(first)
    store.remove_ledger_metadata(45)
    record = store.ledger_deletion(45)
    assert record.ctime_ms == 1_700_000_000_123 and record.deleted_at_ms == store.ledger_deleted_at(45)
    store.purge_deletions(2 ** 62)
    store.create_ledger_metadata(md(45).with_(ctime_ms=1_700_000_000_999))
    version = store.read_ledger_metadata(45).version
    store.remove_ledger_metadata(45, version)
    assert store.ledger_deletion(45).ctime_ms == 1_700_000_000_999
    assert store.ledger_deletion(46) is None


def test_a_write_of_a_deleted_ledger_never_lands_on_the_new_one_of_its_id(backend):
    """A writer of a ledger deleted (and its record purged) whose id a new ledger took:
    the new one's version may equal the one the writer holds (versions count again), and
    its write is still refused (BadVersionError), with the ZooKeeper watch a bookie arms
    fired on the way."""
    store = backend.open()
    old = store.create_ledger_metadata(md(45, ctime_ms=1000))
    old = store.write_ledger_metadata(old.value.with_(length=1), old.version)
    store.remove_ledger_metadata(45)
    store.purge_deletions(int(time.time() * 1000) + 60_000)
    fired = threading.Event()
    new = store.create_ledger_metadata(md(45, ctime_ms=2000))
    if store.watches_ledgers:
        store.read_ledger_metadata(45, watch=lambda changed: changed and fired.set())
    new = store.write_ledger_metadata(new.value.with_(length=2), new.version)
    if backend.family != "etcd":          # etcd's mod revisions never repeat
        assert new.version == old.version
    with pytest.raises(BadVersionError):
        store.write_ledger_metadata(old.value.with_(length=3), old.version)
    assert store.read_ledger_metadata(45).value.length == 2
    if store.watches_ledgers:
        assert fired.wait(10)


def test_second_store_sees_first_stores_writes(backend):
    a, b = backend.open(), backend.open()
    assert a.instance_id == b.instance_id and len(a.instance_id) == 36
    va = a.create_ledger_metadata(md(3))
    vb = b.read_ledger_metadata(3)
    assert vb.value == va.value and vb.version == va.version
    b.write_ledger_metadata(vb.value.with_(length=5), vb.version)
    with pytest.raises(BadVersionError):
        a.write_ledger_metadata(va.value.with_(length=6), va.version)


def test_create_if_absent_race_between_processes(backend, process_pool):
    ids = [(0, i) for i in range(40)] + [(9, i) for i in range(10)]
    start_at = time.time() + 1.0
    futures = [process_pool.submit(create_race, backend.uri, backend.options, ids, f"p{i}", start_at)
               for i in range(3)]
    won = [set(f.result(timeout=60)) for f in futures]
    assert sum(len(w) for w in won) == len(ids)          # every id created exactly once
    assert set().union(*won) == set(ids)
    store = backend.open()
    for i, w in enumerate(won):
        for scope, ledger in w:
            stored = store.read_ledger_metadata(LedgerId(scope, ledger)).value
            assert stored.custom_metadata["owner"] == f"p{i}".encode()


def test_cas_conflicts_between_processes_lose_nothing(backend, process_pool):
    store = backend.open()
    store.create_ledger_metadata(md(11))
    start_at = time.time() + 1.0
    per_process = 25
    futures = [process_pool.submit(cas_increments, backend.uri, backend.options, 0, 11,
                                   per_process, start_at) for _ in range(3)]
    for f in futures:
        f.result(timeout=120)
    # every increment that won was applied once: no lost update, no double apply
    assert store.read_ledger_metadata(11).value.length == 3 * per_process


def test_cas_conflict_between_threads_is_detected(backend):
    """Two writers hold the same version: exactly one wins."""
    a, b = backend.open(), backend.open()
    a.create_ledger_metadata(md(12))
    va, vb = a.read_ledger_metadata(12), b.read_ledger_metadata(12)
    results = []

    def write(store, v, length):
        try:
            store.write_ledger_metadata(v.value.with_(length=length), v.version)
            results.append(length)
        except BadVersionError:
            results.append("lost")

    threads = [threading.Thread(target=write, args=(a, va, 1)),
               threading.Thread(target=write, args=(b, vb, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(map(str, results)) in (["1", "lost"], ["2", "lost"])
    winner = next(r for r in results if r != "lost")
    assert a.read_ledger_metadata(12).value.length == winner


# ---- iteration ----------------------------------------------------------------------

def test_iteration_tolerates_concurrent_creates_and_deletes(backend, monkeypatch):
    # small pages, so the keyset paging of sqlite and etcd is crossed many times
    import embedlog.meta.etcd as etcd_mod
    import embedlog.meta.sqlite as sqlite_mod
    monkeypatch.setattr(sqlite_mod, "_PAGE", 7)
    monkeypatch.setattr(etcd_mod, "_PAGE", 7)
    store, writer = backend.open(), backend.open()
    # ids spread over many (level1, level2) partitions of the hierarchical layouts
    stable = [i * 3001 for i in range(60)]
    doomed = [i * 3001 + 1 for i in range(60)]
    fresh = [i * 3001 + 2 for i in range(60)]
    for i in stable + doomed:
        store.create_ledger_metadata(md(i))
    ever = set(stable) | set(doomed) | set(fresh)
    done = threading.Event()
    errors = []

    def churn():
        try:
            for d, f in zip(doomed, fresh):
                writer.remove_ledger_metadata(d)
                writer.create_ledger_metadata(md(f))
        except Exception as exc:          # reported below: the assertion names it
            errors.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=churn)
    t.start()
    passes = 0
    while passes < 3 or not done.is_set():
        ids = [lid.ledger_id for lid in store.iterate_ledgers(0)]
        assert ids == sorted(set(ids)), "ascending, no duplicates"
        assert set(stable) <= set(ids), "an untouched ledger was missed"
        assert set(ids) <= ever
        passes += 1
        assert passes < 10_000
    t.join(timeout=60)
    assert not errors
    final = [lid.ledger_id for lid in store.iterate_ledgers(0)]
    assert final == sorted(stable + fresh)


def test_partitions_cover_iteration_in_order(backend):
    store = backend.open()
    ids = [0, 1, 9_999, 10_000, 123_456_789, 2**31 - 2, 2**31 - 1, 2**31, 2**62 + 17]
    for i in ids:
        store.create_ledger_metadata(md(i))
    store.create_ledger_metadata(md(5, scope=3))
    parts = list(store.ledger_partitions(0))
    flat = [lid.ledger_id for _, p in parts for lid in p]
    assert flat == sorted(ids)
    assert [lid.ledger_id for lid in store.iterate_ledgers(0)] == sorted(ids)
    if backend.kind in ("zk+hierarchical", "zk+longhierarchical"):
        assert len(parts) > 1
        assert all(len(p) > 0 for _, p in parts)


# ---- scopes and ids -----------------------------------------------------------------

def test_scope_isolation(backend):
    store = backend.open()
    top = 2**64 - 1
    lids = [LedgerId(0, 5), LedgerId(1, 5), LedgerId(top, 5), LedgerId(1, top), LedgerId(0, 2**63 - 1)]
    for n, lid in enumerate(lids):
        store.create_ledger_metadata(LedgerMetadata(lid, n + 1, 1, 1))
    for n, lid in enumerate(lids):
        got = store.read_ledger_metadata(lid).value
        assert got.ledger_id == lid and got.ensemble_size == n + 1
    assert list(store.iterate_ledgers(0)) == [LedgerId(0, 5), LedgerId(0, 2**63 - 1)]
    assert list(store.iterate_ledgers(1)) == [LedgerId(1, 5), LedgerId(1, top)]
    assert list(store.iterate_ledgers(top)) == [LedgerId(top, 5)]
    assert list(store.iterate_ledgers(2)) == []
    assert list(store.iterate_ledgers(None)) == sorted(lids, key=lambda l: (l.scope_id, l.ledger_id))
    store.remove_ledger_metadata(LedgerId(1, 5))
    assert store.read_ledger_metadata(LedgerId(0, 5)).value.ensemble_size == 1
    assert store.read_ledger_metadata(LedgerId(top, 5)).value.ensemble_size == 3
    with pytest.raises(NoSuchLedgerError):
        store.read_ledger_metadata(LedgerId(1, 5))


def test_generated_ids_unique_across_processes(backend, process_pool):
    start_at = time.time() + 1.0
    futures = [process_pool.submit(generate_ids, backend.uri, backend.options, 150, scope, start_at)
               for scope in (0, 0, 0, 4, 4, None)]
    results = [f.result(timeout=120) for f in futures]
    scope0 = [x for r in results[:3] for x in r]
    scope4 = [x for r in results[3:5] for x in r]
    assert len(set(scope0)) == len(scope0) == 450
    assert all(s == 0 and 0 <= l < 2**63 for s, l in scope0)
    assert len(set(scope4)) == len(scope4) == 300
    assert all(s == 4 for s, _ in scope4)
    decentral = results[5]
    assert len(set(decentral)) == 150 and all(s != 0 for s, _ in decentral)
    # a generated id is free: creating it succeeds
    store = backend.open()
    lid = store.generate_ledger_id()
    store.create_ledger_metadata(LedgerMetadata(lid, 1, 1, 1))


# ---- bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("garbage", [
    b"\x00\x01not metadata",
    b"embedlog-ledger-metadata\t1\n{\"truncated\": ",
    b"embedlog-ledger-metadata\t99\n{}",
    b"",
])
def test_corrupted_metadata_is_an_error_not_a_deletion(backend, garbage):
    store = backend.open()
    lid = LedgerId(0, 42)
    store.create_ledger_metadata(md(42))
    raw_put_ledger(backend, store, lid, garbage)
    with pytest.raises(MetadataError) as info:
        store.read_ledger_metadata(lid)
    assert not isinstance(info.value, NoSuchLedgerError)
    if b"\t99\n" in garbage:
        assert "version 99" in str(info.value)
    assert lid in list(store.iterate_ledgers(0))     # still listed: GC must keep its data


def test_metadata_of_another_ledger_is_corruption(backend):
    store = backend.open()
    store.create_ledger_metadata(md(1))
    raw_put_ledger(backend, store, LedgerId(0, 1), md(2).to_bytes())
    with pytest.raises(MetadataError):
        store.read_ledger_metadata(1)


def test_bad_quorums_refused():
    with pytest.raises(MetadataError):
        LedgerMetadata(LedgerId(0, 1), 2, 3, 1)


# ---- registration, liveness and watches ---------------------------------------------

def test_register_list_move_unregister(backend):
    store, client = backend.open(), backend.open()
    store.register_bookie("127.0.0.1:3181", False, {"rack": "/r1"})
    store.register_bookie("127.0.0.1:3182", False)
    assert [b.bookie_id for b in client.get_writable_bookies()] == ["127.0.0.1:3181", "127.0.0.1:3182"]
    assert client.get_writable_bookies()[0].info == {"rack": "/r1"}
    store.register_bookie("127.0.0.1:3181", True)          # goes read-only
    assert [b.bookie_id for b in client.get_writable_bookies()] == ["127.0.0.1:3182"]
    assert [(b.bookie_id, b.read_only) for b in client.get_readonly_bookies()] == [("127.0.0.1:3181", True)]
    store.unregister_bookie("127.0.0.1:3181", True)
    assert client.get_readonly_bookies() == []
    store.close()                                          # ends the registrations
    assert wait_until(lambda: client.get_writable_bookies() == [], 5)


def test_second_live_owner_cannot_take_a_bookie_id(backend):
    a = backend.open()
    a.register_bookie("127.0.0.1:4000", False)
    b = backend.open(timeout_s=1)
    started = time.monotonic()
    with pytest.raises(MetadataError):
        b.register_bookie("127.0.0.1:4000", False)
    assert time.monotonic() - started < 15
    assert [x.bookie_id for x in b.get_writable_bookies()] == ["127.0.0.1:4000"]


def test_registration_disappears_after_sigkill(backend):
    observer = backend.open()
    events: queue.Queue = queue.Queue()
    cancel = observer.watch_bookies(lambda bookies: events.put([b.bookie_id for b in bookies]))
    proc = subprocess.Popen([sys.executable, WORKERS, "hold", backend.uri,
                             json.dumps(backend.options), "127.0.0.1:9999"],
                            stdout=subprocess.PIPE, env=child_env())
    try:
        line = proc.stdout.readline()
        assert line.strip() == b"registered", line
        listed = lambda: [b.bookie_id for b in observer.get_writable_bookies()] == ["127.0.0.1:9999"]  # noqa: E731
        assert listed()
        # alive past its expiry / session / lease: the heartbeat keeps it listed
        bound = LIVENESS_BOUND_S[backend.family]
        time.sleep(bound)
        assert listed()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        assert wait_until(lambda: observer.get_writable_bookies() == [], bound + 2)
        assert time.monotonic() - killed <= bound + 2
        # the watch saw it come and go
        seen = drain_until(events, lambda s: ["127.0.0.1:9999"] in s and s[-1] == [], 5)
        assert ["127.0.0.1:9999"] in seen and seen[-1] == []
    finally:
        cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.parametrize("backend", ["sqlite", "zk+hierarchical", "etcd"], indirect=True)
def test_a_wait_for_an_old_registration_is_logged_when_it_begins(backend, caplog):
    """Issue 52, item 3: a bookie restarted after a SIGKILL waited silently (about 10 s on
    ZooKeeper's defaults) for its old registration to expire. It says what it waits for
    (the znode, key or row and whose session, lease or process) and for how long at most,
    when the wait begins, and again when it is over."""
    caplog.set_level(logging.INFO, logger="embedlog")
    bookie_id = "127.0.0.1:9998"
    proc = subprocess.Popen([sys.executable, WORKERS, "hold", backend.uri,
                             json.dumps(backend.options), bookie_id],
                            stdout=subprocess.PIPE, env=child_env())
    try:
        line = proc.stdout.readline()
        assert line.strip() == b"registered", line
        if backend.family == "sqlite":
            # a SIGKILLed owner on this host is known dead at once (no wait): one that
            # stopped refreshing its row is waited for
            servers.suspend(proc.pid, sqlite_uri=backend.uri)
        else:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        store = backend.open()
        began = time.time()
        store.register_bookie(bookie_id, False)
        done = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert [b.bookie_id for b in store.get_writable_bookies()] == [bookie_id]
    waits = [r for r in caplog.records if "waiting up to" in r.getMessage()]
    assert len(waits) == 1, [r.getMessage() for r in caplog.records]
    rec, msg = waits[0], waits[0].getMessage()
    assert rec.name.startswith("embedlog") and rec.levelno >= logging.INFO
    assert rec.created - began < 1.0, "logged when the wait began, not after it"
    bound = float(re.search(r"waiting up to ([0-9.]+) s", msg).group(1))
    assert done - began <= bound + 1.0 and done - began > 0.5       # it did wait, within it
    assert bookie_id in msg
    if backend.family == "zk":
        root = "/" + backend.uri.split("://", 1)[1].split("/", 1)[1]
        assert f"znode {root}/available/{bookie_id}" in msg and re.search(r"session 0x[0-9a-f]+", msg), msg
    elif backend.family == "etcd":
        assert f"available/readwrite/{bookie_id}" in msg and re.search(r"lease [0-9a-f]+", msg), msg
    else:
        assert str(proc.pid) in msg, msg
    assert any("registered after" in r.getMessage() for r in caplog.records)


def test_watch_fires_on_changes(backend):
    observer, bookie = backend.open(), backend.open()
    events: queue.Queue = queue.Queue()
    cancel = observer.watch_bookies(lambda bookies: events.put(
        sorted((b.bookie_id, b.read_only) for b in bookies)))
    try:
        assert events.get(timeout=5) == []                     # the initial state
        bookie.register_bookie("127.0.0.1:5001", False)
        assert events.get(timeout=5) == [("127.0.0.1:5001", False)]
        bookie.register_bookie("127.0.0.1:5001", True)
        assert events.get(timeout=5) == [("127.0.0.1:5001", True)]
        bookie.unregister_bookie("127.0.0.1:5001", True)
        assert events.get(timeout=5) == []
    finally:
        cancel()
    bookie.register_bookie("127.0.0.1:5002", False)
    time.sleep(0.7)                                            # a cancelled watch stays quiet
    assert events.empty()


def test_watch_listing_sees_a_moving_bookie_in_exactly_one_state(backend):
    """A move between writable and read-only is one transaction; the watch's listing of
    both states (``get_all_bookies``) must come from one moment, never showing the bookie in
    both states or in neither. Two separate reads did, within a fraction of a second."""
    observer, bookie = backend.open(), backend.open()
    bookie.register_bookie("127.0.0.1:5100", False)
    stop = threading.Event()

    def flip():
        read_only = False
        while not stop.is_set():
            read_only = not read_only
            bookie.register_bookie("127.0.0.1:5100", read_only)
            time.sleep(0.002)

    flipper = threading.Thread(target=flip)
    flipper.start()
    listings, states = [], set()
    try:
        # list for 0.6 s, and on until 10 listings saw both states (bounded)
        started = time.monotonic()
        while flipper.is_alive() and time.monotonic() - started < 15 and (
                time.monotonic() - started < 0.6 or len(states) < 2 or len(listings) < 10):
            try:
                listing = [(b.bookie_id, b.read_only) for b in observer.get_all_bookies()]
            except MetadataError:   # ZooKeeper: still changing after its bounded re-listings
                continue
            listings.append(listing)
            states.update(read_only for _, read_only in listing)
    finally:
        stop.set()
        flipper.join(timeout=30)
    assert not flipper.is_alive()
    assert [x for x in listings if len(x) != 1] == []
    assert len(listings) >= 10 and states == {False, True}, (len(listings), states)


# ---- layout, cookies, under-replication ---------------------------------------------

def test_layout_manager(backend):
    store = backend.open()
    stored = store.read_layout()
    assert stored.startswith(b"embedlog-layout\t1\n")
    with pytest.raises(LayoutExistsError):
        store.create_layout(b"other")
    store.delete_layout()
    assert store.read_layout() is None
    store.create_layout(stored)
    assert store.read_layout() == stored


def test_cookies(backend):
    store = backend.open()
    assert store.read_cookie("127.0.0.1:3181") is None
    v0 = store.write_cookie("127.0.0.1:3181", b"cookie-1")
    with pytest.raises(BadVersionError):
        store.write_cookie("127.0.0.1:3181", b"again")           # exists: needs its version
    v1 = store.write_cookie("127.0.0.1:3181", b"cookie-2", v0.version)
    with pytest.raises(BadVersionError):
        store.write_cookie("127.0.0.1:3181", b"stale", v0.version)
    assert store.read_cookie("127.0.0.1:3181") == v1
    with pytest.raises(BadVersionError):
        store.remove_cookie("127.0.0.1:3181", v0.version)
    store.remove_cookie("127.0.0.1:3181", v1.version)
    assert store.read_cookie("127.0.0.1:3181") is None
    with pytest.raises(MetadataError):
        store.remove_cookie("127.0.0.1:3181")


def test_list_cookies(backend):
    """Every cookie record by name, sorted: `bookie list` shows a vanished bookie from it."""
    store = backend.open()
    assert store.list_cookies() == []
    for name in ("bookie-b", "127.0.0.1:3181", "bookie-a"):
        store.write_cookie(name, b"c")
    assert store.list_cookies() == ["127.0.0.1:3181", "bookie-a", "bookie-b"]
    store.remove_cookie("bookie-a")
    assert backend.open().list_cookies() == ["127.0.0.1:3181", "bookie-b"]


def test_underreplication(backend):
    store = backend.open()
    a, b = LedgerId(0, 1), LedgerId(6, 2)
    store.mark_ledger_underreplicated(a, ["b1:1"])
    store.mark_ledger_underreplicated(a, ["b2:1", "b1:1"])
    store.mark_ledger_underreplicated(b, ["b3:1"])
    assert store.list_underreplicated() == {a: ["b1:1", "b2:1"], b: ["b3:1"]}
    store.mark_ledger_replicated(a)
    store.mark_ledger_replicated(a)                              # idempotent
    assert store.list_underreplicated() == {b: ["b3:1"]}


def _liveness_token(backend, store, bookie_id: str):
    """What changes when a registration is made again: the znode's session, the key's
    lease; a SQLite row has none (the test checks its deletion instead)."""
    if backend.family == "zk":
        stat = store._zk.exists(store._reg_path(bookie_id, False))
        return stat and stat.ephemeralOwner
    if backend.family == "etcd":
        meta = store._etcd.get(store._reg_key(bookie_id, False))[1]
        return meta and meta.lease_id
    return None


def _break_liveness(backend, store, bookie_id: str) -> None:
    """End the registration behind the driver's back: a lost ZooKeeper session, a revoked
    etcd lease, a deleted SQLite row (as after a stall past the expiry)."""
    if backend.family == "sqlite":
        with sqlite3.connect(store.path) as conn:
            deleted = conn.execute("DELETE FROM bookies WHERE bookie_id=?", (bookie_id,)).rowcount
        assert deleted == 1
    elif backend.family == "zk":
        from kazoo.client import KazooClient
        # a second client on the same session, closed, ends that session for both
        twin = KazooClient(backend.server.hosts, client_id=store._zk.client_id)
        twin.start(timeout=5)
        twin.stop()
        twin.close()
    else:
        import etcd3
        host, port = backend.server.endpoint.split(":")
        raw = etcd3.client(host, int(port), timeout=5)
        try:
            _, meta = raw.get(store._reg_key(bookie_id, False))
            raw.revoke_lease(meta.lease_id)
        finally:
            raw.close()


def test_registration_comes_back_after_liveness_loss(backend):
    store, observer = backend.open(), backend.open()
    store.register_bookie("127.0.0.1:7000", False)
    before = _liveness_token(backend, store, "127.0.0.1:7000")
    _break_liveness(backend, store, "127.0.0.1:7000")
    # the registering store notices and registers again, as a bookie does on a new session
    assert wait_until(lambda: [b.bookie_id for b in observer.get_writable_bookies()]
                      == ["127.0.0.1:7000"]
                      and (before is None
                           or _liveness_token(backend, store, "127.0.0.1:7000") != before), 10)


def _raw_names(backend) -> list:
    """Everything under the backend's namespace, read with the server's own client."""
    if backend.family == "sqlite":
        path = backend.uri[len("sqlite://"):]
        return [path] if os.path.exists(path) else []
    if backend.family == "zk":
        from kazoo.client import KazooClient
        zk = KazooClient(hosts=backend.server.hosts)
        zk.start(timeout=10)
        try:
            root = backend.uri.split(backend.server.hosts, 1)[1]
            return zk.get_children(root) if zk.exists(root) else []
        finally:
            zk.stop()
            zk.close()
    import etcd3
    host, port = backend.server.endpoint.split(":")
    client = etcd3.client(host, int(port), timeout=5)
    try:
        prefix = backend.uri.split(backend.server.endpoint, 1)[1]
        return [m.key for _v, m in client.get_prefix(prefix)]
    finally:
        client.close()


def test_create_false_refuses_a_missing_store_and_writes_nothing(backend):
    """Issue 17: a read-only tool given a URI that names no store gets a MetadataError
    naming it, and the store is not created (no file, no znode, no layout key)."""
    with pytest.raises(MetadataError) as info:
        backend.open(create=False)
    assert backend.uri.split("?")[0] in str(info.value) and "no metadata store" in str(info.value)
    assert _raw_names(backend) == []
    made = backend.open()                          # a bookie (or `metadata format`) makes it
    store = backend.open(create=False)             # and now a tool may open it
    assert store.instance_id == made.instance_id
