"""A ledger id used again while an embedlog bookie still holds the deleted ledger.

On a BookKeeper root (BookieShell's initnewcluster) with embedlog bookies:

1. BookKeeper's Java client writes ledger X (3/3/2, 100 entries) on B0-B2 and closes it;
2. BookieShell ``deleteledger -f X`` removes its znode (no deletion record: B0 keeps X's
   entries until the absence rule would free them);
3. B1 and B2 stop, two fresh bookies start, so a new X can only be placed on B0 and them;
4. X is created again with the same id, password and digest (embedlog's
   ``create_ledger(ledger_id=X)`` or Java's ``createLedgerAdv``), its writer adds and is
   SIGKILLed (before any add was acknowledged, or after some were, with a spare bookie
   started for its ensemble change; a spare is started before the recovery in any case);
5. X is recovered, by BookKeeper's Java client (v3, or v2 as Pulsar's) or by embedlog's.

B0 must answer every request for the new X as a bookie that does not hold it (its adds
with an error a client replaces a bookie for, its fencing and recovery reads with "no such
ledger"), so the recovered ledger holds exactly the new writer's acknowledged entries
(and possibly unacknowledged ones of its own), never one of the old ledger's.
Under CI=true a missing java, jar or ZooKeeper fails.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from support.cliutil import wait_until
from embedlog import Client
from embedlog.harness.peers import jars
from support.servers import ServerMissing, ZooKeeperServer, require_peer, skip_unless_ci

VERSION = max(jars.BOOKKEEPER_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))
PASSWORD = "pw"
OLD_ENTRIES = 100

# the new writer, in a process of its own: it prints each acknowledged entry id, then
# "done", and waits to be SIGKILLed with its ledger open
WRITER = r"""
import sys
from embedlog import Client
uri, lid, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = Client(uri)
w = client.create_ledger(3, 3, 2, password=b"pw", ledger_id=lid)
print("created", flush=True)
sys.stdin.readline()                       # the parent may start a spare bookie first
for i in range(count):
    try:
        print("ack", w.append(b"new-%d" % i), flush=True)
    except Exception as exc:
        print("failed", type(exc).__name__, str(exc).replace("\n", " "), flush=True)
        break
print("done", flush=True)
sys.stdin.readline()
"""


class Setup:
    def __init__(self, bk, lc, client):
        self.bk, self.lc, self.client = bk, lc, client
        self.running = [0, 1, 2]

    def writable(self) -> set:
        return {r.bookie_id for r in self.client.metadata.registration_client.get_writable_bookies()}

    def start_bookie(self) -> int:
        i = self.lc.add_bookie()
        self.running.append(i)
        return i

    def stop_bookie(self, i: int) -> None:
        self.lc.stop_bookie(i)
        self.running.remove(i)

    def settle(self) -> None:
        want = {self.lc.bookie_id(i) for i in self.running}
        wait_until(lambda: self.writable() == want, 30, f"exactly bookies {sorted(want)} writable")


@pytest.fixture(scope="module")
def setup():
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    from embedlog.harness.cluster import LocalCluster
    require_peer(f"bookkeeper-{VERSION}")
    try:
        zk = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    bk = lc = client = None
    try:
        bk = BookKeeperCluster(VERSION, bookies=0, zk_hosts=zk.hosts, root="/bkreuse")
        lc = LocalCluster(bookies=3, metadata=bk.metadata_uri, proxies=False,
                          autorecovery=False)
        client = Client(bk.metadata_uri)
        yield Setup(bk, lc, client)
    finally:
        if client is not None:
            client.close()
        if lc is not None:
            lc.close()
        if bk is not None:
            bk.close()
        zk.stop()


def _old_ledger(s: Setup) -> tuple[int, int]:
    """Steps 1-3: X written by Java on three bookies and deleted by BookieShell; two of
    its bookies stopped and two fresh ones started. Returns (X, the bookie still holding it)."""
    s.settle()
    old = s.bk.java_client("create", ensemble=3, write_quorum=3, ack_quorum=2,
                           count=OLD_ENTRIES, password=PASSWORD)
    x = old.ledger_id
    holders = [s.lc.index_of(b) for b in old.ensembles[0]]
    s.bk.shell("deleteledger", "-l", x, "-f")
    assert x not in s.bk.list_ledgers()
    keep = holders[0]
    for i in holders[1:]:
        s.stop_bookie(i)
    for i in [i for i in s.running if i not in holders]:
        s.stop_bookie(i)                   # a spare of an earlier case
    s.start_bookie()
    s.start_bookie()
    s.settle()
    return x, keep


def _new_writer(s: Setup, x: int, how: str, acked: bool) -> list[int]:
    """Step 4: X again, written until its writer is SIGKILLed; returns the acknowledged ids."""
    count = 20 if acked else 5
    if how == "java":
        proc = s.bk.java_client_popen("create", ensemble=3, write_quorum=3, ack_quorum=2,
                                      password=PASSWORD, ledger_id=x, stdin=True, no_close=True,
                                      add_timeout_s=20)
        hello = "ledger"
    else:
        proc = subprocess.Popen([sys.executable, "-c", WRITER, s.bk.metadata_uri, str(x), str(count)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                bufsize=1, env=dict(os.environ))
        hello = "created"
    acks, lines = [], []
    try:
        while True:
            line = proc.stdout.readline()
            lines.append(line)
            assert line, f"the writer ended early: {lines}"
            if line.startswith(hello):
                break
        if acked:
            s.start_bookie()              # room for the ensemble change that replaces B0
            s.settle()
        if how == "java":
            for i in range(count):
                proc.stdin.write((b"new-%d" % i).hex() + "\n")
            proc.stdin.flush()
            want = count if acked else 0

            def read_acks():
                line = proc.stdout.readline()
                lines.append(line)
                if line.startswith("ack "):
                    acks.append(int(line.split()[1]))
                return len(acks) >= want or not line or line.startswith("error")
            if acked:
                wait_until(read_acks, 60, f"{count} acknowledgements ({lines[-3:]})", 0)
            else:
                # no spare bookie: B0's refusal cannot be replaced, so nothing is acknowledged
                wait_until(read_acks, 60, f"the writer's failure ({lines[-3:]})", 0)
        else:
            proc.stdin.write("\n")
            proc.stdin.flush()
            while True:
                line = proc.stdout.readline()
                lines.append(line)
                assert line, f"the writer ended early: {lines}"
                if line.startswith("ack "):
                    acks.append(int(line.split()[1]))
                if line.startswith("done"):
                    break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return acks


@pytest.mark.parametrize("writer,acked,recoverer", [
    ("embedlog", False, "java"),
    ("java", True, "java-v2"),
    ("embedlog", True, "embedlog"),
    ("java", False, "embedlog"),
])
def test_a_ledger_id_used_again_never_recovers_the_old_ledgers_entries(setup, writer, acked,
                                                                      recoverer):
    s = setup
    x, keep = _old_ledger(s)
    acks = _new_writer(s, x, writer, acked)
    assert acks == list(range(len(acks))), acks
    if acked:
        assert acks, acks
    else:
        # without a spare, B0's refusal stops the writer (what B3 and B4 acknowledged before
        # B0's answer came, Qa = 2, may be acknowledged); the recovery writes the rest on B3
        # and B4 back, replacing B0 as the writer would have: with a bookie to spare
        s.start_bookie()
        s.settle()
    new = [b"new-%d" % i for i in range(20)]
    if recoverer.startswith("java"):
        got = s.bk.java_client("read", x, recover=True, password=PASSWORD,
                               v2=recoverer == "java-v2")
        lac, entries = got.lac, [p for _, p in got.entries]
    else:
        r = s.client.open_ledger(x, password=PASSWORD)
        lac = r.last_add_confirmed
        entries = r.read_batch(0, lac) if lac >= 0 else []
    assert lac >= (acks[-1] if acks else -1), (lac, acks)
    assert entries == new[:lac + 1], (lac, entries[:5])
    # the old ledger's data stays on B0 (its deletion is not confirmed by the new X)
    assert s.lc.is_running(keep)


def test_a_zookeeper_restored_from_an_older_backup_hands_out_a_held_id_again(tmp_path):
    """The id comes back by itself: ZooKeeper restored from a backup taken before ledger X
    was created hands X out again (BookKeeper's id generator went back with it). The
    bookies holding the old X restart on the restored store; the new X, written, its writer
    killed and recovered by Java, holds only its own entries; the old X's data stays."""
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    from embedlog.harness.cluster import LocalCluster
    require_peer(f"bookkeeper-{VERSION}")
    try:
        zk = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    bk = lc = None
    try:
        bk = BookKeeperCluster(VERSION, bookies=0, zk_hosts=zk.hosts, root="/bkrestore")
        lc = LocalCluster(bookies=3, metadata=bk.metadata_uri, proxies=False,
                          autorecovery=False)
        zk.backup(str(tmp_path / "zk-backup"))            # before X exists
        old = bk.java_client("create", ensemble=3, write_quorum=3, ack_quorum=2,
                             count=OLD_ENTRIES, password=PASSWORD)
        x = old.ledger_id
        for i in range(3):
            lc.stop_bookie(i)
        zk.restore(str(tmp_path / "zk-backup"))
        assert x not in bk.list_ledgers()
        for i in range(3):
            lc.restart_bookie(i)
        for _ in range(3):                                 # room to replace the refusing ones
            lc.add_bookie()
        new = bk.java_client("create", ensemble=3, write_quorum=3, ack_quorum=2,
                             count=10, password=PASSWORD, no_close=True,
                             payloads=[b"new-%d" % i for i in range(10)], check=False)
        assert new.ledger_id == x, (new.ledger_id, x)      # the same id, handed out again
        got = bk.java_client("read", x, recover=True, password=PASSWORD)
        entries = [p for _, p in got.entries]
        assert got.lac >= (new.acked[-1] if new.acked else -1), (got.lac, new.acked)
        assert entries == [b"new-%d" % i for i in range(got.lac + 1)], (got.lac, entries[:5])
        # the old X's entries are still held by its bookies, which said so
        with Client(bk.metadata_uri) as client:
            info = client.bookie_info([lc.bookie_id(i) for i in range(3)], timeout_s=10)
        assert all(v is not None and v["ledgers"] >= 1 for v in info.values()), info
        # restarted again (what they learnt of X's metadata is gone) and asked for X
        # directly (BookKeeper's shell, one bookie at a time, plain reads), each old bookie
        # gives none of the old X's entries (their digests would check), and says why
        for i in range(3):
            lc.stop_bookie(i)
            lc.restart_bookie(i)
        for i in range(3):
            got_i = bk.read_ledger(x, bookie=lc.bookie_id(i), first=0, last=got.lac)
            assert all(p.startswith(b"new-") for _, p in got_i), (i, got_i[:3])  # old: entry-N
            with open(os.path.join(lc.bookie_dir(i), "bookie.log")) as f:
                said = [line for line in f if "holds an earlier ledger" in line]
            assert said, f"bookie {i} did not say it holds an earlier ledger of the id"
        assert all(lc.is_running(i) for i in range(6))
    finally:
        if lc is not None:
            lc.close()
        if bk is not None:
            bk.close()
        zk.stop()
