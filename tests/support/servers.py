"""The real-server fixtures live in the package (LocalCluster uses them too)."""
from embedlog.harness.servers import *  # noqa: F401,F403
from embedlog.harness.servers import ServerMissing, in_ci, free_port  # noqa: F401


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose server or facility is missing here; under CI=true it is a failure."""
    import pytest
    if in_ci():
        pytest.fail(f"CI is set and this is missing: {reason}")
    pytest.skip(reason)


def require_peer(name: str) -> None:
    """A Java peer's jars (embedlog/harness/peers/jars.py) must be in the cache: skip without them
    here, fail under CI (make peers fetches them before the suite)."""
    from embedlog.harness.peers import jars
    if not jars.is_fetched(name):
        skip_unless_ci(f"{name}'s jars are not in {jars.cache_dir()} (make peers)")
