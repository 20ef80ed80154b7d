"""The Spark cells of benchmarks/vs_kafka.py at tiny sizes (issue 30), so the comparison never
rots: format("kafka") from Spark's own connector against format("embedlog"), batch read and
write and a structured streaming job, on one real Kafka broker and the suite's bookies.

The driver-SIGKILL test of the benchmark starts a Spark driver per run (four per system), too
slow for the suite: it runs here as a soak test (pytest -m soak)."""
from __future__ import annotations

import os
import sys

import pytest

from embedlog.harness.peers.kafka import KAFKA_PEER, SPARK_KAFKA_PEER, KafkaCluster
from support.servers import ServerMissing, require_peer, skip_unless_ci

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks"))


@pytest.fixture(scope="module")
def kafka(spark):
    for peer in (KAFKA_PEER, SPARK_KAFKA_PEER):
        require_peer(peer)
    if "spark-sql-kafka" not in spark.conf.get("spark.jars", ""):
        skip_unless_ci("the Spark session started without the Kafka connector")
    try:
        kc = KafkaCluster(brokers=1)
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    yield kc
    kc.close()


@pytest.fixture
def setup(kafka, cluster):
    import vs_kafka
    return vs_kafka.Setup("smoke", kafka, {"sync": cluster, "page cache": cluster}, (3, 3, 2))


def test_batch_read_and_write_cells(spark, setup):
    import vs_kafka
    rows = [vs_kafka.spark_read_cell(spark, setup, system, 300) for system in ("kafka", "embedlog")]
    df = vs_kafka.spark_frame(spark, 300)
    try:
        rows += [vs_kafka.spark_write_cell(spark, setup, "sync", system, df, 300)
                 for system in ("kafka", "embedlog")]
    finally:
        df.unpersist()
    for r in rows:
        assert (r.count, r.errors) == (300, 0), r
    assert "spark_read" in vs_kafka.tables(rows)


def test_streaming_cell(spark, setup, tmp_path):
    import vs_kafka
    for system in ("kafka", "embedlog"):
        r = vs_kafka.stream_cell(spark, setup, system, 300, 100, str(tmp_path))
        assert (r.count, r.errors) == (300, 0), r


@pytest.mark.soak
def test_driver_killed_mid_batch(setup, tmp_path):
    import vs_kafka
    r = vs_kafka.kill_cell(setup, "embedlog", 2000, 100, 1, str(tmp_path))
    assert (r.duplicates, r.losses) == (0, 0), r
    r = vs_kafka.kill_cell(setup, "kafka", 2000, 100, 1, str(tmp_path))
    assert r.losses == 0, r                     # at least once: duplicates are allowed
