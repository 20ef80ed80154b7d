"""On a real Spark standalone cluster: a master and two workers started from PySpark's own
distribution on this host, each worker a JVM of its own with its own executors and Python
workers. The example pipeline reads and writes bookie processes (LocalCluster: `embedlog
bookie serve`), is SIGKILLed after a few micro-batches and restarted from its checkpoint,
and its output must be exact. Marked soak (`make soak-tests`, about 2.5 min): the suite
keeps the same pipeline's restart from its checkpoint on local[2] (test_streaming.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from embedlog.spark.standalone import StandaloneCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    from conftest import _missing
    from support.servers import skip_unless_ci
    why = _missing()
    if why is not None:
        skip_unless_ci(why)
    with StandaloneCluster(workers=2, cores=1, memory="1g",
                           base_dir=str(tmp_path_factory.mktemp("standalone"))) as sc:
        yield sc


@pytest.mark.soak
def test_pipeline_killed_and_restarted_on_a_standalone_cluster(standalone, tmp_path):
    status = standalone.status()
    assert status["aliveworkers"] == 2
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    run = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "spark_pipeline.py"), "demo", "--events", "6000",
         "--max-per-trigger", "1000", "--kill-after", "2", "--master", standalone.master_url,
         "--workdir", str(tmp_path / "work"), "--timeout-s", "400"],
        env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "killed the job (SIGKILL)" in out and "exact output" in out
    assert f"on {standalone.master_url}" in out
    # the work ran in the workers' executors: each worker started an executor for the job
    apps = standalone.status()["completedapps"]
    assert len(apps) >= 2                        # the killed run and the restarted one (and the check)
    for k in range(2):
        app_dirs = os.listdir(os.path.join(standalone.base_dir, f"worker-{k}"))
        assert app_dirs, f"worker {k} ran no executor"
