"""Consumer groups on streams (issue 51), on real processes: members in processes of their
own (tests/support/group_child.py) sharing streams of a LocalCluster; one SIGKILLed, another takes
over from the last committed position; a member paused (SIGSTOP) past its session is a
zombie whose commit is refused; lag = end - committed on the group's record, the CLI and
/metrics; a reset while a member runs. Every wait is on a condition."""
import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

import embedlog
from support.cliutil import SUPPORT, admin_addresses, cli, cli_env, http, wait_until
from embedlog.client import group as G
from embedlog.errors import CommitFailedError, ConfigError, GroupNotEmptyError
from embedlog.harness import LocalCluster, servers


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "cluster"), autorecovery=False,
                      bookie_config={"http_server_enabled": True, "http_server_port": 0}) as lc:
        yield lc


class Member:
    """A group member in its own process (tests/support/group_child.py); stdout lines are kept."""

    def __init__(self, uri, group, streams, mode="loop", session_ms=4000, hb_ms=300, **env):
        self.popen = subprocess.Popen(
            [sys.executable, os.path.join(SUPPORT, "group_child.py"), uri, group, str(session_ms),
             str(hb_ms), mode, *streams], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=cli_env(**env))
        self.lines: list[str] = []
        self.err: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.popen.stderr), daemon=True).start()
        self.member_id = self.expect("MEMBER").split()[1]

    def _pump(self):
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def expect(self, prefix, timeout_s=60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no {prefix!r} line: {self.lines[-20:]} {''.join(self.err)[-3000:]}")
            if line.startswith(prefix):
                return line

    def send(self, command: str) -> None:
        self.popen.stdin.write(command + "\n")
        self.popen.stdin.flush()

    def got(self, stream=None) -> list:
        """[(stream, position, value)] of every GOT line."""
        out = []
        for line in list(self.lines):
            if line.startswith("GOT "):
                _, s, p, v = line.split(" ", 3)
                if stream is None or s == stream:
                    out.append((s, int(p), v))
        return out

    def kill(self, sig=signal.SIGKILL):
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def close(self):
        self.kill()
        self.popen.wait(30)


def group_record(client, gid):
    return G.read_group(client.metadata, gid)[0] or G.empty_record()


def owners(client, gid) -> dict:
    return {s: a["member"] for s, a in group_record(client, gid)["assignment"].items()}


def committed(client, gid) -> dict:
    return {s: c["position"] for s, c in group_record(client, gid)["committed"].items()}


def produce(writers, first, count) -> dict:
    """Append values "<stream>-<i>" for i in first..first+count-1; {stream: [positions]}."""
    out = {}
    for name, w in writers.items():
        last = w.append_many([f"{name}-{i}".encode() for i in range(first, first + count)])
        out[name] = list(range(last - count + 1, last + 1))
    return out


def test_sigkilled_member_stream_taken_over_from_committed_position(cluster):
    client = cluster.client()
    names = [f"orders-{k}" for k in range(4)]
    writers = {n: client.open_stream(n) for n in names}
    for w in writers.values():
        w.take_over()
    uri = cluster.metadata_uri
    a = Member(uri, "billing", ["orders-*"], COMMIT_LAG="5")      # commits 5 behind
    b = Member(uri, "billing", ["orders-*"])
    try:
        wait_until(lambda: sorted(collections.Counter(owners(client, "billing").values()).values())
                   == [2, 2], 60, "two members with two streams each")
        mine_a = sorted(s for s, m in owners(client, "billing").items() if m == a.member_id)
        positions = produce(writers, 0, 100)
        # A has consumed all 100 of each of its streams and committed 95 of them
        wait_until(lambda: all(committed(client, "billing").get(s) == positions[s][94] + 1
                               for s in mine_a), 60, "A's commits")
        wait_until(lambda: all(committed(client, "billing").get(s) == positions[s][99] + 1
                               for s in names if s not in mine_a), 60, "B's commits")
        a.kill()
        a.popen.wait(30)
        at_kill = committed(client, "billing")
        more = produce(writers, 100, 50)
        # B takes A's streams over (A's session expires) and reads them to the end
        wait_until(lambda: all(any(p == more[s][-1] for _, p, _ in b.got(s)) for s in names),
                   90, "B reads every stream to its end")
        assert set(owners(client, "billing").values()) == {b.member_id}
        for s in mine_a:
            got_b = [p for _, p, _ in b.got(s)]
            # from the last committed position, nothing skipped, nothing twice
            assert got_b == [p for p in positions[s] + more[s] if p >= at_kill[s]], s
            assert got_b[0] == at_kill[s] == positions[s][95]
            # what A read past its commit is read again (at least once), never lost
            values = {v for _, _, v in a.got(s)} | {v for _, _, v in b.got(s)}
            assert values == {f"{s}-{i}" for i in range(150)}
        for s in names:
            if s not in mine_a:
                assert [p for _, p, _ in b.got(s)] == positions[s] + more[s]
        wait_until(lambda: all(committed(client, "billing").get(s) == more[s][-1] + 1
                               for s in names), 60, "B commits everything")
        d = G.describe(client.metadata, "billing",
                       lambda n: client.open_stream(n, create=False).last_position() + 1)
        assert [r["lag"] for r in d["streams"]] == [0, 0, 0, 0]
    finally:
        a.close()
        b.close()
        for w in writers.values():
            w.close()


def test_member_paused_past_its_session_cannot_commit(cluster):
    """A zombie: SIGSTOPped past its session, evicted, its stream given to the other member,
    then resumed: its commit is refused (CommitFailedError) and the committed position
    stays the new owner's."""
    client = cluster.client()
    w = client.open_stream("zombie")
    positions = produce({"zombie": w}, 0, 20)["zombie"]
    uri = cluster.metadata_uri
    a = Member(uri, "g", ["zombie"], mode="manual", session_ms=4000, hb_ms=300)
    b = Member(uri, "g", ["zombie"], mode="manual", session_ms=4000, hb_ms=300)
    try:
        wait_until(lambda: len(group_record(client, "g")["members"]) == 2, 30, "two members")
        assert owners(client, "g") == {"zombie": a.member_id}        # sticky: A keeps it
        a.send("consume 100 30")
        assert a.expect("DONE") == "DONE 20"
        servers.suspend(a.popen.pid, sqlite_uri=uri)       # not inside a write: see suspend
        wait_until(lambda: owners(client, "g") == {"zombie": b.member_id}, 60,
                   "B owns the stream once A's session expired")
        assert a.member_id not in group_record(client, "g")["members"]
        b.send("consume 100 30")
        assert b.expect("DONE") == "DONE 20"         # nothing was committed: from the start
        b.send("commit")
        assert b.expect("COMMITTED") == f"COMMITTED zombie:{positions[-1] + 1}"
        a.kill(signal.SIGCONT)
        a.send("commit")
        line = a.expect(("REFUSED", "COMMITTED"))
        assert line.startswith("REFUSED"), line
        assert committed(client, "g") == {"zombie": positions[-1] + 1}
        # its next poll rejoins and finds the stream is B's (sticky): nothing to read
        a.send("consume 10 1")
        assert a.expect("DONE") == "DONE 0"
        a.send("assignment")
        assert a.expect("ASSIGNED") == "ASSIGNED "
        wait_until(lambda: len(group_record(client, "g")["members"]) == 2, 30, "A back in")
        assert owners(client, "g") == {"zombie": b.member_id}
    finally:
        a.kill(signal.SIGCONT)
        a.close()
        b.close()
        w.close()


def test_lag_on_the_record_the_cli_and_metrics_and_a_reset_while_running(cluster):
    client = cluster.client()
    w = client.open_stream("events")
    positions = produce({"events": w}, 0, 100)["events"]
    c = embedlog.Consumer({"group.id": "lagging", "auto.offset.reset": "earliest",
                           "enable.auto.commit": False, "session.timeout.ms": 6000,
                           "heartbeat.interval.ms": 500}, client=client)
    try:
        c.subscribe(["events"])
        got = []
        while len(got) < 37:
            got += c.consume(37 - len(got), 30)
        assert [m.offset() for m in got] == positions[:37]
        assert [m.value() for m in got] == [b"events-%d" % i for i in range(37)]
        c.commit()
        assert c.committed(["events"])[0].offset == positions[37]
        # lag = produced - committed: 100 - 37
        end = lambda n: client.open_stream(n, create=False).last_position() + 1   # noqa: E731
        d = G.describe(client.metadata, "lagging", end)
        assert d["streams"] == [{"stream": "events", "member": c.member_id,
                                 "committed": positions[37], "end": positions[-1] + 1, "lag": 63}]
        md = ["--metadata", cluster.metadata_uri]
        r = cli("group", "describe", "lagging", *md, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["streams"][0]["lag"] == 63
        r = cli("group", "list", *md, "--json")
        assert [(g["group"], g["lag"], g["members"]) for g in json.loads(r.stdout)] == [("lagging", 63, 1)]
        r = cli("stream", "list", "-m", *md, "--json")
        row = json.loads(r.stdout)[0]
        assert (row["end_position"], row["length"]) == (positions[-1] + 1, positions[-1] + 1 - row["first_position"])
        addr = next(a for a in admin_addresses(client).values() if a)

        def metric():
            _, _, body = http(addr, "/metrics")
            for line in body.decode().splitlines():
                if line.startswith('embedlog_consumer_group_lag{group="lagging",stream="events"}'):
                    return float(line.split()[-1])
            return None
        wait_until(lambda: metric() == 63.0, 30, "lag 63 on /metrics")
        # a reset while the member runs: refused without --force (exit 4)
        r = cli("group", "reset", "lagging", "--to-earliest", "--execute", *md)
        assert r.returncode == 4 and "live member" in r.stderr, (r.returncode, r.stderr)
        with pytest.raises(GroupNotEmptyError):
            G.reset_group(client.metadata, "lagging", {"events": 0})
        dry = cli("group", "reset", "lagging", "--to-position", str(positions[10]), *md, "--json")
        assert json.loads(dry.stdout)["streams"]["events"]["position"] == positions[10]
        assert committed(client, "lagging") == {"events": positions[37]}     # a dry run
        r = cli("group", "reset", "lagging", "--to-position", str(positions[10]), "--execute",
                "--force", *md)
        assert r.returncode == 0, r.stderr
        # the member's commit of what it read before the reset is refused (its heartbeats
        # have seen the reset, but a member takes a new assignment up only in poll, as
        # Kafka's does: until then it commits under the generation it read in) ...
        with pytest.raises(CommitFailedError):
            c.commit()
        assert committed(client, "lagging") == {"events": positions[10]}
        # ... and its next poll reads from the reset position
        again = c.consume(1, 30)
        assert again[0].offset() == positions[10]
        c.commit()
        assert committed(client, "lagging") == {"events": positions[11]}
    finally:
        c.close()
        w.close()
    assert group_record(client, "lagging")["members"] == {}       # close() left the group
    r = cli("group", "delete", "lagging", "-y", "--metadata", cluster.metadata_uri)
    assert r.returncode == 0, r.stderr
    r = cli("group", "describe", "lagging", "--metadata", cluster.metadata_uri)
    assert r.returncode == 3, (r.returncode, r.stderr)


def test_consumer_configuration_errors_are_reported_at_once(cluster):
    with pytest.raises(ConfigError) as info:
        embedlog.Consumer({"bootstrap.servers": "x:9092", "group.id": "g", "fetch.min.bytes": 1,
                           "securty.protocol": "SSL"}, client=cluster.client())
    text = str(info.value)
    assert "bootstrap.servers" in text and "metadata.uri" in text
    assert "fetch.min.bytes" in text and "securty.protocol" in text


def test_commits_racing_rebalances_never_move_a_position_back_or_skip(cluster):
    """Attack: two members commit after every batch while a third joins and leaves five
    times (each a rebalance that moves streams while their owners commit), committing as
    it goes, and a producer keeps appending. Sampled all along, no committed position ever
    goes back; commits from owners that lost a stream are refused, never applied; at the
    end every message was delivered and every stream is committed to its end."""
    client = cluster.client()
    names = [f"churn-{k}" for k in range(4)]
    writers = {n: client.open_stream(n) for n in names}
    uri = cluster.metadata_uri
    a = Member(uri, "churn", ["churn-*"], session_ms=4000, hb_ms=200)
    b = Member(uri, "churn", ["churn-*"], session_ms=4000, hb_ms=200)
    seen_by_c = collections.defaultdict(set)
    refused = 0
    produced = {n: [] for n in names}
    backwards = []
    last = {}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            for s, p in committed(client, "churn").items():
                if p < last.get(s, -1):
                    backwards.append((s, last[s], p))
                last[s] = max(p, last.get(s, -1))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        wait_until(lambda: len(group_record(client, "churn")["members"]) == 2, 30, "two members")
        for round_ in range(5):
            for n, ps in produce(writers, 40 * round_, 40).items():
                produced[n] += ps
            c = embedlog.Consumer({"group.id": "churn", "auto.offset.reset": "earliest",
                                   "enable.auto.commit": False, "session.timeout.ms": 4000,
                                   "heartbeat.interval.ms": 200}, client=client)
            try:
                c.subscribe(["churn-*"])
                wait_until(lambda: c.member_id in {a_["member"] for a_ in
                                                   group_record(client, "churn")["assignment"].values()},
                           30, "the third member gets a stream")
                for _ in range(3):
                    for m in c.consume(15, 1):
                        seen_by_c[m.topic()].add(m.value().decode())
                    try:
                        c.commit()
                    except CommitFailedError:
                        refused += 1
            finally:
                c.close()
        total = {n: ps[-1] + 1 for n, ps in produced.items()}
        wait_until(lambda: all(committed(client, "churn").get(n) == total[n] for n in names),
                   120, "every stream committed to its end")
    finally:
        stop.set()
        sampler.join(10)
        a.close()
        b.close()
        for w in writers.values():
            w.close()
    assert backwards == []
    for n in names:
        values = ({v for s, _, v in a.got(n)} | {v for s, _, v in b.got(n)} | seen_by_c[n])
        assert values == {f"{n}-{i}" for i in range(200)}, n
    # the members' own refusals are lines of theirs: every REFUSED was a stale commit,
    # and nothing they committed was lost (the final positions are the ends)
    print("refused commits: third member", refused,
          "members", sum(line.startswith("REFUSED") for line in a.lines + b.lines))


def test_a_member_that_stops_polling_gives_its_streams_up(cluster):
    """max.poll.interval.ms, as Kafka's: a member whose thread stops polling (its heartbeat
    thread still alive) lets its session expire; the other member takes its stream over
    from the committed position, and the stalled one's next poll rejoins (and, its commit
    refused meanwhile, reads from the committed positions)."""
    client = cluster.client()
    writers = {n: client.open_stream(n) for n in ("stall-0", "stall-1")}
    produce(writers, 0, 10)
    conf = {"group.id": "stall", "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "session.timeout.ms": 3000, "heartbeat.interval.ms": 200,
            "max.poll.interval.ms": 1000}
    c1 = embedlog.Consumer(conf, client=client)
    c2 = embedlog.Consumer(conf, client=client)
    try:
        c1.subscribe(["stall-*"])
        c2.subscribe(["stall-*"])
        wait_until(lambda: c1.consume(10, 0.2) is not None and len(c1.assignment()) == 1
                   and c2.consume(10, 0.2) is not None and len(c2.assignment()) == 1,
                   30, "one stream each")
        mine = c1.assignment()[0].topic
        # c1 stops polling; c2 keeps polling and gets c1's stream
        wait_until(lambda: c2.consume(10, 0.2) is not None and len(c2.assignment()) == 2,
                   60, "c2 takes the stalled member's stream")
        assert c1.member_id not in group_record(client, "stall")["members"]
        with pytest.raises(CommitFailedError):
            c1.commit(offsets=[embedlog.TopicPartition(mine, 0, 5)])
        # c1 polls again: it rejoins and the group shares the streams again
        wait_until(lambda: c1.consume(10, 0.2) is not None and len(c1.assignment()) == 1
                   and c2.consume(10, 0.2) is not None and len(c2.assignment()) == 1,
                   60, "c1 back with one stream")
    finally:
        c1.close()
        c2.close()
        for w in writers.values():
            w.close()


def test_a_forced_reset_while_member_processes_run(cluster):
    """Attack: `embedlog group reset --to-earliest --execute --force` while two member
    processes loop (consume, commit). Each re-reads its stream from the first position
    (the reset re-stamps the streams: their next poll takes the reset position up) and the
    group ends committed at the ends again."""
    client = cluster.client()
    names = ["reset-0", "reset-1"]
    writers = {n: client.open_stream(n) for n in names}
    positions = produce(writers, 0, 50)
    uri = cluster.metadata_uri
    a = Member(uri, "resetting", ["reset-*"])
    b = Member(uri, "resetting", ["reset-*"])
    try:
        ends = {n: positions[n][-1] + 1 for n in names}
        wait_until(lambda: committed(client, "resetting") == ends, 60, "everything committed")
        got_before = {n: len(a.got(n)) + len(b.got(n)) for n in names}
        r = cli("group", "reset", "resetting", "--to-earliest", "--execute", "--force",
                "--metadata", uri)
        assert r.returncode == 0, r.stderr
        wait_until(lambda: all(len(a.got(n)) + len(b.got(n)) >= got_before[n] + 50 for n in names),
                   60, "each stream read again from its first position")
        wait_until(lambda: committed(client, "resetting") == ends, 60, "committed to the ends again")
        for n in names:
            again = (a.got(n) + b.got(n))
            assert [p for _, p, _ in again].count(positions[n][0]) >= 2, n
    finally:
        a.close()
        b.close()
        for w in writers.values():
            w.close()


@pytest.mark.parametrize("metadata", ["zk", "etcd"])
def test_groups_on_zookeeper_and_etcd(tmp_path, metadata):
    """The group's record on the other drivers: two member processes share two streams, one
    is SIGKILLed, the other takes its stream over and reads it to the end."""
    from support.servers import ServerMissing, skip_unless_ci
    try:
        lc = LocalCluster(bookies=2, metadata=metadata, base_dir=str(tmp_path / "cluster"),
                          autorecovery=False)
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    with lc:
        client = lc.client()
        names = ["kv-0", "kv-1"]
        writers = {n: client.open_stream(n, ensemble_size=2, write_quorum=2, ack_quorum=2)
                   for n in names}
        a = Member(lc.metadata_uri, "kv", names)
        b = Member(lc.metadata_uri, "kv", names)
        try:
            wait_until(lambda: sorted(collections.Counter(owners(client, "kv").values()).values())
                       == [1, 1], 60, "one stream each")
            first = produce(writers, 0, 20)
            wait_until(lambda: all(committed(client, "kv").get(n) == first[n][-1] + 1
                                   for n in names), 60, "first commits")
            a.kill()
            a.popen.wait(30)
            more = produce(writers, 20, 10)
            wait_until(lambda: all(committed(client, "kv").get(n) == more[n][-1] + 1
                                   for n in names), 90, "B commits both streams to the end")
            assert set(owners(client, "kv").values()) == {b.member_id}
            for n in names:
                values = {v for _, _, v in a.got(n)} | {v for _, _, v in b.got(n)}
                assert values == {f"{n}-{i}" for i in range(30)}
        finally:
            a.close()
            b.close()
            for w in writers.values():
                w.close()


def test_stream_tail_with_a_group_resumes_where_it_stopped(cluster):
    """`embedlog stream tail NAME --group G`, Kafka's console consumer with --group: it
    commits what it printed, and the next run goes on from there."""
    client = cluster.client()
    s = client.open_stream("console")
    first = s.append_many([b"c%d" % i for i in range(10)]) - 9
    s.close()
    md = ["--metadata", cluster.metadata_uri]
    r = cli("stream", "tail", "console", "--group", "con", "--from", str(first), "--count", "3", *md)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(first), "c0", str(first + 1), "c1", str(first + 2), "c2"]
    assert committed(client, "con") == {"console": first + 3}
    r = cli("stream", "tail", "console", "--group", "con", "--count", "4", *md)
    assert r.stdout.split()[::2] == [str(first + k) for k in range(3, 7)], r.stderr
    assert committed(client, "con") == {"console": first + 7}
    assert group_record(client, "con")["members"] == {}
