"""embedlog bookies in a BookKeeper cluster (issue 29): BookKeeper's own Java client, over v3
and over v2 (Pulsar's), writes to and reads from embedlog bookies, 4.17.2 and 4.16.6.

Per version, one BookKeeper root (BookieShell formatted it) with four embedlog bookie
processes on it (three for a 3-bookie ensemble and a spare for the ensemble change) and no
Java bookie: the Java client finds them through their registrations (BookieServiceInfo with
a bookie-rpc endpoint) and speaks BookKeeper's protocols on their one port
(net/bkserver.py). embedlog's own client reads the same ledgers through the embedlog
endpoint. Oracles: BkDriver, BkLedgers (many ledgers in one JVM) and BookieShell's
``readledger -b`` of one embedlog bookie's copy. Under CI=true a missing java, jar or
ZooKeeper fails. The codec alone is tests/net/test_bkserve.py.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from support.cliutil import wait_until
from embedlog import Client
from embedlog._native import bkwire as W
from embedlog._native import bkencode as E
from embedlog._native import format as F
from embedlog.errors import EmbedlogError, LedgerFencedError
from embedlog.harness.peers import jars
from prestart import Prestart
from support.servers import ServerMissing, require_peer, skip_unless_ci
from bk_bookie_tools import (PASSWORD, closed_by_peer, driver_lines, entries, finish,
                             fired_on, java_cookies, java_read_many, lac_body_on_disk,
                             parallel, send_lines)

PW = PASSWORD.encode()
KEY = F.master_key(PW)
VERSIONS = list(jars.BOOKKEEPER_VERSIONS[:2])


class Setup:
    """A BookKeeper root with embedlog bookies on it: ``bk`` (the root, BookieShell and the
    Java client), ``lc`` (the embedlog bookies), ``client`` (embedlog's client)."""

    def __init__(self, bk, lc, client):
        self.bk, self.lc, self.client = bk, lc, client

    def address(self, i: int) -> tuple[str, int]:
        host, _, port = self.client._ctx.address_of(self.lc.bookie_id(i)).rpartition(":")
        return host, int(port)

    def close(self) -> None:
        self.client.close()
        self.lc.close()
        self.bk.close()


def make_setup(version: str, zk_hosts: str) -> Setup:
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    from embedlog.harness.cluster import LocalCluster
    try:
        bk = BookKeeperCluster(version, bookies=0, zk_hosts=zk_hosts,
                               root=f"/bkbookie{version.replace('.', '')}")
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    try:
        bk.driver_command()[1]()
        lc = LocalCluster(bookies=4, metadata=bk.metadata_uri, proxies=False,
                          autorecovery=False, bookie_config={"connection_idle_timeout_ms": 1000,
                                                             "http_server_enabled": True,
                                                             "http_server_port": 0})
    except BaseException:
        bk.close()
        raise
    return Setup(bk, lc, Client(bk.metadata_uri, add_timeout_s=20, read_timeout_s=20))


SETUPS = Prestart(VERSIONS, make_setup, Setup.close)


@pytest.fixture(scope="module", params=VERSIONS)
def setup(request, zk):
    """One version's Setup; the next version's starts meanwhile (tests/interop/prestart.py)."""
    version = request.param
    require_peer(f"bookkeeper-{version}")
    s = SETUPS.take(version, zk.hosts, ready=lambda v: jars.is_fetched(f"bookkeeper-{v}"))
    yield s
    s.close()


# -- registration ------------------------------------------------------------------------------

def test_java_tools_list_embedlog_bookies(setup):
    """Each embedlog bookie is a writable bookie to BookieShell, under its own bookie id."""
    listed = setup.bk.list_bookies()
    for i in range(len(setup.lc)):
        assert any(setup.lc.bookie_id(i) in line for line in listed), listed


def test_java_reads_an_embedlog_bookies_cookie(setup):
    """On a BookKeeper root an embedlog bookie's cookie (ROOT/cookies/<id>) is BookKeeper's
    format: BookKeeper's Cookie class reads it (BookieShell's cookie_get takes host:port ids
    only); embedlog's own checks still pass on a restart (they read it back as embedlog's
    record)."""
    from embedlog.bookie.cookies import Cookie as EmbedlogCookie
    from embedlog.meta.bookkeeper.cookie import Cookie as BkCookie, decode_dirs
    bid = setup.lc.bookie_id(3)
    text = java_cookies(setup.bk, [bid])[bid]
    assert not isinstance(text, Exception), text
    java = BkCookie.from_bytes(text.encode())
    mine = EmbedlogCookie.from_bytes(bytes(setup.client.metadata.cookies.read_cookie(bid).value),
                                     "the store's cookie")
    assert (java.bookie_id, java.instance_id, decode_dirs(java.ledger_dirs)) == (
        bid, setup.client.metadata.instance_id, list(mine.ledger_dirs))
    assert decode_dirs(java.journal_dirs) == [mine.journal_dir]
    setup.lc.restart_bookie(3)          # embedlog's cookie checks accept it
    wait_until(lambda: bid in {r.bookie_id for r in setup.client.metadata.get_all_bookies()},
               what="bookie 3 registered again")
    setup.lc.check_bookies()


# -- the Java client writes and reads --------------------------------------------------------------

def test_java_client_v3_and_v2_every_digest(setup):
    """A 3/2/2 ledger under each digest, two written over v3 and two over v2 (Pulsar's
    protocol), read back by BkLedgers (one JVM for all) and by
    embedlog's client through the embedlog endpoint of the same bookies."""
    bk = setup.bk
    shapes = [("CRC32", False), ("MAC", False), ("CRC32C", True), ("DUMMY", True)]
    made = parallel(*[
        (lambda d=d, v2=v2: bk.java_client("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                           digest=d, password=PASSWORD, v2=v2,
                                           payloads=entries(30, d)))
        for d, v2 in shapes])
    for (d, _), m in zip(shapes, made):
        assert m.acked == list(range(30)) and m.closed and m.lac == 29, (d, m.lines)
    lids = [m.ledger_id for m in made]
    # one JVM reads all four (v3); v2 reads are the kill test's and the fencing test's
    got = java_read_many(bk, lids)
    for lid, (d, _) in zip(lids, shapes):
        assert got[lid] == (29, list(enumerate(entries(30, d)))), (d, got[lid])
    for lid, (d, _) in zip(lids, shapes):
        r = setup.client.open_ledger(lid, PW)
        assert [e.data for e in r.read(0, 29)] == entries(30, d)


def _metric_sums(setup) -> dict:
    """Each (metric sample name, labels) summed over the embedlog bookies' /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    from support.cliutil import http
    sums: dict = {}
    for r in setup.client.metadata.registration_client.get_all_bookies():
        text = http(r.info["http"], "/metrics")[2].decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                sums[key] = sums.get(key, 0.0) + sample.value
    return sums


def test_java_traffic_counts_in_the_bookies_metrics(setup):
    """Adds and reads of BookKeeper's client, v3 and v2 (Pulsar's), count in requests_total,
    the request latency histogram and written_entries_total as embedlog's client's do:
    docs/OPERATIONS.md's write-rate and add-p99 queries see Java and Pulsar traffic."""
    bk = setup.bk
    before = _metric_sums(setup)
    made = [bk.java_client("create", ensemble=3, write_quorum=3, ack_quorum=2, count=40,
                           password=PASSWORD, v2=v2) for v2 in (False, True)]
    bk.java_client("read", made[1].ledger_id, password=PASSWORD, v2=True)
    after = {}

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    def every_add_counted():           # the third replica's answers may come after close
        after.update(_metric_sums(setup))
        return grew("embedlog_bookie_requests_total", op="add", status="0") >= 2 * 40 * 3
    wait_until(every_add_counted, 30, "every replica's add counted")
    assert grew("embedlog_bookie_request_latency_seconds_count", op="add") >= 2 * 40 * 3
    assert grew("embedlog_bookie_requests_total", op="read", status="0") >= 40
    # each replica counts 1/Qw: the two ledgers' 80 entries, once
    assert 2 * 40 - 0.01 <= grew("embedlog_bookie_written_entries_total") <= 2 * 40 + 0.01


def test_java_long_poll_tail_over_v3_of_a_v2_writer(setup):
    """A v2 writer (Pulsar's) writes while a v3 reader long-poll tails: the reader sees every
    entry as the writer's LAC passes it (long polls answered with the entry piggybacked)."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    bk = setup.bk
    writer = bk.java_client_popen("create", ensemble=3, write_quorum=3, ack_quorum=2,
                                  digest="CRC32C", password=PASSWORD, stdin=True, v2=True)
    watchdog = threading.Timer(90, writer.kill)
    watchdog.start()
    result = DriverResult()
    tail = None
    try:
        send_lines(writer, entries(5, "tail"))
        driver_lines(writer, result, lambda r: len(r.acked) == 5, "5 acks")
        # entry 4 carries LAC 3: a reader sees 0..3 until the next add
        tail = bk.java_client_popen("tail", result.ledger_id, password=PASSWORD, count=19,
                                    poll_ms=2000, idle_ms=20000)
        got = DriverResult()
        driver_lines(tail, got, lambda r: len(r.entries) >= 4, "4 tailed entries")
        send_lines(writer, [f"tail-{i}".encode() for i in range(5, 20)])
        driver_lines(tail, got, lambda r: len(r.entries) >= 19, "19 tailed entries")
        assert [p for _, p in got.entries] == entries(19, "tail")
        assert tail.wait(timeout=30) == 0
        assert finish(writer, result) == 0 and result.acked == list(range(20))
    finally:
        watchdog.cancel()
        for p in (writer, tail):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_bookieshell_reads_an_embedlog_bookies_copy(setup):
    """``readledger -b`` of one embedlog bookie: exactly the entries of its write sets, as
    BookKeeper stores them (header, digest, payload)."""
    bk = setup.bk
    made = bk.java_client("create", ensemble=3, write_quorum=2, ack_quorum=2, digest="CRC32",
                          password=PASSWORD, payloads=entries(12, "copy"))
    ensemble = made.ensembles[0]
    bookie = ensemble[0]
    stored = bk.read_ledger(made.ledger_id, bookie=bookie, last=11, digest="CRC32")
    mine = [e for e in range(12) if bookie in (ensemble[e % 3], ensemble[(e + 1) % 3])]
    assert [eid for eid, _ in stored] == mine
    assert [p for _, p in stored] == [f"copy-{e}".encode() for e in mine]


# -- fencing both ways -------------------------------------------------------------------------------

def test_embedlog_recovery_fences_a_java_writer_on_embedlog_bookies(setup):
    """A Java writer (v2) on embedlog bookies; embedlog's recovery closes the ledger at its
    last acknowledged entry; the writer's next add fails LedgerFenced (-101)."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    proc = setup.bk.java_client_popen("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                      digest="CRC32C", password=PASSWORD, stdin=True,
                                      no_close=True, v2=True)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    result = DriverResult()
    try:
        send_lines(proc, entries(10, "fence"))
        driver_lines(proc, result, lambda r: len(r.acked) == 10, "10 acks")
        recovered = setup.client.open_ledger(result.ledger_id, PW, recovery=True)
        assert recovered.is_closed and recovered.last_add_confirmed == 9
        send_lines(proc, [b"after-fence"])
        assert finish(proc, result) == 2, result.lines
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert result.error_code == -101, result.lines


def test_java_recovery_fences_an_embedlog_writer(setup):
    """embedlog's client writes a ledger on the same bookies; BookKeeper's recovery open
    (over v3) fences and closes it; embedlog's next append fails fenced."""
    w = setup.client.create_ledger(3, 2, 2, digest="crc32c", password=PW)
    for p in entries(8, "el"):
        w.append(p)
    closed = setup.bk.java_client("close", w.ledger_id, password=PASSWORD)
    assert closed.closed and closed.lac == 7, closed.lines
    with pytest.raises(LedgerFencedError):
        w.append(b"after")


# -- idle connections, hostile clients ----------------------------------------------------------------

def raw(setup, i: int) -> socket.socket:
    s = socket.create_connection(setup.address(i), timeout=20)
    return s


def test_hostile_frames_close_the_connection_and_lose_nothing(setup):
    """Malformed v3 and v2 frames (garbage protobuf, wrong wire types, short packets, an
    unknown v2 opcode, a frame over 5 MiB, a v3 add whose entry names another id) get an
    error or a closed connection; the bookie goes on serving and what it held reads back."""
    w = setup.client.create_ledger(3, 3, 3, digest="crc32c", password=PW)
    for p in entries(10, "keep"):
        w.append(p)
    w.close()
    lid = w.ledger_id.ledger_id
    frames = [
        b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",          # v3: an overlong varint
        b"\x0a\x02\x08\x03",                                      # v3: header without operation
        b"\x0a\x06\x08\x03\x10\x02\x18\x01\xaa\x06\x03\x08",     # v3: add, truncated sub
        b"\x02\x01\x00\x00" + b"k" * 10,                         # v2: ADDENTRY cut in its key
        b"\x02\x02\x00\x01" + b"\0" * 16,                        # v2: fencing read, no key
        b"\x02\x09\x00\x00" + b"\0" * 16,                        # v2: opcode 9
        b"\x03\x04\x00\x00" + b"\0" * 8,                         # v2: READ_LAC has no v2 form
    ]
    for frame in frames:
        s = raw(setup, 0)
        s.sendall(struct.pack(">I", len(frame)) + frame)
        assert closed_by_peer(s), frame
        s.close()
    # a frame over BookKeeper's 5 MiB: refused from its length alone
    s = raw(setup, 1)
    s.sendall(struct.pack(">I", 6 << 20) + b"\x0a" + b"\0" * 1000)
    assert closed_by_peer(s)
    s.close()
    # an add whose entry is another ledger's, and one with a wrong key: statuses, not crashes
    s = raw(setup, 2)
    entry = struct.pack(">qqqq", lid + 1000, 0, -1, 1) + b"\0" * 4 + b"x"
    s.sendall(E.encode_request(7, W.ADD_ENTRY, ledger_id=lid, entry_id=0,
                               master_key=KEY, body=entry))
    s.sendall(E.encode_request(8, W.ADD_ENTRY, ledger_id=lid, entry_id=10,
                               master_key=b"w" * 20,
                               body=struct.pack(">qqqq", lid, 10, 9, 1) + b"\0" * 4 + b"y"))
    got = {}
    buf = b""
    while len(got) < 2:
        data = s.recv(65536)
        assert data
        buf += data
        resps, pos, err = W.decode_responses(buf)
        assert err is None
        buf = buf[pos:]
        got.update({r.txn_id: r.status for r in resps})
    assert got[7] == W.EBADREQ and got[8] in (W.EUA, W.EFENCED)
    s.close()
    again = setup.client.open_ledger(w.ledger_id, PW)
    assert [e.data for e in again.read(0, 9)] == entries(10, "keep")
    after = setup.bk.java_client("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                 password=PASSWORD, count=5, v2=True)
    assert after.acked == list(range(5))


def test_idle_java_connections_are_kept_past_the_idle_timeout(setup):
    """The bookies close idle embedlog connections after 1 s (GOAWAY); a BookKeeper client's
    connection is never closed for idleness (BookKeeper's bookie closes none): a writer idle
    for three idle timeouts writes on without an ensemble change."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    proc = setup.bk.java_client_popen("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                      password=PASSWORD, stdin=True, v2=True)
    result = DriverResult()
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    try:
        send_lines(proc, entries(3, "idle"))
        driver_lines(proc, result, lambda r: len(r.acked) == 3, "3 acks")
        idle_until = time.monotonic() + 3.5          # the idle timeout is 1 s
        while time.monotonic() < idle_until:
            time.sleep(0.1)
        send_lines(proc, [b"idle-3", b"idle-4"])
        driver_lines(proc, result, lambda r: len(r.acked) == 5, "5 acks")
        assert finish(proc, result) == 0
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(result.ensembles) == 1 or all(v == result.ensembles[0]
                                             for v in result.ensembles.values()), result.ensembles


@pytest.mark.newest_bookkeeper
def test_idle_v3_connections_give_their_slots_to_a_new_java_client(setup):
    """1,152 BookKeeper v3 connections (max_connections + 128) to every embedlog bookie, each
    of which sent one GET_BOOKIE_INFO and went idle: a new Java client still makes all 20 of
    its adds (it got 0 of 20 before: every slot was taken for ever), as does a new embedlog
    client; the least recently used idle connection gives its slot. A Java writer that wrote
    before the flood and stayed idle through it goes on without an ensemble change (if its
    idle connection gave way, its next add opened a new one)."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    from embedlog.harness.hostile import idle_connections
    proc = setup.bk.java_client_popen("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                      password=PASSWORD, stdin=True)
    result = DriverResult()
    watchdog = threading.Timer(240, proc.kill)
    watchdog.start()
    socks = []
    try:
        send_lines(proc, entries(3, "before"))
        driver_lines(proc, result, lambda r: len(r.acked) == 3, "3 acks")
        for i in range(len(setup.lc)):
            host, port = setup.address(i)
            socks += idle_connections(f"{host}:{port}", 1152,
                                      [f"127.0.{10 + i}.{k}" for k in range(1, 10)], ["v3"])
        made = setup.bk.java_client("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                    password=PASSWORD, count=20, check=False)
        assert made.acked == list(range(20)), made.lines
        w = setup.client.create_ledger(3, 2, 2, password=PW)
        assert [w.append(p) for p in entries(5, "embedlog")] == list(range(5))
        w.close()
        send_lines(proc, [f"after-{i}".encode() for i in range(3)])
        driver_lines(proc, result, lambda r: len(r.acked) == 6, "6 acks")
        assert finish(proc, result) == 0
    finally:
        watchdog.cancel()
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(result.ensembles) == 1 or all(v == result.ensembles[0]
                                             for v in result.ensembles.values()), result.ensembles


# -- Pulsar's settings; the explicit LAC across a SIGKILL -----------------------------------------

PULSAR_METADATA = {"application": b"pulsar", "component": b"managed-ledger",
                   "pulsar/managed-ledger": b"public/default/persistent/topic"}


def test_pulsar_settings_then_the_explicit_lac_survives_sigkill(setup):
    """Pulsar's client settings on embedlog bookies: v2 for adds and reads (its v3 pool for
    WRITE_LAC and READ_LAC), CRC32C, an empty password, custom metadata, explicitLacInterval
    100 ms, a tailing reader polling readLastAddConfirmed, and (4.17 on: 4.16 has no batch
    read API) batch reads of an E = Qw ledger, served as v2 BATCH_READ_ENTRY requests.

    The reader runs after the writer and every bookie of the ensemble were SIGKILLed and
    restarted: readExplicitLastConfirmed still gets 29 (one past what the last entry
    carries) because the bookies keep the WRITE_LAC body (index header, synced before the
    answer), as BookKeeper keeps it (journalled); with it the reader reads entry 29."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    bk, lc, client = setup.bk, setup.lc, setup.client
    batch = tuple(map(int, bk.version.split("."))) >= (4, 17)
    meta = ",".join(f"{k}={v.decode()}" for k, v in PULSAR_METADATA.items())
    writer = bk.java_client_popen("create", ensemble=3, write_quorum=3, ack_quorum=2,
                                  digest="CRC32C", password="", stdin=True, no_close=True,
                                  v2=True, explicit_lac_ms=100, custom_metadata=meta)
    tail = None
    watchdog = threading.Timer(120, writer.kill)
    watchdog.start()
    result, tailed = DriverResult(), DriverResult()
    try:
        send_lines(writer, entries(20, "pulsar"))
        driver_lines(writer, result, lambda r: len(r.acked) == 20, "20 acks")
        lid, ensemble = result.ledger_id, result.ensembles[0]
        # entry 19 carries LAC 18: a LAC poller reads 0..18 until the next add
        tail = bk.java_client_popen("tail", lid, count=29, poll_ms=50, idle_ms=60000,
                                    poll_lac=True, v2=True)
        driver_lines(tail, tailed, lambda r: len(r.entries) >= 19, "19 polled entries")
        send_lines(writer, [f"pulsar-{i}".encode() for i in range(20, 30)])
        driver_lines(writer, result, lambda r: len(r.acked) == 30, "30 acks")
        driver_lines(tail, tailed, lambda r: len(r.entries) >= 29, "29 polled entries")
        assert tail.wait(timeout=30) == 0
        assert tailed.entries == list(enumerate(entries(29, "pulsar")))
        # the writer's WRITE_LAC (29) is on every bookie of the ensemble, its body on disk
        mine = client.open_ledger(lid, b"", recovery=False)
        wait_until(lambda: mine.read_lac() == 29, what="the explicit LAC 29")
        idx = [lc.index_of(b) for b in ensemble]
        wait_until(lambda: all(lac_body_on_disk(lc, i, lid) is not None for i in idx),
                   what="the WRITE_LAC bodies in the index headers")
    finally:
        watchdog.cancel()
        for p in (writer, tail):              # the writer dies as a broker does: no close
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    # every copy of the explicit LAC's body dies with its bookie unless it was kept
    for i in idx:
        lc.kill_bookie(i)
    parallel(*[lambda i=i: lc.restart_bookie(i) for i in idx])
    read = bk.java_client("read", lid, v2=True, explicit_lac=True, batch_read=batch,
                          batch=10 if batch else None)
    served = client.bookie_info(ensemble)
    assert read.custom_metadata == PULSAR_METADATA, read.lines
    assert read.lac == 28 and read.explicit_lac == 29, read.lines
    assert read.entries == list(enumerate(entries(30, "pulsar")))
    batches = sum(served[b]["server"].get("bk_batch_reads", 0) for b in ensemble)
    if batch:
        assert read.batches and max(n for _, n in read.batches) > 1, read.batches
        assert batches >= len(read.batches), (batches, read.batches)
    else:
        assert batches == 0


# -- per-message faults on BookKeeper connections ----------------------------------------------------

# on the faulted bookie: its 3rd add answered 0.8 s late, its 12th answered EIO, its 20th
# stored but never answered; its 1st read answered EIO, its 2nd never, its 3rd 0.8 s late
MESSAGE_FAULTS = "bkserver.add=delay:3:800|error:12|drop:20,bkserver.read=error:1|drop:2|delay:3:800"


@pytest.mark.newest_bookkeeper
def test_message_faults_on_java_connections_lose_nothing(setup):
    """Two Java writers (v3 and v2, one add at a time, 3 s add timeout) on 3/3/3 ledgers
    whose ensembles share bookie X; X is restarted with message failpoints armed
    (MESSAGE_FAULTS). Writer A meets the late answer (no change) and the EIO (it replaces
    X); writer B meets the lost answer (its add times out: it replaces X). Qa = Qw: with
    Qa < Qw a Java client ignores a failure that comes after its ack quorum (it only
    counts the entry under-replicated), so the faults could pass unseen. Every entry of
    both reads back through BookKeeper's reader, whose first three reads on X meet an EIO,
    a lost answer and a late one; X goes on serving: BookieShell reads its copy of B,
    the add whose answer was lost included."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    bk, lc = setup.bk, setup.lc
    procs = [bk.java_client_popen("create", ensemble=3, write_quorum=3, ack_quorum=3,
                                  digest="CRC32C", password=PASSWORD, stdin=True,
                                  add_timeout_s=3, v2=v2) for v2 in (False, True)]
    results = [DriverResult(), DriverResult()]
    watchdog = threading.Timer(120, lambda: [p.kill() for p in procs])
    watchdog.start()
    x = None
    clean = False
    try:
        for p, r in zip(procs, results):
            driver_lines(p, r, lambda r: r.ensembles, "an ensemble")
        x = sorted(set(results[0].ensembles[0]) & set(results[1].ensembles[0]))[0]
        # armed in X's process only: os.environ reached the next version's bookies, which
        # start in the background meanwhile, and armed faults on bookies the test did not pick
        lc.restart_bookie(lc.index_of(x), env={"EMBEDLOG_FAILPOINTS": MESSAGE_FAULTS})
        a, b = [entries(15, tag) for tag in ("fa", "fb")]
        for p, r, payloads in zip(procs, results, (a, b)):   # one writer after the other:
            send_lines(p, payloads)                          # X counts A's adds first
            driver_lines(p, r, lambda r: len(r.acked) == 15, "15 acks")
            assert finish(p, r) == 0, r.lines
            assert r.acked == list(range(15)) and r.closed and r.lac == 14
            assert len(r.ensembles) >= 2 and x not in list(r.ensembles.values())[-1], (
                r.ensembles, fired_on(lc, x))
        got = java_read_many(bk, [r.ledger_id for r in results])
        for r, payloads in zip(results, (a, b)):
            assert got[r.ledger_id] == (14, list(enumerate(payloads))), got[r.ledger_id]
        fired = fired_on(lc, x)
        assert sorted(fired) == sorted([("bkserver.add", "delay"), ("bkserver.add", "error"),
                                        ("bkserver.add", "drop"), ("bkserver.read", "error"),
                                        ("bkserver.read", "drop"), ("bkserver.read", "delay")]), fired
        # B's adds on X: entries 0..7 (7's answer was lost) before X was replaced
        held = bk.read_ledger(results[1].ledger_id, bookie=x, last=7, digest="CRC32C")
        assert held == list(enumerate(b[:8])), held
        clean = True
    finally:
        watchdog.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if x is not None and not clean:
            lc.restart_bookie(lc.index_of(x))          # unarmed, for the tests after this one


# -- a bookie made read-only mid-write, recoveries racing ------------------------------------------

def test_embedlog_bookie_read_only_mid_write_java_changes_ensemble(setup):
    """A Java writer (v2, Pulsar's) on 3 of the 4 embedlog bookies; one of its ensemble turns
    read-only after 10 acknowledged entries (its registration moves to available/readonly
    and its adds are answered EREADONLY, as BookKeeper's WriteEntryProcessor answers them):
    the writer replaces it with the spare and loses nothing; every entry reads back over v3
    and through embedlog's client (entries 0..9 partly from the read-only bookie)."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    bk, lc = setup.bk, setup.lc
    proc = bk.java_client_popen("create", ensemble=3, write_quorum=3, ack_quorum=2,
                                digest="CRC32C", password=PASSWORD, stdin=True, v2=True,
                                outstanding=4)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    result = DriverResult()
    victim = None
    try:
        send_lines(proc, entries(10, "ro"))
        driver_lines(proc, result, lambda r: len(r.acked) == 10, "10 acks")
        victim = result.ensembles[0][1]
        lc.set_read_only(lc.index_of(victim))       # returns once registered read-only
        send_lines(proc, [f"ro-{i}".encode() for i in range(10, 30)])
        driver_lines(proc, result, lambda r: len(r.acked) == 30, "30 acks")
        assert finish(proc, result) == 0, result.lines
        assert sorted(result.acked) == list(range(30))
        assert len(result.ensembles) >= 2 and victim not in list(result.ensembles.values())[-1]
        read = bk.java_client("read", result.ledger_id, password=PASSWORD)
        assert read.closed and read.lac == 29 and read.entries == list(enumerate(entries(30, "ro")))
        r = setup.client.open_ledger(result.ledger_id, PW, recovery=False)
        assert [e.data for e in r.read(0, 29)] == entries(30, "ro")
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if victim is not None:
            lc.set_read_only(lc.index_of(victim), False)


def test_java_recovery_writes_back_to_a_read_only_embedlog_bookie(setup):
    """BookKeeper's read-only bookie still takes high-priority adds (WriteEntryProcessor's
    isAvailableForHighPriorityWrites): a recovery's write-backs (RECOVERY_ADD, priority set
    over v3, FLAG_HIGH_PRIORITY over v2). A Java writer (3/3/2) SIGKILLed after 20 acks, one
    bookie of its ensemble turned read-only, BookKeeper's recovery (v2 on 4.16, v3 on 4.17)
    writes entry 19 (past the LAC 18 it carries) back to all three and closes with the
    ensemble unchanged: refused, the read-only bookie would have been replaced."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    bk, lc = setup.bk, setup.lc
    proc = bk.java_client_popen("create", ensemble=3, write_quorum=3, ack_quorum=2,
                                digest="CRC32C", password=PASSWORD, stdin=True, no_close=True)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    result = DriverResult()
    ro = None
    try:
        send_lines(proc, entries(20, "hp"))
        driver_lines(proc, result, lambda r: len(r.acked) == 20, "20 acks")
        proc.kill()
        proc.wait()
        ro = result.ensembles[0][2]
        lc.set_read_only(lc.index_of(ro))
        closed = bk.java_client("close", result.ledger_id, password=PASSWORD,
                                v2=bk.version.startswith("4.16"))
        assert closed.closed and closed.lac == 19, closed.lines
        assert closed.ensembles == result.ensembles, (closed.ensembles, result.ensembles)
        r = setup.client.open_ledger(result.ledger_id, PW, recovery=False)
        assert [e.data for e in r.read(0, 19)] == entries(20, "hp")
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if ro is not None:
            lc.set_read_only(lc.index_of(ro), False)


def test_java_recovery_races_embedlog_recovery_on_embedlog_bookies(setup):
    """A Java writer (v3, 8 adds in flight) SIGKILLed after 20 acks; BookKeeper's recovery
    and embedlog's start at once (embedlog's the moment the Java client has marked the ledger
    in recovery). One closed metadata: both clients that finish report its last entry and
    length, no acknowledged entry is lost, BookieShell's metadata says the same."""
    from embedlog.meta.api import LedgerState
    from embedlog.harness.peers.bookkeeper import DriverResult
    bk, client = setup.bk, setup.client
    payloads = entries(60, "race")
    proc = bk.java_client_popen("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                digest="CRC32", password=PASSWORD, stdin=True, no_close=True,
                                outstanding=8)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    result = DriverResult()
    try:
        send_lines(proc, payloads)
        driver_lines(proc, result, lambda r: len(r.acked) >= 20, "20 acks")
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    for line in proc.stdout:                     # acks printed before it died
        result.feed(line)
    acked = max(result.acked)
    lid = result.ledger_id
    mine: dict = {}

    def embedlog_recovery():
        wait_until(lambda: client.ledger_metadata(lid).state != LedgerState.OPEN,
                   timeout_s=60, interval_s=0.002, what="the Java recovery to begin")
        try:
            r = client.open_ledger(lid, PW, recovery=True)
            mine["got"] = ("ok", r.last_add_confirmed, r.length)
        except EmbedlogError as exc:             # losing the race, in embedlog's own terms
            mine["got"] = ("error", type(exc).__name__, str(exc))

    racer = threading.Thread(target=embedlog_recovery, daemon=True)
    racer.start()
    java = bk.java_client("close", lid, password=PASSWORD, check=False)
    racer.join(90)
    assert "got" in mine
    final = client.ledger_metadata(lid)
    assert final.state == LedgerState.CLOSED and final.last_entry_id >= acked, (final, acked)
    last = final.last_entry_id
    length = sum(len(p) for p in payloads[:last + 1])
    assert final.length == length
    got = mine["got"]
    assert got[0] == "ok" or got[1] in ("BadVersionError", "LedgerRecoveryError"), got
    if got[0] == "ok":
        assert got[1:] == (last, length), (got, final)
    if java.returncode == 0:
        assert java.closed and (java.lac, java.length) == (last, length), java.lines
    else:
        assert java.error_code is not None, java.lines
    meta = bk.ledger_metadata(lid)
    assert "state=CLOSED" in meta and f"lastEntryId={last}," in meta and \
        f"length={length}," in meta, meta
    r = client.open_ledger(lid, PW, recovery=False)
    assert [e.data for e in r.read(0, last)] == payloads[:last + 1]


# -- a bookie SIGKILLed mid-write (last: it leaves one bookie down) -----------------------------------

def test_embedlog_bookie_killed_mid_write_java_changes_ensemble(setup):
    """A Java writer (v3) on 3 of the 4 embedlog bookies; one of its ensemble is SIGKILLed
    after 10 acknowledged entries; the writer replaces it with the spare and every entry
    reads back (over v2)."""
    from embedlog.harness.peers.bookkeeper import DriverResult
    bk, lc = setup.bk, setup.lc
    proc = bk.java_client_popen("create", ensemble=3, write_quorum=2, ack_quorum=2,
                                digest="CRC32", password=PASSWORD, stdin=True)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    result = DriverResult()
    try:
        send_lines(proc, entries(10, "kill"))
        driver_lines(proc, result, lambda r: len(r.acked) == 10, "10 acks")
        victim = result.ensembles[0][0]
        lc.kill_bookie(lc.index_of(victim))
        send_lines(proc, [f"kill-{i}".encode() for i in range(10, 30)])
        driver_lines(proc, result, lambda r: len(r.acked) == 30, "30 acks")
        assert finish(proc, result) == 0, result.lines
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(result.ensembles) >= 2 and victim not in list(result.ensembles.values())[-1]
    read = bk.java_client("read", result.ledger_id, password=PASSWORD, v2=True)
    assert [p for _, p in read.entries] == entries(30, "kill")
