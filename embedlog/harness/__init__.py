"""A local cluster of bookie processes for replication and recovery testing."""
from embedlog.harness.cluster import LocalCluster
from embedlog.harness.faults import Faults, Gate, Rule
from embedlog.harness.proxy import FaultProxy

__all__ = ["LocalCluster", "Faults", "Rule", "Gate", "FaultProxy"]
