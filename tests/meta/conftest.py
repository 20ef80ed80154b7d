"""Fixtures of the metadata contract suite: real servers, one namespace per test.

``backend`` is parametrised over every driver; each test gets its own sqlite file,
ZooKeeper root or etcd prefix, and stores opened through it are closed at teardown.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/support/servers.py

from support import servers  # noqa: E402

from embedlog.meta import open_metadata_store  # noqa: E402

DRIVERS = ["sqlite", "zk+flat", "zk+hierarchical", "zk+longhierarchical", "etcd"]

# Liveness settings short enough that "a dead bookie disappears" is seconds, not minutes,
# yet long enough that a live one survives a stall of a loaded 2-core machine: a
# registration is lost when its refresh (SQLite heartbeat commit, ZooKeeper ping, etcd
# lease keep-alive at a third of the TTL) is late by about the expiry, and stalls of
# over a second were seen with a 1.5-2 s expiry. SQLite commits without fsync
# (synchronous=NORMAL: WAL stays consistent after a process crash, which is all these
# tests kill), so a heartbeat does not wait on the disk. The driver defaults are
# unchanged. The longer expiries cost about 25 s over the whole of tests/meta.
FAST_OPTIONS = {
    "sqlite": dict(heartbeat_interval_s=0.2, expiry_s=3.0, poll_interval_s=0.1,
                   synchronous="NORMAL"),
    "zk": dict(session_timeout_s=4.0, poll_interval_s=0.5),
    "etcd": dict(lease_ttl_s=4, poll_interval_s=0.5),
}
# how long after a SIGKILL a registration may stay listed, per driver family: the
# expiry plus the server's expiry granularity (ZooKeeper ticks, etcd's lease checks) and
# the listing
LIVENESS_BOUND_S = {"sqlite": 3.0 + 1.0, "zk": 4.0 + 2.5, "etcd": 4.0 + 2.5}


def _start(cls):
    try:
        return cls()
    except servers.ServerMissing as exc:
        servers.skip_unless_ci(str(exc))


@pytest.fixture(scope="session")
def zk_server():
    server = _start(servers.ZooKeeperServer)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd_server():
    server = _start(servers.EtcdServer)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def process_pool():
    """Worker processes started with spawn (never fork: kazoo and gRPC run threads)."""
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=3, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


class Backend:
    """One driver, one private namespace."""

    def __init__(self, kind: str, uri: str, options: dict, server=None):
        self.kind, self.uri, self.options, self.server = kind, uri, options, server
        self.family = kind.split("+")[0]
        self._opened = []

    def open(self, **extra):
        store = open_metadata_store(self.uri, **{**self.options, **extra})
        self._opened.append(store)
        return store

    def close_all(self):
        for store in self._opened:
            store.close()


@pytest.fixture(params=DRIVERS)
def backend(request, tmp_path):
    kind = request.param
    family = kind.split("+")[0]
    name = "t" + uuid.uuid4().hex[:12]
    if family == "sqlite":
        b = Backend(kind, f"sqlite://{tmp_path}/meta.db", FAST_OPTIONS["sqlite"])
    elif family == "zk":
        server = request.getfixturevalue("zk_server")
        b = Backend(kind, f"{kind}://{server.hosts}/{name}/ledgers", FAST_OPTIONS["zk"], server)
    else:
        server = request.getfixturevalue("etcd_server")
        b = Backend(kind, f"etcd://{server.endpoint}/{name}", FAST_OPTIONS["etcd"], server)
    yield b
    b.close_all()
