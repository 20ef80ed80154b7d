"""The replication protocol over bookie processes: embedlog.Client."""
from embedlog.client.client import Client

__all__ = ["Client"]
