"""A writer on embedlog's protocol, a reader on BookKeeper's: the explicit LAC.

embedlog's client, idle, sends its LAC to its bookies (WRITE_LAC) on embedlog's protocol,
whose frame carries the LAC and no body. A Java reader asks for it with READ_LAC, whose
answer is a WRITE_LAC body (ledger id, LAC, digest) the reader checks with the ledger's
digest. The bookies make that body, so a Java tailer of an idle embedlog writer reads its
last batch (Pulsar's managed ledger reads a ledger it did not write this way). Under
CI=true a missing ZooKeeper or jar fails.
"""
from __future__ import annotations

from support.cliutil import wait_until
from embedlog import Client
from embedlog.harness.peers import jars
from support.servers import require_peer

VERSION = max(jars.BOOKKEEPER_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))


def test_a_java_reader_sees_the_explicit_lac_of_an_embedlog_writer(own_zookeeper):
    from embedlog.harness.cluster import LocalCluster
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    require_peer(f"bookkeeper-{VERSION}")
    with BookKeeperCluster(VERSION, bookies=0, zk_hosts=own_zookeeper.hosts,
                           root="/explicitlac") as bk, \
            LocalCluster(bookies=3, metadata=bk.metadata_uri, proxies=False,
                         autorecovery=False), Client(bk.metadata_uri) as client:
        for digest in ("crc32c", "crc32", "mac"):
            w = client.create_ledger(3, 3, 2, digest=digest, password=b"pw")
            w.append_many([b"e-%d" % i for i in range(10)])
            lid = w.ledger_id.ledger_id
            # entry 9 carries LAC 8; idle, the writer sends WRITE_LAC 9 to its bookies
            mine = client.open_ledger(lid, b"pw", recovery=False)
            wait_until(lambda: mine.read_lac() == 9, 30, "the explicit LAC 9 on the bookies")
            got = bk.java_client("read", lid, explicit_lac=True, password="pw",
                                 digest=digest.upper())
            assert got.explicit_lac == 9, (digest, got.lines)
            assert got.entries == [(i, b"e-%d" % i) for i in range(10)], (digest, got.lines)
            w.close()
