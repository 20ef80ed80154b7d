"""The Spark source as a Kafka user meets it: every unknown option in one error, Kafka's
group and header options mapped or refused with why, a streaming query on a stream that
does not exist yet waits for it (failOnMissingStreams=true fails instead), the query's
progress in a consumer group, and a clear message when Spark's workers lack embedlog."""
from __future__ import annotations

import pytest

from support.cliutil import wait_until
from embedlog.client import group as G
from embedlog.errors import ConfigError


def read_stream(spark, uri, **opts):
    r = spark.readStream.format("embedlog").option("metadataServiceUri", uri)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def test_every_unknown_option_in_one_error(spark, uri):
    """Four Kafka options in one job: one error names all four, and what to use instead."""
    r = (spark.read.format("embedlog").option("metadataServiceUri", uri)
         .option("subscribe", "x").option("kafka.bootstrap.servers", "h:9092")
         .option("maxOffsetsPerTrigger", "10").option("groupIdPrefix", "p").option("colour", "b"))
    with pytest.raises(Exception) as info:
        r.load()
    text = str(info.value)
    assert "5 options are not embedlog's" in text, text
    for said in ("'subscribe' is Kafka's; did you mean streams",
                 "'kafka.bootstrap.servers' is Kafka's; did you mean metadataServiceUri",
                 "'maxOffsetsPerTrigger' is Kafka's; did you mean maxEntriesPerTrigger",
                 "'groupIdPrefix' is Kafka's and has no meaning here",
                 "unknown option 'colour'"):
        assert said in text, (said, text)


def test_include_headers(spark, uri, client, name):
    s = client.open_stream(name)
    s.append(b"a")
    s.close()
    base = spark.read.format("embedlog").option("metadataServiceUri", uri).option("streams", name)
    assert [r.payload for r in base.option("includeHeaders", "false").load().collect()] == [b"a"]
    with pytest.raises(Exception, match="stream entries carry no headers"):
        base.option("includeHeaders", "true").load()


def test_streaming_query_waits_for_a_stream_and_records_progress_in_a_group(spark, uri, client,
                                                                           name, tmp_path):
    """The stream does not exist when the query starts: it waits (as Kafka's source waits
    for a topic), then reads it from its beginning; kafka.group.id records each batch's end
    in that consumer group, for `embedlog group describe` and the lag metric."""
    df = read_stream(spark, uri, streams=name, **{"kafka.group.id": f"spark-{name}"})
    q = (df.writeStream.format("memory").queryName(f"t_{abs(hash(name))}")
         .option("checkpointLocation", str(tmp_path / "c"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: q.exception() is not None or len(q.recentProgress) >= 2, 120,
                   "two empty batches while the stream is missing")
        assert q.exception() is None and q.isActive
        s = client.open_stream(name)
        positions = [s.append(b"m%d" % i) for i in range(10)]
        s.close()
        table = f"t_{abs(hash(name))}"
        wait_until(lambda: q.exception() is not None or
                   spark.sql(f"select count(*) from {table}").collect()[0][0] == 10, 120,
                   "the query reads the stream once it exists")
        assert q.exception() is None
        got = sorted(r.payload for r in spark.sql(f"select payload from {table}").collect())
        assert got == sorted(b"m%d" % i for i in range(10))
        end = positions[-1] + 1
        wait_until(lambda: (G.read_group(client.metadata, f"spark-{name}")[0] or G.empty_record())
                   ["committed"].get(name, {}).get("position") == end, 60, "the group's position")
    finally:
        q.stop()


def test_fail_on_missing_streams(spark, uri, name, tmp_path):
    df = read_stream(spark, uri, streams=name, failOnMissingStreams="true")
    q = (df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c")).start())
    try:
        with pytest.raises(Exception, match=f"no stream named '{name}'"):
            q.awaitTermination(60)
    finally:
        q.stop()


def test_workers_that_cannot_import_the_package_are_named(spark):
    """One small job asks every worker slot for the module; a missing one is a ConfigError
    that says what to install or set (a real Spark job, asking for a module nobody has)."""
    import embedlog.spark
    embedlog.spark.workers_can_import(spark)           # they have embedlog
    with pytest.raises(ConfigError) as info:
        embedlog.spark.workers_can_import(spark, module="embedlog_absent_for_the_test")
    text = str(info.value)
    assert "cannot import embedlog_absent_for_the_test" in text
    assert "pip install 'embedlog[spark]'" in text and "spark.executorEnv.PYTHONPATH" in text
