"""Fixtures the interop modules share: one ZooKeeper per module (``zk``), and ``cluster``,
a module's BookKeeperCluster (its ``bk`` fixture) with every bookie running; and the
``newest_bookkeeper`` marker: a test of a version-parametrized module that runs against the
newest BookKeeper peer only (long fault runs: the older version's wire is the same, and the
module's other tests keep the whole matrix)."""
from __future__ import annotations

import pytest

from embedlog.harness.peers import jars

from prestart import Prestart
from support.servers import ServerMissing, ZooKeeperServer, skip_unless_ci


@pytest.fixture(scope="module")
def zk(request):
    """A ZooKeeper server for one module. At its end the setups a module's Prestart started
    for params no test took are closed first: they stand on this ZooKeeper."""
    try:
        server = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    yield server
    for value in list(vars(request.module).values()):
        if isinstance(value, Prestart):
            value.close_unused()
    server.stop()


@pytest.fixture
def cluster(bk):
    bk.start_all()          # whatever an earlier test killed runs again (no-op otherwise)
    return bk


def _newest() -> str:
    return max(jars.BOOKKEEPER_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))


def pytest_collection_modifyitems(config, items):
    newest, keep, dropped = _newest(), [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        version = params.get("setup", params.get("version"))
        if item.get_closest_marker("newest_bookkeeper") and version not in (None, newest):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
