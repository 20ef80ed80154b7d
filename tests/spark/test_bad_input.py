"""Bad input fails while Spark plans, with embedlog's message, before any task runs."""
from __future__ import annotations

import json
import os

import pytest
from pyspark.sql import functions as F


def load(spark, uri, **opts):
    r = spark.read.format("embedlog")
    if uri is not None:
        r = r.option("metadataServiceUri", uri)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()



@pytest.mark.parametrize("opts, message", [
    (dict(ledgers="424242"), "no ledger 00000000000000000000000000067932"),
    (dict(ledgers="not-a-ledger"), "is not a ledger id"),
    (dict(streams="no-such-stream"), "no stream named 'no-such-stream'"),
    (dict(ledgers="1", streams="x"), "exactly one of the options"),
    (dict(streams="x", colour="blue"), "unknown option 'colour'"),
    (dict(streams="x", entriesPerPartition="many"), "entriesPerPartition must be an integer"),
    (dict(streams="x", entriesPerPartition="0"), "entriesPerPartition must be in 1.."),
    (dict(streams="x", startingOffsets="{bad json"), "option startingOffsets is"),
    (dict(streams="x", startingOffsets="newest"), "option startingOffsets is 'earliest' or 'latest'"),
    (dict(streams="x", startingOffsets='{"x": -3}'), "-2 for earliest, -1 for latest"),
    (dict(streams="x", endingOffsets='{"x": -2}'), "option endingOffsets is"),
    (dict(streams="x", failOnDataLoss="maybe"), "failOnDataLoss is true or false"),
    (dict(streams="x", maxTriggerDelay="soon"), "maxTriggerDelay is a duration"),
    (dict(streams="x", minPartitions="0"), "minPartitions must be in 1.."),
    (dict(streams="x", maxEntriesPerTrigger="10", minEntriesPerTrigger="20"), "is above maxEntriesPerTrigger"),
    (dict(ledgers="1", startingTimestamp="5"), "startingTimestamp needs streams"),
    (dict(streams="x", startingOffsetsByTimestamp="[1]"), "stream name -> time"),
    (dict(streams="x", passwordFile="/no/such/file"), "passwordFile: cannot read"),
    (dict(streams="x", tlsCaFile="/no/such/ca.pem"), "tlsCaFile: no file"),
    (dict(streams="x", password="a", passwordFile="/etc/hostname"), "password or passwordFile, not both"),
    # issue 27 item 9: Kafka's names (docs/SPARK.md's table) and near misses say what to use
    (dict(subscribe="x"), "option 'subscribe' is Kafka's; did you mean streams"),
    (dict(streams="x", maxOffsetsPerTrigger="10"), "'maxOffsetsPerTrigger' is Kafka's; did you mean maxEntriesPerTrigger"),
    (dict(streams="x", maxEntriesPerTriger="10"), "Did you mean maxEntriesPerTrigger"),
])
def test_bad_read_options(spark, uri, opts, message):
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(".", r"\.")):
        load(spark, uri, **opts).collect()
    if "no ledger" in message or "no stream" in message:
        return                            # these need the metadata store: checked by reader()
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(".", r"\.")):
        load(spark, uri, **opts)          # already when load() is called


def test_a_bad_option_is_the_first_thing_said(spark, uri):
    """Issue 27 item 9: Spark prints the Python traceback inside its error; embedlog's
    message comes after one frame, not after the whole call chain of the option checks."""
    with pytest.raises(Exception) as info:
        load(spark, uri, streams="x", maxOffsetsPerTrigger="10")
    text = str(info.value)
    assert text.count('File "') == 1 and "did you mean maxEntriesPerTrigger" in text, text
    with pytest.raises(Exception) as info:
        load(spark, uri, streams="x", Colour="blue")
    # Spark lower-cases option names before the source sees them: the message says so
    assert "unknown option 'colour' (Spark passes option names lower-cased)" in str(info.value)


def test_ending_offsets_in_a_streaming_read(spark, uri, tmp_path):
    """Issue 27 item 9: docs/SPARK.md says endingOffsets is batch only; a streaming read
    with it fails when the query starts, before any batch."""
    q = (spark.readStream.format("embedlog").option("metadataServiceUri", uri)
         .option("streams", "x").option("endingOffsets", "latest").load()
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c")).start())
    try:
        with pytest.raises(Exception, match="option endingOffsets is for batch reads"):
            q.awaitTermination(60)
        assert q.lastProgress is None
    finally:
        q.stop()


def test_missing_uri(spark):
    with pytest.raises(Exception, match="metadataServiceUri is required"):
        load(spark, None, streams="x").collect()


def test_bad_write_options(spark, uri, tmp_path):
    df = spark.range(3).select(F.col("id").cast("string").alias("payload"))
    with pytest.raises(Exception, match="needs option stream, option scope, or a string column 'stream'"):
        df.write.format("embedlog").option("metadataServiceUri", uri).mode("append").save()
    with pytest.raises(Exception, match="needs a binary or string column named 'payload'"):
        (spark.range(3).write.format("embedlog").option("metadataServiceUri", uri)
         .option("stream", "x").mode("append").save())
    # a streaming sink is created when the query starts: it fails before its first batch
    q = (spark.readStream.format("rate").load().select(F.col("value").cast("string").alias("payload"))
         .writeStream.format("embedlog").option("metadataServiceUri", uri).option("stream", "x")
         .option("checkpointLocation", str(tmp_path / "c")).start())
    try:
        with pytest.raises(Exception, match="needs option sinkId"):
            q.awaitTermination(60)
        assert q.lastProgress is None                 # no batch ran
    finally:
        q.stop()


def test_malformed_checkpoint_offset(spark, uri, client, name, tmp_path):
    s = client.open_stream(name)
    s.append_many([b"1", b"2", b"3"])
    s.close()
    ckpt = str(tmp_path / "ckpt")

    def run():
        q = (spark.readStream.format("embedlog").option("metadataServiceUri", uri)
             .option("streams", name).load().writeStream.format("noop")
             .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        try:
            q.awaitTermination(60)
        except Exception:
            pass                       # q.exception() has it
        return q

    assert run().exception() is None
    offsets = os.path.join(ckpt, "offsets")
    last = max(int(f) for f in os.listdir(offsets) if f.isdigit())
    path = os.path.join(offsets, str(last))
    lines = open(path).read().splitlines()
    lines[-1] = json.dumps({name: "three"})          # a position that is not a number
    open(path, "w").write("\n".join(lines))
    crc = os.path.join(offsets, f".{last}.crc")
    if os.path.exists(crc):
        os.unlink(crc)
    q = run()
    assert q.exception() is not None
    assert "malformed" in str(q.exception()) and "next position" in str(q.exception())


@pytest.mark.parametrize("opts, message", [
    (dict(streams="x", maxEntriesPerTrigger="lots"), "maxEntriesPerTrigger must be an integer"),
    (dict(streams="x", colour="blue"), "unknown option 'colour'"),
    (dict(streams="x", minEntriesPerTrigger="-1"), "minEntriesPerTrigger must be in 1.."),
])
def test_streaming_options_fail_at_load(spark, uri, opts, message):
    """A bad option fails when load() is called, not seconds after start()."""
    r = spark.readStream.format("embedlog").option("metadataServiceUri", uri)
    for k, v in opts.items():
        r = r.option(k, v)
    with pytest.raises(Exception, match=message):
        r.load()


def test_batch_options_fail_at_load(spark, uri):
    r = spark.read.format("embedlog").option("metadataServiceUri", uri).option("streams", "x")
    with pytest.raises(Exception, match="startingOffsets is 'earliest' or 'latest'"):
        r.option("startingOffsets", "newest").load()


def test_latest_in_a_batch_read_is_nothing(spark, uri, client, name):
    s = client.open_stream(name)
    s.append_many([b"a", b"b"])
    s.close()
    assert load(spark, uri, streams=name, startingOffsets="latest").count() == 0
    assert load(spark, uri, streams=name, startingOffsets=json.dumps({name: -1})).count() == 0
    assert load(spark, uri, streams=name, startingOffsets=json.dumps({name: -2}),
                endingOffsets=json.dumps({name: -1})).count() == 2


def test_secrets_stay_out_of_plans_and_messages(spark, uri, client, name, tmp_path):
    secret = "hunter2-" + name
    s = client.open_stream(name, password=secret.encode())
    s.append(b"x")
    s.close()
    df = load(spark, uri, streams=name, password=secret)
    plan = df._jdf.queryExecution().toString()
    assert secret not in plan and df.count() == 1
    # a wrong password fails without printing either
    with pytest.raises(Exception) as failure:
        load(spark, uri, streams=name, password=secret + "-wrong").collect()
    assert "wrong password" in str(failure.value) and secret not in str(failure.value)
    # and from a file
    path = tmp_path / "pw"
    path.write_text(secret + "\n")
    assert load(spark, uri, streams=name, passwordFile=str(path)).count() == 1
    from embedlog.spark.options import read_options
    opts = read_options({"metadataServiceUri": uri, "streams": name, "password": secret,
                         "authToken": "tok-" + secret})
    assert secret not in repr(opts)


def test_a_mistyped_uri_is_refused_and_makes_no_store(spark, tmp_path):
    """Issue 27 item 5: the CLI's message (no store there), never a new, empty store."""
    typo = f"sqlite://{tmp_path}/typo.db"
    with pytest.raises(Exception, match="no metadata store at"):
        load(spark, typo, streams="clicks").collect()
    assert not (tmp_path / "typo.db").exists()
