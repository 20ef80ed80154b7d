"""Batch read and write of 1 KiB payloads through Spark: embedlog vs Parquet, one run.

    python benchmarks/spark_io.py [--rows 200000] [--partitions 4] [--repeat 3] [--ensemble 3,3,2]

Same DataFrame (id -> 1024 incompressible bytes), same local[2] session, same machine:
``write`` (tasks pack rows into data ledgers on a LocalCluster of 3 bookie processes, the
driver's commit links them into a stream) against ``write_parquet`` (snappy, local disk);
``read`` (the stream, every digest checked) against ``read_parquet`` and against ``floor``,
a Python data source that hands Spark the same rows from memory (benchmarks/spark_floor.py:
what any Python data source pays here). Reads count rows and sum payload lengths, so every
payload reaches the JVM. The cases run interleaved (A B C A B C ...) so that a neighbour's
load hits them alike; each figure is the best of ``--repeat``, and the ratios are of figures
from this run. Prints a Markdown table for docs/PERFORMANCE.md with the load average.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

PAYLOAD_BYTES = 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ensemble", default="3,3,2", help="E,Qw,Qa of the ledgers written")
    ap.add_argument("--driver-memory", default="3g")
    args = ap.parse_args()
    e, qw, qa = (int(x) for x in args.ensemble.split(","))
    # executors import the floor source by module name
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    import embedlog.spark
    from pyspark.sql import functions as F
    from embedlog.harness import LocalCluster
    from spark_floor import FloorDataSource
    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix="embedlog-spark-bench-")
    spark = embedlog.spark.local_session("local[2]", "embedlog-bench",
                                         **{"spark.driver.memory": args.driver_memory})
    spark.dataSource.register(FloorDataSource)
    n = args.rows
    df = (spark.range(0, n, 1, args.partitions)
          .select(F.expr("unhex(repeat(sha2(cast(id as string), 256), 32))").alias("payload")))
    df = df.cache()
    assert df.count() == n                      # built before timing
    times: dict = {}

    def timed(label, fn):
        t = time.perf_counter()
        fn()
        times.setdefault(label, []).append(time.perf_counter() - t)

    def agg(frame):
        r = frame.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("b")).first()
        assert (r.n, r.b) == (n, n * PAYLOAD_BYTES), r

    with LocalCluster(bookies=3, base_dir=os.path.join(work, "cluster"), autorecovery=False,
                      proxies=False) as cl:
        uri = cl.metadata_uri
        streams = []
        parquet = os.path.join(work, "parquet")

        def write_embedlog():
            streams.append(f"bench-{len(streams)}")
            (df.write.format("embedlog").option("metadataServiceUri", uri)
             .option("stream", streams[-1]).option("ensembleSize", e).option("writeQuorum", qw)
             .option("ackQuorum", qa).mode("append").save())

        def read_embedlog():
            agg(spark.read.format("embedlog").option("metadataServiceUri", uri)
                .option("streams", streams[-1])
                .option("entriesPerPartition", max(1, n // args.partitions)).load())

        for _ in range(args.repeat):
            timed("write_parquet", lambda: df.write.mode("overwrite").parquet(parquet))
            timed("write", write_embedlog)
        for _ in range(args.repeat):
            timed("read_parquet", lambda: agg(spark.read.parquet(parquet)))
            timed("read", read_embedlog)
            timed("floor", lambda: agg(spark.read.format("embedlog_floor").option("rows", n)
                                       .option("partitions", args.partitions).load()))
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    mb = n * PAYLOAD_BYTES / 1e6
    best = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n`python benchmarks/spark_io.py --rows {n} --partitions {args.partitions} --repeat "
          f"{args.repeat} --ensemble {args.ensemble}`: {n} rows of {PAYLOAD_BYTES} B, local[2], "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after\n")
    print("| work | rows/s (best) | MB/s (best) | / Parquet (best) | / Parquet (median) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, ref in (("write_parquet", "write_parquet"), ("write", "write_parquet"),
                       ("read_parquet", "read_parquet"), ("read", "read_parquet"),
                       ("floor", "read_parquet")):
        t = best[label]
        print(f"| {label} | {n / t:,.0f} | {mb / t:,.1f} | {best[ref] / t:.2f} | {med[ref] / med[label]:.2f} |")
    print(f"\nread / floor: {best['floor'] / best['read']:.2f} (best), {med['floor'] / med['read']:.2f} (median)")


if __name__ == "__main__":
    main()
