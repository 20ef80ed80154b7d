"""embedlog's client speaking BookKeeper's v3 protocol to real Java bookies (issue 28 item 3),
4.17.2 and 4.16.6: embedlog writes with every digest and BookKeeper's own client and
BookieShell read it back; embedlog reads and long-poll tails what a Java writer writes;
embedlog's recovery fences a live Java writer; wrong keys, fencing, recovery adds, LAC
writes and bookie info on one pipelined connection; a Java bookie killed mid-write.

One cluster of 3 Java bookies per version for the module (its start is most of the
cost), on the root BookieShell formatted; embedlog reads it in BookKeeper's metadata
format (embedlog/meta/bookkeeper). Under CI=true a missing java, jar or ZooKeeper fails.
The codec alone (and a hostile peer) is tests/net/test_bkwire.py.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from embedlog import Client
from embedlog._native import format as F
from embedlog.errors import (IllegalOpError, LedgerFencedError, NoSuchEntryError, NoSuchLedgerError,
                             UnauthorizedAccessError)
from embedlog.harness.peers import jars
from embedlog.net import protocol as P
from embedlog.net.bookkeeper import BookKeeperConnection, WriteLac
from prestart import Prestart
from support.servers import ServerMissing, require_peer, skip_unless_ci

PASSWORD = "wire-pw"
PW = PASSWORD.encode()
KEY = F.master_key(PW)
DIGESTS = {"crc32": "CRC32", "crc32c": "CRC32C", "mac": "MAC", "dummy": "DUMMY"}


# 4.17.2 on the default SortedLedgerStorage; 4.16.6 (Pulsar 3.x's line) on DbLedgerStorage,
# what Pulsar runs
CLUSTERS = [(jars.BOOKKEEPER_VERSIONS[0], "sorted"), (jars.BOOKKEEPER_VERSIONS[1], "db")]


def make_cluster(param, zk_hosts: str):
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    version, storage = param
    try:
        cluster = BookKeeperCluster(version, bookies=3, zk_hosts=zk_hosts, ledger_storage=storage,
                                    root=f"/wire{version.replace('.', '')}")
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    try:
        # BookKeeperCluster.driver_command sets up the driver's classpath and archive
        # lazily; once here, before any test runs JVMs in parallel
        cluster.driver_command()[1]()
        cluster.embedlog = Client(cluster.metadata_uri, add_timeout_s=20, read_timeout_s=20)
    except BaseException:
        cluster.close()
        raise
    return cluster


def close_cluster(cluster) -> None:
    cluster.embedlog.close()
    cluster.close()


STARTED = Prestart(CLUSTERS, make_cluster, close_cluster)


@pytest.fixture(scope="module", params=CLUSTERS, ids=[f"{v}-{s}" for v, s in CLUSTERS])
def bk(request, zk):
    """One version's cluster; the next one starts meanwhile (tests/interop/prestart.py)."""
    require_peer(f"bookkeeper-{request.param[0]}")
    cluster = STARTED.take(request.param, zk.hosts,
                           ready=lambda p: jars.is_fetched(f"bookkeeper-{p[0]}"))
    yield cluster
    close_cluster(cluster)


def parallel(*calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def wait_for(cond, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def driver_lines(proc, result, until, what: str) -> None:
    """Feed BkDriver's output lines to ``result`` until ``until(result)``."""
    while not until(result):
        line = proc.stdout.readline()
        assert line, f"BkDriver ended before {what}: {result.lines} {proc.stderr.read()[-2000:]}"
        result.feed(line)


def java_ledgers(cluster, mode: str, lids) -> dict:
    """embedlog/harness/peers/java/BkLedgers.java MODE over ``lids`` in one JVM: per ledger, what BookKeeper's
    client read (``read``: (lac, [(eid, payload)]); ``explicit-lac``: the LAC), or its error."""
    source = jars.java_source("BkLedgers.java")
    out = subprocess.run([jars.java(), *jars.JVM_OPTS, "-Xmx192m", "-cp",
                          jars.classpath(f"bookkeeper-{cluster.version}"), source, mode,
                          cluster.metadata_uri, PASSWORD, *map(str, lids)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    got: dict = {}
    for line in out.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "lac":
            lid, lac = map(int, rest.split())
            got[lid] = (lac, [])
        elif word == "entry":
            lid, eid, data = rest.split(" ")
            got[int(lid)][1].append((int(eid), bytes.fromhex(data)))
        elif word == "explicit":
            lid, lac = map(int, rest.split())
            got[lid] = lac
        elif word == "error":
            lid, _, why = rest.partition(" ")
            got[int(lid)] = why
    return got


def send_lines(proc, payloads) -> None:
    proc.stdin.write("".join(p.hex() + "\n" for p in payloads))
    proc.stdin.flush()


# -- embedlog writes, BookKeeper reads -------------------------------------------------------------

def test_embedlog_writes_every_digest_java_reads_back(cluster):
    """3/2/2 and 1/1/1 ledgers under each digest: BookKeeper's client reads every entry back
    (its digests checked; one JVM for all), and BookieShell one of them and its metadata
    (BkDriver's own read is test_bookkeeper_fixture's)."""
    client = cluster.embedlog
    made = {}
    for shape in ((3, 2, 2), (1, 1, 1)):
        for digest in DIGESTS:
            w = client.create_ledger(*shape, digest=digest, password=PW)
            payloads = [b"%s-%d" % (digest.encode(), i) * (1 + i % 7) for i in range(40)]
            for f in w.append_many_async(payloads[:30]):          # many entries per ADD frame
                f.result(30)
            for p in payloads[30:]:
                w.append(p)
            w.close()
            made[(shape, digest)] = (int(w.ledger_id), payloads)
    wide = {d: made[((3, 2, 2), d)] for d in DIGESTS}
    many, shell, meta = parallel(
        lambda: java_ledgers(cluster, "read", [lid for lid, _ in made.values()]),
        lambda: cluster.read_ledger(wide["crc32"][0]),
        lambda: cluster.ledger_metadata(wide["mac"][0]))
    for key, (lid, payloads) in made.items():
        assert many[lid] == (39, list(enumerate(payloads))), (key, many[lid])
    assert shell == list(enumerate(wide["crc32"][1]))
    assert "digestType=MAC" in meta and "lastEntryId=39" in meta


# -- BookKeeper writes, embedlog reads -------------------------------------------------------------

def test_embedlog_reads_and_long_poll_tails_what_java_writes(cluster):
    client = cluster.embedlog
    closed = cluster.java_client("create", ensemble=3, write_quorum=2, ack_quorum=2, digest="CRC32",
                                 password=PASSWORD, count=30, size=100)
    r = client.open_ledger(closed.ledger_id, PW)
    got = [(e.entry_id, e.data) for e in r.read(0, 29)]
    assert [eid for eid, _ in got] == list(range(30))
    assert all(d.startswith(b"entry-%d" % eid) and len(d) == 100 for eid, d in got)
    assert r.is_closed and r.last_add_confirmed == 29

    # a Java writer filling a ledger; embedlog tails it with long polls as it goes
    proc = cluster.java_client_popen("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                     digest="CRC32C", password=PASSWORD, stdin=True)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    from embedlog.harness.peers.bookkeeper import DriverResult
    result, seen, failure = DriverResult(), [], []
    try:
        driver_lines(proc, result, lambda r: r.ledger_id is not None, "its ledger id")
        reader = client.open_ledger(result.ledger_id, PW, recovery=False)

        def tail():
            try:
                for e in reader.tail(0, poll_timeout_ms=500):
                    seen.append((e.entry_id, e.data))
            except BaseException as exc:          # the test's thread reports it
                failure.append(exc)

        t = threading.Thread(target=tail, daemon=True)
        t.start()
        send_lines(proc, [b"tail-%d" % i for i in range(10)])
        driver_lines(proc, result, lambda r: len(r.acked) == 10, "10 acks")
        # the tenth entry's LAC rides on the next add: the tail sees 0..8 now
        wait_for(lambda: len(seen) >= 9 or failure, what="the tail to reach entry 8")
        send_lines(proc, [b"tail-%d" % i for i in range(10, 20)])
        proc.stdin.close()                        # the writer closes the ledger at its end
        for line in proc.stdout:
            result.feed(line)
        assert proc.wait() == 0, result.lines
        t.join(30)
        assert not t.is_alive() and not failure, failure
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert result.closed and result.lac == 19
    assert seen == [(i, b"tail-%d" % i) for i in range(20)]


def test_embedlog_recovery_fences_a_live_java_writer(cluster):
    """The Java writer has 10 acknowledged entries and is still writing; embedlog's recovery
    fences and closes the ledger at entry 9; the writer's next add fails fenced and a Java
    reader agrees on the last entry."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    proc = cluster.java_client_popen("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                     digest="CRC32C", password=PASSWORD, stdin=True, no_close=True)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    result = DriverResult()
    try:
        send_lines(proc, [b"fence-%d" % i for i in range(10)])
        driver_lines(proc, result, lambda r: len(r.acked) == 10, "10 acks")
        recovered = cluster.embedlog.open_ledger(result.ledger_id, PW, recovery=True)
        assert recovered.is_closed and recovered.last_add_confirmed == 9
        assert [e.data for e in recovered.read(0, 9)] == [b"fence-%d" % i for i in range(10)]
        send_lines(proc, [b"after-fence"])
        proc.stdin.close()
        for line in proc.stdout:
            result.feed(line)
        assert proc.wait() == 2, result.lines
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert result.error_code == -101 and "Fenced" in result.error, result.lines   # LedgerFenced
    read = cluster.java_client("read", result.ledger_id, password=PASSWORD)
    assert read.closed and read.lac == 9 and len(read.entries) == 10


# -- one connection, every operation ----------------------------------------------------------------

def test_one_connection_every_operation(cluster):
    client = cluster.embedlog
    w = client.create_ledger(1, 1, 1, digest="crc32c", password=PW)
    lid, bookie = int(w.ledger_id), w.metadata.fragments[0][1][0]
    w.close()                            # empty and closed: the bookie has never seen it
    other = client.create_ledger(1, 1, 1, digest="mac", password=PW)
    other_lid, other_bookie = int(other.ledger_id), other.metadata.fragments[0][1][0]
    other.close()
    dg = F.digest_code("crc32c")

    def entry(i):
        return F.encode_entry(0, lid, i, i - 1, i, dg, b"e%d" % i)

    async def run():
        c = BookKeeperConnection(bookie)
        try:
            # many requests in flight on one connection, answered out of order, matched by txnId
            singles = [c.call(lambda rid, i=i: P.add_request(rid, 0, lid, KEY, [entry(i)]), 20)
                       for i in range(300)]
            batch = c.call(lambda rid: P.add_request(rid, 0, lid, KEY, [entry(i) for i in range(300, 500)]), 20)
            answers = await asyncio.gather(*singles, batch)
            assert [P.ADD_RESP.unpack(a.body) for a in answers[:3]] == [(0, 1), (1, 1), (2, 1)]
            assert P.ADD_RESP.unpack(answers[-1].body) == (300, 200)
            # reads: ranges come back as embedlog's body, up to what the bookie has
            resp = await c.call(lambda rid: P.read_request(rid, 0, lid, 490, 20), 20)
            lac, entries = P.parse_read_body(resp.body)
            assert lac == 498 and [e for e, _ in entries] == list(range(490, 500))
            assert [F.decode_entry(d, 0, lid, e, dg) for e, d in entries] == [b"e%d" % e for e in range(490, 500)]
            with pytest.raises(NoSuchEntryError):
                await c.call(lambda rid: P.read_request(rid, 0, lid, 500), 20)
            with pytest.raises(NoSuchLedgerError):
                await c.call(lambda rid: P.read_request(rid, 0, lid + (1 << 40), 0), 20)
            # LAC: the last entry's, then an explicit one written under the ledger's digest
            resp = await c.call(lambda rid: P.read_lac_request(rid, 0, lid), 20)
            assert P.parse_read_lac_body(resp.body)[:2] == (498, 499)
            await c.call(WriteLac(0, lid, KEY, 499, 0, dg, None), 20)
            resp = await c.call(lambda rid: P.read_lac_request(rid, 0, lid), 20)
            assert P.parse_read_lac_body(resp.body)[:2] == (499, 499)
            with pytest.raises(IllegalOpError, match="WriteLac"):
                await c.call(lambda rid: P.write_lac_request(rid, 0, lid, KEY, 499), 20)
            # the long poll answers at once when the LAC is already past previous_lac
            resp = await c.call(lambda rid: P.read_request(rid, 0, lid, 499, flags=P.FLAG_LONG_POLL,
                                                           previous_lac=498, timeout_ms=5000), 20)
            lac, entries = P.parse_read_body(resp.body)
            assert lac == 499 and [e for e, _ in entries] == [499]
            # and waits out its timeout when it is not, answering with the LAC
            started = time.monotonic()
            resp = await c.call(lambda rid: P.read_request(rid, 0, lid, 500, flags=P.FLAG_LONG_POLL,
                                                           previous_lac=499, timeout_ms=300), 20)
            assert P.parse_read_body(resp.body) == (499, []) and time.monotonic() - started >= 0.25
            # a wrong master key: the bookie's EUA as embedlog's error, for adds and fences
            bad_key = F.master_key(b"not-" + PW)
            with pytest.raises(UnauthorizedAccessError, match="EUA"):
                await c.call(lambda rid: P.add_request(rid, 0, lid, bad_key, [entry(500)]), 20)
            with pytest.raises(UnauthorizedAccessError):
                await c.call(lambda rid: P.read_lac_request(rid, 0, lid, P.FLAG_FENCE, bad_key), 20)
            # fencing: the LAC read fences; a plain add is refused, a recovery add goes in
            resp = await c.call(lambda rid: P.read_lac_request(rid, 0, lid, P.FLAG_FENCE, KEY), 20)
            assert P.parse_read_lac_body(resp.body)[:2] == (498, 499)
            with pytest.raises(LedgerFencedError):
                await c.call(lambda rid: P.add_request(rid, 0, lid, KEY, [entry(500)]), 20)
            await c.call(lambda rid: P.add_request(rid, 0, lid, KEY, [entry(500)], P.FLAG_RECOVERY_ADD), 20)
            resp = await c.call(lambda rid: P.read_request(rid, 0, lid, 500, flags=P.FLAG_FENCE,
                                                           master_key=KEY), 20)
            assert [e for e, _ in P.parse_read_body(resp.body)[1]] == [500]
            # bookie info
            info = json.loads(bytes((await c.call(P.bookie_info_request, 20)).body))
            assert info["protocol"] == "bookkeeper" and 0 < info["free_bytes"] <= info["total_bytes"]
            # what BookKeeper cannot express is refused, never sent
            with pytest.raises(IllegalOpError, match="TRIM|trim"):
                await c.call(lambda rid: P.trim_request(rid, 0, lid, KEY, 3), 20)
            with pytest.raises(IllegalOpError, match="terms"):
                await c.call(lambda rid: P.add_request(rid, 0, lid, KEY, [entry(501)], term=2), 20)
            assert not c.closed
        finally:
            c.close()

        # the MAC ledger on its bookie: a LAC written under the MAC digest
        c = BookKeeperConnection(other_bookie)
        try:
            mac = F.mac_key(PW)
            e0 = F.encode_entry(0, other_lid, 0, -1, 2, F.digest_code("mac"), b"m0", mac)
            await c.call(lambda rid: P.add_request(rid, 0, other_lid, KEY, [e0]), 20)
            await c.call(WriteLac(0, other_lid, KEY, 0, 0, F.digest_code("mac"), mac), 20)
            resp = await c.call(lambda rid: P.read_lac_request(rid, 0, other_lid), 20)
            assert P.parse_read_lac_body(resp.body)[:2] == (0, 0)
        finally:
            c.close()

    asyncio.run(run())


def test_lac_written_under_each_digest_passes_javas_digest_check(cluster):
    """WRITE_LAC's body carries the LAC under the ledger's digest: BookKeeper's client
    (LedgerHandle.readExplicitLastConfirmed, its DigestManager) verifies it for every digest.
    The writer's own explicit-LAC flush sends it (it used to be refused before sending, as a
    plain WRITE_LAC frame carries no digest, and skipped in silence)."""
    client = cluster.embedlog
    writers, lids = [], []
    for digest in DIGESTS:
        w = client.create_ledger(1, 1, 1, digest=digest, password=PW)
        for i in range(5):
            w.append(b"lac-%d" % i)            # the last entry carries LAC 3; 4 is explicit only
        writers.append(w)
        lids.append(int(w.ledger_id))
        client.context.run(w.flush_lac(), timeout=30)
    got = java_ledgers(cluster, "explicit-lac", lids)
    for w in writers:
        w.close()
    assert got == {lid: 4 for lid in lids}


# -- a Java bookie dies under embedlog's writer -----------------------------------------------------

def test_java_bookie_killed_mid_write_embedlog_changes_ensemble(cluster):
    """A 2/2/2 ledger on 3 Java bookies: one of its bookies is SIGKILLed after 30 entries;
    embedlog's writer replaces it with the third and every entry is acknowledged; Java's
    client reads all of them through the ensemble change."""
    client = cluster.embedlog
    w = client.create_ledger(2, 2, 2, digest="crc32", password=PW)
    for f in w.append_many_async([b"k-%d" % i for i in range(30)]):
        f.result(30)
    victim = w.metadata.fragments[0][1][0]
    cluster.kill_bookie(cluster.bookie_ids.index(victim))
    for f in w.append_many_async([b"k-%d" % i for i in range(30, 60)]):
        f.result(60)
    w.close()
    fragments = client.ledger_metadata(w.ledger_id).fragments
    assert len(fragments) == 2 and victim not in fragments[1][1] and fragments[1][0] == 30
    read = cluster.java_client("read", int(w.ledger_id), password=PASSWORD)
    assert read.closed and read.lac == 59 and read.entries == [(i, b"k-%d" % i) for i in range(60)]
    assert sorted(read.ensembles) == [0, fragments[1][0]]
