"""Every cluster class names the same acts the same way (docs/TESTING.md, "The same verbs on
every cluster"): kill, stop, start and restart of a member, the member named after what the
cluster runs (a bookie or a broker); is_running and pid of one (None when it is not
running); close for the whole."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from embedlog.harness import LocalCluster
from embedlog.harness import cluster as local
from embedlog.harness.peers import bookkeeper, kafka
from embedlog.harness.peers.bookkeeper import BookKeeperCluster
from embedlog.harness.peers.kafka import KafkaCluster
from embedlog.harness.peers.pulsar import PulsarCluster

CLUSTERS = [(LocalCluster, "bookie"), (BookKeeperCluster, "bookie"),
            (KafkaCluster, "broker"), (PulsarCluster, "broker")]
VERBS = ["kill", "stop", "start", "restart"]
# the spellings each class had before it took the table's
RETIRED = ["kill", "start", "restart", "stop"]


@pytest.mark.parametrize("cls,member", CLUSTERS, ids=[c.__name__ for c, _ in CLUSTERS])
def test_the_verbs(cls, member):
    for verb in VERBS:
        method = getattr(cls, f"{verb}_{member}", None)
        assert callable(method), f"{cls.__name__} has no {verb}_{member}"
        first = list(inspect.signature(method).parameters)[1]
        assert first == "i", f"{cls.__name__}.{verb}_{member} takes the member's index first"
    for name in ("is_running", "pid", "close", "__enter__", "__exit__"):
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}"
    for name in RETIRED:
        assert not hasattr(cls, name), f"{cls.__name__}.{name}: another spelling of a verb"


def _with_member(cls, directory: str, proc):
    """A ``cls`` whose one member's process is ``proc`` (nothing started: the Java peers'
    pid reads only that)."""
    c = cls.__new__(cls)
    if cls is LocalCluster:
        c._bookies = [local._Bookie(0, directory)]
        c._bookies[0].process = proc
    elif cls is BookKeeperCluster:
        c._bookies = [bookkeeper._Bookie(0, directory, 0)]
        c._bookies[0].proc = proc
    elif cls is KafkaCluster:
        c._brokers = [kafka._Broker(1, directory)]
        c._brokers[0].process = proc
    else:
        c._broker = proc
    return c


@pytest.mark.parametrize("cls", [c for c, _ in CLUSTERS], ids=[c.__name__ for c, _ in CLUSTERS])
def test_pid_is_none_for_a_member_not_running(cls, tmp_path):
    assert _with_member(cls, str(tmp_path), None).pid(0) is None          # never started
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _with_member(cls, str(tmp_path), proc).pid(0) == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert _with_member(cls, str(tmp_path), proc).pid(0) is None          # stopped


def test_local_cluster_starts_a_killed_bookie_again(tmp_path):
    with LocalCluster(bookies=1, base_dir=str(tmp_path), autorecovery=False) as cluster:
        bookie_id = cluster.bookie_id(0)
        cluster.kill_bookie(0)
        assert not cluster.is_running(0) and cluster.pid(0) is None
        cluster.start_bookie(0)
        assert cluster.is_running(0) and cluster.bookie_id(0) == bookie_id
        assert isinstance(cluster.pid(0), int)
        with pytest.raises(Exception, match="is running"):
            cluster.start_bookie(0)
        cluster.stop_bookie(0)
        cluster.restart_bookie(0)                # a stopped bookie: restart starts it
        assert cluster.is_running(0)
