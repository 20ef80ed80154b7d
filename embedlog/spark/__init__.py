"""embedlog.spark: the PySpark data source "embedlog" (batch and streaming, read and write).

    import embedlog.spark
    embedlog.spark.register(spark)
    df = (spark.read.format("embedlog")
          .option("metadataServiceUri", uri).option("streams", "events").load())

Options, schema, offsets and the commit protocol: docs/SPARK.md (and options.py,
source.py, commit.py). Needs the ``spark`` extra (pyspark 4.3, pyarrow).
"""
from __future__ import annotations

try:
    from pyspark.sql.datasource import DataSource
except ImportError as exc:         # pragma: no cover - the extra is missing
    raise ImportError("embedlog.spark needs PySpark 4.3 and pyarrow: "
                      "pip install 'embedlog[spark]'") from exc

from embedlog.spark.commit import committed_batches  # noqa: F401
from embedlog.spark.options import read_options, write_options
from embedlog.spark.source import SCHEMA, BatchReader, StreamReader
from embedlog.spark.sink import BatchWriter, StreamWriter

__all__ = ["EmbedlogDataSource", "register", "SCHEMA", "local_session", "committed_batches"]


class EmbedlogDataSource(DataSource):
    """Spark's name for it: "embedlog". Options are checked here, while Spark plans."""

    @classmethod
    def name(cls):
        return "embedlog"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return BatchReader(read_options(self.options))

    def streamReader(self, schema):
        return StreamReader(read_options(self.options))

    def writer(self, schema, overwrite):
        if overwrite:
            from embedlog.errors import IllegalOpError
            raise IllegalOpError("embedlog: a stream is append-only; use mode('append')")
        return BatchWriter(write_options(self.options, streaming=False), schema)

    def streamWriter(self, schema, overwrite):
        return StreamWriter(write_options(self.options, streaming=True), schema)


def register(spark) -> None:
    """Make format("embedlog") known to this SparkSession."""
    spark.dataSource.register(EmbedlogDataSource)


def local_session(master: str = "local[2]", app_name: str = "embedlog", **conf):
    from embedlog.spark.session import local_session as _ls
    return _ls(master, app_name, **conf)
