"""Loopback ports free right now, for the processes a harness or a Spark standalone cluster
starts on this host (bookies, ZooKeeper, etcd, Java peers, Spark's master and workers)."""
from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free right now. Every probe socket stays bound until all are
    chosen, so the kernel cannot hand out one port twice (closing each probe first
    could). Another process may still bind one before the server does: see
    embedlog.harness.servers.start_retrying."""
    socks = []
    try:
        for _ in range(n):
            socks.append(socket.socket())
            socks[-1].bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
