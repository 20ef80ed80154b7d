"""A Spark standalone cluster on this host, from PySpark's own distribution (tests, recipes).

    from embedlog.spark.standalone import StandaloneCluster
    with StandaloneCluster(workers=2) as sc:                 # a master and two workers
        spark = embedlog.spark.local_session(sc.master_url, "job",
                                             **{"spark.executor.memory": "512m"})

PySpark's wheel has no sbin/start-*.sh, but its bin/spark-class starts both daemons:
``spark-class org.apache.spark.deploy.master.Master`` and ``... deploy.worker.Worker``.
Each runs in a JVM of its own, each worker starts executors (more JVMs) that start their
own Python workers, so a job runs as it would on several machines. Everything binds to
127.0.0.1 (SPARK_LOCAL_IP), on free ports; the cluster is ready when the master's web UI
reports every worker alive, and is stopped by PID. docs/SPARK.md has the shell recipe.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from embedlog.errors import EmbedlogError
from embedlog.net.ports import free_ports
from embedlog.spark.session import LOG4J2 as SESSION_LOG4J2

READY_TIMEOUT_S = 120.0
# the daemons log warnings too (a lost worker is worth seeing), the sessions only errors
LOG4J2 = SESSION_LOG4J2.replace("rootLogger.level = error", "rootLogger.level = warn")


def spark_home() -> str:
    """The installed pyspark package directory: it holds bin/spark-class and the jars."""
    # optional dependency: pyspark comes with the spark extra
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


class StandaloneCluster:
    """A master and ``workers`` workers (``cores`` and ``memory`` each) on 127.0.0.1."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g",
                 base_dir: str | None = None):
        self._own_dir = base_dir is None
        self.base_dir = os.path.abspath(base_dir or tempfile.mkdtemp(prefix="embedlog-spark-standalone-"))
        os.makedirs(self.base_dir, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        port, ui, *worker_uis = free_ports(2 + workers)
        self.master_url = f"spark://127.0.0.1:{port}"
        self.ui_url = f"http://127.0.0.1:{ui}"
        log_conf = os.path.join(self.base_dir, "log4j2.properties")
        with open(log_conf, "w") as f:
            f.write(LOG4J2)
        self.env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=spark_home(),
                        PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
                        SPARK_DAEMON_MEMORY="256m", SPARK_LOG_DIR=self.base_dir,
                        SPARK_DAEMON_JAVA_OPTS=f"-Dlog4j2.configurationFile=file:{log_conf}")
        cls = os.path.join(spark_home(), "bin", "spark-class")
        try:
            self._start("master", [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", str(ui)])
            for k, wui in enumerate(worker_uis):
                work = os.path.join(self.base_dir, f"worker-{k}")
                os.makedirs(work, exist_ok=True)
                self._start(f"worker-{k}", [cls, "org.apache.spark.deploy.worker.Worker", self.master_url,
                                            "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                                            "--webui-port", str(wui), "--work-dir", work])
            self._wait_for_workers(workers)
        except BaseException:
            self.close()
            raise

    def _start(self, name: str, argv: list) -> None:
        log = open(os.path.join(self.base_dir, f"{name}.log"), "wb")
        try:
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=self.env,
                                               start_new_session=True))
        finally:
            log.close()

    def status(self) -> dict:
        """The master's own account of the cluster (its web UI's JSON)."""
        with urllib.request.urlopen(self.ui_url + "/json/", timeout=5) as r:
            return json.loads(r.read())

    def _wait_for_workers(self, n: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise EmbedlogError(f"a Spark daemon exited with {p.returncode}; see {self.base_dir}")
            try:
                st = self.status()
                if st.get("status") == "ALIVE" and st.get("aliveworkers", 0) >= n:
                    return
            except (OSError, ValueError):
                # the master's web UI is not up yet, or not wholly: under load it once
                # answered /json/ with its HTML page while starting (a CI rehearsal)
                pass
            time.sleep(0.2)
        raise EmbedlogError(f"the Spark master did not see {n} workers in {READY_TIMEOUT_S} s; "
                            f"see {self.base_dir}")

    def close(self) -> None:
        for p in reversed(self.procs):         # workers first: they stop their executors
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
