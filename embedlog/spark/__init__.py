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

from embedlog.errors import ConfigError, EmbedlogError, IllegalOpError
from embedlog.spark.commit import committed_batches, delete_stream
from embedlog.spark.options import check_at_load, read_options, write_options
from embedlog.spark.session import local_session
from embedlog.spark.sink import BatchWriter, StreamWriter
from embedlog.spark.source import SCHEMA, BatchReader, StreamReader

__all__ = ["EmbedlogDataSource", "register", "workers_can_import", "SCHEMA", "local_session", "committed_batches",
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


def register(spark, check_workers: bool = True) -> None:
    """Make format("embedlog") known to this SparkSession; first (``check_workers``) run one
    small job that checks Spark's Python workers can import embedlog, so a session whose
    workers lack it fails here, saying what to install or set, rather than inside the first
    query's tasks with ``ModuleNotFoundError: No module named 'embedlog'``."""
    if check_workers:
        workers_can_import(spark)
    spark.dataSource.register(EmbedlogDataSource)


_PROBE = """
def probe(_):
    import importlib.util, socket, sys
    try:
        found = importlib.util.find_spec(MODULE) is not None
    except Exception:
        found = False
    return socket.gethostname(), sys.executable, found
"""


def workers_can_import(spark, module: str = "embedlog") -> None:
    """Run one task per default-parallelism slot that looks for ``module`` in the Python
    the workers run; ConfigError naming the hosts and Pythons that lack it, and the ways
    to give it to them."""
    # the probe is made outside any importable module, so Spark pickles it by value: a
    # function of embedlog.spark would itself need embedlog on the worker to unpickle
    namespace = {"__name__": "__embedlog_worker_probe__", "MODULE": module}
    exec(compile(_PROBE, "<embedlog worker probe>", "exec"), namespace)
    sc = spark.sparkContext
    n = max(1, int(sc.defaultParallelism))
    found = sc.parallelize(range(n), n).map(namespace["probe"]).collect()
    lacking = sorted({(host, exe) for host, exe, ok in found if not ok})
    if lacking:
        where = ", ".join(f"{exe} on {host}" for host, exe in lacking)
        raise ConfigError(
            f"embedlog: Spark's Python workers cannot import {module} ({where}). Install it "
            f"into the Python the workers run (pip install 'embedlog[spark]' on every worker, "
            f"or point spark.pyspark.python / PYSPARK_PYTHON at a Python that has it), ship it "
            f"(--py-files or spark.submit.pyFiles with a zip of the package, or "
            f"spark.sparkContext.addPyFile), or, for a source checkout on a shared path, set "
            f"spark.executorEnv.PYTHONPATH to it; embedlog.spark.local_session does the last "
            f"for one host")
