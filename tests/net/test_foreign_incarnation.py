"""A ledger id the metadata store gives to a new ledger while a bookie process still holds
the old one, over embedlog's wire: every request for it is answered as by a bookie that
does not hold it (plain and long-poll READ, READ_LAC, fencing READ_LAC: ENOLEDGER; ADD and
WRITE_LAC: ELEDGEREXISTS, which a writer answers by replacing the bookie), and the old entries
stay. SQLite has no watch: the bookie reads the facts of a held ledger again when they are
over a second old (bookie/descriptors.py), so the test waits for that, on the answer."""
import pytest

from support.cliutil import wait_until
from embedlog._native import format as nf
from embedlog.harness import LocalCluster
from embedlog.harness.hostile import RawConnection
from embedlog.net import protocol as P

CRC32C = nf.digest_code("crc32c")
KEY = nf.master_key(b"")


def relist(lm, md) -> None:
    """The store lists ``md`` in place of the ledger of its id: deleted, its deletion record
    purged, created again (what an id used again or a restored backup leaves)."""
    lm.remove_ledger_metadata(md.ledger_id)
    lm.purge_deletions(2 ** 62)
    lm.create_ledger_metadata(md)


@pytest.fixture
def setup(tmp_path):
    with LocalCluster(bookies=1, base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False) as cluster:
        with cluster.client() as client:
            yield cluster, client


def test_a_held_ledger_of_another_incarnation_is_answered_as_absent(setup):
    cluster, client = setup
    w = client.create_ledger(1, 1, 1)
    w.append_many([b"old-0", b"old-1", b"old-2"])
    w.close()
    lid = w.ledger_id
    address = client._ctx.address_of(cluster.bookie_id(0))

    def ask(frame):
        conn = RawConnection(address)
        try:
            conn.send(frame)
            return conn.recv_response()
        finally:
            conn.close()

    assert ask(P.read_lac_request(1, 0, lid.ledger_id)).status == P.EOK
    # the store now lists a new ledger under the id (deleted and created again, or restored)
    lm = client.metadata.ledger_manager
    orig = lm.read_ledger_metadata(lid).value
    relist(lm, orig.with_(ctime_ms=orig.ctime_ms + 1, state=orig.state.OPEN,
                             last_entry_id=-1, length=0))
    wait_until(lambda: ask(P.read_lac_request(2, 0, lid.ledger_id)).status == P.ENOLEDGER,
               30, "READ_LAC answered as for a ledger the bookie does not hold")
    assert ask(P.read_request(3, 0, lid.ledger_id, 0, 3)).status == P.ENOLEDGER
    poll = ask(P.read_request(4, 0, lid.ledger_id, 3, 1, flags=P.FLAG_LONG_POLL,
                              previous_lac=2, timeout_ms=100))
    assert poll.status == P.ENOLEDGER, poll
    fence = ask(P.read_lac_request(5, 0, lid.ledger_id, flags=P.FLAG_FENCE, master_key=KEY))
    assert fence.status == P.ENOLEDGER, fence
    entry = nf.encode_entry(0, lid.ledger_id, 0, -1, 5, CRC32C, b"new-0")
    assert ask(P.add_request(6, 0, lid.ledger_id, KEY, [entry])).status == P.ELEDGEREXISTS
    assert ask(P.write_lac_request(7, 0, lid.ledger_id, KEY, 0)).status == P.ELEDGEREXISTS
    # the store lists the old ledger again: its entries were kept, unchanged
    relist(lm, orig)
    wait_until(lambda: ask(P.read_lac_request(8, 0, lid.ledger_id)).status == P.EOK, 30,
               "the old ledger served again")
    assert ask(P.read_request(9, 0, lid.ledger_id, 0, 3)).status == P.EOK
    r = client.open_ledger(lid)
    assert r.read_batch(0, 2) == [b"old-0", b"old-1", b"old-2"]


def test_a_restarted_bookie_checks_a_held_ledger_before_its_first_plain_read(setup):
    """Restarted, a bookie has read no ledger's metadata: the first plain READ of a held
    ledger reads it, so the old incarnation's entries (whose digests would check: same id,
    and a CRC digest takes no password) never reach a reader of the new ledger."""
    cluster, client = setup
    w = client.create_ledger(1, 1, 1)
    w.append_many([b"old-0", b"old-1"])
    w.close()
    lid = w.ledger_id
    cluster.stop_bookie(0)
    lm = client.metadata.ledger_manager
    orig = lm.read_ledger_metadata(lid).value
    relist(lm, orig.with_(ctime_ms=orig.ctime_ms + 1, state=orig.state.OPEN,
                             last_entry_id=-1, length=0))
    cluster.restart_bookie(0)
    conn = RawConnection(client._ctx.address_of(cluster.bookie_id(0)))
    try:
        conn.send(P.read_request(1, 0, lid.ledger_id, 0, 2))
        assert conn.recv_response().status == P.ENOLEDGER
        relist(lm, orig)                 # listed again: the kept entries are served

        def status():
            conn.send(P.read_request(2, 0, lid.ledger_id, 0, 2))
            return conn.recv_response().status
        wait_until(lambda: status() == P.EOK, 30, "the old ledger served again")
    finally:
        conn.close()
