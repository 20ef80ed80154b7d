"""Mixed ensembles (issue 29 item 4): three Java bookies (BookKeeper 4.17.2) and three
embedlog bookies on one BookKeeper root, E=5/Qw=3/Qa=2. BookKeeper's Java client and
embedlog's client write at the same time; a Java bookie both ensembles hold is SIGKILLed
mid-write (each writer replaces it with its one spare), then an embedlog bookie is killed
too; both clients read both ledgers back whole. With 6 bookies and E=5 there is one spare,
so the second kill comes after the writes (a writer losing a second bookie would have no
replacement). Under CI=true a missing java, jar or ZooKeeper fails."""
from __future__ import annotations

import threading

import pytest

from embedlog import Client
from support.servers import ServerMissing, ZooKeeperServer, require_peer, skip_unless_ci

VERSION = "4.17.2"
PASSWORD = "mixed-pw"
PW = PASSWORD.encode()


@pytest.fixture(scope="module")
def mixed():
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    from embedlog.harness.cluster import LocalCluster
    require_peer(f"bookkeeper-{VERSION}")
    try:
        zk = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    try:
        bk = BookKeeperCluster(VERSION, bookies=3, zk_hosts=zk.hosts, root="/mixed")
        lc = LocalCluster(bookies=3, metadata=bk.metadata_uri, proxies=False, autorecovery=False)
        try:
            yield bk, lc
        finally:
            lc.close()
            bk.close()
    finally:
        zk.stop()


def payloads(tag: str, first: int, count: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(first, first + count)]


def test_mixed_ensembles_written_by_both_clients_survive_one_bookie_of_each_kind(mixed):
    from embedlog.harness.peers.bookkeeper import DriverResult
    bk, lc = mixed
    java_ids = set(bk.bookie_ids)
    client = Client(bk.metadata_uri, add_timeout_s=30, read_timeout_s=30)
    proc = bk.java_client_popen("create", ensemble=5, write_quorum=3, ack_quorum=2,
                                digest="CRC32C", password=PASSWORD, stdin=True)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    java = DriverResult()
    try:
        w = client.create_ledger(5, 3, 2, digest="crc32c", password=PW)
        w.append_many(payloads("emb", 0, 10))
        proc.stdin.write("".join(p.hex() + "\n" for p in payloads("java", 0, 10)))
        proc.stdin.flush()
        while len(java.acked) < 10:
            line = proc.stdout.readline()
            assert line, f"BkDriver ended: {java.lines} {proc.stderr.read()[-2000:]}"
            java.feed(line)
        ens_java, ens_emb = set(java.ensembles[0]), set(w.metadata.fragments[0][1])
        # both kinds in both ensembles (5 of 3 + 3), and a Java bookie the two share
        assert ens_java & java_ids and ens_java - java_ids, ens_java
        assert ens_emb & java_ids and ens_emb - java_ids, ens_emb
        victim = sorted(ens_java & ens_emb & java_ids)[0]
        bk.kill_bookie(bk.bookie_ids.index(victim))
        w.append_many(payloads("emb", 10, 20))
        proc.stdin.write("".join(p.hex() + "\n" for p in payloads("java", 10, 20)))
        proc.stdin.close()
        for line in proc.stdout:
            java.feed(line)
        assert proc.wait(timeout=60) == 0, java.lines
        w.close()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert java.acked == list(range(30)) and java.closed, java.lines
    assert victim not in list(java.ensembles.values())[-1], java.ensembles
    emb_meta = client.ledger_metadata(w.ledger_id)
    assert victim not in emb_meta.fragments[-1][1], emb_meta.fragments
    # an embedlog bookie of the last ensembles down as well: Qw=3, so every entry keeps a copy
    down = sorted(set(emb_meta.fragments[-1][1]) - java_ids)[0]
    lc.kill_bookie(lc.index_of(down))
    lids = {"java": java.ledger_id, "emb": w.ledger_id.ledger_id}
    for tag, lid in lids.items():
        read = bk.java_client("read", lid, password=PASSWORD)
        assert [p for _, p in read.entries] == payloads(tag, 0, 30), (tag, read.lines)
        r = client.open_ledger(lid, PW)
        assert [e.data for e in r.read(0, 29)] == payloads(tag, 0, 30), tag
    client.close()
