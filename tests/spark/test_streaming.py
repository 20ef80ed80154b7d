"""Structured Streaming over streams: offsets, limits, availableNow, checkpoints, exactly-once."""
from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest
from sparkutil import markers
from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from embedlog.spark import committed_batches
from embedlog.spark.commit import Target, commit_job, data_scope
from embedlog.spark.options import read_options, write_options
from embedlog.spark.sink import write_task
from embedlog.spark.source import StreamReader, shares_by_lag


def stream_df(spark, uri, **opts):
    r = spark.readStream.format("embedlog").option("metadataServiceUri", uri)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def payloads(spark, uri, stream):
    rows = (spark.read.format("embedlog").option("metadataServiceUri", uri)
            .option("streams", stream).load().orderBy("position", "index").collect())
    return [bytes(r.payload) for r in rows]


def append(client, stream, items):
    s = client.open_stream(stream)
    s.append_many(items)
    s.close()


def test_available_now_with_a_small_limit_reads_everything(spark, uri, client, name):
    append(client, name, [b"a%d" % i for i in range(1000)])
    got = []

    def collect(df, batch_id):
        got.append((batch_id, [bytes(r.payload) for r in df.orderBy("position").collect()]))

    q = (stream_df(spark, uri, streams=name, maxEntriesPerTrigger=128).writeStream
         .foreachBatch(collect).trigger(availableNow=True).start())
    assert q.awaitTermination(120)
    assert q.exception() is None
    rows = [p for _b, batch in sorted(got) for p in batch]
    assert rows == [b"a%d" % i for i in range(1000)]
    assert max(len(b) for _i, b in got) <= 128
    assert len([b for b in got if b[1]]) >= 8


def _wait_for_batches(q, n, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if q.exception() is not None:
            raise q.exception()
        p = q.lastProgress
        if p is not None and p["batchId"] >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"the query did not reach batch {n} in {timeout_s} s")


def test_stop_and_restart_from_checkpoint_exactly_once(spark, uri, client, name, tmp_path):
    src, dst = name + "-in", name + "-out"
    append(client, src, [b"m%d" % i for i in range(600)])
    ckpt = str(tmp_path / "ckpt")

    def start(trigger):
        df = stream_df(spark, uri, streams=src, maxEntriesPerTrigger=50)
        out = df.select(F.concat(F.lit(b"x"), "payload").alias("payload"))
        w = (out.writeStream.format("embedlog").option("metadataServiceUri", uri)
             .option("stream", dst).option("sinkId", "restart-test")
             .option("checkpointLocation", ckpt))
        return w.trigger(**trigger).start()

    q = start({"processingTime": "100 milliseconds"})
    _wait_for_batches(q, 2)
    q.stop()                                      # stopped in the middle of the input
    first_run = payloads(spark, uri, dst)
    assert 0 < len(first_run) < 600
    append(client, src, [b"m%d" % i for i in range(600, 800)])
    q = start({"availableNow": True})
    assert q.awaitTermination(180)
    assert q.exception() is None
    want = [b"xm%d" % i for i in range(800)]
    assert payloads(spark, uri, dst) == want

    # a batch whose sink commit happened but Spark's did not: Spark replays it, the sink skips it
    commits = os.path.join(ckpt, "commits")
    last = max(int(f) for f in os.listdir(commits) if f.isdigit())
    os.unlink(os.path.join(commits, str(last)))
    if os.path.exists(os.path.join(commits, f".{last}.crc")):
        os.unlink(os.path.join(commits, f".{last}.crc"))
    q = start({"availableNow": True})
    assert q.awaitTermination(120)
    assert q.exception() is None
    assert any(p["batchId"] == last and p["numInputRows"] > 0 for p in q.recentProgress)  # replayed
    assert payloads(spark, uri, dst) == want
    assert committed_batches(client, dst)["restart-test"] == last
    assert markers(client, dst) == []


def task_ledgers(uri, name, rows, job="job-x"):
    """What a task of a write to stream ``name`` leaves for the commit (the real task code)."""
    opts = write_options({"metadataServiceUri": uri, "stream": name}, streaming=False)
    out = write_task(opts, job, "payload", None, [pa.record_batch([pa.array(rows, pa.binary())],
                                                                  names=["payload"])])
    return [(q, m, s) for _t, q, m, s in out.ledgers]


def test_interrupted_commit_is_rolled_forward_once(uri, client, name):
    first = task_ledgers(uri, name, [b"a%d" % i for i in range(30)]) + \
        task_ledgers(uri, name, [b"b%d" % i for i in range(30)])
    try:
        commit_job(client, name, "sink", 0, first, _crash_after_links=1)
    except RuntimeError:
        pass
    s = client.open_stream(name, create=False)
    assert [e.data for e in s.read(0)] == [b"a%d" % i for i in range(30)]     # decided, half applied
    assert len(markers(client, name)) == 2                                    # markers still there
    # the next commit (any sink) finishes batch 0 first, then adds its own
    assert commit_job(client, name, "sink", 1, task_ledgers(uri, name, [b"c0"]))
    # a replay of batch 0 with fresh task ledgers changes nothing
    assert not commit_job(client, name, "sink", 0, task_ledgers(uri, name, [b"zz"]))
    data = [e.data for e in s.read(0)]
    assert data == [b"a%d" % i for i in range(30)] + [b"b%d" % i for i in range(30)] + [b"c0"]
    assert markers(client, name) == []
    assert len(client.list_ledgers(data_scope(Target(stream=name)))) == 3     # the replay's went
    assert committed_batches(client, name) == {"sink": 1}


def test_only_entries_up_to_the_lac_are_read(spark, uri, client, name):
    s = client.open_stream(name)
    s.append_many([b"p%d" % i for i in range(20)])
    lac = s.last_position()
    got = []
    q = (stream_df(spark, uri, streams=name).writeStream
         .foreachBatch(lambda df, i: got.extend(r.position for r in df.collect()))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(60)
    assert got and max(got) <= lac
    s.close()


@pytest.mark.parametrize("lags, budget, want", [
    ({"a": 900, "b": 100}, 100, {"a": 89, "b": 11}),
    ({"a": 5, "b": 5}, 100, {"a": 5, "b": 5}),          # all of it fits
    ({"a": 1_000_000, "b": 1}, 10, {"a": 9, "b": 1}),   # a small backlog is not starved
    ({"a": 3, "b": 1, "c": 1}, 2, {"a": 1, "b": 1, "c": 0}),
    ({"a": 0, "b": 7}, 3, {"b": 3}),
])
def test_shares_by_lag(lags, budget, want):
    got = shares_by_lag(lags, budget)
    assert got == want and sum(got.values()) == min(budget, sum(lags.values()))


def test_limit_is_shared_by_lag(spark, uri, client, name):
    append(client, name + "-big", [b"B%d" % i for i in range(900)])
    append(client, name + "-small", [b"s%d" % i for i in range(100)])
    got = []
    q = (stream_df(spark, uri, streams=f"{name}-big,{name}-small", maxEntriesPerTrigger=100).writeStream
         .foreachBatch(lambda df, i: got.append(
             (i, {r.stream: r["count"] for r in df.groupBy("stream").count().collect()})))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(180) and q.exception() is None
    first = dict(sorted(got)[0][1])
    # positions are shared out (a take-over's no-op is one and holds no row): 100 at most
    assert 96 <= sum(first.values()) <= 100
    assert first[name + "-big"] >= 85 and first[name + "-small"] >= 8
    totals = {}
    for _i, counts in got:
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
    assert totals == {name + "-big": 900, name + "-small": 100}


def test_min_entries_wait_up_to_the_trigger_delay(uri, client, name):
    """Kafka's minOffsetsPerTrigger / maxTriggerDelay, driving the source as Spark does."""
    def end():                                   # the next position to be written
        return client.open_stream(name, create=False).last_position() + 1

    append(client, name, [b"x"] * 10)
    r = StreamReader(read_options({"metadataServiceUri": uri, "streams": name,
                                   "minEntriesPerTrigger": "50", "maxTriggerDelay": "300ms"}))
    start = r.initialOffset()
    first = r.latestOffset(start, ReadAllAvailable())        # the first trigger is not held back
    assert first == {name: end()}
    append(client, name, [b"y"] * 10)
    assert r.latestOffset(first, ReadAllAvailable()) == first        # about 10 < 50: wait
    assert r.reportLatestOffset() == {name: end()}                   # the backlog shows
    append(client, name, [b"z"] * 40)
    second = r.latestOffset(first, ReadAllAvailable())               # 50 or more: go
    assert second == {name: end()}
    append(client, name, [b"late"])
    assert r.latestOffset(second, ReadAllAvailable()) == second
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:                               # the delay passes (a clock)
        pass
    assert r.latestOffset(second, ReadMaxRows(1000)) == {name: end()}


def test_the_first_trigger_is_never_held_back_whatever_the_clock(uri, client, name):
    """A delay longer than the machine's uptime (time.monotonic() counts from boot): the
    first trigger still goes, as Kafka's does, however few entries wait."""
    append(client, name, [b"x"] * 10)
    delay_ms = int(time.monotonic() * 1000) + 3_600_000
    r = StreamReader(read_options({"metadataServiceUri": uri, "streams": name,
                                   "minEntriesPerTrigger": "50", "maxTriggerDelay": str(delay_ms)}))
    start = r.initialOffset()
    end = client.open_stream(name, create=False).last_position() + 1
    assert r.latestOffset(start, ReadAllAvailable()) == {name: end}


def test_progress_shows_the_backlog(spark, uri, client, name):
    """reportLatestOffset: the progress carries the latest position ahead of the batch's end."""
    s = client.open_stream(name)
    s.append_many([b"p"] * 10)
    got = []
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "50")
    try:
        q = (stream_df(spark, uri, streams=name, minEntriesPerTrigger=100, maxTriggerDelay="1h")
             .writeStream.foreachBatch(lambda df, i: got.append(df.count()))
             .trigger(processingTime="100 milliseconds").start())
        try:
            deadline = time.monotonic() + 60
            while not got and time.monotonic() < deadline:
                time.sleep(0.1)
            assert got == [10]
            s.append_many([b"q"] * 30)
            lac = s.last_position()
            while time.monotonic() < deadline:
                p = q.lastProgress
                src = p["sources"][0] if p else None
                if src and json.loads(src["latestOffset"])[name] == lac + 1:
                    break
                time.sleep(0.1)
            assert json.loads(src["latestOffset"])[name] - json.loads(src["endOffset"])[name] == 30
            assert got == [10]                     # held back: fewer than minEntriesPerTrigger
        finally:
            q.stop()
    finally:
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    s.close()


def test_fail_on_data_loss_when_retention_passes_a_checkpoint(spark, uri, client, name, tmp_path):
    s = client.open_stream(name, rollover_entries=20)
    s.append_many([b"a%d" % i for i in range(30)])
    ckpt = str(tmp_path / "ckpt")
    got = []

    def run(**opts):
        q = (stream_df(spark, uri, streams=name, **opts).writeStream
             .foreachBatch(lambda df, i: got.extend(r.position for r in df.collect()))
             .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        except Exception:
            pass                            # q.exception() has it
        return q

    assert run().exception() is None and len(got) == 30
    for k in range(6):                      # fragments of about 20 positions
        s.append_many([b"b%d" % i for i in range(10 * k, 10 * k + 10)])
    kept = s.truncate_before(70)            # the positions the checkpoint points at are gone
    assert kept > max(got) + 1
    s.append_many([b"c%d" % i for i in range(5)])
    lac = s.last_position()
    q = run()
    assert "removed by retention" in str(q.exception()) and "failOnDataLoss" in str(q.exception())
    got.clear()
    assert run(failOnDataLoss="false").exception() is None
    assert min(got) == kept and max(got) == lac
    s.close()


def test_spark_written_stream_in_micro_batches(spark, uri, client, name):
    """A stream written by Spark holds links; micro-batches count their rows, links whole."""
    df = spark.range(0, 450, 1, 9).select(F.format_string("r%d", "id").alias("payload"))
    (df.write.format("embedlog").option("metadataServiceUri", uri).option("stream", name)
     .mode("append").save())                 # nine tasks: nine links of 50 rows
    got = []
    q = (stream_df(spark, uri, streams=name, maxEntriesPerTrigger=120).writeStream
         .foreachBatch(lambda df, i: got.append([bytes(r.payload) for r in
                                                 df.orderBy("position", "index").collect()]))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120) and q.exception() is None
    sizes = [len(b) for b in got if b]
    assert sum(sizes) == 450 and max(sizes) <= 120 and len(sizes) >= 5   # 50-row links, <= 2 a batch
    assert [p for b in got for p in b] == [b"r%d" % i for i in range(450)]
