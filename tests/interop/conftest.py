"""Fixtures the interop modules share: each module gets its own real ZooKeeper (Debian's 3.8;
BookKeeper's jars bring the 3.9 client), stopped when the module ends."""
import pytest

from servers import ServerMissing, ZooKeeperServer, skip_unless_ci


@pytest.fixture(scope="module")
def zk():
    try:
        server = ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    yield server
    server.stop()
