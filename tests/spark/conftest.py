"""One SparkSession (local[2]) and one LocalCluster for the whole Spark suite.

Without Java or PySpark the suite skips, except under CI, where that is a failure."""
from __future__ import annotations

import itertools
import shutil

import pytest

from support.servers import in_ci, skip_unless_ci


def _missing() -> str | None:
    if shutil.which("java") is None:
        return "java is not installed (make servers installs openjdk-17-jre-headless)"
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"the spark extra is not installed ({exc}); pip install -e '.[spark]'"
    return None


# without PySpark the test modules cannot even be imported: outside CI they are left out
# (the header says why); under CI they are collected and their ImportError fails the run
_WHY = _missing()
if _WHY is not None and "spark extra" in _WHY and not in_ci():
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config):
    if _WHY is not None:
        return f"embedlog spark tests: {'FAIL (CI)' if in_ci() else 'skipped'}: {_WHY}"


def _kafka_connector() -> str | None:
    """Spark's Kafka connector jars (the spark-sql-kafka peer, fetched by make peers), if here."""
    from embedlog.harness.peers import jars
    from embedlog.harness.peers.kafka import SPARK_KAFKA_PEER, spark_jars
    return spark_jars() if jars.is_fetched(SPARK_KAFKA_PEER) else None


@pytest.fixture(scope="session")
def spark():
    why = _missing()
    if why is not None:
        skip_unless_ci(why)
    import embedlog.spark
    conf = {"spark.task.maxFailures": "1"}
    kafka = _kafka_connector()
    if kafka:                          # format("kafka") for test_vs_kafka.py (issue 30)
        conf["spark.jars"] = kafka
    session = embedlog.spark.local_session("local[2]", "embedlog-tests", **conf)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(spark, tmp_path_factory):
    from embedlog.harness import LocalCluster
    c = LocalCluster(bookies=3, base_dir=str(tmp_path_factory.mktemp("spark-cluster")),
                     autorecovery=False, proxies=False)
    yield c
    c.close()


@pytest.fixture
def client(cluster):
    c = cluster.client()
    yield c
    c.close()


_names = itertools.count()


@pytest.fixture
def name(request):
    """A stream name of this test's own."""
    return f"{request.node.name.replace('[', '-').rstrip(']')}-{next(_names)}"


@pytest.fixture
def uri(cluster):
    return cluster.metadata_uri

