"""Removing an embedlog bookie from a BookKeeper cluster, as docs/BOOKKEEPER.md tells an
operator: stop it, `embedlog bookie decommission BOOKIE_ID --yes` (BookieShell's
`decommissionbookie` needs an auditor; its `cookie_delete` refuses `bookie-<hex>` ids). The
Java client's closed ledgers no longer name it, read back whole through Java, its cookie is
gone from ROOT/cookies, and the bookie started again on its old directory is refused until
`embedlog cookie create` brings it back on purpose. Under CI=true a missing java, jar or
ZooKeeper fails.
"""
from __future__ import annotations

from support.cliutil import cli, cli_json, wait_until
from embedlog import Client
from embedlog.harness.peers import jars
from support.servers import require_peer

VERSION = max(jars.BOOKKEEPER_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))


def test_an_embedlog_bookie_removed_from_a_bookkeeper_cluster(own_zookeeper, tmp_path):
    from embedlog.errors import EmbedlogError
    from embedlog.harness.cluster import LocalCluster
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    require_peer(f"bookkeeper-{VERSION}")
    with BookKeeperCluster(VERSION, bookies=0, zk_hosts=own_zookeeper.hosts, root="/rm",
                           base_dir=str(tmp_path / "bk")) as bk, \
            LocalCluster(bookies=4, metadata=bk.metadata_uri, proxies=False, autorecovery=False,
                         base_dir=str(tmp_path / "el")) as lc:
        md = ("--metadata", bk.metadata_uri)
        wait_until(lambda: len(bk.list_bookies()) == 4, 60, "4 embedlog bookies listed")
        made = bk.java_client("create", ensemble=3, write_quorum=3, ack_quorum=2, count=30)
        victim = made.ensembles[0][0]
        i = lc.index_of(victim)
        lc.stop_bookie(i)
        wait_until(lambda: victim not in bk.list_bookies(), 60, f"{victim} unregistered")
        done = cli_json("bookie", "decommission", victim, *md, "--yes")
        assert done["decommissioned"] and done["cookie_removed"], done
        assert victim not in bk.ledger_metadata(made.ledger_id)
        got = bk.java_client("read", made.ledger_id)
        assert [e for e, _ in got.entries] == list(range(30)), got.lines
        assert cli("cookie", "show", victim, *md).returncode == 3
        try:
            lc.start_bookie(i)
        except EmbedlogError as exc:
            assert "cookie" in str(exc).lower(), exc
        else:
            raise AssertionError("a decommissioned bookie started on its old directory")
        cli_json("cookie", "create", victim, "--dir", lc.bookie_dir(i), *md)
        lc.start_bookie(i)
        with Client(bk.metadata_uri) as client:
            wait_until(lambda: victim in {r.bookie_id for r in
                                          client.metadata.registration_client.get_writable_bookies()},
                       60, f"{victim} back")
