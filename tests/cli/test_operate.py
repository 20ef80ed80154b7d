"""Issue 17: what BookKeeper operators use every day, on real bookie processes.

CLI: bookie list | readonly | recover | decommission, autorecovery status | audit, metadata
format, cookie show | delete. Admin HTTP: ledger/read, bookie/gc, bookie/state/readonly,
bookie/last_log_mark, bookie/list_disk_file, bookie/cluster_info,
autorecovery/who_is_auditor and trigger_audit.

One cluster of five bookies with autorecovery running (so an auditor is elected) and a
lost-bookie grace far longer than the tests: nothing is re-replicated behind their back
unless a test asks for an audit.
"""
from __future__ import annotations

import json
import os
import sqlite3

import pytest

from support.cliutil import ROOT, admin_auth, cli, cli_json, http, http_json, wait_until
from embedlog.harness import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=5, base_dir=str(tmp_path_factory.mktemp("operate") / "cluster"),
                      lost_bookie_grace_s=3600.0,
                      bookie_config={"http_server_enabled": True, "http_server_port": 0}) as lc:
        yield lc


@pytest.fixture(scope="module")
def client(cluster):
    return cluster.client()


@pytest.fixture(scope="module")
def md(cluster):
    return ("--metadata", cluster.metadata_uri)


def admin_of(client, bookie_id):
    for r in client.metadata.registration_client.get_all_bookies():
        if r.bookie_id == bookie_id:
            return r.info["http"]
    raise AssertionError(f"{bookie_id} is not registered")


def closed_ledgers(client, n, entries=20):
    out = []
    for k in range(n):
        w = client.create_ledger(3, 2, 2)
        w.append_many([b"%d-%d" % (k, i) for i in range(entries)])
        w.close()
        out.append(w.ledger_id)
    return out


def test_bookie_list(cluster, md):
    rows = cli_json("bookie", "list", *md)
    assert sorted(r["bookie_id"] for r in rows) == sorted(cluster.bookie_id(i) for i in range(5))
    assert all(r["state"] == "writable" and r["free_bytes"] > 0 and r["address"] and r["http"]
               for r in rows)
    text = cli("bookie", "list", *md).stdout
    assert "free disk" in text and "5 bookies registered" in text
    assert cluster.bookie_id(0) in text


def test_readonly_on_and_off(cluster, client, md):
    bid = cluster.bookie_id(1)
    out = cli_json("bookie", "readonly", "on", bid, *md)
    assert out == {"bookie_id": bid, "read_only": True, "reasons": ["operator"]}
    assert bid in client.bookies()[1]
    assert http_json(admin_of(client, bid), "/api/v1/bookie/state/readonly") == \
        {"readOnly": True, "reasons": ["operator"]}
    row = [r for r in cli_json("bookie", "list", *md) if r["bookie_id"] == bid][0]
    assert row["state"] == "read_only" and row["read_only_reasons"] == ["operator"]
    assert cli_json("bookie", "readonly", "off", bid, *md)["read_only"] is False
    assert bid in client.bookies()[0]
    r = cli("bookie", "readonly", "on", "bookie-nosuch", *md)
    assert r.returncode == 3


def test_admin_ledger_read(cluster, client):
    lid = closed_ledgers(client, 1, entries=12)[0]
    address = admin_of(client, cluster.bookie_id(0))
    got = http_json(address, f"/api/v1/ledger/read?ledger_id={lid.ledger_id}&start_entry_id=2"
                             f"&end_entry_id=4")
    assert [e["entry_id"] for e in got["entries"]] == [2, 3, 4]
    assert [e["data"] for e in got["entries"]] == ["0-2", "0-3", "0-4"]
    assert got["last_add_confirmed"] == 11 and not got["truncated"]
    whole = http_json(address, f"/api/v1/ledger/read?ledger_qualified_name={lid.qualified_name}")
    assert len(whole["entries"]) == 12
    code, _, body = http(address, "/api/v1/ledger/read?ledger_id=999999")
    assert code == 404, body
    code, _, body = http(address, f"/api/v1/ledger/read?ledger_id={lid.ledger_id}&start=1")
    assert code == 400 and b"start" in body


def test_admin_gc_log_mark_and_disk_files(cluster, client):
    address = admin_of(client, cluster.bookie_id(0))
    before = http_json(address, "/api/v1/bookie/gc")["stats"]["cycles"]
    assert http(address, "/api/v1/bookie/gc?force_minor=true", "PUT")[0] == 401     # no token
    code, _, body = http(address, "/api/v1/bookie/gc?force_minor=true", "PUT",
                         headers=admin_auth(client, address))
    assert code == 200, body
    wait_until(lambda: not http_json(address, "/api/v1/bookie/gc")["is_in_force_gc"], 60, "the GC cycle")
    after = http_json(address, "/api/v1/bookie/gc")
    assert after["stats"]["cycles"] > before and "ledgers" in after["last"]
    mark = http_json(address, "/api/v1/bookie/last_log_mark")
    [(journal_dir, where)] = mark.items()
    assert journal_dir.endswith("journal") and int(where["journal_id"], 16) >= 0 and where["offset"] >= 0
    files = http_json(address, "/api/v1/bookie/list_disk_file")
    kinds = {f["kind"] for f in files["files"]}
    assert "journal" in kinds and files["count"] == len(files["files"])
    only = http_json(address, "/api/v1/bookie/list_disk_file?file_type=journal")
    assert {f["kind"] for f in only["files"]} == {"journal"}
    assert http(address, "/api/v1/bookie/list_disk_file?file_type=pictures")[0] == 400
    assert http(address, "/api/v1/bookie/gc", "DELETE")[0] == 405


def test_auditor_and_cluster_info(cluster, client, md):
    ids = {cluster.bookie_id(i) for i in range(5)}
    auditor = wait_until(lambda: cli_json("autorecovery", "status", *md)["auditor"], 30,
                         "an auditor elected")
    assert auditor in ids
    address = admin_of(client, cluster.bookie_id(2))
    assert http_json(address, "/api/v1/autorecovery/who_is_auditor") == {"auditor": auditor}
    info = http_json(address, "/api/v1/bookie/cluster_info")
    assert info["auditor_elected"] and info["auditor_id"] == auditor
    assert info["writable_bookies_count"] == 5 and info["unavailable_bookies_count"] == 0
    assert "auditor: " + auditor in cli("autorecovery", "status", *md).stdout


def test_metadata_format(tmp_path):
    uri = f"sqlite://{tmp_path}/new/meta.db"
    made = cli_json("metadata", "format", "--metadata", uri)
    assert made["formatted"] and made["instance_id"]
    assert cli_json("ledger", "list", "--metadata", uri) == []          # a store: tools open it
    r = cli("metadata", "format", "--metadata", uri)
    assert r.returncode == 4 and made["instance_id"] in r.stderr       # never wiped
    assert cli("metadata", "format", "--metadata", "nosuch://x").returncode == 2


def test_cookie_show_and_delete_guard(cluster, md):
    bid = cluster.bookie_id(0)
    c = cli_json("cookie", "show", bid, *md)
    assert c["bookie_id"] == bid and c["instance_id"] and c["ledger_dirs"]
    assert cli("cookie", "show", "bookie-nosuch", *md).returncode == 3
    assert cli("cookie", "delete", bid, *md).returncode == 2          # no terminal: needs --yes
    r = cli("cookie", "delete", bid, *md, "--yes")
    assert r.returncode == 4 and "registered" in r.stderr             # refused while it runs
    assert cli_json("cookie", "show", bid, *md)["bookie_id"] == bid


def _victim(client, ledgers, avoid=()):
    counts = {}
    for lid in ledgers:
        for b in client.ledger_metadata(lid).fragments[0][1]:
            counts[b] = counts.get(b, 0) + 1
    return max((b for b in counts if b not in avoid), key=counts.get)


def _wait_unregistered(client, bookie_id):
    wait_until(lambda: bookie_id not in sum(client.bookies(), []), 30, f"{bookie_id} unregistered")


def test_decommission_and_recover(cluster, client, md):
    ledgers = closed_ledgers(client, 4)
    victim = _victim(client, ledgers)
    i = cluster.index_of(victim)
    r = cli("bookie", "decommission", victim, *md, "--yes")
    assert r.returncode == 4 and "stop it" in r.stderr                 # it still runs
    # an OPEN ledger whose last fragment holds the victim: its writer's job, not recover's
    # (Qa = 3, so no ack is on its way when the victim stops: a late one would move the
    # writer's fragment to a spare bookie)
    w = client.create_ledger(3, 3, 3)
    while victim not in w.metadata.fragments[-1][1]:
        w.close()
        w = client.create_ledger(3, 3, 3)
    w.append_many([b"open"] * 5)
    cluster.stop_bookie(i)
    _wait_unregistered(client, victim)
    on_victim = [lid for lid in ledgers if victim in client.ledger_metadata(lid).fragments[0][1]]
    r = cli("bookie", "recover", victim, *md, "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert {x["ledger_qualified_name"] for x in out["replicated"]} >= {l.qualified_name for l in on_victim}
    assert [x["ledger_qualified_name"] for x in out["left"]] == [w.ledger_id.qualified_name]
    assert "OPEN" in out["left"][0]["reason"]
    for lid in on_victim:
        assert victim not in client.ledger_metadata(lid).fragments[0][1]
        assert len(client.open_ledger(lid).read_batch(0, 19)) == 20
    assert cli_json("cookie", "show", victim, *md)["bookie_id"] == victim   # recover keeps it
    r = cli("bookie", "decommission", victim, *md, "--yes")
    assert r.returncode == 1                                  # the open ledger still names it
    assert cli_json("cookie", "show", victim, *md)["bookie_id"] == victim
    w.close()                                                 # its writer ends it...
    client.open_ledger(w.ledger_id)
    done = cli_json("bookie", "decommission", victim, *md, "--yes")
    assert done["decommissioned"] and done["cookie_removed"]  # ...and now it can go
    assert cli("cookie", "show", victim, *md).returncode == 3
    assert all(victim not in ens for lid in client.list_ledgers(0)
               for _f, ens in client.ledger_metadata(lid).fragments)


def test_audit_now(cluster, client, md):
    ledgers = closed_ledgers(client, 3)
    running = [cluster.bookie_id(k) for k in range(5) if cluster.is_running(k)]
    victim = _victim(client, ledgers, avoid=[b for b in client.bookies()[1]])
    assert victim in running
    cluster.stop_bookie(cluster.index_of(victim))
    _wait_unregistered(client, victim)
    # an audit asked now (the cluster's own grace period is an hour): marked at once ...
    marked = cli_json("autorecovery", "audit", *md)["marked"]
    assert {m["ledger_qualified_name"] for m in marked} >= {
        lid.qualified_name for lid in ledgers if victim in client.ledger_metadata(lid).fragments[0][1]}
    assert all(victim in m["missing_bookies"] for m in marked)
    # ... and the running replication workers copy them away
    wait_until(lambda: cli_json("autorecovery", "status", *md)["underreplicated"] == [], 60,
               "autorecovery to re-replicate the marked ledgers")
    for lid in ledgers:
        assert victim not in client.ledger_metadata(lid).fragments[0][1]
    address = admin_of(client, client.bookies()[0][0])
    assert http_json(address, "/api/v1/autorecovery/trigger_audit", "PUT",
                     headers=admin_auth(client, address))["count"] == 0
    info = http_json(address, "/api/v1/bookie/cluster_info")
    assert info["unavailable_bookies_count"] == 0 and not info["cluster_under_replicated"]


def test_grafana_dashboard_names_only_metrics_a_bookie_exports(cluster, client):
    """docs/grafana-dashboard.json: every metric an expression names, and every label it
    selects or groups by, is in a live bookie's /metrics (with autorecovery running)."""
    import re
    from prometheus_client.parser import text_string_to_metric_families
    dash = json.load(open(os.path.join(ROOT, "docs", "grafana-dashboard.json")))
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] and dash["templating"]["list"]
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    wait_until(lambda: cli_json("autorecovery", "status", "--metadata", cluster.metadata_uri)["auditor"],
               30, "an auditor")
    address = admin_of(client, client.bookies()[0][0])
    labels: dict = {}
    for fam in text_string_to_metric_families(http(address, "/metrics")[2].decode()):
        for s in fam.samples:
            labels.setdefault(s.name, set()).update(s.labels)
    for expr in exprs:
        for name in set(re.findall(r"\bembedlog_[a-z0-9_]+", expr)):
            assert name in labels, f"{name} (in {expr}) is not exported"
            for key in re.findall(name + r"\{([^}]*)\}", expr):
                for label in re.findall(r"(\w+)\s*!?=", key):
                    assert label in labels[name], (name, label)
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (g.strip() for g in group.split(",")):
                if label not in ("le", "instance"):      # le: histograms; instance: Prometheus's
                    assert any(label in labels[n] for n in re.findall(r"embedlog_[a-z0-9_]+", expr)), \
                        (label, expr)


def test_missing_ledgers_are_reported_and_deleted_only_when_confirmed(cluster, client, md):
    """Issue 13.1: a ledger whose metadata row is lost (no deletion record) is kept by GC
    and reported (metric, `bookie missing`, admin API) until an operator confirms."""
    [lid] = closed_ledgers(client, 1)
    bid = client.ledger_metadata(lid).fragments[0][1][0]
    address = admin_of(client, bid)
    db = cluster.metadata_uri[len("sqlite://"):]
    with sqlite3.connect(db) as c:                      # a lost row, not a deletion
        c.execute("DELETE FROM ledgers WHERE name=?", (lid.qualified_name,))
    auth = admin_auth(client, address)

    def gc_once():
        assert http(address, "/api/v1/bookie/gc", "PUT", headers=auth)[0] == 200
        wait_until(lambda: not http_json(address, "/api/v1/bookie/gc")["is_in_force_gc"], 60, "GC")

    gc_once()
    out = cli_json("bookie", "missing", bid, *md)
    assert [m["ledger_qualified_name"] for m in out["missing"]] == [lid.qualified_name]
    metrics = http(address, "/metrics")[2].decode()
    assert "embedlog_gc_missing_ledgers 1.0" in metrics
    gc_once()                                           # kept, cycle after cycle
    assert cli_json("bookie", "missing", bid, *md)["count"] == 1
    info = client.bookie_info([bid])[bid]
    assert info["ledgers"] >= 1
    assert cli_json("bookie", "missing", bid, "--delete", "--ledger", lid.qualified_name, *md) == \
        {"deleted": 1}
    assert cli_json("bookie", "missing", bid, *md)["count"] == 0


def test_recover_and_decommission_name_bookkeeper_ledgers_by_their_plain_ids(tmp_path):
    """Issue 52, item 4: on a root in BookKeeper's format every ledger is BookKeeper's, in
    scope 0, and its operators know it by BookKeeper's decimal id: `bookie recover` and
    `bookie decommission` named the ledgers they left by the 32-hex-digit qualified name."""
    from embedlog.meta import open_metadata_store
    from support.servers import ServerMissing, ZooKeeperServer, skip_unless_ci
    try:
        zk = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    try:
        uri = f"zk+hierarchical://{zk.hosts}/bkroot?metadata_format=bookkeeper"
        with open_metadata_store(uri) as store:
            assert store.metadata_format == "bookkeeper"
        with LocalCluster(bookies=3, metadata=uri, base_dir=str(tmp_path / "cluster"),
                          autorecovery=False) as lc, lc.client() as client:
            for _ in range(3):                     # ids past 0, whose hex and decimal differ
                client.create_ledger(2, 2, 2).close()
            # OPEN, the victim in its last fragment. Qa = 3: every replica has acknowledged
            # when append_many returns; an ack still on its way when the victim stops would
            # send the writer to an ensemble change that finds no spare and closes the ledger
            w = client.create_ledger(3, 3, 3)
            w.append_many([b"open"] * 3)
            victim = lc.bookie_id(0)
            lid = w.ledger_id
            assert lid.scope_id == 0 and lid.ledger_id > 0
            lc.stop_bookie(0)
            _wait_unregistered(client, victim)
            md = ("--metadata", uri)
            for command, *yes in (("recover",), ("decommission", "--yes")):
                r = cli("bookie", command, victim, *md, *yes)
                assert r.returncode == 1, r.stderr              # the OPEN ledger is left
                assert f"ledger {lid.ledger_id}: OPEN" in r.stderr, r.stderr
                assert lid.qualified_name not in r.stdout + r.stderr, r.stderr
                out = json.loads(cli("bookie", command, victim, *md, *yes, "--json").stdout)
                assert [x["ledger_id"] for x in out["left"]] == [lid.ledger_id]
            w.close()
    finally:
        zk.stop()
