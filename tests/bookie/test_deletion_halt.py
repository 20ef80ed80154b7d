"""A ZooKeeper restored from an older backup never makes a bookie free a ledger it holds
(bookie/rollback.py): the restored id generator hands the ledger's id to a new ledger, that
one is deleted (a deletion record for the id), and garbage collection would free the old
ledger's data. The bookie sees the generator's mark below the one it read before (as it
starts, or in a GC cycle, before clients have had the ids handed out again), halts
every deletion, says so (log, admin API, `embedlog bookie deletion-halt`, the metric) and
keeps it so across a restart until an operator resumes; the old ledger reads back whole
once its metadata comes back. Real processes: ZooKeeper, a bookie, the `embedlog` command.
Under CI=true a missing ZooKeeper fails."""
from __future__ import annotations

import os

import pytest

from support.cliutil import admin_auth, cli, cli_json, http, http_json, wait_until
from embedlog import Client
from embedlog.harness.cluster import LocalCluster

CONFIG = {"gc_wait_time_ms": 0, "http_server_enabled": True, "http_server_port": 0}


@pytest.fixture
def zk(own_zookeeper):
    """Each test restores its ZooKeeper from a backup."""
    return own_zookeeper


def _admin(client, lc, i: int = 0) -> str:
    bid = lc.bookie_id(i)

    def registered():
        for r in client.metadata.registration_client.get_all_bookies():
            if r.bookie_id == bid and (r.info or {}).get("http"):
                return r.info["http"]
        return None
    return wait_until(registered, 30, "the bookie's admin address")


def _gc_cycle(client, lc) -> dict:
    address = _admin(client, lc)
    before = http_json(address, "/api/v1/bookie/gc")["stats"]["cycles"]
    code, _, body = http(address, "/api/v1/bookie/gc", "PUT", headers=admin_auth(client, address))
    assert code == 200, body

    def done():
        got = http_json(address, "/api/v1/bookie/gc")
        return got if got["stats"]["cycles"] > before and not got["is_in_force_gc"] else None
    return wait_until(done, 60, "the GC cycle")["last"]["ledgers"]


def _old_ledger_after_a_backup(zk, uri, lc, tmp_path):
    """A backup of ZooKeeper, then a ledger of 200 entries the backup does not know, and a
    GC cycle in which the bookie reads the generator's mark. Returns (id, metadata)."""
    with Client(uri) as client:
        zk.backup(str(tmp_path / "zk-backup"))      # before the ledger exists
        w = client.create_ledger(1, 1, 1, password=b"pw")
        w.append_many([b"old-%d" % i for i in range(200)])
        w.close()
        saved = client.metadata.ledger_manager.read_ledger_metadata(w.ledger_id).value
        assert _gc_cycle(client, lc)["deleted"] == 0
    return w.ledger_id, saved


@pytest.mark.parametrize("restart", [True, False], ids=["bookie-restarted", "bookie-running"])
def test_a_restored_zookeeper_halts_deletion_until_an_operator_resumes(tmp_path, zk, restart):
    uri = f"zk+hierarchical://{zk.hosts}/halt"
    with LocalCluster(bookies=1, metadata=uri, proxies=False, autorecovery=False,
                      bookie_config=CONFIG, base_dir=str(tmp_path / "c")) as lc:
        x, saved = _old_ledger_after_a_backup(zk, uri, lc, tmp_path)
        if restart:
            lc.stop_bookie(0)
        zk.restore(str(tmp_path / "zk-backup"))
        if restart:
            lc.restart_bookie(0)                  # it reads the mark as it starts
        with Client(uri) as client:
            if not restart:
                # the restored server refuses the bookie's session (it saw later zxids):
                # past the session timeout the bookie starts a new one and registers
                # again; then a cycle, before ids are handed out again, sees the mark
                first = wait_until(lambda: (lambda r: r if not r["aborted"] else None)(
                    _gc_cycle(client, lc)), 90, "a GC cycle that reads the store")
                assert first.get("halted"), first
                with open(os.path.join(lc.bookie_dir(0), "bookie.log")) as f:
                    said = f.read()
                # said as the connection went, not when a GC cycle failed
                assert "stays registered only while its session lives" in said
                assert "starting a new session" in said
                wait_until(lambda: "registered again" in open(os.path.join(
                    lc.bookie_dir(0), "bookie.log")).read(), 30, "the re-registration said")
            lm = client.metadata.ledger_manager
            # the restored generator hands the id out again; that ledger is deleted
            again = client.metadata.id_generator.generate_ledger_id(0)
            assert again == x
            lm.create_ledger_metadata(saved.with_(ctime_ms=saved.ctime_ms + 1))
            lm.remove_ledger_metadata(x)
            report = _gc_cycle(client, lc)
            assert report["deleted"] == 0 and report["halted"], report
            assert any("went back" in r for r in report["halted"]), report
            address = _admin(client, lc)
            state = http_json(address, "/api/v1/bookie/deletion_halt")
            assert state["halted"] and state["reasons"], state
            metrics = http(address, "/metrics")[2].decode()
            assert 'embedlog_bookie_statistic{key="gc_deletion_halted"} 1.0' in metrics
            shown = cli("bookie", "deletion-halt", lc.bookie_id(0), "--metadata", uri)
            assert shown.returncode == 0 and "went back" in shown.stdout, shown
            with open(os.path.join(lc.bookie_dir(0), "bookie.log")) as f:
                assert any("ledger deletion halted" in line for line in f)
        lc.restart_bookie(0)                               # the halt is kept
        with Client(uri) as client:
            assert _gc_cycle(client, lc)["halted"]
            # the newest metadata comes back: every entry is there
            client.metadata.ledger_manager.purge_deletions(2 ** 62)
            client.metadata.ledger_manager.create_ledger_metadata(saved)
            r = client.open_ledger(x, password=b"pw")
            assert r.read_batch(0, 199) == [b"old-%d" % i for i in range(200)]
            resumed = cli_json("bookie", "deletion-halt", lc.bookie_id(0), "--metadata", uri,
                               "--resume")
            assert resumed["resumed"], resumed
            report = _gc_cycle(client, lc)
            assert not report.get("halted") and report["aborted"] is None, report


def test_a_deletion_record_of_a_reissued_id_never_frees_the_ledger_held(tmp_path, zk):
    """The store is restored while the bookie is down, and clients get the generator past
    its old mark before the bookie starts: the mark shows nothing. The re-issued id's ledger
    is deleted; its deletion record names that ledger (its ctime), not the one the bookie
    holds, so the bookie keeps its data and halts deletion until an operator resumes."""
    uri = f"zk+hierarchical://{zk.hosts}/reissued"
    with LocalCluster(bookies=1, metadata=uri, proxies=False, autorecovery=False,
                      bookie_config=CONFIG, base_dir=str(tmp_path / "c")) as lc:
        x, saved = _old_ledger_after_a_backup(zk, uri, lc, tmp_path)
        lc.stop_bookie(0)
        zk.restore(str(tmp_path / "zk-backup"))
        with Client(uri) as client:
            lm, ids = client.metadata.ledger_manager, client.metadata.id_generator
            assert ids.generate_ledger_id(0) == x
            lm.create_ledger_metadata(saved.with_(ctime_ms=saved.ctime_ms + 1))
            past = [ids.generate_ledger_id(0) for _ in range(3)]
            assert min(past) > x                  # the generator is past its old mark
            lm.remove_ledger_metadata(x)
        lc.restart_bookie(0)
        with Client(uri) as client:
            report = _gc_cycle(client, lc)
            assert report["deleted"] == 0 and report["halted"], report
            assert any("deleted in the metadata store as another ledger" in r
                       for r in report["halted"]), report
            assert not any("went back" in r for r in report["halted"]), report
            lm = client.metadata.ledger_manager
            # the newest metadata comes back: every entry is there
            lm.purge_deletions(2 ** 62)
            lm.create_ledger_metadata(saved)
            r = client.open_ledger(x, password=b"pw")
            assert r.read_batch(0, 199) == [b"old-%d" % i for i in range(200)]
            r.close()
            assert cli_json("bookie", "deletion-halt", lc.bookie_id(0), "--metadata", uri,
                            "--resume")["resumed"]
            # a deletion of the ledger held (its own ctime in the record) frees it
            lm.remove_ledger_metadata(x)
            report = _gc_cycle(client, lc)
            assert not report.get("halted") and report["deleted"] == 1, report
