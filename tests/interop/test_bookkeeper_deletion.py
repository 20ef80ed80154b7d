"""A ledger BookKeeper's Java client deletes, freed by an embedlog bookie (issue 29 item 3).

One BookKeeper root (BookieShell's initnewcluster), one embedlog bookie process on it,
the newest BookKeeper version's Java client (BkDriver) writing and BookieShell's
``deleteledger`` deleting: the znode goes and no deletion record is left. The bookie's GC
(cycles asked for through the admin API, gc_wait_time_ms=0) keeps the ledger on the first
cycle and frees it on the first cycle a gc_missing_ledger_wait_time_ms later
(embedlog/bookie/absence.py): index file and the files it filled gone, journalled (a
restart keeps it gone), counted in the metrics, named in the log; the ledger the Java
client did not delete stays and reads back. The rule's other cases, against a real
ZooKeeper without Java: tests/bookie/test_gc_without_record.py. Under CI=true a missing
java, jar or ZooKeeper fails.

Both storage layouts: in layout 1 the deleted ledger filled entry logs of its own; in
layout 2 (the default) it filled journal segments of its own (1 MiB journals), which GC
deletes once no index location names them.
"""
from __future__ import annotations

import os

import pytest

from support.cliutil import admin_auth, http, http_json, wait_until
from embedlog import Client
from embedlog.harness.peers import jars
from support.servers import ServerMissing, ZooKeeperServer, require_peer, skip_unless_ci

VERSION = max(jars.BOOKKEEPER_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))
WAIT_MS = 1000
LOG_LIMIT = 1 << 16          # small entry logs: the deleted ledger fills some of its own
JOURNAL_MB = 1               # small journals: in layout 2 it fills segments of its own
BOOKIE_CONFIG = {"gc_wait_time_ms": 0, "gc_missing_ledger_wait_time_ms": WAIT_MS,
                 "entry_log_size_limit": LOG_LIMIT, "skip_list_size_limit": LOG_LIMIT,
                 "journal_max_size_mb": JOURNAL_MB, "journal_pre_alloc_size_mb": JOURNAL_MB,
                 "flush_interval_ms": 100, "http_server_enabled": True, "http_server_port": 0}
# the deleted ledger's entries of 1 KiB: layout 2 needs 3 MiB for 2 journals of its own
GONE_ENTRIES = {1: 200, 2: 3000}


class Setup:
    def __init__(self, bk, lc, client, layout):
        self.bk, self.lc, self.client, self.layout = bk, lc, client, layout

    def admin(self) -> tuple[str, dict]:
        """The bookie's admin address (it changes with a restart) and the header that
        authorizes changing requests."""
        bid = self.lc.bookie_id(0)

        def registered():
            for r in self.client.metadata.registration_client.get_all_bookies():
                if r.bookie_id == bid and (r.info or {}).get("http"):
                    return r.info["http"]
            return None
        address = wait_until(registered, 30, "the bookie's registration")
        return address, admin_auth(self.client, address)

    def held(self) -> set:
        address, _ = self.admin()
        return {r["ledger_id"] for r in http_json(address, "/api/v1/bookie/ledgers")["ledgers"]}

    def gc_cycle(self) -> dict:
        """One GC cycle through the admin API (BookKeeper's forceGC); its ledgers report."""
        address, auth = self.admin()
        before = http_json(address, "/api/v1/bookie/gc")["stats"]["cycles"]
        code, _, body = http(address, "/api/v1/bookie/gc", "PUT", headers=auth)
        assert code == 200, body

        def done():
            got = http_json(address, "/api/v1/bookie/gc")
            assert "error" not in (got["last"] or {}), got
            return got if got["stats"]["cycles"] > before and not got["is_in_force_gc"] else None
        return wait_until(done, 60, "the GC cycle")["last"]["ledgers"]

    def disk(self, kind: str) -> tuple[int, int]:
        address, _ = self.admin()
        got = http_json(address, f"/api/v1/bookie/list_disk_file?file_type={kind}")
        return got["count"], got["bytes"]


@pytest.fixture(scope="module", params=[1, 2], ids=["layout1", "layout2"])
def setup(request):
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    from embedlog.harness.cluster import LocalCluster
    require_peer(f"bookkeeper-{VERSION}")
    try:
        zk = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    bk = lc = client = None
    try:
        bk = BookKeeperCluster(VERSION, bookies=0, zk_hosts=zk.hosts, root="/bkdeletion")
        lc = LocalCluster(bookies=1, metadata=bk.metadata_uri, proxies=False, autorecovery=False,
                          bookie_config={**BOOKIE_CONFIG, "storage_layout": request.param})
        client = Client(bk.metadata_uri)
        yield Setup(bk, lc, client, request.param)
    finally:
        if client is not None:
            client.close()
        if lc is not None:
            lc.close()
        if bk is not None:
            bk.close()
        zk.stop()


def statistic(address: str, key: str) -> float | None:
    """A figure of the bookie's statistics, as /metrics carries it."""
    for line in http(address, "/metrics")[2].decode().splitlines():
        if line.startswith(f'embedlog_bookie_statistic{{key="{key}"}} '):
            return float(line.split()[-1])
    return None


def segments(setup) -> list[str]:
    address, _ = setup.admin()
    files = http_json(address, "/api/v1/bookie/list_disk_file?file_type=journal")["files"]
    return sorted(f["path"] for f in files if f["path"].endswith(".seg"))


def test_a_ledger_the_java_client_deletes_is_freed_after_two_reads_a_wait_apart(setup):
    bk, lc = setup.bk, setup.lc
    address, _ = setup.admin()
    assert statistic(address, "layout") == setup.layout    # the bookie runs the layout asked for
    gone = bk.java_client("create", ensemble=1, write_quorum=1, ack_quorum=1,
                          count=GONE_ENTRIES[setup.layout], size=1024).ledger_id
    kept = bk.java_client("create", ensemble=1, write_quorum=1, ack_quorum=1, count=20).ledger_id
    assert {gone, kept} <= setup.held()
    assert setup.gc_cycle()["missing"] == 0                 # both exist: nothing to do
    wait_until(lambda: setup.disk("index")[0] >= 2, 30, "both index files on disk")
    if setup.layout == 2:
        # the mark passes the full journals (a checkpoint every flush_interval_ms): segments
        segs_before = wait_until(lambda: (lambda s: s if len(s) >= 2 else None)(segments(setup)),
                                 30, "the deleted ledger's journals kept as segments")
    logs_before = setup.disk("entrylog")
    bk.shell("deleteledger", "-l", gone, "-f")               # the Java client's deletion
    listed = bk.list_ledgers()
    assert gone not in listed and kept in listed

    first = setup.gc_cycle()
    assert (first["missing"], first["deleted"], first["deleted_without_record"]) == (1, 0, 0), first
    address, _ = setup.admin()
    assert [r["ledger_id"] for r in http_json(address, "/api/v1/bookie/missing_ledgers")["missing"]] == [gone]
    assert gone in setup.held()

    reports = []
    wait_until(lambda: reports.append(setup.gc_cycle()) or gone not in setup.held(), 60,
               f"ledger {gone} freed")
    assert reports[-1]["deleted_without_record"] == 1 and reports[-1]["missing"] == 0, reports
    assert kept in setup.held()
    assert setup.disk("index")[0] == 1
    gc = http_json(address, "/api/v1/bookie/gc")["stats"]
    assert gc["ledgers_deleted_without_record"] == 1, gc
    if setup.layout == 1:
        logs_after = setup.disk("entrylog")
        assert logs_after[1] <= logs_before[1] - LOG_LIMIT, (logs_before, logs_after)
        assert gc["entry_logs_deleted"] >= 1, gc
    else:
        # positive deletion over layout 2: the segments only the deleted ledger filled are
        # unlinked by GC (no index location names them), and no entry log was ever written
        freed = set(segs_before) - set(segments(setup))
        assert freed and gc["segments_deleted"] >= len(freed), (segs_before, gc)
        assert gc["segment_bytes_deleted"] >= len(freed) * (JOURNAL_MB << 20), gc
        assert logs_before == setup.disk("entrylog") == (0, 0)
    metrics = http(address, "/metrics")[2].decode()
    assert 'embedlog_bookie_statistic{key="gc_ledgers_deleted_without_record"} 1.0' in metrics
    with open(os.path.join(lc.bookie_dir(0), "bookie.log")) as f:
        said = [line for line in f if "without a deletion record" in line]
    assert said and f"ledger_id={gone})" in said[-1], said

    lc.restart_bookie(0)                                     # journalled: it stays gone
    assert setup.held() == {kept}
    read = bk.java_client("read", kept)
    assert [p for _, p in read.entries][-1].startswith(b"entry-19")
    assert setup.gc_cycle()["missing"] == 0
