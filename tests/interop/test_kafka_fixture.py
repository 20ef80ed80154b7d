"""The Kafka peer itself (issue 30): a KRaft broker from the pinned jars, formatted, started,
killed, restarted and cleaned up by KafkaCluster, driven by confluent-kafka; and the Python
cells of benchmarks/vs_kafka.py at tiny sizes, so the comparison never rots.

One broker for the whole module (start-up is most of the cost). Three brokers (RF 3, min ISR
2) are exercised by the benchmark and by the soak test at the end (pytest -m soak). Under
CI=true a missing java, jar or confluent-kafka fails instead of skipping.
"""
from __future__ import annotations

import logging
import os
import sys
import time

import pytest

from embedlog.harness.peers.kafka import KAFKA_PEER, KafkaCluster
from support.servers import ServerMissing, require_peer, skip_unless_ci

log = logging.getLogger(__name__)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks"))


def _cluster(brokers: int) -> KafkaCluster:
    require_peer(KAFKA_PEER)
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        skip_unless_ci("confluent-kafka is not installed (the test extra)")
    try:
        kc = KafkaCluster(brokers=brokers)
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    log.warning("Kafka: %d broker(s) formatted, started and listed in %.2fs", brokers, kc.startup_s)
    return kc


@pytest.fixture(scope="module")
def kafka():
    kc = _cluster(1)
    yield kc
    pids = [kc.pid(i) for i in range(len(kc))]
    kc.close()
    assert not os.path.exists(kc.base_dir)
    for pid in pids:                     # reaped: no process left with that id of ours
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _consume(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fixture-test",
                  "enable.auto.commit": False, "log_level": 0})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                got.append(m.value())
    finally:
        c.close()
    return got


def test_produce_consume_kill_restart(kafka):
    from confluent_kafka import Producer
    kafka.create_topic("fixture", partitions=1, config={"flush.messages": "1"})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all", "log_level": 0})
    for i in range(100):
        p.produce("fixture", b"m%d" % i)
    assert p.flush(30) == 0
    want = [b"m%d" % i for i in range(100)]
    assert _consume(kafka.bootstrap, "fixture", 100) == want

    kafka.kill_broker(0)                           # SIGKILL: no controlled shutdown
    assert not kafka.is_running(0)
    kafka.start_broker(0)                          # same ports, same data
    assert kafka.is_running(0)
    assert _consume(kafka.bootstrap, "fixture", 100) == want   # flushed: all there


def test_topic_settings_and_metadata(kafka):
    kafka.create_topic("two-parts", partitions=2, rf=1)
    md = kafka.admin().list_topics("two-parts", timeout=10).topics["two-parts"]
    assert sorted(md.partitions) == [0, 1]
    assert all(p.leader == 1 for p in md.partitions.values())
    assert kafka.bootstrap == f"127.0.0.1:{kafka.port(0)}"


def test_python_cells_of_the_benchmark(kafka, tmp_path):
    """Every Python cell of benchmarks/vs_kafka.py, tiny, through its interleaved rounds:
    produce with each client and both durabilities (the page-cache bookie without
    journal_sync_data, as in the run), consume from the beginning, tail end to end."""
    import vs_kafka
    from embedlog.harness import LocalCluster
    lines: list = []
    with LocalCluster(bookies=1, base_dir=str(tmp_path / "el"), proxies=False,
                      autorecovery=False) as el, \
            LocalCluster(bookies=1, base_dir=str(tmp_path / "el-pc"), proxies=False, autorecovery=False,
                         bookie_config={"journal_sync_data": False}) as el_pc:
        setup = vs_kafka.Setup("one node", kafka, {"sync": el, "page cache": el_pc}, (1, 1, 1))
        cells = [lambda d=d, c=c: vs_kafka.produce_cell(setup, d, c, 100, 300)
                 for d in ("sync", "page cache") for c in vs_kafka.PRODUCERS]
        for system in ("kafka", "embedlog"):
            cells.append(lambda system=system: vs_kafka.consume_cell(setup, system, 100, 300))
            cells.append(lambda system=system: vs_kafka.tail_cell(setup, system, 100, rate=200,
                                                                  seconds=0.5))
        rows, notes = vs_kafka.run_rounds(cells, 1, lines.append)
    assert len(rows) == len(cells) and len(notes) == 1, notes
    for r in rows:
        assert r.count > 0 and r.seconds > 0, r
        assert r.errors == 0, r
    assert len(lines) == len(cells) + 2 and "load average" in notes[0]
    table = vs_kafka.tables(rows)
    for head in ("Produce from Python", "Consume from the beginning", "Tail: end-to-end"):
        assert head in table


@pytest.mark.soak
def test_three_brokers_keep_writing_with_one_killed():
    """RF 3, min.insync.replicas 2: a killed broker leaves the ISR and acks=all goes on with
    two; restarted, it catches up. Three JVMs: a soak test (pytest -m soak)."""
    from confluent_kafka import Producer
    kc = _cluster(3)
    try:
        kc.create_topic("three", partitions=1)              # rf 3 by default
        md = kc.admin().list_topics("three", timeout=10).topics["three"].partitions[0]
        assert len(md.replicas) == 3 and len(md.isrs) == 3
        p = Producer({"bootstrap.servers": kc.bootstrap, "acks": "all", "log_level": 0})
        for i in range(50):
            p.produce("three", b"a%d" % i)
        assert p.flush(30) == 0
        kc.kill_broker(2)
        for i in range(50):
            p.produce("three", b"b%d" % i)
        assert p.flush(60) == 0                              # two in sync are enough
        kc.start_broker(2)
        want = [b"a%d" % i for i in range(50)] + [b"b%d" % i for i in range(50)]
        assert _consume(kc.bootstrap, "three", 100) == want
    finally:
        kc.close()
    assert not os.path.exists(kc.base_dir)
