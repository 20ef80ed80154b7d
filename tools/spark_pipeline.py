"""The example pipeline of README.md: app -> stream "events" -> Spark -> Parquet + stream "totals".

    python tools/spark_pipeline.py demo [--events 20000] [--workdir DIR] [--keep]

``demo`` starts a LocalCluster, appends events to the stream ``events`` as an application
would, runs the Spark job (``job``, a child process) and SIGKILLs it once a few
micro-batches are committed, starts it again from its checkpoint, and checks that the
Parquet files and the stream ``totals`` hold exactly the totals of the events: nothing
lost, nothing counted twice.

Everything it makes (the cluster, the checkpoint, the Parquet files, and the temporary files
of Spark and of its JVM: TMPDIR, SPARK_LOCAL_DIRS and java.io.tmpdir point into the work
directory) lives in one work directory, removed at the end unless ``--keep`` or
``--workdir`` (a SIGKILLed Spark job cannot clean up after itself: 65-150 MB were left in
/tmp after each run).

The job reads ``events`` with a read limit per micro-batch; in each micro-batch
(foreachBatch) it counts and sums the events per user, writes the result to
Parquet under ``<workdir>/parquet/batch=<id>`` (overwriting that directory, so a replay
is idempotent) and appends it to ``totals`` with sinkId/batchId (exactly once).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

USERS = 7


def event(i: int) -> bytes:
    return json.dumps({"user": f"u{i % USERS}", "amount": i % 100, "seq": i}).encode()


def expected(n: int) -> dict:
    out = {}
    for i in range(n):
        c, s = out.get(f"u{i % USERS}", (0, 0))
        out[f"u{i % USERS}"] = (c + 1, s + i % 100)
    return out


def _session(app: str):
    """A local session whose temporary files stay in this process's TMPDIR (the work
    directory's, set by the demo for its children)."""
    import tempfile as tf
    import embedlog.spark
    tmp = tf.gettempdir()
    # -XX:-UsePerfData: no hsperfdata file in /tmp (a killed JVM leaves its own behind)
    opts = (f"-Djava.io.tmpdir={tmp} -XX:-UsePerfData "
            f"-Dlog4j2.configurationFile=file:{os.path.join(tmp, 'embedlog-spark-log4j2.properties')}")
    return embedlog.spark.local_session("local[2]", app, **{
        "spark.local.dir": tmp, "spark.driver.extraJavaOptions": opts,
        "spark.executor.extraJavaOptions": opts})


def run_job(args) -> None:
    from pyspark.sql import functions as F
    spark = _session("embedlog-pipeline")
    schema = "user string, amount long, seq long"

    def each_batch(df, batch_id):
        events = df.select(F.from_json(F.col("payload").cast("string"), schema).alias("e")).select("e.*")
        totals = events.groupBy("user").agg(F.count("*").alias("events"),
                                            F.sum("amount").alias("amount")).cache()
        totals.write.mode("overwrite").parquet(os.path.join(args.out, "parquet", f"batch={batch_id}"))
        (totals.select(F.to_json(F.struct(F.lit(batch_id).alias("batch"), "user", "events", "amount"))
                       .alias("payload"))
         .write.format("embedlog").option("metadataServiceUri", args.uri).option("stream", "totals")
         .option("sinkId", "pipeline-totals").option("batchId", batch_id).mode("append").save())
        totals.unpersist()
        if args.batch_delay_s:
            time.sleep(args.batch_delay_s)         # so that the demo can kill it mid-way

    q = (spark.readStream.format("embedlog").option("metadataServiceUri", args.uri)
         .option("streams", "events").option("maxEntriesPerTrigger", args.max_per_trigger).load()
         .writeStream.foreachBatch(each_batch).option("checkpointLocation", args.checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    spark.stop()


def _committed(checkpoint: str) -> int:
    d = os.path.join(checkpoint, "commits")
    return len([f for f in os.listdir(d) if f.isdigit()]) if os.path.isdir(d) else 0


def demo(args) -> int:
    import shutil
    made = args.workdir is None
    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="embedlog-pipeline-"))
    os.makedirs(work, exist_ok=True)
    try:
        return _demo(args, work)
    finally:
        if made and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


def _demo(args, work: str) -> int:
    from embedlog.harness import LocalCluster
    out, ckpt = os.path.join(work, "out"), os.path.join(work, "checkpoint")
    # Spark, its JVM and its Python workers write their temporary files here
    tmp = os.path.join(work, "tmp")
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, TMPDIR=tmp, SPARK_LOCAL_DIRS=tmp)
    with LocalCluster(bookies=3, base_dir=os.path.join(work, "cluster"), autorecovery=False) as cluster:
        client = cluster.client()
        events = client.open_stream("events")
        events.append_many([event(i) for i in range(args.events)])     # the application
        events.close()
        print(f"appended {args.events} events to stream 'events'")
        cmd = [sys.executable, os.path.abspath(__file__), "job", "--uri", cluster.metadata_uri,
               "--checkpoint", ckpt, "--out", out, "--max-per-trigger", str(args.max_per_trigger)]
        first = subprocess.Popen(cmd + ["--batch-delay-s", "1"], start_new_session=True, env=env)
        deadline = time.monotonic() + 300
        while _committed(ckpt) < args.kill_after and first.poll() is None:
            if time.monotonic() > deadline:
                first.kill()
                raise SystemExit("the job did not commit its first batches in 300 s")
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)          # the driver and its Python workers
        first.wait()
        print(f"killed the job (SIGKILL) after {_committed(ckpt)} committed micro-batches")
        second = subprocess.run(cmd, timeout=900, env=env)
        if second.returncode != 0:
            raise SystemExit(f"the restarted job failed ({second.returncode})")
        print(f"restarted job finished: {_committed(ckpt)} micro-batches in all")
        check = subprocess.run([sys.executable, os.path.abspath(__file__), "verify", "--uri",
                                cluster.metadata_uri, "--out", out, "--events", str(args.events)],
                               timeout=900, env=env)
        return check.returncode


def verify(uri: str, out: str, n: int) -> int:
    from pyspark.sql import functions as F
    spark = _session("embedlog-pipeline-check")
    want = expected(n)
    pq = (spark.read.parquet(os.path.join(out, "parquet")).groupBy("user")
          .agg(F.sum("events").alias("events"), F.sum("amount").alias("amount")).collect())
    from_parquet = {r.user: (r.events, r.amount) for r in pq}
    rows = (spark.read.format("embedlog").option("metadataServiceUri", uri)
            .option("streams", "totals").load().select(F.col("payload").cast("string")).collect())
    from_stream: dict = {}
    batches = set()
    for r in rows:
        t = json.loads(r.payload)
        batches.add(t["batch"])
        c, s = from_stream.get(t["user"], (0, 0))
        from_stream[t["user"]] = (c + t["events"], s + t["amount"])
    spark.stop()
    ok = from_parquet == want and from_stream == want
    print(f"parquet totals  {'==' if from_parquet == want else '!='} expected: {sorted(from_parquet.items())}")
    print(f"'totals' stream {'==' if from_stream == want else '!='} expected "
          f"({len(rows)} rows from {len(batches)} micro-batches)")
    print("exact output" if ok else "OUTPUT IS WRONG")
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo")
    d.add_argument("--events", type=int, default=20000)
    d.add_argument("--max-per-trigger", type=int, default=2000)
    d.add_argument("--kill-after", type=int, default=3, help="committed micro-batches before the kill")
    d.add_argument("--workdir", help="work here and keep it (default: a temporary directory, removed)")
    d.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    v = sub.add_parser("verify")
    v.add_argument("--uri", required=True)
    v.add_argument("--out", required=True)
    v.add_argument("--events", type=int, required=True)
    j = sub.add_parser("job")
    j.add_argument("--uri", required=True)
    j.add_argument("--checkpoint", required=True)
    j.add_argument("--out", required=True)
    j.add_argument("--max-per-trigger", type=int, default=2000)
    j.add_argument("--batch-delay-s", type=float, default=0.0)
    args = p.parse_args(argv)
    if args.cmd == "job":
        run_job(args)
        return 0
    if args.cmd == "verify":
        return verify(args.uri, args.out, args.events)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
