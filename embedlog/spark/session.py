"""A quiet local SparkSession whose Python workers can import embedlog (tests, tools, bench)."""
from __future__ import annotations

import os
import sys
import tempfile

LOG4J2 = """status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def local_session(master: str = "local[2]", app_name: str = "embedlog", **conf):
    """Start (or get) a SparkSession with the settings docs/SPARK.md recommends for one host.

    Spark's Python workers are started by the JVM: they run PYSPARK_PYTHON and import the
    data source by module name, so both point at this interpreter and this checkout."""
    # optional dependency: pyspark comes with the spark extra
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [root] + paths if p)
    log_conf = os.path.join(tempfile.gettempdir(), "embedlog-spark-log4j2.properties")
    with open(log_conf, "w") as f:
        f.write(LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log_conf}"
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.extraJavaOptions", java_opts)
               .config("spark.executor.extraJavaOptions", java_opts)
               .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"]))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # cycle: embedlog.spark's __init__ re-exports this module's local_session
    from embedlog.spark import register
    register(spark)
    return spark
