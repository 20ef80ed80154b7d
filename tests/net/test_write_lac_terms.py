"""A WRITE_LAC's term is checked as an ADD's is (issue 52, item 5), over the wire of a real
bookie process: a bounded ledger takes no term (IllegalOpError, EBADREQ; one WRITE_LAC with
term 5 was answered OK), a stream's ledger takes its current term, refuses a lower one
(EINVALIDTERM), and a stream whose writer sends its LAC with its term goes on."""
import pytest

from embedlog._native import format as nf
from embedlog.harness import LocalCluster
from embedlog.harness.hostile import RawConnection
from embedlog.net import protocol as P

CRC32C = nf.digest_code("crc32c")
KEY = nf.master_key(b"")          # the default (empty) password's key


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=1, base_dir=str(tmp_path_factory.mktemp("lacterm")), proxies=False,
                      autorecovery=False) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    return cluster.client()


def send(cluster, client, frame):
    conn = RawConnection(client._ctx.address_of(cluster.bookie_id(0)))
    try:
        conn.send(frame)
        resp = conn.recv_response()
    finally:
        conn.close()
    assert resp is not None
    return resp


@pytest.mark.parametrize("written", [True, False], ids=["after-adds", "first-request"])
def test_a_write_lac_with_a_term_on_a_bounded_ledger_is_refused(cluster, client, written):
    w = client.create_ledger(1, 1, 1)
    lid = w.ledger_id
    if written:
        w.append_many([b"zero", b"one"])
    entry = nf.encode_entry(0, lid.ledger_id, 2 if written else 0, -1, 4, CRC32C, b"evil")
    add = send(cluster, client, P.add_request(7, 0, lid.ledger_id, KEY, [entry], term=5))
    lac = send(cluster, client, P.write_lac_request(8, 0, lid.ledger_id, KEY, 1, term=5))
    assert add.status == P.EBADREQ, add                    # as an ADD with a term is...
    assert lac.status == P.EBADREQ, lac                    # ...so is a WRITE_LAC
    assert b"bounded" in bytes(lac.body) and b"term 5" in bytes(lac.body)
    # without a term it is taken, and the ledger's own writer goes on
    assert send(cluster, client, P.write_lac_request(9, 0, lid.ledger_id, KEY, -1)).status == P.EOK
    first = 2 if written else 0
    assert w.append(b"two") == first
    w.close()
    r = client.open_ledger(lid)
    assert r.last_add_confirmed == first and r.read_entry(first) == b"two"


def test_a_stream_ledger_takes_its_term_and_refuses_a_lower_one(cluster, client):
    s = client.open_stream("lac-terms", ensemble_size=1, write_quorum=1, ack_quorum=1)
    s.append(b"a")
    lid, term = s.metadata.ledger_id, s.term
    assert term >= 1 and s.metadata.unbounded
    ok = send(cluster, client, P.write_lac_request(7, lid.scope_id, lid.ledger_id, KEY, 0, term=term))
    assert ok.status == P.EOK, ok
    low = send(cluster, client, P.write_lac_request(8, lid.scope_id, lid.ledger_id, KEY, 0,
                                                    term=term - 1))
    assert low.status == P.EINVALIDTERM, low
    # the writer's own WRITE_LACs (flush_lac, with its term) and adds still pass
    for i in range(5):
        s.append(b"%d" % i)
    writer = s._writer
    client._ctx.run(writer.flush_lac())
    assert s.append(b"last") >= 0 and s.is_leader
    assert [e.data for e in s.read(0)][-1] == b"last"
