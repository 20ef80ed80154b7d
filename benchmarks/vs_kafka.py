#!/usr/bin/env python
"""Side by side with Kafka: the pipeline a Kafka user would build, on this machine.

    python benchmarks/vs_kafka.py [--rounds 3] [--messages 200000] [--sizes 100,1024]
                                  [--nodes 1,3] [--tail-rate 1000] [--tail-seconds 5]
                                  [--spark-rows 200000] [--no-spark] [--out FILE]

Real Apache Kafka 4.4 brokers (KRaft, embedlog.harness.peers.kafka.KafkaCluster: Kafka's G1
settings, 1 GiB heap) against embedlog bookie processes (LocalCluster, no fault proxies),
on one node (Kafka RF 1; E=Qw=Qa=1) and on three (RF 3, min.insync.replicas 2, acks=all;
E=Qw=3, Qa=2), every cell at a durability stated in its row:

- ``sync``: Kafka's topic has ``flush.messages=1`` (the leader fsyncs each append before
  it counts; followers fsync theirs too) against embedlog's default (fdatasync of the
  journal before a bookie acknowledges);
- ``page cache``: Kafka's default (acknowledged once in every in-sync replica's page
  cache, flushed when the OS does) against bookies with ``journal_sync_data=False``
  (acknowledged after write(2), synced every second).

Cells (payloads built before the clock starts; one partition against one stream, the
unit of order of each):

- ``produce``: ``--messages`` messages from this Python process as fast as the client takes
  them, until every one is acknowledged. Kafka: confluent-kafka's Producer, acks=all,
  librdkafka's defaults otherwise (linger.ms 5, batches up to 1 MB). embedlog: a stream's
  ``produce`` (the same loop as Kafka's: a delivery callback per message, poll(0) every 100,
  poll(0.001) on BufferError, flush at the end), ``append_async`` (at most
  max_pending_adds=20,000 outstanding) and ``append_many`` (one blocking call per 1,000
  messages). msgs/s, and p50/p99 of each message's acknowledgement
  latency (send to delivery callback, ack callback, or return of its append_many call);
- ``consume``: the same number of messages read from the beginning by a new reader:
  confluent-kafka's Consumer (assigned partition 0, no group) against ``Stream.read(0)``,
  each message's bytes handed to Python;
- ``tail``: a producer in another process sends ``--tail-rate`` messages/s for
  ``--tail-seconds`` (linger.ms 0 for Kafka, append_async for embedlog), each carrying its
  send time; this process tails (Consumer.consume / Stream.tail) and records receive -
  send: end-to-end latency p50/p99 (sync durability);
- ``spark_read``: ``--spark-rows`` messages of 1 KiB, written by Python beforehand, read by
  a local[2] SparkSession with ``format("kafka")`` (minPartitions 4) and ``format("embedlog")``
  (4 partitions), counted and their lengths summed so every byte reaches the JVM;
- ``spark_write``: the same rows (a cached DataFrame) written with ``format("kafka")``
  (kafka.acks=all) and ``format("embedlog")`` (E/Qw/Qa as above, the job commit included).

Rounds are interleaved (every cell once per round, in the same order) so a neighbour's load
hits both systems alike; tables show the median over rounds and the ratio of the medians
(embedlog / Kafka: above 1.0 means embedlog is faster; for latency, Kafka's / embedlog's).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

ANSWER_TIMEOUT_S = 120.0
APPEND_MANY_BATCH = 1000
SPARK_PARTITIONS = 4
PRODUCERS = ("kafka", "produce", "append_async", "append_many")
# the fixture shortens Kafka's broker session for tests that kill brokers; nothing is killed here
KAFKA_DEFAULTS = {"broker.heartbeat.interval.ms": 2000, "broker.session.timeout.ms": 9000}
# Kafka writes until the disk is full; a bookie turns read-only at 95% used by default, which
# stopped a run on this shared disk (other sessions had filled it): the same as Kafka, nearly
BOOKIE_DISK = {"disk_usage_threshold": 0.99, "disk_usage_warn_threshold": 0.98,
               "disk_usage_lwm_threshold": 0.98}
_names = itertools.count()


@dataclasses.dataclass
class Row:
    cell: str                    # produce, consume, tail, spark_read, spark_write
    setup: str                   # "one node", "three nodes"
    durability: str              # "sync", "page cache", "-"
    client: str                  # kafka, append_async, append_many, embedlog
    size: int
    count: int
    seconds: float
    p50_us: float | None = None
    p99_us: float | None = None
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    @property
    def system(self) -> str:
        return "kafka" if self.client == "kafka" else "embedlog"


@dataclasses.dataclass
class Setup:
    name: str
    kafka: object                # KafkaCluster
    embedlog: dict               # durability -> LocalCluster
    quorum: tuple                # (E, Qw, Qa) of embedlog's streams


def _percentiles(lat_s: list) -> tuple:
    if not lat_s:
        return None, None
    q = statistics.quantiles(lat_s, n=100, method="inclusive") if len(lat_s) > 1 else lat_s * 99
    return q[49] * 1e6, q[98] * 1e6


def _name(kind: str) -> str:
    return f"vs-kafka-{kind}-{os.getpid()}-{next(_names)}"


def _topic(setup: Setup, durability: str, partitions: int = 1) -> str:
    name = _name("t")
    setup.kafka.create_topic(name, partitions=partitions,
                             config={"flush.messages": "1"} if durability == "sync" else None)
    return name


def _client(cl):
    """A plain Client of a LocalCluster, as a user has: cl.client() would route every call
    through the harness's fault rules (5% of a producer's samples, with no rule set)."""
    from embedlog import Client
    return Client(cl.metadata_uri)


def _stream(setup: Setup, durability: str, client=None):
    cl = setup.embedlog[durability]
    c = client or _client(cl)
    e, qw, qa = setup.quorum
    s = c.open_stream(_name("s"), ensemble_size=e, write_quorum=qw, ack_quorum=qa)
    return c, s


def _producer(bootstrap: str, **extra):
    from confluent_kafka import Producer
    from embedlog.harness.peers.kafka import _rdkafka_quiet
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", **_rdkafka_quiet(), **extra})


def _consumer(bootstrap: str, topic: str):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from embedlog.harness.peers.kafka import _rdkafka_quiet
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": _name("g"),
                  "enable.auto.commit": False, **_rdkafka_quiet()})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    return c


def _kafka_fill(bootstrap: str, topic: str, payload: bytes, count: int) -> None:
    p = _producer(bootstrap)
    for i in range(count):
        while True:
            try:
                p.produce(topic, payload)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    if p.flush(ANSWER_TIMEOUT_S):
        raise RuntimeError(f"kafka: messages left unacknowledged in {topic}")


def _embedlog_fill(stream, payload: bytes, count: int) -> None:
    for k in range(0, count, APPEND_MANY_BATCH):
        stream.append_many([payload] * min(APPEND_MANY_BATCH, count - k))


# -- produce ------------------------------------------------------------------------------

def produce_cell(setup: Setup, durability: str, client: str, size: int, count: int) -> Row:
    payload = os.urandom(size)
    sent: list = []
    acked: list = []
    errors = [0]
    clock = time.perf_counter
    if client == "kafka":
        topic = _topic(setup, durability)
        p = _producer(setup.kafka.bootstrap)
        p.list_topics(topic, timeout=10)          # connected, before the clock

        def delivered(err, _msg):
            acked.append(clock())
            if err is not None:
                errors[0] += 1

        t0 = clock()
        for i in range(count):
            sent.append(clock())
            while True:
                try:
                    p.produce(topic, payload, on_delivery=delivered)
                    break
                except BufferError:                # librdkafka's queue is full
                    p.poll(0.001)
            if i % 100 == 0:
                p.poll(0)
        left = p.flush(ANSWER_TIMEOUT_S)
        seconds = clock() - t0
        errors[0] += left
        setup.kafka.admin().delete_topics([topic])
    else:
        c, s = _stream(setup, durability)
        s.take_over()                              # the writer, before the clock
        try:
            if client == "produce":
                def delivered(err, _pos):
                    acked.append(clock())
                    if err is not None:
                        errors[0] += 1

                t0 = clock()
                for i in range(count):
                    sent.append(clock())
                    while True:
                        try:
                            s.produce(payload, on_delivery=delivered)
                            break
                        except BufferError:        # the queue is full, as librdkafka's
                            s.poll(0.001)
                    if i % 100 == 0:
                        s.poll(0)
                errors[0] += s.flush(ANSWER_TIMEOUT_S)
                seconds = clock() - t0
            elif client == "append_async":
                def done(f):
                    acked.append(clock())
                    if f.exception() is not None:
                        errors[0] += 1

                t0 = clock()
                last = None
                for _ in range(count):
                    sent.append(clock())
                    last = s.append_async(payload)
                    last.add_done_callback(done)
                last.exception(ANSWER_TIMEOUT_S)
                while len(acked) < count:          # callbacks run on the client's loop
                    time.sleep(0.0005)
                seconds = clock() - t0
            else:
                batch = [payload] * APPEND_MANY_BATCH
                t0 = clock()
                for k in range(0, count, APPEND_MANY_BATCH):
                    n = min(APPEND_MANY_BATCH, count - k)
                    start = clock()
                    s.append_many(batch if n == APPEND_MANY_BATCH else batch[:n])
                    end = clock()
                    sent.extend([start] * n)
                    acked.extend([end] * n)
                seconds = clock() - t0
        finally:
            s.close()
            c.delete_stream(s.name)
            c.close()
    lat = [a - b for a, b in zip(sorted(acked), sent)]
    return Row("produce", setup.name, durability, client, size, count, seconds,
               *_percentiles(lat), errors=errors[0])


# -- consume ------------------------------------------------------------------------------

def consume_cell(setup: Setup, system: str, size: int, count: int) -> Row:
    """Read ``count`` messages from the beginning with a new reader (filled untimed)."""
    payload = os.urandom(size)
    got = nbytes = 0
    if system == "kafka":
        topic = _topic(setup, "sync")
        _kafka_fill(setup.kafka.bootstrap, topic, payload, count)
        t0 = time.perf_counter()
        c = _consumer(setup.kafka.bootstrap, topic)
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while got < count and time.monotonic() < deadline:
            for m in c.consume(num_messages=10000, timeout=0.5):
                if m.error() is None:
                    nbytes += len(m.value())
                    got += 1
        seconds = time.perf_counter() - t0
        c.close()
        setup.kafka.admin().delete_topics([topic])
    else:
        w, s = _stream(setup, "sync")
        _embedlog_fill(s, payload, count)
        s.close()
        t0 = time.perf_counter()
        c = _client(setup.embedlog["sync"])
        for e in c.open_stream(s.name, create=False).read(0):
            nbytes += len(e.data)
            got += 1
        seconds = time.perf_counter() - t0
        c.close()
        w.delete_stream(s.name)
        w.close()
    return Row("consume", setup.name, "-", system, size, got, seconds,
               errors=(count - got) + (got * size != nbytes))


# -- tail: end-to-end latency ---------------------------------------------------------------

def tail_cell(setup: Setup, system: str, size: int, rate: float, seconds: float,
              durability: str = "sync") -> Row:
    """A producer process sends ``rate`` messages/s for ``seconds``; this process tails them
    and records receive time - send time (time.time_ns(), one clock for both processes)."""
    count = max(1, int(rate * seconds))
    lat: list = []
    if system == "kafka":
        topic = _topic(setup, durability)
        target, name = setup.kafka.bootstrap, topic
        reader = _consumer(setup.kafka.bootstrap, topic)
        reader.consume(num_messages=1, timeout=0.5)     # assigned and fetching, before the producer
    else:
        w, s = _stream(setup, durability)
        s.close()
        target, name = setup.embedlog[durability].metadata_uri, s.name
        rc = _client(setup.embedlog[durability])
        rs = rc.open_stream(name, create=False)
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "tail-producer", system, target, name,
         str(rate), str(count), str(size)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + seconds + ANSWER_TIMEOUT_S
    try:
        if system == "kafka":
            while len(lat) < count and time.monotonic() < deadline:
                for m in reader.consume(num_messages=1000, timeout=0.1):
                    if m.error() is None:
                        lat.append(time.time_ns() - struct.unpack_from("<q", m.value())[0])
            reader.close()
        else:
            for e in rs.tail(0, poll_timeout_ms=100,
                             stop=lambda: len(lat) >= count or time.monotonic() > deadline):
                lat.append(time.time_ns() - struct.unpack_from("<q", e.data)[0])
            rc.close()
        out, _ = child.communicate(timeout=ANSWER_TIMEOUT_S)
        errors = child.returncode != 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if system == "kafka":
        setup.kafka.admin().delete_topics([topic])
    else:
        w.delete_stream(name)
        w.close()
    p50, p99 = _percentiles([x / 1e9 for x in lat])
    return Row("tail", setup.name, durability, system, size, len(lat), seconds, p50, p99,
               errors=int(errors) + (count - len(lat)))


def tail_producer(system: str, target: str, name: str, rate: float, count: int, size: int) -> int:
    """The producer of tail_cell, in its own process: paced sends, each stamped at send."""
    pad = os.urandom(max(0, size - 8))
    if system == "kafka":
        p = _producer(target, **{"linger.ms": 0})
        p.list_topics(name, timeout=10)
        send = lambda data: (p.produce(name, data), p.poll(0))     # noqa: E731
    else:
        from embedlog import Client
        c = Client(target)
        s = c.open_stream(name, create=False)
        s.take_over()
        futs = []
        send = lambda data: futs.append(s.append_async(data))      # noqa: E731
    t0 = time.monotonic()
    for i in range(count):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        send(struct.pack("<q", time.time_ns()) + pad)
    if system == "kafka":
        left = p.flush(ANSWER_TIMEOUT_S)
    else:
        left = sum(1 for f in futs if f.exception(ANSWER_TIMEOUT_S) is not None)
        s.close()
        c.close()
    print(f"sent {count}, unacknowledged {left}", flush=True)
    return 1 if left else 0


# -- Spark ----------------------------------------------------------------------------------

def spark_session():
    import embedlog.spark
    from embedlog.harness.peers.kafka import spark_jars
    return embedlog.spark.local_session("local[2]", "vs-kafka", **{
        "spark.jars": spark_jars(), "spark.driver.memory": "3g"})


def spark_frame(spark, rows: int, size: int = 1024):
    """A cached DataFrame of ``rows`` incompressible ``size``-byte payloads (built untimed)."""
    from pyspark.sql import functions as F
    reps = -(-size // 32)
    df = (spark.range(0, rows, 1, SPARK_PARTITIONS)
          .select(F.expr(f"substring(unhex(repeat(sha2(cast(id as string), 256), {reps})), 1, {size})")
                  .alias("payload"))).cache()
    assert df.count() == rows
    return df


def _agg(frame, column: str) -> tuple:
    from pyspark.sql import functions as F
    r = frame.agg(F.count("*").alias("n"), F.sum(F.length(column)).alias("b")).first()
    return r.n, r.b


def spark_read_cell(spark, setup: Setup, system: str, rows: int, size: int = 1024) -> Row:
    payload = os.urandom(size)
    if system == "kafka":
        topic = _topic(setup, "sync")
        _kafka_fill(setup.kafka.bootstrap, topic, payload, rows)
        t0 = time.perf_counter()
        n, b = _agg(spark.read.format("kafka").option("kafka.bootstrap.servers", setup.kafka.bootstrap)
                    .option("subscribe", topic).option("startingOffsets", "earliest")
                    .option("endingOffsets", "latest").option("minPartitions", SPARK_PARTITIONS)
                    .load(), "value")
        seconds = time.perf_counter() - t0
        setup.kafka.admin().delete_topics([topic])
    else:
        w, s = _stream(setup, "sync")
        _embedlog_fill(s, payload, rows)
        s.close()
        t0 = time.perf_counter()
        n, b = _agg(spark.read.format("embedlog")
                    .option("metadataServiceUri", setup.embedlog["sync"].metadata_uri)
                    .option("streams", s.name)
                    .option("entriesPerPartition", -(-rows // SPARK_PARTITIONS)).load(), "payload")
        seconds = time.perf_counter() - t0
        w.delete_stream(s.name)
        w.close()
    return Row("spark_read", setup.name, "-", system, size, n, seconds,
               errors=int((n, b) != (rows, rows * size)))


def spark_write_cell(spark, setup: Setup, durability: str, system: str, df, rows: int,
                     size: int = 1024) -> Row:
    from pyspark.sql import functions as F
    if system == "kafka":
        topic = _topic(setup, durability)
        t0 = time.perf_counter()
        (df.select(F.col("payload").alias("value")).write.format("kafka")
         .option("kafka.bootstrap.servers", setup.kafka.bootstrap).option("kafka.acks", "all")
         .option("topic", topic).save())
        seconds = time.perf_counter() - t0
        n, b = _agg(spark.read.format("kafka").option("kafka.bootstrap.servers", setup.kafka.bootstrap)
                    .option("subscribe", topic).load(), "value")
        setup.kafka.admin().delete_topics([topic])
    else:
        cl = setup.embedlog[durability]
        name = _name("w")
        e, qw, qa = setup.quorum
        t0 = time.perf_counter()
        (df.write.format("embedlog").option("metadataServiceUri", cl.metadata_uri)
         .option("stream", name).option("ensembleSize", e).option("writeQuorum", qw)
         .option("ackQuorum", qa).mode("append").save())
        seconds = time.perf_counter() - t0
        n, b = _agg(spark.read.format("embedlog").option("metadataServiceUri", cl.metadata_uri)
                    .option("streams", name).load(), "payload")
        import embedlog.spark
        c = _client(cl)
        embedlog.spark.delete_stream(c, name)
        c.close()
    return Row("spark_write", setup.name, durability, system, size, n, seconds,
               errors=int((n, b) != (rows, rows * size)))


# -- Spark structured streaming -----------------------------------------------------------------

def _indexed(i: int, size: int) -> bytes:
    """Message ``i`` of a streaming input: its index in 12 digits, padded to ``size``."""
    head = b"%012d" % i
    return head + bytes(size - len(head))


def _fill_indexed(setup: Setup, system: str, rows: int, size: int) -> str:
    """A source topic / stream holding messages 0..rows-1 (written untimed); its name."""
    if system == "kafka":
        topic = _topic(setup, "sync")
        p = _producer(setup.kafka.bootstrap)
        for i in range(rows):
            p.produce(topic, _indexed(i, size))
            if i % 1000 == 0:
                p.poll(0)
        if p.flush(ANSWER_TIMEOUT_S):
            raise RuntimeError(f"kafka: messages left unacknowledged in {topic}")
        return topic
    w, s = _stream(setup, "sync")
    for k in range(0, rows, APPEND_MANY_BATCH):
        s.append_many([_indexed(i, size) for i in range(k, min(rows, k + APPEND_MANY_BATCH))])
    s.close()
    w.close()
    return s.name


def _output_target(setup: Setup, system: str) -> str:
    if system == "kafka":
        return _topic(setup, "sync")
    w, s = _stream(setup, "sync")
    s.close()
    w.close()
    return s.name


def streaming_query(spark, system: str, target: str, src: str, dst: str, ckpt: str,
                    per_trigger: int, trigger: dict, quorum=(3, 3, 2)):
    """src -> "out:" + payload -> dst, at most ``per_trigger`` rows a micro-batch: Kafka's
    source and sink (maxOffsetsPerTrigger, acks=all) or embedlog's (maxEntriesPerTrigger,
    sinkId for the exactly-once commit)."""
    from pyspark.sql import functions as F
    if system == "kafka":
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", target)
              .option("subscribe", src).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", per_trigger).load())
        out = df.select(F.concat(F.lit(b"out:"), F.col("value")).alias("value"))
        w = (out.writeStream.format("kafka").option("kafka.bootstrap.servers", target)
             .option("kafka.acks", "all").option("topic", dst))
    else:
        df = (spark.readStream.format("embedlog").option("metadataServiceUri", target)
              .option("streams", src).option("maxEntriesPerTrigger", per_trigger).load())
        out = df.select(F.concat(F.lit(b"out:"), F.col("payload")).alias("payload"))
        e, qw, qa = quorum
        w = (out.writeStream.format("embedlog").option("metadataServiceUri", target)
             .option("stream", dst).option("sinkId", sink_id(dst)).option("ensembleSize", e)
             .option("writeQuorum", qw).option("ackQuorum", qa))
    return w.option("checkpointLocation", ckpt).trigger(**trigger).start()


def sink_id(dst: str) -> str:
    return f"vs-kafka-{dst}"


def _target(setup: Setup, system: str) -> str:
    return setup.kafka.bootstrap if system == "kafka" else setup.embedlog["sync"].metadata_uri


def _drop(setup: Setup, system: str, *names: str) -> None:
    if system == "kafka":
        setup.kafka.admin().delete_topics(list(names))
        return
    import embedlog.spark
    c = _client(setup.embedlog["sync"])
    for n in names:
        embedlog.spark.delete_stream(c, n)
    c.close()


def output_indexes(setup: Setup, system: str, dst: str) -> list:
    """The input index of every message in ``dst`` (an "out:" + _indexed message), in order."""
    out = []
    if system == "kafka":
        from confluent_kafka import TopicPartition
        c = _consumer(setup.kafka.bootstrap, dst)
        _low, high = c.get_watermark_offsets(TopicPartition(dst, 0), timeout=30)
        seen = 0
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while seen < high and time.monotonic() < deadline:
            for m in c.consume(num_messages=10000, timeout=0.5):
                if m.error() is None:
                    seen = m.offset() + 1
                    out.append(int(m.value()[4:16]))
        c.close()
        return out
    c = _client(setup.embedlog["sync"])
    out = [int(e.data[4:16]) for e in c.open_stream(dst, create=False).read(0)]
    c.close()
    return out


def stream_cell(spark, setup: Setup, system: str, rows: int, per_trigger: int, workdir: str,
                size: int = 1024) -> Row:
    """A streaming job reads ``rows`` messages at ``per_trigger`` a micro-batch, transforms
    them and writes a second topic / stream (trigger availableNow): rows/s, start to end."""
    src = _fill_indexed(setup, system, rows, size)
    dst = _output_target(setup, system)
    ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=workdir)
    t0 = time.perf_counter()
    q = streaming_query(spark, system, _target(setup, system), src, dst, ckpt, per_trigger,
                        {"availableNow": True}, setup.quorum)
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    failed = q.exception() is not None
    got = output_indexes(setup, system, dst)
    _drop(setup, system, src, dst)
    return Row("spark_stream", setup.name, "sync", system, size, len(got), seconds,
               errors=int(failed) + int(sorted(got) != list(range(rows))))


def _batch_ids(ckpt: str, kind: str) -> list:
    d = os.path.join(ckpt, kind)
    return sorted(int(f) for f in os.listdir(d) if f.isdigit()) if os.path.isdir(d) else []


def kill_cell(setup: Setup, system: str, rows: int, per_trigger: int, kills: int, workdir: str,
              size: int = 100) -> Row:
    """The streaming job of stream_cell in a child driver process, SIGKILLed ``kills`` times
    while a micro-batch is in flight (its offsets logged, its commit not) and restarted from
    its checkpoint each time, then run to the end (availableNow). Row.count is the number of
    output messages; Row.errors is duplicates + losses (``kill_counts`` tells them apart)."""
    import signal
    src = _fill_indexed(setup, system, rows, size)
    dst = _output_target(setup, system)
    ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=workdir)
    tmp = tempfile.mkdtemp(prefix="driver-tmp-", dir=workdir)
    env = {**os.environ, "TMPDIR": tmp, "SPARK_LOCAL_DIRS": tmp}
    cmd = [sys.executable, os.path.abspath(__file__), "stream-job", system, _target(setup, system),
           src, dst, ckpt, str(per_trigger), ",".join(map(str, setup.quorum))]
    t0 = time.perf_counter()
    ahead = _sink_probe(setup, system, dst, ckpt)
    for k in range(kills):
        log_path = os.path.join(workdir, f"{system}-{dst}-run{k}.log")
        with open(log_path, "wb") as log:
            child = subprocess.Popen(cmd + ["run"], env=env, start_new_session=True,
                                     stdout=log, stderr=subprocess.STDOUT)
        done_before = (_batch_ids(ckpt, "commits") or [-1])[-1]
        deadline = time.monotonic() + 300
        in_flight = None                  # (batch id, when first seen planned and not committed)
        last_took = 1.0                   # how long a batch took, between two commits
        committed_at = None
        try:
            while time.monotonic() < deadline and child.poll() is None:
                done = (_batch_ids(ckpt, "commits") or [-1])[-1]
                planned = (_batch_ids(ckpt, "offsets") or [-1])[-1]
                now = time.monotonic()
                if committed_at is not None and committed_at[0] != done:
                    last_took = now - committed_at[1]
                if committed_at is None or committed_at[0] != done:
                    committed_at = (done, now)
                if done > done_before and planned > done:   # one batch made, the next in flight
                    if in_flight is None or in_flight[0] != planned:
                        in_flight = (planned, now)
                    # the sink wrote (some of) the batch Spark has not recorded: the window a
                    # replay duplicates in; or, not seen, half a batch into it
                    if ahead(done) or now - in_flight[1] > last_took / 2:
                        break
                time.sleep(0.005)
            else:
                with open(log_path, errors="replace") as f:
                    tail = "".join(line for line in f.readlines() if not line.startswith("\t"))[-4000:]
                raise RuntimeError(f"{system} stream job {k}: no batch in flight within 300 s "
                                   f"(exit {child.poll()}); its log ends:\n{tail}")
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)      # the driver and its Python workers
            child.wait()
    ahead.close()
    final = subprocess.run(cmd + ["available-now"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=900)
    seconds = time.perf_counter() - t0
    got = output_indexes(setup, system, dst)
    dup, lost = kill_counts(got, rows)
    _drop(setup, system, src, dst)
    if final.returncode != 0:
        raise RuntimeError(f"{system} stream job, last run: {final.stderr[-3000:]}")
    row = Row("spark_kill", setup.name, "sync", system, size, len(got), seconds, errors=dup + lost)
    row.duplicates, row.losses, row.kills = dup, lost, kills     # type: ignore[attr-defined]
    return row


def _sink_probe(setup: Setup, system: str, dst: str, ckpt: str):
    """A function of ``done`` (the last batch Spark recorded): True when the sink already
    holds output of a later batch. Close it with .close()."""
    import json
    if system == "kafka":
        from confluent_kafka import TopicPartition
        consumer = _consumer(setup.kafka.bootstrap, dst)

        def ahead(done: int) -> bool:
            with open(os.path.join(ckpt, "offsets", str(done))) as f:
                ends = json.loads(f.read().splitlines()[-1])   # {"topic": {"0": end offset}}
            committed = sum(int(o) for parts in ends.values() for o in parts.values())
            _low, high = consumer.get_watermark_offsets(TopicPartition(dst, 0), timeout=5)
            return high > committed
        ahead.close = consumer.close                            # type: ignore[attr-defined]
        return ahead
    import embedlog.spark
    client = _client(setup.embedlog["sync"])

    def ahead(done: int) -> bool:
        return embedlog.spark.committed_batches(client, dst).get(sink_id(dst), -1) > done
    ahead.close = client.close                                  # type: ignore[attr-defined]
    return ahead


def kill_counts(indexes: list, rows: int) -> tuple:
    """(duplicates, losses) of an output that should hold each of 0..rows-1 once."""
    unique = set(indexes)
    return len(indexes) - len(unique), len(set(range(rows)) - unique)


def stream_job(system: str, target: str, src: str, dst: str, ckpt: str, per_trigger: int,
               quorum: str, how: str) -> int:
    """The driver of kill_cell, in its own process: ``run`` goes on until killed,
    ``available-now`` ends once everything is read."""
    spark = spark_session()
    trigger = {"availableNow": True} if how == "available-now" else {"processingTime": "0 seconds"}
    q = streaming_query(spark, system, target, src, dst, ckpt, per_trigger, trigger,
                        tuple(int(x) for x in quorum.split(",")))
    q.awaitTermination()
    failed = q.exception()
    spark.stop()
    if failed is not None:
        print(failed, file=sys.stderr)
        return 1
    return 0


# -- the run and its tables ---------------------------------------------------------------------

def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _fmt_lat(r50, r99) -> str:
    if r50 is None:
        return "-"
    f = lambda us: f"{us / 1000:.1f} ms" if us >= 10_000 else f"{us:,.0f} µs"  # noqa: E731
    return f"{f(r50)} / {f(r99)}"


def _med(rows: list, attr: str):
    vals = [getattr(r, attr) for r in rows if getattr(r, attr) is not None]
    return statistics.median(vals) if vals else None


def tables(rows: list) -> str:
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.cell, r.setup, r.durability, r.size, r.client), []).append(r)
    out = []

    def rate(key):
        g = groups.get(key)
        return _med(g, "rate") if g else None

    def lat(key):
        g = groups.get(key)
        return _fmt_lat(_med(g, "p50_us"), _med(g, "p99_us")) if g else "-"

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    setups = list(dict.fromkeys(r.setup for r in rows))
    sizes = sorted({r.size for r in rows if r.cell == "produce"})
    if any(r.cell == "produce" for r in rows):
        out += ["### Produce from Python (msgs/s; ack latency p50 / p99)", "",
                "| setup | durability | size | Kafka producer | Kafka ack p50 / p99 | produce | "
                "ack p50 / p99 | / Kafka | append_async | "
                "ack p50 / p99 | / Kafka | append_many (1000) | ack p50 / p99 | / Kafka |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for st in setups:
            for d in ("sync", "page cache"):
                for size in sizes:
                    k = ("produce", st, d, size)
                    kr, ar, mr = rate(k + ("kafka",)), rate(k + ("append_async",)), rate(k + ("append_many",))
                    pr = rate(k + ("produce",))
                    if kr is None:
                        continue
                    out.append(f"| {st} | {d} | {size} B | {_fmt_rate(kr)} | {lat(k + ('kafka',))} | "
                               f"{_fmt_rate(pr) if pr else '-'} | {lat(k + ('produce',))} | {ratio(pr, kr)} | "
                               f"{_fmt_rate(ar) if ar else '-'} | {lat(k + ('append_async',))} | {ratio(ar, kr)} | "
                               f"{_fmt_rate(mr) if mr else '-'} | {lat(k + ('append_many',))} | {ratio(mr, kr)} |")
        out.append("")
    if any(r.cell == "consume" for r in rows):
        out += ["### Consume from the beginning, from Python (msgs/s)", "",
                "| setup | size | Kafka Consumer | embedlog Stream.read | / Kafka |",
                "| --- | ---: | ---: | ---: | ---: |"]
        for st in setups:
            for size in sorted({r.size for r in rows if r.cell == "consume"}):
                k = ("consume", st, "-", size)
                kr, er = rate(k + ("kafka",)), rate(k + ("embedlog",))
                if kr:
                    out.append(f"| {st} | {size} B | {_fmt_rate(kr)} | {_fmt_rate(er)} | {ratio(er, kr)} |")
        out.append("")
    if any(r.cell == "tail" for r in rows):
        out += ["### Tail: end-to-end latency, producer process to tailing reader", "",
                "| setup | durability | size | rate | Kafka p50 / p99 | embedlog p50 / p99 | "
                "Kafka p50 / embedlog p50 |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for st in setups:
            for d in ("sync", "page cache"):
                for size in sorted({r.size for r in rows if r.cell == "tail"}):
                    k = ("tail", st, d, size)
                    if k + ("kafka",) not in groups:
                        continue
                    kp = _med(groups[k + ("kafka",)], "p50_us")
                    ep = _med(groups.get(k + ("embedlog",), []), "p50_us")
                    rate_s = groups[k + ("kafka",)][0]
                    out.append(f"| {st} | {d} | {size} B | {rate_s.count / rate_s.seconds:,.0f}/s | "
                               f"{lat(k + ('kafka',))} | {lat(k + ('embedlog',))} | {ratio(kp, ep)} |")
        out.append("")
    if any(r.cell in ("spark_read", "spark_write") for r in rows):
        out += ["### Spark batch, 1 KiB rows (rows/s)", "",
                "| work | setup | durability | format(\"kafka\") | format(\"embedlog\") | / Kafka |",
                "| --- | --- | --- | ---: | ---: | ---: |"]
        for cell in ("spark_read", "spark_write"):
            for st in setups:
                for d in ("-", "sync", "page cache"):
                    k = (cell, st, d, 1024)
                    kr, er = rate(k + ("kafka",)), rate(k + ("embedlog",))
                    if kr:
                        out.append(f"| {cell} | {st} | {d} | {_fmt_rate(kr)} | {_fmt_rate(er)} | {ratio(er, kr)} |")
        out.append("")
    if any(r.cell == "spark_stream" for r in rows):
        out += ["### Spark structured streaming: topic -> transform -> topic, 1 KiB rows, "
                "availableNow (rows/s, sync durability)", "",
                "| setup | Kafka source + sink | embedlog source + sink | / Kafka |",
                "| --- | ---: | ---: | ---: |"]
        for st in setups:
            k = ("spark_stream", st, "sync", 1024)
            kr, er = rate(k + ("kafka",)), rate(k + ("embedlog",))
            if kr:
                out.append(f"| {st} | {_fmt_rate(kr)} | {_fmt_rate(er)} | {ratio(er, kr)} |")
        out.append("")
    kills = [r for r in rows if r.cell == "spark_kill"]
    if kills:
        out += ["### The streaming job's driver SIGKILLed mid-batch and restarted from its checkpoint", "",
                "| system | setup | inputs | kills | output messages | duplicates | lost |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in kills:
            out.append(f"| {r.system} | {r.setup} | {r.count - r.duplicates + r.losses:,} | "
                       f"{getattr(r, 'kills', '-')} | {r.count:,} | {r.duplicates:,} | {r.losses:,} |")
        out.append("")
    bad = [r for r in rows if r.errors and not (r.cell == "spark_kill" and r.system == "kafka")]
    if bad:
        out += ["Cells with errors (unacknowledged, missing or wrong messages):", ""]
        out += [f"- {r}" for r in bad]
    return "\n".join(out)


def run_rounds(cells: list, rounds: int, log=print) -> tuple:
    """Every cell once per round, in the same order (Kafka's and embedlog's side by side), so
    a neighbour's load hits both alike: (rows, one note per round with its time, load average
    and free disk, then one per failed cell). Each row's line goes to ``log`` as it is
    measured."""
    rows, notes, failed = [], [], []
    for rnd in range(rounds):
        load, start = os.getloadavg()[0], time.time()
        log(f"# round {rnd + 1} starts {_hhmm(start)} UTC: load {load:.1f}, {_disk_free()}")
        for k, cell in enumerate(cells):
            try:
                r = cell()
            except Exception as exc:     # one cell's failure (a full disk...) ends no run
                log(f"round {rnd + 1}: cell {k + 1} of {len(cells)} FAILED: {exc!r}"[:2000])
                failed.append(f"round {rnd + 1}, cell {k + 1}: {exc!r}"[:500])
                continue
            rows.append(r)
            log(f"round {rnd + 1}: {r.cell} {r.setup} {r.durability} {r.client} {r.size} B: "
                f"{_fmt_rate(r.rate)}/s {_fmt_lat(r.p50_us, r.p99_us)}"
                f"{'  ERRORS ' + str(r.errors) if r.errors else ''}  (load {os.getloadavg()[0]:.1f})")
        notes.append(f"round {rnd + 1}: {_hhmm(start)}-{_hhmm(time.time())} UTC, load average "
                     f"{load:.1f} at its start, {os.getloadavg()[0]:.1f} at its end, "
                     f"{_disk_free()} after it")
        log("# " + notes[-1])
    notes += [f"FAILED: {f}" for f in failed]
    return rows, notes


def _hhmm(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t))


def _disk_free() -> str:
    st = os.statvfs(tempfile.gettempdir())
    return f"{st.f_bavail * st.f_frsize / 2**30:.0f} GiB free on {tempfile.gettempdir()}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "tail-producer":
        system, target, name, rate, count, size = argv[1:7]
        return tail_producer(system, target, name, float(rate), int(count), int(size))
    if argv and argv[0] == "stream-job":
        system, target, src, dst, ckpt, per_trigger, quorum, how = argv[1:9]
        return stream_job(system, target, src, dst, ckpt, int(per_trigger), quorum, how)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--nodes", default="1,3")
    ap.add_argument("--tail-rate", type=float, default=1000.0)
    ap.add_argument("--tail-seconds", type=float, default=5.0)
    ap.add_argument("--spark-rows", type=int, default=200_000)
    ap.add_argument("--stream-rows", type=int, default=100_000,
                    help="rows of 1 KiB through the streaming job, per round")
    ap.add_argument("--per-trigger", type=int, default=10_000,
                    help="maxOffsetsPerTrigger / maxEntriesPerTrigger")
    ap.add_argument("--kills", type=int, default=3, help="driver SIGKILLs in the kill test")
    ap.add_argument("--kill-rows", type=int, default=20_000)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated cells: produce,consume,tail,"
                    "spark_read,spark_write,spark_stream,spark_kill")
    ap.add_argument("--out", default="", help="also write the tables to this file")
    args = ap.parse_args(argv)
    from embedlog.harness import LocalCluster
    from embedlog.harness.peers.kafka import KafkaCluster
    sizes = [int(s) for s in args.sizes.split(",")]
    only = set(filter(None, args.only.split(",")))
    want = lambda cell: not only or cell in only      # noqa: E731
    load0, t_start = os.getloadavg(), time.time()
    work = tempfile.mkdtemp(prefix="embedlog-vs-kafka-")
    progress = open(args.out + ".log", "a") if args.out else None

    def _log(line: str) -> None:
        # as it happens, also to FILE.log: a run cut short keeps its finished rounds
        print(line, flush=True)
        if progress is not None:
            progress.write(line + "\n")
            progress.flush()

    _log(f"# {' '.join(argv)}: starts {_hhmm(t_start)} UTC, load {load0[0]:.1f}, {_disk_free()}")
    round_notes: list = []
    owned: list = []
    rows: list = []
    setups = []
    try:
        for n in (int(x) for x in args.nodes.split(",")):
            kc = KafkaCluster(brokers=n, base_dir=os.path.join(work, f"kafka-{n}"), heap_mb=1024,
                              fast_start=False, broker_config=KAFKA_DEFAULTS)
            owned.append(kc)
            print(f"# Kafka, {n} broker(s): formatted, started and listed in {kc.startup_s:.1f} s", flush=True)
            els = {}
            for d, conf in (("sync", BOOKIE_DISK), ("page cache", {**BOOKIE_DISK, "journal_sync_data": False})):
                els[d] = LocalCluster(bookies=n, base_dir=os.path.join(work, f"el-{n}-{d.replace(' ', '')}"),
                                      proxies=False, autorecovery=False, bookie_config=conf)
                owned.append(els[d])
            setups.append(Setup("one node" if n == 1 else f"{n} nodes", kc, els,
                                (1, 1, 1) if n == 1 else (3, 3, 2)))
        spark = df = None
        if not args.no_spark and any(want(c) for c in ("spark_read", "spark_write", "spark_stream",
                                                          "spark_kill")):
            spark = spark_session()
            df = spark_frame(spark, args.spark_rows)
            # untimed: a format's first query in the session starts its Python workers
            # (embedlog; 5-17 s at a load of 11-25) or loads its connector classes (Kafka)
            for st in setups:
                for system in ("kafka", "embedlog"):
                    spark_read_cell(spark, st, system, 100)
        cells = []
        for st in setups:
            for d in ("sync", "page cache"):
                for size in sizes:
                    for client in PRODUCERS:
                        if want("produce"):
                            cells.append(lambda st=st, d=d, size=size, client=client:
                                         produce_cell(st, d, client, size, args.messages))
            for size in sizes:
                for system in ("kafka", "embedlog"):
                    if want("consume"):
                        cells.append(lambda st=st, size=size, system=system:
                                     consume_cell(st, system, size, args.messages))
            for d in ("sync", "page cache"):
                for system in ("kafka", "embedlog"):
                    if want("tail"):
                        cells.append(lambda st=st, system=system, d=d:
                                     tail_cell(st, system, 100, args.tail_rate, args.tail_seconds, d))
            if spark is not None:
                for system in ("kafka", "embedlog"):
                    if want("spark_read"):
                        cells.append(lambda st=st, system=system:
                                     spark_read_cell(spark, st, system, args.spark_rows))
                for d in ("sync", "page cache"):
                    for system in ("kafka", "embedlog"):
                        if want("spark_write"):
                            cells.append(lambda st=st, d=d, system=system:
                                         spark_write_cell(spark, st, d, system, df, args.spark_rows))
                for system in ("kafka", "embedlog"):
                    if want("spark_stream"):
                        cells.append(lambda st=st, system=system:
                                     stream_cell(spark, st, system, args.stream_rows,
                                                 args.per_trigger, work))
        rows, round_notes = run_rounds(cells, args.rounds, _log)
        if spark is not None and want("spark_kill") and args.kills:
            # once, after the rounds: a count of duplicates and losses, not a speed
            for system in ("kafka", "embedlog"):
                r = kill_cell(setups[-1], system, args.kill_rows, max(1, args.kill_rows // 20),
                              args.kills, work)
                rows.append(r)
                _log(f"kill test: {system} on {r.setup}: {r.count} output messages for "
                     f"{args.kill_rows} inputs, {r.duplicates} duplicates, {r.losses} lost "
                     f"({r.seconds:.0f} s, load {os.getloadavg()[0]:.1f})")
        if spark is not None:
            spark.stop()
    finally:
        for o in reversed(owned):
            try:
                o.close()
            except Exception as exc:
                print(f"closing {o}: {exc}", file=sys.stderr)
        import shutil
        shutil.rmtree(work, ignore_errors=True)
        if progress is not None:
            progress.close()
    head = (f"`python benchmarks/vs_kafka.py {' '.join(argv)}`".replace(" `", "`") +
            f": {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t_start))}, {args.rounds} interleaved "
            f"rounds, {time.time() - t_start:.0f} s, nproc {os.cpu_count()}, load average "
            f"{load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after; Kafka 4.4.0 (KRaft), "
            f"confluent-kafka/librdkafka, Spark's Kafka connector 4.2.0 on PySpark 4.3.0\n")
    text = head + "\n" + "".join(f"- {n}\n" for n in round_notes) + "\n" + tables(rows)
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    # Kafka's sink is at-least-once: its duplicates are a measurement, not a failure
    return 1 if any(n.startswith("FAILED") for n in round_notes) or any(
        r.errors for r in rows if not (r.cell == "spark_kill" and r.system == "kafka")) else 0


if __name__ == "__main__":
    raise SystemExit(main())
