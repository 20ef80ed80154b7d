"""Entry ids a client may send are bounded (issue 25, item 6): an ADD at entry id 2^61 or
2^42, signed with the empty password's key (what any default ledger accepts from anyone
who reaches the bookie), is refused with an error, the bookie keeps serving, its
checkpoints keep passing and it restarts cleanly. In process: a checkpoint that keeps
failing is counted, logged and makes the bookie read-only, instead of killing its thread."""
import pytest

import embedlog
from support.cliutil import wait_until
from embedlog._native import format as nf
from embedlog.errors import IllegalOpError
from embedlog.harness import LocalCluster
from embedlog.harness.hostile import RawConnection
from embedlog.net import protocol as P

CRC32C = nf.digest_code("crc32c")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("idbounds")
    with LocalCluster(bookies=1, base_dir=str(base), proxies=False, autorecovery=False,
                      bookie_config={"flush_interval_ms": 100}) as c:
        yield c


@pytest.mark.parametrize("eid", [1 << 61, 1 << 42, nf.MAX_ENTRY_ID + 1, (1 << 63) - 1])
def test_an_add_past_the_index_is_refused_and_the_bookie_goes_on(cluster, eid):
    client = cluster.client()
    w = client.create_ledger(1, 1, 1)          # the default (empty) password
    w.append(b"zero")
    lid = w.ledger_id
    entry = nf.encode_entry(0, lid.ledger_id, eid, 0, 4, CRC32C, b"evil")
    conn = RawConnection(client._ctx.address_of(cluster.bookie_id(0)))
    try:
        conn.send(P.add_request(7, 0, lid.ledger_id, nf.master_key(b""), [entry]))
        resp = conn.recv_response()
    finally:
        conn.close()
    assert resp is not None and resp.status != P.EOK
    assert str(nf.MAX_ENTRY_ID) in bytes(resp.body).decode(errors="replace")
    # the bookie still serves, and its checkpoints still pass
    before = _stats(client, cluster)["checkpoints"]
    assert w.append(b"one") == 1
    # two checkpoints: each syncs the entry logs, seconds apart on a disk other work saturates
    wait_until(lambda: _stats(client, cluster)["checkpoints"] > before + 1, 90, "checkpoints")
    assert _stats(client, cluster)["checkpoint_failures"] == 0
    w.close()
    cluster.restart_bookie(0)
    r = cluster.client().open_ledger(lid)
    assert [e.data for e in r.read(0, r.last_add_confirmed)] == [b"zero", b"one"]


def _stats(client, cluster):
    import json
    ctx = client._ctx
    return json.loads(bytes(ctx.run(ctx.call(cluster.bookie_id(0), P.bookie_info_request,
                                             5)).body))


def test_embedded_refuses_entry_ids_past_the_index(tmp_path):
    with embedlog.open(str(tmp_path / "d")) as log:
        b = log.bookie
        with pytest.raises(IllegalOpError, match="over"):
            b.add_payloads(1, nf.master_key(b""), nf.MAX_ENTRY_ID, -1, 0, CRC32C, None,
                           [b"a", b"b"])
        entry = nf.encode_entry(0, 1, 1 << 61, -1, 1, CRC32C, b"x")
        with pytest.raises(IllegalOpError, match="over"):
            b.add_entries([entry], nf.master_key(b""))


def test_a_failing_checkpoint_is_counted_and_makes_the_bookie_read_only(tmp_path):
    from embedlog import failpoints
    from embedlog.bookie import checkpoint

    def broken():
        raise OverflowError("an index offset past what the file system takes")

    with embedlog.open(str(tmp_path / "d"), flush_interval_ms=20) as log:
        w = log.create_ledger()
        w.append(b"a")
        failpoints.arm("checkpoint.before_lastmark", broken)
        try:
            b = log.bookie
            wait_until(lambda: b.read_only, what="read-only after failed checkpoints")
            assert b.checkpointer.failures >= checkpoint.READ_ONLY_AFTER_FAILURES
            assert "checkpoint" in b.read_only_reasons
            assert "OverflowError" in b.statistics()["checkpoint_last_error"]
        finally:
            failpoints.disarm()
        wait_until(lambda: not b.read_only, what="writable once a checkpoint passes")
        assert b.checkpointer.failures == 0
        w.append(b"b")


@pytest.mark.parametrize("ledger", [1 << 63, (1 << 64) - 1])
def test_a_scope_0_ledger_id_past_2_63_is_answered_and_the_connection_kept(cluster, ledger):
    # was: the dispatcher's LedgerId() raised outside its error handling (a traceback in the
    # bookie's log, the connection dropped)
    client = cluster.client()
    key = nf.master_key(b"")
    entry = nf.encode_entry(0, 1, 0, -1, 4, CRC32C, b"evil")    # only the frame names it
    frames = [P.add_request(1, 0, ledger, key, [entry]), P.write_lac_request(2, 0, ledger, key, 0),
              P.trim_request(3, 0, ledger, key, 0),
              P.read_request(4, 0, ledger, 0, flags=P.FLAG_FENCE, master_key=key),
              P.read_request(5, 0, ledger, 0), P.read_lac_request(6, 0, ledger)]
    conn = RawConnection(client._ctx.address_of(cluster.bookie_id(0)))
    try:
        for frame in frames:
            conn.send(frame)
            resp = conn.recv_response()
            assert resp is not None, "the bookie dropped the connection"
            assert resp.status == P.EBADREQ and "2^63" in resp.message, resp.message
        conn.send(P.bookie_info_request(7))            # the same connection goes on
        resp = conn.recv_response()
        assert resp is not None and resp.status == P.EOK
    finally:
        conn.close()
