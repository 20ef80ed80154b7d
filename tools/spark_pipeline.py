"""The example pipeline of README.md: app -> stream "events" -> Spark -> Parquet + stream "totals".

    python tools/spark_pipeline.py demo [--events 20000] [--workdir DIR] [--keep]
                                        [--master spark://127.0.0.1:7077] [--uri METADATA_URI]

``demo`` starts a LocalCluster (or uses the bookies of ``--uri``, e.g. started with
``embedlog bookie serve``), appends events to the stream ``events`` as an application
would, runs the Spark job (``job``, a child process, on ``--master``: local[2] by
default, or a standalone cluster) and SIGKILLs it once a few micro-batches are committed,
starts it again from its checkpoint, and checks that the Parquet files and the stream
``totals`` hold exactly the totals of the events: nothing lost, nothing counted twice.
It prints what it does as it goes, and the job prints each micro-batch.

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


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def event(i: int) -> bytes:
    return json.dumps({"user": f"u{i % USERS}", "amount": i % 100, "seq": i}).encode()


def expected(n: int) -> dict:
    out = {}
    for i in range(n):
        c, s = out.get(f"u{i % USERS}", (0, 0))
        out[f"u{i % USERS}"] = (c + 1, s + i % 100)
    return out


def session(master: str, name: str):
    """A session whose temporary files stay in this process's TMPDIR (the work directory's,
    set by the demo for its children)."""
    import tempfile as tf
    import embedlog.spark
    tmp = tf.gettempdir()
    # -XX:-UsePerfData: no hsperfdata file in /tmp (a killed JVM leaves its own behind)
    opts = (f"-Djava.io.tmpdir={tmp} -XX:-UsePerfData "
            f"-Dlog4j2.configurationFile=file:{os.path.join(tmp, 'embedlog-spark-log4j2.properties')}")
    conf = {"spark.local.dir": tmp, "spark.driver.extraJavaOptions": opts,
            "spark.executor.extraJavaOptions": opts}
    if not master.startswith("local"):
        # one core and 512 MiB per executor: two small workers fit a 2-core host
        conf.update({"spark.executor.memory": "512m", "spark.executor.cores": "1",
                     "spark.cores.max": "2"})
    return embedlog.spark.local_session(master, name, **conf)


def run_job(args) -> None:
    from pyspark.sql import functions as F
    spark = session(args.master, "embedlog-pipeline")
    say(f"job: Spark {spark.version} on {args.master}, reading 'events' at most "
        f"{args.max_per_trigger} a micro-batch")
    schema = "user string, amount long, seq long"

    def each_batch(df, batch_id):
        events = df.select(F.from_json(F.col("payload").cast("string"), schema).alias("e")).select("e.*")
        totals = events.groupBy("user").agg(F.count("*").alias("events"),
                                            F.sum("amount").alias("amount")).cache()
        n = totals.agg(F.sum("events")).first()[0] or 0
        totals.write.mode("overwrite").parquet(os.path.join(args.out, "parquet", f"batch={batch_id}"))
        (totals.select(F.to_json(F.struct(F.lit(batch_id).alias("batch"), "user", "events", "amount"))
                       .alias("payload"))
         .write.format("embedlog").option("metadataServiceUri", args.uri).option("stream", "totals")
         .option("sinkId", "pipeline-totals").option("batchId", batch_id).mode("append").save())
        totals.unpersist()
        say(f"job: micro-batch {batch_id}: {n} events -> Parquet batch={batch_id} and stream 'totals'")
        if args.batch_delay_s:
            time.sleep(args.batch_delay_s)         # so that the demo can kill it mid-way

    q = (spark.readStream.format("embedlog").option("metadataServiceUri", args.uri)
         .option("streams", "events").option("maxEntriesPerTrigger", args.max_per_trigger).load()
         .writeStream.foreachBatch(each_batch).option("checkpointLocation", args.checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    say("job: every event read")
    spark.stop()


def _committed(checkpoint: str) -> int:
    d = os.path.join(checkpoint, "commits")
    return len([f for f in os.listdir(d) if f.isdigit()]) if os.path.isdir(d) else 0


def demo(args) -> int:
    import shutil
    made = args.workdir is None
    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="embedlog-pipeline-"))
    os.makedirs(work, exist_ok=True)
    say(f"workdir {work}")
    try:
        if args.uri:
            return _demo(args, work, args.uri)
        from embedlog.harness import LocalCluster
        say("starting a LocalCluster of 3 bookie processes")
        with LocalCluster(bookies=3, base_dir=os.path.join(work, "cluster"), autorecovery=False,
                          proxies=False) as cluster:
            say(f"bookies up; metadata {cluster.metadata_uri}")
            return _demo(args, work, cluster.metadata_uri)
    finally:
        if made and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept {work}")


def _demo(args, work: str, uri: str) -> int:
    from embedlog.client import Client
    out, ckpt = os.path.join(work, "out"), os.path.join(work, "checkpoint")
    # Spark, its JVM and its Python workers write their temporary files here
    tmp = os.path.join(work, "tmp")
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, TMPDIR=tmp, SPARK_LOCAL_DIRS=tmp)
    with Client(uri) as client:
        events = client.open_stream("events")
        for lo in range(0, args.events, 5000):                         # the application
            events.append_many([event(i) for i in range(lo, min(args.events, lo + 5000))])
        events.close()
    say(f"appended {args.events} events to stream 'events'")
    cmd = [sys.executable, os.path.abspath(__file__), "job", "--uri", uri, "--checkpoint", ckpt,
           "--out", out, "--max-per-trigger", str(args.max_per_trigger), "--master", args.master]
    say(f"starting the job; it is SIGKILLed after {args.kill_after} committed micro-batches")
    first = subprocess.Popen(cmd + ["--batch-delay-s", "1"], start_new_session=True, env=env)
    deadline = time.monotonic() + args.timeout_s
    seen = 0
    while _committed(ckpt) < args.kill_after and first.poll() is None:
        if time.monotonic() > deadline:
            first.kill()
            raise SystemExit(f"the job did not commit {args.kill_after} micro-batches in {args.timeout_s} s")
        if _committed(ckpt) != seen:
            seen = _committed(ckpt)
            say(f"Spark recorded micro-batch {seen - 1} in its checkpoint")
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)          # the driver and its Python workers
    first.wait()
    say(f"killed the job (SIGKILL) after {_committed(ckpt)} committed micro-batches; restarting it "
        "from its checkpoint")
    second = subprocess.run(cmd, timeout=args.timeout_s, env=env)
    if second.returncode != 0:
        raise SystemExit(f"the restarted job failed ({second.returncode})")
    say(f"restarted job finished: {_committed(ckpt)} micro-batches in all; checking the output")
    check = subprocess.run([sys.executable, os.path.abspath(__file__), "verify", "--uri", uri,
                            "--out", out, "--events", str(args.events), "--master", args.master],
                           timeout=args.timeout_s, env=env)
    return check.returncode


def verify(uri: str, out: str, n: int, master: str) -> int:
    from pyspark.sql import functions as F
    spark = session(master, "embedlog-pipeline-check")
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
    say(f"parquet totals  {'==' if from_parquet == want else '!='} expected: {sorted(from_parquet.items())}")
    say(f"'totals' stream {'==' if from_stream == want else '!='} expected "
        f"({len(rows)} rows from {len(batches)} micro-batches)")
    say("exact output" if ok else "OUTPUT IS WRONG")
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
    d.add_argument("--master", default="local[2]", help="Spark master URL (spark://host:port)")
    d.add_argument("--uri", help="metadata service URI of running bookies (default: a LocalCluster)")
    d.add_argument("--timeout-s", type=float, default=900.0)
    v = sub.add_parser("verify")
    v.add_argument("--uri", required=True)
    v.add_argument("--out", required=True)
    v.add_argument("--events", type=int, required=True)
    v.add_argument("--master", default="local[2]")
    j = sub.add_parser("job")
    j.add_argument("--uri", required=True)
    j.add_argument("--checkpoint", required=True)
    j.add_argument("--out", required=True)
    j.add_argument("--max-per-trigger", type=int, default=2000)
    j.add_argument("--batch-delay-s", type=float, default=0.0)
    j.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    if args.cmd == "job":
        run_job(args)
        return 0
    if args.cmd == "verify":
        return verify(args.uri, args.out, args.events, args.master)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
