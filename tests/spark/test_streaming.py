"""Structured Streaming over streams: offsets, limits, availableNow, checkpoints, exactly-once."""
from __future__ import annotations

import os
import time

import pyarrow as pa
from pyspark.sql import functions as F

from embedlog.spark import committed_batches
from embedlog.spark.commit import TASK_SCOPE_ID, Target, commit_job, data_scope
from embedlog.spark.options import write_options
from embedlog.spark.sink import write_task


def stream_df(spark, uri, **opts):
    r = spark.readStream.format("embedlog").option("metadataServiceUri", uri)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def payloads(spark, uri, stream):
    rows = (spark.read.format("embedlog").option("metadataServiceUri", uri)
            .option("streams", stream).load().orderBy("position").collect())
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
    assert client.list_ledgers(TASK_SCOPE_ID) == []


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
    assert len(client.list_ledgers(TASK_SCOPE_ID)) == 2                       # markers still there
    # the next commit (any sink) finishes batch 0 first, then adds its own
    assert commit_job(client, name, "sink", 1, task_ledgers(uri, name, [b"c0"]))
    # a replay of batch 0 with fresh task ledgers changes nothing
    assert not commit_job(client, name, "sink", 0, task_ledgers(uri, name, [b"zz"]))
    data = [e.data for e in s.read(0)]
    assert data == [b"a%d" % i for i in range(30)] + [b"b%d" % i for i in range(30)] + [b"c0"]
    assert client.list_ledgers(TASK_SCOPE_ID) == []
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
