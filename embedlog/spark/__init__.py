"""embedlog.spark: the PySpark data source "embedlog" (batch and streaming, read and write).

    import embedlog.spark
    embedlog.spark.register(spark)
    df = (spark.read.format("embedlog")
          .option("metadataServiceUri", uri).option("streams", "events").load())

Options, schema, offsets and the commit protocol: docs/SPARK.md (and options.py,
source.py, planning.py, commit.py). Needs the ``spark`` extra (pyspark 4.3, pyarrow).
"""
from __future__ import annotations

import functools

try:
    from pyspark.sql.datasource import DataSource
except ImportError as exc:         # pragma: no cover - the extra is missing
    raise ImportError("embedlog.spark needs PySpark 4.3 and pyarrow: "
                      "pip install 'embedlog[spark]'") from exc

from embedlog.errors import EmbedlogError, IllegalOpError
from embedlog.spark.commit import committed_batches, delete_stream
from embedlog.spark.options import check_at_load, read_options, write_options
from embedlog.spark.session import local_session
from embedlog.spark.sink import BatchWriter, StreamWriter
from embedlog.spark.source import SCHEMA, BatchReader, StreamReader

__all__ = ["EmbedlogDataSource", "register", "SCHEMA", "local_session", "committed_batches",
           "delete_stream"]


def _planning(fn):
    """embedlog's errors while Spark plans come with one traceback frame: Spark prints the
    whole Python traceback inside its own error, and the message is its last line."""
    @functools.wraps(fn)
    def checked(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EmbedlogError as exc:
            raise exc.with_traceback(None) from None
    return checked


class EmbedlogDataSource(DataSource):
    """Spark's name for it: "embedlog". Options are checked here, while Spark plans."""

    @classmethod
    def name(cls):
        return "embedlog"

    @_planning
    def schema(self):
        # Spark asks for the schema when load() is called: what can be checked before the
        # query is known to be a batch or a streaming one fails here, not after start()
        check_at_load(self.options)
        return SCHEMA

    @_planning
    def reader(self, schema):
        return BatchReader(read_options(self.options))

    @_planning
    def streamReader(self, schema):
        return StreamReader(read_options(self.options, streaming=True))

    @_planning
    def writer(self, schema, overwrite):
        if overwrite:
            raise IllegalOpError("embedlog: streams and ledgers are append-only; use mode('append')")
        return BatchWriter(write_options(self.options, streaming=False), schema)

    @_planning
    def streamWriter(self, schema, overwrite):
        return StreamWriter(write_options(self.options, streaming=True), schema)


def register(spark) -> None:
    """Make format("embedlog") known to this SparkSession."""
    spark.dataSource.register(EmbedlogDataSource)
