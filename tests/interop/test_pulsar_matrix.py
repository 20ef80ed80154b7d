"""What a Pulsar broker does with its bookies, on embedlog bookies: the soak set.

One broker (PulsarCluster: Pulsar's own set-up, embedlog bookies started as an operator
starts them) with managed ledgers at 3/2/2 on four bookies and ledgers rolled over every
50 entries, so that every topic spans several BookKeeper ledgers. Partitioned topics, the
four subscription types, individual and cumulative acks, redelivery after a consumer
process dies, a reader across rollovers after an unload (the bookies serve it), topic
compaction, a schema, the broker SIGKILLed and restarted, a deleted topic's ledgers freed
by the bookies' garbage collection, BookKeeper's own auditor re-replicating a lost
bookie's ledgers. Marked soak (``make soak-pulsar``); the suite keeps tests/interop/
test_pulsar.py. Under CI=true a missing java, jar or ZooKeeper fails.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pulsar                                    # the test extra's pulsar-client
import pytest

from support.cliutil import http_json, wait_until
from embedlog import Client
from support.servers import ServerMissing, require_peer, skip_unless_ci

pytestmark = pytest.mark.soak

NS = "persistent://public/default"
ROLL = 50                       # entries per ledger before the managed ledger rolls over
GC_MS = 1000


@pytest.fixture(scope="module")
def pc(tmp_path_factory):
    from embedlog.harness.peers.pulsar import PULSAR_PEER, PulsarCluster
    require_peer(PULSAR_PEER)
    try:
        cluster = PulsarCluster(
            bookies=4, base_dir=str(tmp_path_factory.mktemp("pulsar")), ensemble=(3, 2, 2),
            broker_config={"managedLedgerMaxEntriesPerLedger": ROLL,
                           "managedLedgerMinLedgerRolloverTimeMinutes": 0,
                           "brokerDeleteInactiveTopicsEnabled": "false",
                           # keep what no subscription holds: readers from the earliest
                           "defaultRetentionTimeInMinutes": -1,
                           "defaultRetentionSizeInMB": -1,
                           # a SIGKILLed broker's bundles are free again this soon
                           "metadataStoreSessionTimeoutMillis": 6000},
            bookie_config={"gc_wait_time_ms": GC_MS, "gc_missing_ledger_wait_time_ms": GC_MS,
                           "http_server_enabled": True, "http_server_port": 0})
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    with cluster:
        yield cluster


@pytest.fixture
def client(pc):
    c = pulsar.Client(pc.service_url, operation_timeout_seconds=60)
    yield c
    c.close()


def admin(pc, path: str, method: str = "GET", body=None):
    """Pulsar's admin REST API; the decoded JSON answer (None when empty)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{pc.web_url}/admin/v2/{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def produce(client, topic: str, n: int, *, batching: bool = False, key=None, midway=None,
            **kw) -> list[bytes]:
    """n messages sent asynchronously; those the broker acknowledged, in send order."""
    producer = client.create_producer(topic, batching_enabled=batching, block_if_queue_full=True,
                                      send_timeout_millis=60_000, **kw)
    acked = {}

    def done(res, _mid, i):
        if res == pulsar.Result.Ok:
            acked[i] = True
    payloads = [b"m-%06d" % i for i in range(n)]
    for i, p in enumerate(payloads):
        producer.send_async(p, lambda res, mid, i=i: done(res, mid, i),
                            partition_key=None if key is None else key(i))
        if midway is not None and i == n // 3:
            midway()
    producer.flush()
    producer.close()
    return [p for i, p in enumerate(payloads) if i in acked]


def receive_all(consumer, n: int, ack=True) -> list:
    got = []
    while len(got) < n:
        msg = consumer.receive(timeout_millis=60_000)
        got.append(msg)
        if ack:
            consumer.acknowledge(msg)
    return got


def drain(consumer, quiet_ms: int = 3000) -> list:
    """Everything the consumer gets until it has been quiet for quiet_ms."""
    got = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=quiet_ms)
        except pulsar.Timeout:
            return got
        got.append(msg)
        consumer.acknowledge(msg)


def read_from_earliest(client, topic: str) -> list[bytes]:
    """Every message of the topic, by a reader from the earliest."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(timeout_millis=60_000).data())
    reader.close()
    return got


def topic_ledgers(pc, name: str) -> list[int]:
    stats = admin(pc, f"persistent/public/default/{name}/internalStats")
    return [row["ledgerId"] for row in stats["ledgers"]]


# -- topics, subscriptions, acks -------------------------------------------------------------

def test_a_partitioned_topic_with_keys(pc, client):
    admin(pc, "persistent/public/default/parts/partitions", "PUT", 4)
    sent = produce(client, f"{NS}/parts", 2_000, batching=True, key=lambda i: f"k{i % 16}")
    assert len(sent) == 2_000
    consumer = client.subscribe(f"{NS}/parts", "all", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    got = [m.data() for m in receive_all(consumer, 2_000)]
    consumer.close()
    assert sorted(got) == sorted(sent)
    stats = admin(pc, "persistent/public/default/parts/partitioned-stats")
    assert len(stats["partitions"]) == 4


def test_exclusive_failover_shared_and_key_shared(pc, client):
    topic = f"{NS}/subs"
    sub = lambda name, kind, **kw: client.subscribe(      # noqa: E731
        topic, name, consumer_type=kind, initial_position=pulsar.InitialPosition.Earliest, **kw)
    first = sub("ex", pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        sub("ex", pulsar.ConsumerType.Exclusive)
    a = sub("fo", pulsar.ConsumerType.Failover, consumer_name="a")
    b = sub("fo", pulsar.ConsumerType.Failover, consumer_name="b")
    s1, s2 = sub("sh", pulsar.ConsumerType.Shared), sub("sh", pulsar.ConsumerType.Shared)
    k1, k2 = sub("ks", pulsar.ConsumerType.KeyShared), sub("ks", pulsar.ConsumerType.KeyShared)
    sent = produce(client, topic, 600, key=lambda i: f"key-{i % 12}")
    assert len(sent) == 600
    assert [m.data() for m in receive_all(first, 600)] == sent
    # failover: one consumer is active; it closes holding a message, and the standby
    # takes over from that message
    try:
        held, active, standby = a.receive(timeout_millis=3000), a, b
    except pulsar.Timeout:
        held, active, standby = b.receive(timeout_millis=60_000), b, a
    assert held.data() == sent[0]
    active.close()
    assert [m.data() for m in drain(standby)] == sent
    # shared: the two split the messages, each once
    shared = drain(s1) + drain(s2)
    assert sorted(m.data() for m in shared) == sent
    # key_shared: each key goes to one consumer only
    g1, g2 = drain(k1), drain(k2)
    assert sorted(m.data() for m in g1 + g2) == sent
    assert not {m.partition_key() for m in g1} & {m.partition_key() for m in g2}
    for c in (first, standby, s1, s2, k1, k2):
        c.close()


def test_cumulative_ack_and_redelivery_after_a_consumer_process_dies(pc, client, tmp_path):
    topic = f"{NS}/acks"
    sent = produce(client, topic, 300)
    # cumulative: acking message 99 acks 0..99; a new consumer starts at 100
    c = client.subscribe(topic, "cum", initial_position=pulsar.InitialPosition.Earliest)
    msgs = receive_all(c, 100, ack=False)
    c.acknowledge_cumulative(msgs[-1])
    c.close()
    c = client.subscribe(topic, "cum", initial_position=pulsar.InitialPosition.Earliest)
    assert c.receive(timeout_millis=60_000).data() == sent[100]
    c.close()
    shared = client.subscribe(topic, "cum-shared", consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest)
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        shared.acknowledge_cumulative(shared.receive(timeout_millis=60_000))
    shared.close()
    # a consumer process acks 0..49, holds 50..149 unacknowledged, and is SIGKILLed: the
    # subscription's next consumer gets every message from 50 on
    child = subprocess.Popen([sys.executable, "-c", CHILD, pc.service_url, topic],
                             stdout=subprocess.PIPE, text=True)
    try:
        lines = []                        # the Pulsar client logs to stdout too
        while not lines or not lines[-1].startswith("holding"):
            lines.append(child.stdout.readline())
            assert lines[-1], lines[-5:]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    c = client.subscribe(topic, "red", initial_position=pulsar.InitialPosition.Earliest,
                         consumer_type=pulsar.ConsumerType.Shared)
    got = [m.data() for m in drain(c)]
    c.close()
    assert set(sent[50:]) <= set(got), sorted(set(sent[50:]) - set(got))[:5]


CHILD = r"""
import sys, time, pulsar
client = pulsar.Client(sys.argv[1])
c = client.subscribe(sys.argv[2], "red", initial_position=pulsar.InitialPosition.Earliest,
                     consumer_type=pulsar.ConsumerType.Shared)
for i in range(150):
    m = c.receive(timeout_millis=60000)
    if i < 50:
        c.acknowledge(m)
print("holding", flush=True)
time.sleep(3600)
"""


# -- ledgers: rollover, unload, compaction, schemas ----------------------------------------------

def test_a_reader_from_the_earliest_across_rollovers_after_an_unload(pc, client):
    topic = f"{NS}/rolled"
    sent = produce(client, topic, 10 * ROLL + 7)
    assert len(topic_ledgers(pc, "rolled")) >= 10
    admin(pc, "persistent/public/default/rolled/unload", "PUT")   # the broker's cache goes
    assert read_from_earliest(client, topic) == sent


def test_topic_compaction_keeps_the_last_value_of_each_key(pc, client):
    topic = f"{NS}/compacted"
    producer = client.create_producer(topic, batching_enabled=False)
    for r in range(10):
        for k in range(8):
            producer.send(b"%d-%d" % (k, r), partition_key=f"k{k}")
    producer.close()
    admin(pc, "persistent/public/default/compacted/compaction", "PUT")
    wait_until(lambda: admin(pc, "persistent/public/default/compacted/compaction")["status"]
               == "SUCCESS", 120, "the compaction")
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    got = {}
    while reader.has_message_available():
        m = reader.read_next(timeout_millis=60_000)
        got[m.partition_key()] = m.data()
    reader.close()
    assert got == {f"k{k}": b"%d-9" % k for k in range(8)}
    stats = admin(pc, "persistent/public/default/compacted/internalStats")
    assert stats["compactedLedger"]["ledgerId"] > 0


def test_a_schema_registered_and_read_back(pc, client):
    from pulsar.schema import Integer, JsonSchema, Record, String

    class Reading(Record):
        sensor = String()
        value = Integer()
    topic = f"{NS}/readings"
    consumer = client.subscribe(topic, "s", schema=JsonSchema(Reading))
    producer = client.create_producer(topic, schema=JsonSchema(Reading))
    for i in range(20):
        producer.send(Reading(sensor=f"s{i % 3}", value=i))
    producer.close()
    got = [consumer.receive(timeout_millis=60_000) for _ in range(20)]
    consumer.close()
    assert [(m.value().sensor, m.value().value) for m in got] == \
        [(f"s{i % 3}", i) for i in range(20)]
    schema = admin(pc, "schemas/public/default/readings/schema")
    assert schema["type"] == "JSON" and "sensor" in schema["data"]


# -- faults ------------------------------------------------------------------------------------

def test_the_broker_sigkilled_and_restarted_loses_no_acknowledged_message(pc):
    topic = f"{NS}/broker-killed"
    before = pulsar.Client(pc.service_url, operation_timeout_seconds=60)
    try:
        c = before.subscribe(topic, "kept", initial_position=pulsar.InitialPosition.Earliest)
        sent = produce(before, topic, 3_000, batching=True)
        assert len(sent) == 3_000
        first = receive_all(c, 1_000, ack=False)
        c.acknowledge_cumulative(first[-1])
    finally:
        before.close()
    pc.kill_broker()
    pc.start_broker()                       # topics reopen through BookKeeper recovery
    again = pulsar.Client(pc.service_url, operation_timeout_seconds=60)
    try:
        c = subscribe_when_served(again, topic, "kept")
        got = [m.data() for m in drain(c, 5000)]
        c.close()
        # the cursor resumes at or before message 1000 (its mark is persisted lazily), with
        # nothing skipped after it
        assert got and got[-1] == sent[-1], got[-3:]
        start = sent.index(got[0])
        assert start <= 1_000 and got == sent[start:], (start, len(got))
    finally:
        again.close()


def subscribe_when_served(client, topic: str, name: str):
    """Subscribe from the earliest, retrying while a restarted broker takes its bundles."""
    def subscribed():
        try:
            return client.subscribe(topic, name, initial_position=pulsar.InitialPosition.Earliest)
        except pulsar.Timeout:
            return None
    return wait_until(subscribed, 240, f"{topic} served again")


def test_a_bookie_made_read_only_mid_produce(pc, client):
    """The broker's writes go round a bookie an operator turns read-only (SIGUSR1, as
    `embedlog bookie readonly on`): nothing acknowledged is lost."""
    topic = f"{NS}/read-only"
    pid = pc.bookies.pid(1)
    try:
        sent = produce(client, topic, 3_000, midway=lambda: os.kill(pid, signal.SIGUSR1))
        assert len(sent) == 3_000
        with Client(pc.metadata_uri) as meta:
            readonly = {r.bookie_id for r in meta.metadata.registration_client.get_all_bookies()
                        if r.read_only}
        assert readonly == {pc.bookies.bookie_id(1)}, readonly
    finally:
        os.kill(pid, signal.SIGUSR2)
    c = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
    assert [m.data() for m in receive_all(c, 3_000)] == sent
    c.close()


def test_a_bookie_and_the_broker_killed_together(pc):
    topic = f"{NS}/both-killed"
    before = pulsar.Client(pc.service_url, operation_timeout_seconds=60)
    try:
        sent = produce(before, topic, 2_000, batching=True)
    finally:
        before.close()
    pc.bookies.kill_bookie(2)
    pc.kill_broker()
    try:
        pc.start_broker()
        again = pulsar.Client(pc.service_url, operation_timeout_seconds=60)
        try:
            c = subscribe_when_served(again, topic, "after")
            assert [m.data() for m in drain(c, 5000)] == sent
            c.close()
            # and the topic takes new messages on the three bookies left
            assert len(produce(again, topic, 100)) == 100
        finally:
            again.close()
    finally:
        pc.bookies.restart_bookie(2)


def _bookie_admin(pc, i: int) -> str:
    with Client(pc.metadata_uri) as c:
        for r in c.metadata.registration_client.get_all_bookies():
            if r.bookie_id == pc.bookies.bookie_id(i) and (r.info or {}).get("http"):
                return r.info["http"]
    return ""


def test_retention_keeps_what_a_consumer_never_acked(pc, client):
    """A namespace without retention: what a subscription has not acknowledged stays on
    the bookies through trims; once acknowledged, the ledgers go and the bookies free them."""
    admin(pc, "namespaces/public/noretention", "PUT")
    admin(pc, "namespaces/public/noretention/retention", "POST",
          {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    topic = "persistent://public/noretention/lazy"
    lazy = client.subscribe(topic, "lazy", receiver_queue_size=10)
    sent = produce(client, topic, 4 * ROLL)
    path = "persistent/public/noretention/lazy"
    ledgers = [row["ledgerId"] for row in admin(pc, f"{path}/internalStats")["ledgers"]]
    assert len(ledgers) >= 4
    admin(pc, f"{path}/trim", "POST")
    assert [row["ledgerId"] for row in admin(pc, f"{path}/internalStats")["ledgers"]] == ledgers
    assert set(ledgers[:-1]) <= held_ledgers(pc)
    got = receive_all(lazy, len(sent), ack=False)
    assert [m.data() for m in got] == sent
    lazy.acknowledge_cumulative(got[-1])

    def trimmed():
        admin(pc, f"{path}/trim", "POST")
        left = {row["ledgerId"] for row in admin(pc, f"{path}/internalStats")["ledgers"]}
        return not set(ledgers[:-1]) & left
    wait_until(trimmed, 120, "the acknowledged ledgers trimmed", interval_s=1)
    lazy.close()
    gone = set(ledgers[:-1])
    wait_until(lambda: not gone & held_ledgers(pc), 120, "the bookies' GC freeing them")


def held_ledgers(pc) -> set:
    return set().union(*(
        {r["ledger_id"] for r in http_json(_bookie_admin(pc, i), "/api/v1/bookie/ledgers")["ledgers"]}
        for i in range(4)))


def test_a_deleted_topics_ledgers_are_freed_by_the_bookies(pc):
    c = pulsar.Client(pc.service_url, operation_timeout_seconds=60)
    try:
        produce(c, f"{NS}/doomed", 4 * ROLL)
    finally:
        c.close()
    ledgers = set(topic_ledgers(pc, "doomed"))
    assert len(ledgers) >= 3
    held = lambda: held_ledgers(pc)                                     # noqa: E731
    assert ledgers & held()
    admin(pc, "persistent/public/default/doomed?force=true", "DELETE")
    with Client(pc.metadata_uri) as meta:
        listed = lambda: {int(m) for m in meta.metadata.ledger_manager.iterate_ledgers()}  # noqa: E731
        wait_until(lambda: not ledgers & listed(), 60, "Pulsar deleting the topic's ledgers")
    wait_until(lambda: not ledgers & held(), 120, "the bookies' GC freeing them")


def test_bookkeepers_auditor_re_replicates_a_lost_embedlog_bookie(pc, client):
    from embedlog.harness.peers import jars
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster
    version = max(jars.BOOKKEEPER_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))
    require_peer(f"bookkeeper-{version}")
    topic = f"{NS}/healed"
    sent = produce(client, topic, 3 * ROLL)
    with BookKeeperCluster(version, bookies=0, zk_hosts=pc.zk.hosts, root="/ledgers",
                           format=False, base_dir=os.path.join(pc.dir, "bk-ar")) as bk:
        bk.start_autorecovery()
        lost = pc.bookies.bookie_id(3)
        pc.bookies.kill_bookie(3)
        try:
            closed = topic_ledgers(pc, "healed")[:-1]      # the last one is open
            assert closed

            def healed():
                marked = bk.shell("listunderreplicated")
                return all(lost not in bk.ledger_metadata(lid) and str(lid) not in marked
                           for lid in closed)
            wait_until(healed, 300, "the auditor re-replicating the lost bookie's ledgers",
                       interval_s=2)
            admin(pc, "persistent/public/default/healed/unload", "PUT")
            assert read_from_earliest(client, topic) == sent
        finally:
            pc.bookies.restart_bookie(3)


def test_one_broker_over_java_and_embedlog_bookies(tmp_path):
    """Two Java bookies (BookKeeper's newest peer) and two embedlog bookies under one
    broker, 3/2/2: every ledger's ensemble holds both kinds; a reader after an unload reads
    every message back from them."""
    from embedlog.harness.peers.pulsar import PulsarCluster
    with PulsarCluster(bookies=2, java_bookies=2, base_dir=str(tmp_path / "mixed"),
                       ensemble=(3, 2, 2),
                       broker_config={"managedLedgerMaxEntriesPerLedger": ROLL,
                                      "managedLedgerMinLedgerRolloverTimeMinutes": 0,
                                      "defaultRetentionTimeInMinutes": -1,
                                      "defaultRetentionSizeInMB": -1}) as mixed:
        client = pulsar.Client(mixed.service_url, operation_timeout_seconds=60)
        try:
            sent = produce(client, f"{NS}/mixed", 4 * ROLL + 3)
            assert len(sent) == 4 * ROLL + 3
            admin(mixed, "persistent/public/default/mixed/unload", "PUT")
            assert read_from_earliest(client, f"{NS}/mixed") == sent
        finally:
            client.close()
        java = set(mixed.java_bookies.bookie_ids)
        ours = {mixed.bookies.bookie_id(i) for i in range(2)}
        for lid in topic_ledgers(mixed, "mixed"):
            md = mixed.java_bookies.ledger_metadata(lid)
            assert any(b in md for b in java) and any(b in md for b in ours), (lid, md)
