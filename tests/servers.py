"""The real-server fixtures live in the package (LocalCluster uses them too)."""
from embedlog.harness.servers import *  # noqa: F401,F403
from embedlog.harness.servers import ServerMissing, in_ci, free_port  # noqa: F401
