"""Batch read and write through Spark against a real LocalCluster."""
from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pytest
from sparkutil import markers
from pyspark.sql import Window
from pyspark.sql import functions as F

from embedlog.spark import committed_batches, delete_stream
from embedlog.spark.commit import Target, data_scope


def read(spark, uri, **opts):
    r = spark.read.format("embedlog").option("metadataServiceUri", uri)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def write(df, uri, stream, **opts):
    w = df.write.format("embedlog").option("metadataServiceUri", uri)
    if stream is not None:
        w = w.option("stream", stream)
    for k, v in opts.items():
        w = w.option(k, str(v))
    w.mode("append").save()


def test_million_rows_round_trip(spark, uri, client, name):
    # two copies (E = Qw = Qa = 2) of every entry keep this inside the suite's time budget
    client.open_stream(name, ensemble_size=2, write_quorum=2, ack_quorum=2).close()
    n = 1_000_000
    df = spark.range(0, n, 1, 4).select(F.col("id").cast("string").alias("payload"))
    write(df, uri, name, ensembleSize=2, writeQuorum=2, ackQuorum=2)
    assert markers(client, name) == []                        # no marker left after the commit
    back = read(spark, uri, streams=name, entriesPerPartition=200_000)
    assert back.rdd.getNumPartitions() >= 5
    got = back.select(F.col("payload").cast("string").cast("long").alias("v"), "position", "index")
    row = got.agg(F.count("*").alias("n"), F.countDistinct("v").alias("d"),
                  F.sum("v").alias("s"), F.min("v").alias("lo"), F.max("v").alias("hi")).first()
    assert (row.n, row.d, row.s, row.lo, row.hi) == (n, n, n * (n - 1) // 2, 0, n - 1)
    # task order: rows come back in (position, index) order exactly as they were numbered
    w = Window.orderBy("position", "index")
    out_of_order = got.withColumn("rank", F.row_number().over(w) - 1).where(F.col("rank") != F.col("v"))
    assert out_of_order.count() == 0


def test_ledgers_by_id_name_and_scope(spark, uri, client):
    handles = [client.create_ledger(3, 3, 2, scope_id=77) for _ in range(2)]
    for k, h in enumerate(handles):
        h.append_many([b"%d-%d" % (k, i) for i in range(250)])
        h.close()
    qnames = ",".join(h.ledger_id.qualified_name for h in handles)
    by_name = read(spark, uri, ledgers=qnames, entriesPerPartition=100)
    assert by_name.rdd.getNumPartitions() == 6
    rows = by_name.orderBy("ledger_id", "entry_id").collect()
    assert [bytes(r.payload) for r in rows] == [b"%d-%d" % (k, i) for k in range(2) for i in range(250)]
    assert {r.scope_id for r in rows} == {77} and rows[0].stream is None and rows[0].position is None
    assert rows[0].qualified_name == handles[0].ledger_id.qualified_name
    assert read(spark, uri, scope=77).count() == 500
    # start inclusive, end exclusive, per ledger
    q0 = handles[0].ledger_id.qualified_name
    part = read(spark, uri, ledgers=q0, startingOffsets=f'{{"{q0}": 10}}',
                endingOffsets=f'{{"{q0}": 20}}').collect()
    assert [r.entry_id for r in part] == list(range(10, 20))


def test_unsigned_halves_are_twos_complement(spark, uri, client):
    from embedlog import LedgerId
    lid = LedgerId((1 << 64) - 2, (1 << 63) + 5)
    h = client.create_ledger(3, 3, 2, ledger_id=lid, scope_id=lid.scope_id)
    h.append(b"x")
    h.close()
    r = read(spark, uri, ledgers=lid.qualified_name).first()
    assert (r.scope_id, r.ledger_id) == (-2, (1 << 63) + 5 - (1 << 64))
    assert LedgerId.parse(r.qualified_name) == lid
    assert ((r.scope_id & (2**64 - 1)), (r.ledger_id & (2**64 - 1))) == (lid.scope_id, lid.ledger_id)


def test_task_order_and_killed_job_leaves_nothing(spark, uri, client, name):
    df = spark.range(0, 300, 1, 3).select(F.format_string("r%d", "id").alias("payload"))
    write(df, uri, name)
    rows = read(spark, uri, streams=name).orderBy("position").collect()
    assert [bytes(r.payload) for r in rows] == [b"r%d" % i for i in range(300)]

    @F.udf("string")
    def explode_at_250(i):
        if i == 250:
            raise RuntimeError("task killed in the middle")
        return "k%d" % i

    bad = spark.range(0, 300, 1, 3).select(explode_at_250("id").alias("payload"))
    with pytest.raises(Exception, match="task killed in the middle"):
        write(bad, uri, name)
    assert read(spark, uri, streams=name).count() == 300          # nothing of the failed job
    assert markers(client, name) == []                             # no marker left behind
    assert len(client.list_ledgers(data_scope(Target(stream=name)))) == 3   # the first write's


def test_read_while_a_writer_appends(spark, uri, client):
    h = client.create_ledger(3, 3, 2)
    h.append_many([b"e%d" % i for i in range(100)])
    stop = threading.Event()

    def keep_appending():
        i = 100
        while not stop.is_set() and i < 5000:
            h.append(b"e%d" % i)
            i += 1

    t = threading.Thread(target=keep_appending)
    t.start()
    try:
        before = client.open_ledger(h.ledger_id, recovery=False).last_add_confirmed
        rows = read(spark, uri, ledgers=str(h.ledger_id.ledger_id)).orderBy("entry_id").collect()
        after = client.open_ledger(h.ledger_id, recovery=False).last_add_confirmed
    finally:
        stop.set()
        t.join(30)
    assert before + 1 <= len(rows) <= after + 1
    assert [bytes(r.payload) for r in rows] == [b"e%d" % i for i in range(len(rows))]
    assert len(rows) <= h.last_add_confirmed + 1          # never past what the writer had confirmed
    h.close()


def test_stream_pattern_skips_commit_logs(spark, uri, client, name):
    write(spark.range(0, 10, 1, 2).select(F.col("id").cast("string").alias("payload")), uri, name + "-a")
    s = client.open_stream(name + "-b")
    s.append_many([b"b%d" % i for i in range(5)])
    s.close()
    assert any(n.startswith("__spark_commits__/") for n in client.list_streams(f"*{name}-*"))
    rows = read(spark, uri, streamPattern=f"*{name}-*").groupBy("stream").count().collect()
    assert {r.stream: r["count"] for r in rows} == {name + "-a": 10, name + "-b": 5}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_timestamps_and_reads_by_time(spark, uri, client, name):
    s = client.open_stream(name)
    marks = []
    for k in range(3):
        t = now_ms()
        while now_ms() <= t:              # the next batch gets a later time (clock, not sleep)
            pass
        marks.append(now_ms())
        s.append_many([b"%d-%d" % (k, i) for i in range(10)])
    s.close()
    rows = read(spark, uri, streams=name).orderBy("position").collect()
    assert len(rows) == 30 and all(r.timestamp is not None for r in rows)
    by_time = read(spark, uri, streams=name, startingTimestamp=marks[1]).orderBy("position").collect()
    assert [bytes(r.payload) for r in by_time] == [b"%d-%d" % (k, i) for k in (1, 2) for i in range(10)]
    window = read(spark, uri, streams=name, startingOffsetsByTimestamp=json.dumps({name: marks[1]}),
                  endingOffsetsByTimestamp=json.dumps({name: marks[2]})).collect()
    assert sorted(bytes(r.payload) for r in window) == sorted(b"1-%d" % i for i in range(10))
    assert read(spark, uri, streams=name, endingTimestamp=marks[0]).count() == 0
    # no position at or after a time in the future: an error, or the end with strategy latest
    future = now_ms() + 3_600_000
    with pytest.raises(Exception, match="no position appended at or after"):
        read(spark, uri, streams=name, startingTimestamp=future).collect()
    assert read(spark, uri, streams=name, startingTimestamp=future,
                startingOffsetsByTimestampStrategy="latest").count() == 0


def test_min_partitions_and_an_empty_read(spark, uri, client, name):
    s = client.open_stream(name)
    s.append_many([b"m%d" % i for i in range(100)])
    s.close()
    df = read(spark, uri, streams=name, minPartitions=7)
    assert df.rdd.getNumPartitions() >= 7 and df.count() == 100
    empty = read(spark, uri, streams=name, startingOffsets="latest")
    assert empty.count() == 0 and empty.collect() == []


def test_fail_on_data_loss(spark, uri, client, name, caplog):
    s = client.open_stream(name, rollover_entries=20)
    s.append_many([b"d%d" % i for i in range(40)])
    s.append_many([b"d%d" % i for i in range(40, 100)])
    first_kept = s.truncate_before(60)
    s.close()
    assert 0 < first_kept <= 60
    start = json.dumps({name: 1})
    with pytest.raises(Exception, match="removed by retention.*failOnDataLoss=false"):
        read(spark, uri, streams=name, startingOffsets=start).collect()
    rows = read(spark, uri, streams=name, startingOffsets=start, failOnDataLoss="false").collect()
    assert min(r.position for r in rows) == first_kept
    # the skip is reported (the planner's log; here called in this process)
    from embedlog.spark.options import read_options
    from embedlog.spark.planning import plan_batch
    with caplog.at_level("WARNING", logger="embedlog.spark"):
        plan_batch(read_options({"metadataServiceUri": uri, "streams": name, "startingOffsets": start,
                                 "failOnDataLoss": "false"}))
    assert f"positions 1..{first_kept - 1} were removed by retention" in caplog.text


def test_rows_routed_by_their_stream_column(spark, uri, client, name):
    df = spark.range(0, 90, 1, 3).select(
        F.format_string("r%d", "id").alias("payload"),
        F.concat(F.lit(name + "-"), (F.col("id") % 3).cast("string")).alias("stream"))
    write(df, uri, None)
    for k in range(3):
        rows = read(spark, uri, streams=f"{name}-{k}").orderBy("position", "index").collect()
        assert [bytes(r.payload) for r in rows] == [b"r%d" % i for i in range(k, 90, 3)]
    # the option wins over the column, as Kafka's topic option does
    write(df, uri, name + "-all")
    assert read(spark, uri, streams=name + "-all").count() == 90
    with pytest.raises(Exception, match="'stream' is null"):
        write(spark.range(2).select(F.lit("x").alias("payload"), F.lit(None).cast("string").alias("stream")),
              uri, None)


def test_writing_ledgers_of_a_scope(spark, uri, client):
    scope = 4242
    df = spark.range(0, 500, 1, 2).select(F.format_string("l%d", "id").alias("payload"))
    write(df, uri, None, scope=scope, sinkId="ledgers", batchId=0)
    write(df, uri, None, scope=scope, sinkId="ledgers", batchId=0)      # a replay: skipped
    assert len(client.list_ledgers(scope)) == 2
    rows = read(spark, uri, scope=scope).collect()
    assert sorted(bytes(r.payload) for r in rows) == sorted(b"l%d" % i for i in range(500))
    assert {r.stream for r in rows} == {None}
    # a task's ledger that no commit published is not read
    from embedlog.spark.options import write_options
    from embedlog.spark.sink import write_task
    opts = write_options({"metadataServiceUri": uri, "scope": str(scope)}, streaming=False)
    write_task(opts, "job-never-committed", "payload", None,
               [pa.record_batch([pa.array([b"zz"] * 10, pa.binary())], names=["payload"])])
    assert len(client.list_ledgers(scope)) == 3
    assert read(spark, uri, scope=scope).count() == 500


def test_spark_written_stream_keeps_what_readers_need(spark, uri, client, name):
    """Links, their ledgers after retention, the commit log's own retention, delete_stream."""
    client.open_stream(name, rollover_entries=4, retention_entries=8).close()
    # 18 batches: two commit-log records each, enough to fill two of the commit log's
    # 16-entry fragments, so its retention must have trimmed the first
    for k in range(18):
        write(spark.range(0, 20, 1, 2).select(F.format_string(f"{k}-%d", "id").alias("payload")),
              uri, name, sinkId="keep", batchId=k)
    s = client.open_stream(name, create=False)
    md = s.refresh()
    assert md.first_entry_id > 0                      # retention removed the first batches' links
    scope = data_scope(Target(stream=name))
    linked = client.list_ledgers(scope)
    # the ledgers of links retention removed are gone: what is left is what readers can reach
    reachable = {lk.ledger_id for lk in s.read_arrow(md.first_entry_id, s.last_position()).links}
    assert set(linked) == reachable
    rows = read(spark, uri, streams=name).collect()
    assert len(rows) == 20 * len({bytes(r.payload).split(b"-")[0] for r in rows})
    log_md = client.open_stream("__spark_commits__/" + name, create=False).metadata
    assert log_md.first_entry_id > 0 and len(log_md.fragments) <= 3     # the commit log is trimmed
    assert committed_batches(client, name) == {"keep": 17}
    s.close()
    delete_stream(client, name)
    assert client.list_ledgers(scope) == []
    assert name not in client.list_streams() and committed_batches(client, name) == {}


def test_write_with_one_copy_on_a_one_bookie_cluster(spark, tmp_path):
    """ensembleSize=1 is a whole write on one bookie: the commit log keeps at most the copies
    the write asks for (it asked for two, and a one-bookie cluster refused the commit)."""
    from embedlog.harness import LocalCluster
    with LocalCluster(bookies=1, base_dir=str(tmp_path / "one"), proxies=False,
                      autorecovery=False) as one:
        df = spark.range(0, 100, 1, 2).select(F.col("id").cast("string").alias("payload"))
        write(df, one.metadata_uri, "single", ensembleSize=1, writeQuorum=1, ackQuorum=1)
        got = read(spark, one.metadata_uri, streams="single").orderBy("position", "index").collect()
        assert [r.payload for r in got] == [str(i).encode() for i in range(100)]
