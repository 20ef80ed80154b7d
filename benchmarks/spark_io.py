"""Batch read and write of 1 KiB payloads through Spark: embedlog vs Parquet, one run.

    python benchmarks/spark_io.py [--rows 200000] [--partitions 4]

Same DataFrame (id -> 1024 incompressible bytes), same local[2] session, same machine:
``write_embedlog`` (task ledgers + the driver's commit into a stream, 3 bookies, E=3
Qw=3 Qa=2), ``write_parquet`` (snappy), ``read_embedlog`` and ``read_parquet`` (count and
sum of payload lengths, so every payload is read). Inputs are built before timing;
each figure is the best of ``--repeat`` runs. Prints a Markdown table for
docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PAYLOAD_BYTES = 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    import embedlog.spark
    from pyspark.sql import functions as F
    from embedlog.harness import LocalCluster
    work = tempfile.mkdtemp(prefix="embedlog-spark-bench-")
    spark = embedlog.spark.local_session("local[2]", "embedlog-bench")
    n = args.rows
    df = (spark.range(0, n, 1, args.partitions)
          .select(F.expr("unhex(repeat(sha2(cast(id as string), 256), 32))").alias("payload")))
    df = df.cache()
    assert df.count() == n                      # built before timing
    results = {}

    def best(label, fn):
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        results[label] = min(times)

    with LocalCluster(bookies=3, base_dir=os.path.join(work, "cluster"), autorecovery=False) as cl:
        uri = cl.metadata_uri
        runs = iter(range(1000))
        last_stream = {}

        def write_embedlog():
            name = f"bench-{next(runs)}"
            (df.write.format("embedlog").option("metadataServiceUri", uri).option("stream", name)
             .mode("append").save())
            last_stream["name"] = name

        def write_parquet():
            path = os.path.join(work, "parquet")
            df.write.mode("overwrite").parquet(path)

        def agg(frame):
            r = frame.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("b")).first()
            assert (r.n, r.b) == (n, n * PAYLOAD_BYTES), r

        best("write", write_embedlog)
        best("write_parquet", write_parquet)
        best("read", lambda: agg(spark.read.format("embedlog").option("metadataServiceUri", uri)
                                 .option("streams", last_stream["name"])
                                 .option("entriesPerPartition", max(1, n // args.partitions)).load()))
        best("read_parquet", lambda: agg(spark.read.parquet(os.path.join(work, "parquet"))))
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    mb = n * PAYLOAD_BYTES / 1e6
    print(f"\n{n} rows of {PAYLOAD_BYTES} B, local[2], {args.partitions} partitions, best of {args.repeat}\n")
    print("| work | embedlog rows/s | embedlog MB/s | Parquet rows/s | Parquet MB/s | embedlog / Parquet |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for op in ("write", "read"):
        e, p = results[op], results[op + "_parquet"]
        print(f"| batch {op} | {n / e:,.0f} | {mb / e:,.1f} | {n / p:,.0f} | {mb / p:,.1f} | {p / e:.3f} |")


if __name__ == "__main__":
    main()
