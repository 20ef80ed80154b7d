"""Fixtures the interop modules share: one ZooKeeper per module (``zk``), and ``cluster``,
a module's BookKeeperCluster (its ``bk`` fixture) with every bookie running."""
from __future__ import annotations

import pytest

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
