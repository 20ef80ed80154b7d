"""Cross recovery between embedlog's client and BookKeeper's Java client on real Java
bookies, 4.17.2 and 4.16.6 (issue 28 item 4 and its attacks):

- a Java writer (BkDriver) SIGKILLed mid-ledger is recovered by embedlog: closed at the
  last entry the writer saw acknowledged or later, read back byte for byte, and
  BookieShell and BookKeeper's Java reader agree on the last entry and the length;
- an embedlog writer (a child process) SIGKILLed mid-ledger is recovered by the Java
  client, and embedlog's reader sees the same closed metadata; a live embedlog writer is
  fenced by the Java client's recovery and acknowledged nothing past its close;
- either side's close rewrites only the closing fields of BookKeeper's record (the znode
  bytes compared);
- attacks: Java writers killed mid-ensemble-change (right after their new ensemble is
  written, and just before, so embedlog's recovery changes the ensemble itself); an
  embedlog recovery racing a Java one on a ledger whose last entry is on one bookie only
  (either may decide it exists; one closed metadata wins); per-message faults (delays,
  lost answers, errors) and cut connections, through a TCP proxy in front of every Java
  bookie, under an embedlog writer and then its recovery: nothing acknowledged is lost.

One cluster of 3 Java bookies per version (module-scoped; the test that kills a bookie
for good runs last). Payloads are known functions of the entry id, so whatever a killed
writer had in flight is checked too. Under CI=true a missing java, jar or ZooKeeper fails.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from embedlog import Client
from embedlog.errors import EmbedlogError, LedgerClosedError, LedgerFencedError
from embedlog.harness.peers import jars
from embedlog.harness.peers.bookkeeper import DriverResult
from embedlog.harness.faults import Faults
from embedlog.harness.proxy import FaultProxy
from embedlog._native.format import LedgerId
from embedlog.meta.api import LedgerState
from embedlog.meta.bookkeeper import ledger_metadata as bkmd
from embedlog.meta.bookkeeper import protobuf as pb
from embedlog.meta.bookkeeper.layout import parse_layout
from embedlog.meta.bookkeeper.tree import BookKeeperTree
from bk_writer_child import payload as py_payload      # the child's own payloads
from prestart import Prestart
from support.servers import ServerMissing, require_peer, skip_unless_ci

PASSWORD = "recovery-pw"
PW = PASSWORD.encode()
HERE = os.path.dirname(os.path.abspath(__file__))

WATCHDOG_S = 90.0           # a writer still alive this long after its start is killed


def java_payload(i: int) -> bytes:
    """What the Java writers here append as entry i (8 to 60 bytes)."""
    return (b"java-%d;" % i) * (1 + i % 5)


def make_cluster(version: str, zk_hosts: str):
    """3 Java bookies on a root of their own, a raw ZooKeeper client and embedlog's."""
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    try:
        cluster = BookKeeperCluster(version, bookies=3, zk_hosts=zk_hosts,
                                    root=f"/recovery{version.replace('.', '')}")
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    from kazoo.client import KazooClient  # lazy: the optional 'zk' extra, as embedlog's store
    cluster.zk = KazooClient(hosts=zk_hosts, timeout=10.0)
    cluster.embedlog = None
    try:
        cluster.driver_command()[1]()   # the driver's jar and archive, before JVMs run in parallel
        cluster.zk.start(timeout=30)
        cluster.ledger_layout = parse_layout(cluster.zk.get(f"{cluster.root}/LAYOUT")[0]).ledger_layout
        cluster.embedlog = Client(cluster.metadata_uri, add_timeout_s=20, read_timeout_s=20)
    except BaseException:
        close_cluster(cluster)
        raise
    return cluster


def close_cluster(cluster) -> None:
    if cluster.embedlog is not None:
        cluster.embedlog.close()
    cluster.zk.stop()
    cluster.zk.close()
    cluster.close()


CLUSTERS = Prestart(jars.BOOKKEEPER_VERSIONS, make_cluster, close_cluster)


@pytest.fixture(scope="module", params=jars.BOOKKEEPER_VERSIONS)
def bk(request, zk):
    """One version's cluster; the next version's starts meanwhile (tests/interop/prestart.py)."""
    require_peer(f"bookkeeper-{request.param}")
    cluster = CLUSTERS.take(request.param, zk.hosts,
                            ready=lambda v: jars.is_fetched(f"bookkeeper-{v}"))
    yield cluster
    close_cluster(cluster)


def parallel(*calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def wait_for(cond, timeout_s: float = 30.0, what: str = "condition", step_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step_s)


def stored_fields(cluster, lid: int) -> dict[int, list[bytes]]:
    """The ledger's metadata record as stored on ZooKeeper: each LedgerMetadataFormat field
    number's fields, tag and value bytes as written."""
    path = BookKeeperTree(cluster.root, cluster.ledger_layout).ledger_path(LedgerId.coerce(lid))
    data, _ = cluster.zk.get(path)
    version, at = bkmd.read_header(data)
    assert version == 3, data[:40]
    fields: dict[int, list[bytes]] = {}
    for f in pb.parse(pb.read_delimited(data, at)[0]):
        fields.setdefault(f.number, []).append(f.raw)
    return fields


def rewritten(before: dict, after: dict) -> set[int]:
    """Which fields a rewrite changed (every other field kept byte for byte)."""
    return {n for n in set(before) | set(after) if before.get(n) != after.get(n)}


def closed_as(last: int, length: int) -> dict:
    """shell_metadata of a ledger closed at ``last`` with ``length`` bytes."""
    return {"state": "CLOSED", "lastEntryId": str(last), "length": str(length)}


def shell_metadata(cluster, lid: int) -> dict:
    """state, lastEntryId and length of BookieShell's ``ledgermetadata`` of ``lid``."""
    meta = cluster.ledger_metadata(lid)
    return {k: re.search(rf"\b{k}=([^,}}]*)", meta).group(1) for k in ("state", "lastEntryId", "length")}


# -- writers that are killed ------------------------------------------------------------------------

_WRITERS: list = []            # every KilledWriter started: the test's teardown kills what lives


@pytest.fixture(autouse=True)
def _kill_leftover_writers():
    yield
    while _WRITERS:
        _WRITERS.pop()._kill_quietly()


class KilledWriter:
    """A writer process appending entries until it is SIGKILLed, whose output lines (ledger
    id, ensembles, acks) are read as they come by a thread of ours."""

    def __init__(self, proc: subprocess.Popen, feed: bool):
        _WRITERS.append(self)
        self.proc = proc
        self.ledger_id: int | None = None
        self.ensemble: list[str] = []
        self.acked: list[int] = []
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.stderr: list[str] = []
        self._cv = threading.Condition()
        self._done = False
        self._watchdog = threading.Timer(WATCHDOG_S, self._kill_quietly)
        self._watchdog.start()
        threading.Thread(target=self._read, daemon=True).start()
        # drained as it comes: a JVM blocked on a full stderr pipe would stop writing
        threading.Thread(target=lambda: self.stderr.extend(proc.stderr), daemon=True).start()
        if feed:
            threading.Thread(target=self._feed, daemon=True).start()

    def _kill_quietly(self):
        self._watchdog.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _feed(self):
        """Java's --stdin: one hex line an entry, for as long as the writer takes them."""
        try:
            for i in range(1_000_000):
                self.proc.stdin.write(java_payload(i).hex() + "\n")
        except (OSError, ValueError):     # it was killed: the pipe is gone
            pass

    def _read(self):
        for line in self.proc.stdout:
            word, _, rest = line.strip().partition(" ")
            with self._cv:
                self.lines.append(line.strip())
                if word == "ledger":
                    self.ledger_id = int(rest)
                elif word == "ensemble":
                    # Java: "ensemble FIRST B1,B2"; the child: "ensemble B1,B2"
                    self.ensemble = rest.split(" ")[-1].split(",")
                elif word == "ack":
                    self.acked.append(int(rest))
                elif word in ("error", "usage"):
                    self.errors.append(rest)
                self._cv.notify_all()
        with self._cv:
            self._done = True
            self._cv.notify_all()

    def wait_acks(self, n: int, timeout_s: float = 60.0) -> None:
        with self._cv:
            ok = self._cv.wait_for(lambda: len(self.acked) >= n or self.errors or self._done,
                                   timeout_s)
            assert ok and len(self.acked) >= n, (f"{len(self.acked)} acks of {n}: "
                                                 f"{self.lines[-5:]} {self.stderr_tail()}")

    def kill(self) -> int:
        """SIGKILL it; every ack it printed before dying is read; the highest acked id."""
        self._kill_quietly()
        with self._cv:
            self._cv.wait_for(lambda: self._done, 10)
        assert not self.errors, self.errors
        return max(self.acked)

    def stderr_tail(self) -> str:
        return "".join(self.stderr[-20:])


def java_writer(cluster, ensemble: int, write_quorum: int, ack_quorum: int,
                digest: str = "CRC32C", outstanding: int = 16, v2: bool = False) -> KilledWriter:
    proc = cluster.java_client_popen("create", ensemble=ensemble, write_quorum=write_quorum,
                                     ack_quorum=ack_quorum, digest=digest, password=PASSWORD,
                                     outstanding=outstanding, no_close=True, stdin=True, v2=v2)
    return KilledWriter(proc, feed=True)


def embedlog_writer(cluster, ensemble: int, write_quorum: int, ack_quorum: int,
                    digest: str = "crc32c") -> KilledWriter:
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "bk_writer_child.py"),
                             cluster.metadata_uri, str(ensemble), str(write_quorum),
                             str(ack_quorum), digest, PASSWORD],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1)
    return KilledWriter(proc, feed=False)


def written(payload, last: int) -> list[tuple[int, bytes]]:
    """(entry id, payload) of entries 0..last as their writer made them."""
    return [(i, payload(i)) for i in range(last + 1)]


def read_back(handle, last: int) -> list[tuple[int, bytes]]:
    """(entry id, data) of entries 0..last read through embedlog's handle."""
    return [(e.entry_id, e.data) for e in handle.read(0, last)] if last >= 0 else []


def check_embedlog_recovered(cluster, lid: int, acked: int, payload) -> int:
    """Recover ``lid`` with embedlog's client: closed at ``acked`` or later, every entry
    byte for byte, the length theirs; the last entry."""
    r = cluster.embedlog.open_ledger(lid, PW, recovery=True)
    last = r.last_add_confirmed
    assert r.is_closed and last >= acked, (last, acked)
    assert read_back(r, last) == written(payload, last)
    assert r.length == sum(len(payload(i)) for i in range(last + 1))
    return last


def check_java_agrees(cluster, lids_lasts: dict[int, int], payload, shell: tuple = ()) -> None:
    """BookKeeper's Java reader (and BookieShell's metadata, for the ledgers in ``shell``)
    see each ledger closed at its last entry, with every entry and the same length (the
    JVMs at once)."""
    lids = list(lids_lasts)
    answers = parallel(*[lambda lid=lid: cluster.java_client("read", lid, password=PASSWORD)
                         for lid in lids],
                       *[lambda lid=lid: shell_metadata(cluster, lid) for lid in shell])
    shells = dict(zip(shell, answers[len(lids):]))
    for lid, read in zip(lids, answers):
        last = lids_lasts[lid]
        length = sum(len(payload(i)) for i in range(last + 1))
        assert read.closed and read.lac == last and read.length == length, (lid, read.lines[:6])
        assert read.entries == written(payload, last), lid
        if lid in shells:
            assert shells[lid] == closed_as(last, length), lid


# -- 1. a Java writer killed, embedlog recovers -------------------------------------------------------

def test_java_writer_killed_embedlog_recovers(bk):
    """A 3/2/2 Java writer on BookKeeper's v2 protocol (as Pulsar runs it) and a 1/1/1 MAC one
    on v3, 16 adds in flight, SIGKILLed after 40 acks. embedlog's recovery rewrites only the
    state, the last entry and the length of BookKeeper's record (every other field as
    BookKeeper wrote it, byte for byte)."""
    writers = [java_writer(bk, 3, 2, 2, "CRC32C", v2=True), java_writer(bk, 1, 1, 1, "MAC")]
    for w in writers:
        w.wait_acks(40)
    acked = [w.kill() for w in writers]
    lasts = {}
    for w, a in zip(writers, acked):
        assert bk.embedlog.ledger_metadata(w.ledger_id).state == LedgerState.OPEN
        before = stored_fields(bk, w.ledger_id)
        lasts[w.ledger_id] = check_embedlog_recovered(bk, w.ledger_id, a, java_payload)
        assert rewritten(before, stored_fields(bk, w.ledger_id)) <= {
            bkmd.LENGTH, bkmd.LAST_ENTRY_ID, bkmd.STATE}
    check_java_agrees(bk, lasts, java_payload, shell=(writers[0].ledger_id,))


# -- 2. an embedlog writer killed, Java recovers -----------------------------------------------------

def test_embedlog_writer_killed_java_recovers(bk):
    """An embedlog writer process (3/2/2, 16 adds in flight) SIGKILLed after 40 acks; BookKeeper's
    client recovers it; embedlog's reader sees the same closed metadata."""
    w = embedlog_writer(bk, 3, 2, 2, "crc32")
    w.wait_acks(40)
    acked = w.kill()
    lid = w.ledger_id
    assert bk.embedlog.ledger_metadata(lid).state == LedgerState.OPEN
    before = stored_fields(bk, lid)
    recovered = bk.java_client("read", lid, password=PASSWORD, recover=True)
    # BookKeeper's rewrite of embedlog's record changes only the closing fields, and the
    # creator token: BookKeeper 4.16 and 4.17 write cToken 0 whenever they rewrite a record,
    # their own ledgers' too (embedlog keeps it; it only counts while the version is 0)
    assert rewritten(before, stored_fields(bk, lid)) <= {bkmd.LENGTH, bkmd.LAST_ENTRY_ID,
                                                          bkmd.STATE, bkmd.CTOKEN}
    last = recovered.lac
    length = sum(len(py_payload(i)) for i in range(last + 1))
    assert recovered.closed and last >= acked and recovered.length == length, recovered.lines[:6]
    assert recovered.entries == written(py_payload, last)

    with ThreadPoolExecutor(1) as pool:
        shell = pool.submit(shell_metadata, bk, lid)        # a JVM, while embedlog reads
        r = bk.embedlog.open_ledger(lid, PW, recovery=False)
        assert r.is_closed and r.last_add_confirmed == last and r.length == length
        assert r.metadata.fragments == tuple((first, tuple(bs)) for first, bs in
                                             sorted(recovered.ensembles.items()))
        assert read_back(r, last) == written(py_payload, last)
        assert shell.result() == closed_as(last, length)


def fence_payload(i: int) -> bytes:
    return b"live-%d" % i


def test_java_recovery_fences_a_live_embedlog_writer(bk):
    """An embedlog writer (in this process, 2/2/2) keeps appending while BookKeeper's client
    recovers its ledger: the writer is stopped by LedgerFencedError (its close fails in
    embedlog's own terms), every entry it was told was acknowledged is at or below the
    Java client's close, and embedlog's reader sees that close."""
    c = Client(bk.metadata_uri, add_timeout_s=20, max_pending_adds=64)
    w = c.create_ledger(2, 2, 2, digest="crc32c", password=PW)
    lid = int(w.ledger_id)
    acked, failures = [], []
    writing = threading.Event()

    def write():
        futures = []
        try:
            for i in range(0, 1_000_000, 10):   # about a thousand entries a second
                futures += w.append_many_async([fence_payload(i + k) for k in range(10)])
                writing.set()
                time.sleep(0.01)
        except EmbedlogError as exc:            # the writer knows it is fenced
            failures.append(exc)
        writing.set()
        for f in futures:
            try:
                acked.append(f.result(30))
            except EmbedlogError as exc:
                failures.append(exc)

    t = threading.Thread(target=write, daemon=True)
    try:
        t.start()
        assert writing.wait(30)
        recovered = bk.java_client("read", lid, password=PASSWORD, recover=True)
        t.join(60)
        assert not t.is_alive()
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            w.close()
    finally:
        c.close()
    last = recovered.lac
    assert recovered.closed and recovered.entries == written(fence_payload, last)
    assert failures and all(isinstance(e, LedgerFencedError) for e in failures), failures[:3]
    assert sorted(acked) == list(range(len(acked))) and len(acked) - 1 <= last, (len(acked), last)
    r = bk.embedlog.open_ledger(lid, PW, recovery=False)
    assert r.is_closed and r.last_add_confirmed == last and r.length == recovered.length


# -- 3b. an embedlog recovery racing a Java one ------------------------------------------------------

def race_payload(i: int) -> bytes:
    return b"race-%d" % i


def half_written_ledger(cluster) -> tuple[int, str, str]:
    """A 2/2/2 ledger whose writer (embedlog's, in this process) was abandoned with entries
    0..19 acknowledged and entry 20 on one bookie only (the other never saw it): recoveries
    may find entry 20 or rule it out, depending on which bookie answers first."""
    faults = Faults()
    c = Client(cluster.metadata_uri, faults=faults, add_timeout_s=60,
               explicit_lac_interval_ms=10 ** 9)
    try:
        w = c.create_ledger(2, 2, 2, digest="crc32c", password=PW)
        for f in w.append_many_async([race_payload(i) for i in range(20)]):
            f.result(30)
        has, lacks = w.metadata.fragments[0][1]
        faults.drop(bookie=lacks, op="add", entries=(20, 20))
        stored = faults.delay(0, bookie=has, op="add", entries=(20, 20), direction="response")
        w.append_async(race_payload(20))
        assert stored.wait_passed(1, 30)
        return int(w.ledger_id), has, lacks
    finally:
        c.close()                       # the ledger stays open, as a dead writer's


def test_embedlog_recovery_races_java_recovery(bk):
    """Two races on half-written ledgers. embedlog's recovery hears the bookie without
    entry 20 first (its reads of the other are held back), so it rules entry 20 out and
    closes at 19; the Java client decides for itself (here it found entry 20 in every run
    and wrote it back). Each race ends in one closed metadata both clients agree on:

    - gated: embedlog's recovery fences, reads and is paused just before its closing
      compare-and-set; the Java client recovers and closes meanwhile; embedlog's CAS then
      fails on the version and it takes the Java client's close as its answer;
    - free: embedlog's recovery starts the moment the Java client has marked the ledger
      IN_RECOVERY and both run to their end at once; whichever closes second takes the
      other's close (here embedlog closed first in every run and the Java client, which
      had found entry 20, closed at 19 too)."""
    (gated_lid, gated_has, _), (free_lid, free_has, _) = parallel(lambda: half_written_ledger(bk),
                                                                  lambda: half_written_ledger(bk))
    faults = Faults()
    rc = Client(bk.metadata_uri, faults=faults, add_timeout_s=20, read_timeout_s=20,
                client_name="racer")
    for lid, has in ((gated_lid, gated_has), (free_lid, free_has)):
        faults.delay(5, ledger=lid, bookie=has, op="read", recovery=True)
    gate = faults.gate("close", ledger=gated_lid)
    outcome: dict = {}

    def recover(lid):
        try:
            r = rc.open_ledger(lid, PW, recovery=True)
            outcome[lid] = ("ok", r.last_add_confirmed, r.length)
        except EmbedlogError as exc:        # losing a race may fail, in embedlog's own terms
            outcome[lid] = ("error", type(exc).__name__, str(exc))

    def free_race():
        # go as soon as the Java client has marked the ledger in recovery
        wait_for(lambda: rc.ledger_metadata(free_lid).state != LedgerState.OPEN,
                 timeout_s=60, what="the Java recovery to begin", step_s=0.002)
        recover(free_lid)

    threads = [threading.Thread(target=recover, args=(gated_lid,), daemon=True),
               threading.Thread(target=free_race, daemon=True)]
    java_free = None
    try:
        threads[0].start()
        assert gate.wait_reached(30), faults.log
        threads[1].start()
        java_free = bk.java_client_popen("read", free_lid, password=PASSWORD, recover=True)
        java_gated = bk.java_client("read", gated_lid, password=PASSWORD, recover=True, check=False)
        gate.release()
        out, err = java_free.communicate(timeout=60)
        for t in threads:
            t.join(60)
    finally:
        faults.clear()
        if java_free is not None and java_free.poll() is None:
            java_free.kill()
        rc.close()
    free_java = DriverResult(returncode=java_free.returncode)
    for line in out.splitlines():
        free_java.feed(line)

    for lid, java in ((gated_lid, java_gated), (free_lid, free_java)):
        final = bk.embedlog.ledger_metadata(lid)
        assert final.state == LedgerState.CLOSED and final.last_entry_id in (19, 20), final
        last = final.last_entry_id
        length = sum(len(race_payload(i)) for i in range(last + 1))
        assert final.length == length
        mine = outcome[lid]
        assert mine[0] == "ok" or mine[1] in ("BadVersionError", "LedgerRecoveryError"), mine
        if mine[0] == "ok":
            assert mine[1:] == (last, length), (lid, mine, final)
        if java.returncode == 0:            # Java's handle and its reads say the same
            assert java.closed and java.lac == last and java.length == length, (lid, java.lines, err)
            assert java.entries == written(race_payload, last)
        else:                               # the Java side lost the race and said so
            assert java.error_code is not None, java.lines
    # the gated recovery lost its CAS and took the Java client's close
    assert outcome[gated_lid][0] == "ok" and gate.passed == 0, (outcome, faults.log)


# -- 3c. per-message faults and cut connections on the Java bookies' connections ---------------------

class _Rerouted:
    """A registration client whose Java bookies' addresses are FaultProxies in front of
    them: the bookie ids (in the ledgers' ensembles) stay the bookies' own."""

    def __init__(self, store, proxies: dict[str, FaultProxy]):
        self._store, self._proxies = store, proxies

    def get_all_bookies(self):
        regs = self._store.get_all_bookies()
        return [dataclasses.replace(r, info={**r.info, "address": self._proxies[r.bookie_id].address})
                if r.bookie_id in self._proxies else r for r in regs]

    def __getattr__(self, name):
        return getattr(self._store, name)


def proxied_client(cluster, proxies, faults, **config) -> Client:
    c = Client(cluster.metadata_uri, faults=faults, **config)
    c.metadata.registration_client = _Rerouted(c.metadata, proxies)
    return c


def ensemble_of(fragments, entry_id: int) -> tuple:
    """The bookies of the fragment ``entry_id`` is in."""
    return [bookies for first, bookies in fragments if first <= entry_id][-1]


def fault_payload(i: int) -> bytes:
    return (b"fault-%d/" % i) * (1 + i % 9)


def test_message_faults_and_cut_connections_lose_nothing_acknowledged(bk):
    """An embedlog writer (2/2/2 on 3 Java bookies, each behind a TCP proxy) appends 200
    entries while its messages are delayed, an add's answer is lost (the bookie stored it),
    an add is answered EIO after the bookie stored it, and every connection to a bookie of
    its ensemble is cut mid-stream; the writer changes its ensemble around each and
    acknowledges everything. Abandoned, it is recovered by embedlog's client through the
    same proxies with delayed fences and a lost recovery read: every acknowledged entry
    is there, and the Java reader agrees."""
    proxies = {bid: FaultProxy(int(bid.rsplit(":", 1)[1])) for bid in bk.bookie_ids}
    faults = Faults()
    c = proxied_client(bk, proxies, faults, add_timeout_s=2, read_timeout_s=5,
                       explicit_lac_interval_ms=10 ** 9, quarantine_s=0)
    try:
        w = c.create_ledger(2, 2, 2, digest="crc32", password=PW)
        lid = int(w.ledger_id)
        first, second = w.metadata.fragments[0][1]
        faults.delay(0.02, bookie=first, op="add", entries=(0, 99))
        lost = faults.drop(bookie=second, op="add", entries=(50, 50), direction="response")
        futures = [w.append_async(fault_payload(i)) for i in range(50)]
        futures.append(w.append_async(fault_payload(50)))   # its answer from `second` is lost
        futures += [w.append_async(fault_payload(i)) for i in range(51, 100)]
        assert lost.wait_hits(1, 30)
        for f in futures:
            f.result(60)
        # the bookie did the work and answered EIO: the writer replaces it
        faults.fail("EIO", op="add", entries=(120, 120), direction="response", count=1)
        futures = [w.append_async(fault_payload(i)) for i in range(100, 150)]
        for f in futures:
            f.result(60)
        # every connection to one bookie of the current ensemble cut with adds in flight:
        # its proxy holds what it is sent for a second, and is cut once they are sent
        victim = w.metadata.fragments[-1][1][0]
        proxies[victim].delay(1.0)
        sent = faults.delay(0, bookie=victim, op="add", entries=(150, 199))
        futures = [w.append_async(fault_payload(i)) for i in range(150, 200)]
        assert sent.wait_passed(1, 30)
        proxies[victim].cut()
        assert [f.result(60) for f in futures] == list(range(150, 200))
        proxies[victim].heal()
        changes = w.metadata.fragments
        # each fault replaced a bookie (a change before anything was acknowledged rewrites
        # the first fragment in place, as BookKeeper's does)
        assert second not in ensemble_of(changes, 50), (changes, faults.log)
        assert ensemble_of(changes, 120) != ensemble_of(changes, 99), (changes, faults.log)
        assert victim not in ensemble_of(changes, 150), (changes, faults.log)
    finally:
        c.close()                       # abandoned: the ledger stays open
    rfaults = Faults()
    rc = proxied_client(bk, proxies, rfaults, add_timeout_s=5, read_timeout_s=5)
    try:
        proxies[changes[-1][1][0]].delay(0.05)
        rfaults.delay(0.2, op="read_lac", recovery=True, count=1)
        rfaults.drop(op="read", recovery=True, count=1, direction="response")
        r = rc.open_ledger(lid, PW, recovery=True)
        last = r.last_add_confirmed
        assert r.is_closed and last >= 199
        assert read_back(r, last) == written(fault_payload, last)
    finally:
        rc.close()
        for p in proxies.values():
            p.close()
    check_java_agrees(bk, {lid: last}, fault_payload)


# -- 3a. Java writers killed mid-ensemble-change (kills a bookie: runs last) ------------------------

def test_java_writers_killed_mid_ensemble_change(bk):
    """Two 2/2/2 Java writers on 3 bookies, 8 adds in flight, share a bookie (two pairs of
    three always do). After 30 acks each: writer B is SIGKILLed, the shared bookie at once
    after it (B's ledger keeps the dead bookie in its only ensemble: embedlog's recovery must
    write back past it, changing the ensemble itself); writer A changes its ensemble and is
    SIGKILLed the moment its new ensemble is in the metadata, with its resent adds in flight.
    embedlog recovers both at or after their last acknowledged entry; Java agrees."""
    a = java_writer(bk, 2, 2, 2, "CRC32", outstanding=8)
    b = java_writer(bk, 2, 2, 2, "CRC32C", outstanding=8)
    a.wait_acks(30)
    b.wait_acks(30)
    shared = (set(a.ensemble) & set(b.ensemble)).pop()
    b_acked = b.kill()
    bk.kill_bookie(bk.bookie_ids.index(shared))
    wait_for(lambda: (len(bk.embedlog.ledger_metadata(a.ledger_id).fragments) > 1
                      or a.proc.poll() is not None),
             timeout_s=30, what="writer A's ensemble change", step_s=0.002)
    a_acked = a.kill()
    md = bk.embedlog.ledger_metadata(a.ledger_id)
    assert len(md.fragments) == 2 and shared not in md.fragments[1][1], (md.fragments, a.lines[-5:])
    assert len(bk.embedlog.ledger_metadata(b.ledger_id).fragments) == 1

    before = {w.ledger_id: stored_fields(bk, w.ledger_id) for w in (a, b)}
    a_last = check_embedlog_recovered(bk, a.ledger_id, a_acked, java_payload)
    b_last = check_embedlog_recovered(bk, b.ledger_id, b_acked, java_payload)
    closing = {bkmd.LENGTH, bkmd.LAST_ENTRY_ID, bkmd.STATE}
    assert rewritten(before[a.ledger_id], stored_fields(bk, a.ledger_id)) <= closing
    assert rewritten(before[b.ledger_id], stored_fields(bk, b.ledger_id)) <= closing | {bkmd.SEGMENT}
    # B's recovery wrote back at least its last entry (no bookie's LAC reaches it), which
    # the dead bookie could not take: the recovery's own ensemble change closed the ledger
    b_md = bk.embedlog.ledger_metadata(b.ledger_id)
    assert len(b_md.fragments) == 2 and shared not in b_md.fragments[1][1], b_md.fragments
    check_java_agrees(bk, {a.ledger_id: a_last, b.ledger_id: b_last}, java_payload)
