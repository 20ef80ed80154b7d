"""The floor of benchmarks/spark_io.py: a Python data source that hands Spark the same rows as
embedlog's (same schema, 1 KiB payloads, Arrow batches) from memory, reading nothing.

What any PySpark Python data source pays on this machine to get rows into Spark: the
planning round trips to Python workers, the Arrow stream to the JVM and the rows there.
Executors import it by module name, so spark_io.py puts this directory on PYTHONPATH.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from embedlog.spark.source import ARROW_SCHEMA, SCHEMA

BATCH_ROWS = 8192


class _Part(InputPartition):
    def __init__(self, rows: int, size: int):
        super().__init__((rows, size))
        self.rows, self.size = rows, size


class _Reader(DataSourceReader):
    def __init__(self, rows: int, parts: int, size: int):
        self.rows, self.parts, self.size = rows, parts, size

    def partitions(self):
        per = -(-self.rows // self.parts)
        return [_Part(min(per, self.rows - k * per), self.size) for k in range(self.parts)]

    def read(self, part):
        n = min(BATCH_ROWS, part.rows)
        payload = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(
            np.arange(0, (n + 1) * part.size, part.size, dtype=np.int32)),
            pa.py_buffer(os.urandom(n * part.size))])
        qname = pa.array(["5354524541d0001" + "0" * 17] * n, pa.string())
        stream = pa.array(["bench"] * n, pa.string())
        ids = pa.array(np.arange(n, dtype=np.int64))
        batch = pa.RecordBatch.from_arrays([
            pa.array(np.full(n, 7, np.int64)), pa.array(np.full(n, 9, np.int64)), qname, ids,
            payload, stream, ids, pa.array(np.zeros(n, np.int64)),
            pa.array(np.full(n, 1_700_000_000_000_000, np.int64), pa.timestamp("us", tz="UTC"))],
            schema=ARROW_SCHEMA)
        left = part.rows
        while left > 0:
            yield batch if left >= n else batch.slice(0, left)
            left -= n


class FloorDataSource(DataSource):
    @classmethod
    def name(cls):
        return "embedlog_floor"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        o = self.options
        return _Reader(int(o["rows"]), int(o.get("partitions", 4)), int(o.get("size", 1024)))
