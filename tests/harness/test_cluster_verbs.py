"""Every cluster class names the same acts the same way (docs/TESTING.md, "The same verbs on
every cluster"): kill, stop, start and restart of a member, the member named after what the
cluster runs (a bookie or a broker); is_running and pid of one; close for the whole."""
from __future__ import annotations

import inspect

import pytest

from embedlog.harness import LocalCluster
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


def test_local_cluster_starts_a_killed_bookie_again(tmp_path):
    with LocalCluster(bookies=1, base_dir=str(tmp_path), autorecovery=False) as cluster:
        bookie_id = cluster.bookie_id(0)
        cluster.kill_bookie(0)
        assert not cluster.is_running(0)
        cluster.start_bookie(0)
        assert cluster.is_running(0) and cluster.bookie_id(0) == bookie_id
        with pytest.raises(Exception, match="is running"):
            cluster.start_bookie(0)
        cluster.stop_bookie(0)
        cluster.restart_bookie(0)                # a stopped bookie: restart starts it
        assert cluster.is_running(0)
