"""BookKeeper's own auditor on a root served by embedlog bookies, seen by embedlog's views.

An operator running BookKeeper's AutoRecoveryMain beside embedlog bookies (docs/BOOKKEEPER.md
tells them to leave autorecovery to it) saw `embedlog autorecovery status`, the
`embedlog_underreplicated_ledgers` metric and the admin API say 0 and "none elected" while
BookKeeper's auditor ran and its `listunderreplicated` listed the ledgers. Now they read
BookKeeper's election and marks (embedlog/meta/bookkeeper/replication.py). Real processes:
ZooKeeper, BookKeeper 4.17.2's AutoRecoveryMain and shell, three embedlog bookies. Under
CI=true a missing java, jar or ZooKeeper fails."""
from __future__ import annotations

from support.cliutil import cli_json, http, http_json, wait_until
from embedlog import Client
from support.servers import require_peer

VERSION = "4.17.2"


def test_bookkeepers_auditor_and_its_marks_show_in_embedlogs_views(tmp_path, own_zookeeper):
    zk = own_zookeeper
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    from embedlog.harness.cluster import LocalCluster
    require_peer(f"bookkeeper-{VERSION}")
    with BookKeeperCluster(VERSION, bookies=0, zk_hosts=zk.hosts, root="/ar",
                           base_dir=str(tmp_path / "bk")) as bk, \
            LocalCluster(bookies=3, metadata=bk.metadata_uri, proxies=False, autorecovery=False,
                         base_dir=str(tmp_path / "el"),
                         bookie_config={"http_server_enabled": True, "http_server_port": 0}) as lc:
        uri = bk.metadata_uri
        with Client(uri) as client:
            w = client.create_ledger(3, 3, 2, password=b"pw")
            w.append_many([b"entry-%d" % i for i in range(10)])
            w.close()
            lid = w.ledger_id.ledger_id
            admin = next(r.info["http"] for r in client.metadata.registration_client.get_all_bookies()
                         if r.bookie_id == lc.bookie_id(0))
        auditor = bk.start_autorecovery()

        def status():
            return cli_json("autorecovery", "status", "--metadata", uri)
        wait_until(lambda: status()["auditor"] == auditor, 120, "BookKeeper's auditor elected")
        lost = lc.bookie_id(2)
        lc.stop_bookie(2)

        def marked():
            rows = {r["ledger_id"]: r["missing_bookies"] for r in status()["underreplicated"]}
            return rows if lid in rows else None
        rows = wait_until(marked, 120, "BookKeeper's auditor marking the ledger")
        assert rows[lid] == [lost], rows
        assert str(lid) in bk.shell("listunderreplicated"), "BookKeeper's own view agrees"
        assert http_json(admin, "/api/v1/autorecovery/status")["underreplicated_ledgers"] == 1
        assert http_json(admin, "/api/v1/autorecovery/who_is_auditor")["auditor"] == auditor
        # the metric is cached for a few seconds
        assert wait_until(lambda: 'embedlog_underreplicated_ledgers 1.0' in
                          http(admin, "/metrics")[2].decode(), 60, "the metric")
