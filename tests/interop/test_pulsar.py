"""Apache Pulsar's broker on embedlog bookies, set up as an operator does it
(embedlog/harness/peers/pulsar.py): Pulsar's `initialize-cluster-metadata`, embedlog bookies
started with `embedlog bookie serve` on the root it made, then the broker. Before, the first
bookie took that root (an INSTANCEID, no LAYOUT) for an empty one and formatted it in
embedlog's format, and the broker never came up. Real processes: ZooKeeper, Pulsar 4.0.0's
broker and set-up tool, three embedlog bookies, Python's pulsar-client. Under CI=true a
missing java, jar or ZooKeeper fails."""
from __future__ import annotations

import threading

import pulsar                                    # the test extra's pulsar-client
import pytest

from support.servers import ServerMissing, require_peer, skip_unless_ci


@pytest.fixture(scope="module")
def pc(tmp_path_factory):
    from embedlog.harness.peers.pulsar import PULSAR_PEER, PulsarCluster
    require_peer(PULSAR_PEER)
    try:
        cluster = PulsarCluster(bookies=3, base_dir=str(tmp_path_factory.mktemp("pulsar")))
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    with cluster:
        yield cluster


def _produce(client, topic: str, n: int, *, batching: bool, midway=None) -> list[bytes]:
    """Sends n messages asynchronously; returns those the broker acknowledged."""
    producer = client.create_producer(topic, batching_enabled=batching, block_if_queue_full=True,
                                      send_timeout_millis=60_000)
    acked, lock = [], threading.Lock()

    def done(res, _msg_id, payload):
        if res == pulsar.Result.Ok:
            with lock:
                acked.append(payload)
    for i in range(n):
        payload = b"m-%06d" % i
        producer.send_async(payload, lambda res, mid, p=payload: done(res, mid, p))
        if midway is not None and i == n // 3:
            midway()
    producer.flush()
    producer.close()
    return sorted(acked)


def _consume(client, topic: str, n: int) -> list[bytes]:
    consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    got = []
    try:
        while len(got) < n:
            msg = consumer.receive(timeout_millis=60_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
    finally:
        consumer.close()
    return got


def test_topics_live_on_embedlog_bookies_in_bookkeepers_format(pc):
    from embedlog import Client
    client = pulsar.Client(pc.service_url, operation_timeout_seconds=60)
    try:
        for batching in (True, False):
            topic = f"persistent://public/default/plain-{batching}"
            sent = _produce(client, topic, 2_000, batching=batching)
            assert len(sent) == 2_000
            assert _consume(client, topic, 2_000) == sent      # in order, every one
    finally:
        client.close()
    with Client(pc.metadata_uri) as c:
        assert c.metadata.metadata_format == "bookkeeper"
        ledgers = list(c.metadata.ledger_manager.iterate_ledgers())
        assert ledgers, "the managed ledgers and cursors are BookKeeper ledgers here"
        infos = c.bookie_info()
        assert len(infos) == 3 and sum(i["add_entries"] for i in infos.values() if i) > 0


def test_a_bookie_killed_mid_produce_loses_no_acknowledged_message(pc):
    """2/2/2 on three bookies: the managed ledger replaces the SIGKILLed bookie with the
    spare; every message the producer saw acknowledged is consumed, in order."""
    client = pulsar.Client(pc.service_url, operation_timeout_seconds=60)
    topic = "persistent://public/default/bookie-killed"
    try:
        sent = _produce(client, topic, 6_000, batching=True,
                        midway=lambda: pc.bookies.kill_bookie(0))
        assert len(sent) >= 2_000, len(sent)
        got = _consume(client, topic, len(sent))
        assert got == sent
    finally:
        client.close()
        pc.bookies.restart_bookie(0)
