"""Resource exhaustion before authentication (docs/SECURITY.md): one host cannot take every
connection, a frame trickled a byte at a time is cut off, and frames before AUTH are
small, so unauthenticated connections hold little memory. A well-behaved client on its own
connection keeps working throughout."""
import socket

import pytest

from support.cliutil import wait_until
from embedlog.harness import LocalCluster
from embedlog.harness.hostile import RawConnection, rss_bytes
from embedlog.net import protocol as P

CONFIG = {"max_connections_per_address": 16, "frame_read_timeout_ms": 1000}
TOKEN = "s3cret-token-0123456789abcdef"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=1, base_dir=str(tmp_path_factory.mktemp("c")), proxies=False,
                      autorecovery=False, bookie_config=CONFIG, auth_token=TOKEN) as lc:
        yield lc


@pytest.fixture(scope="module")
def good(cluster):
    client = cluster.client("good")
    w = client.create_ledger(1, 1, 1)
    return client, w


def address(client, cluster):
    return client._ctx.address_of(cluster.bookie_id(0))


def closed(conn) -> bool:
    """True once the bookie has closed the connection (an error frame may come first)."""
    try:
        while True:
            resp = conn.recv_response(timeout_s=30)
            if resp is None:
                return True
    except socket.timeout:
        return False                 # still open after 30 s
    except (ConnectionError, OSError):
        return True


def test_one_address_cannot_take_every_connection(cluster, good):
    client, w = good
    addr = address(client, cluster)
    conns = [RawConnection(addr, source="127.0.0.2") for _ in range(CONFIG["max_connections_per_address"])]
    extra = RawConnection(addr, source="127.0.0.2")
    resp = extra.recv_response(timeout_s=30)
    assert resp is not None and resp.status == P.ETOOMANYREQUESTS and "127.0.0.2" in resp.message
    assert w.append(b"still served") >= 0            # the good client, from 127.0.0.1
    for c in conns:
        c.sock.close()


def test_a_trickled_frame_is_cut_off(cluster, good):
    client, w = good
    conn = RawConnection(address(client, cluster), source="127.0.0.3")
    conn.send(P.LENGTH.pack(200) + b"\x01" * 10)      # a frame that never finishes arriving
    assert closed(conn)
    assert w.append(b"meanwhile") >= 0


def test_frames_before_auth_are_small_and_memory_stays_bounded(cluster, good):
    client, w = good
    pid = cluster.pid(0)
    before = rss_bytes(pid)
    conns = []
    for i in range(12):
        c = RawConnection(address(client, cluster), source=f"127.0.1.{i + 1}")
        c.send(P.LENGTH.pack(2 * 1024 * 1024) + b"\0" * 60_000)   # a 2 MiB frame before AUTH
        conns.append(c)
    for c in conns:
        resp = c.recv_response(timeout_s=30)
        assert resp is not None and resp.status == P.EBADREQ and "before AUTH" in resp.message
        assert closed(c)
    assert rss_bytes(pid) - before < 16 * 1024 * 1024
    assert w.append(b"fine") >= 0
