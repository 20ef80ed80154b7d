"""An entry id costs the index 8 bytes of file for every id below it (locations are
addressed, not stored in order), so one add at 2^40 - 1 made an 8 TiB sparse index file,
from anyone who reaches the bookie with a default ledger's empty password. A bounded
ledger's ids stop at 2^32 - 1 (an index file of at most 32 GiB): above, an add is refused
with IllegalOpError before any of it is written, embedded and over the wire, and the
bookie goes on. A stream's adds (they carry a term) keep the index's whole range."""
import os

import pytest

import embedlog
from embedlog._native import format as nf
from embedlog._native import index as nix
from embedlog.bookie.bookie import MAX_BOUNDED_ENTRY_ID
from embedlog.errors import IllegalOpError

CRC32C = nf.digest_code("crc32c")
LARGEST_INDEX = nix.HEADER_SIZE + (MAX_BOUNDED_ENTRY_ID // nix.ENTRIES_PER_PAGE + 1) * nix.PAGE_SIZE


def _index_sizes(root):
    return {os.path.join(d, n): os.path.getsize(os.path.join(d, n))
            for d, _dirs, files in os.walk(root) for n in files if n.endswith(".idx")}


def test_the_bound_keeps_a_bounded_ledgers_index_within_32_gib():
    assert MAX_BOUNDED_ENTRY_ID == (1 << 32) - 1 < nf.MAX_ENTRY_ID
    assert LARGEST_INDEX <= (32 << 30) + nix.HEADER_SIZE


def test_embedded_far_ids_are_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "d"
    with embedlog.open(path) as log:
        b = log.bookie
        w = log.create_ledger()
        w.append(b"zero")
        lid = w.ledger_id
        key = b.master_key_of(lid)
        for eid in ((1 << 40) - 1, MAX_BOUNDED_ENTRY_ID + 1):
            with pytest.raises(IllegalOpError, match="over 4294967295"):
                b.add_entries([nf.encode_entry(0, lid.ledger_id, eid, -1, 1, CRC32C, b"x")], key)
            with pytest.raises(IllegalOpError, match="over 4294967295"):
                b.add_payloads(lid.ledger_id, key, eid, -1, 0, CRC32C, None, [b"a"])
            with pytest.raises(IllegalOpError, match="over 4294967295"):   # a batch's last
                b.add_entries([nf.encode_entry(0, lid.ledger_id, e, -1, 1, CRC32C, b"x")
                               for e in (1, eid)], key)
        assert b.read_last_entry_id(lid) == 0
        # the highest id taken: its index file is as large as one gets
        b.add_entry(nf.encode_entry(0, lid.ledger_id, MAX_BOUNDED_ENTRY_ID, 0, 1, CRC32C, b"top"), key)
        b.checkpoint()
        assert b.read_entry(lid, MAX_BOUNDED_ENTRY_ID).endswith(b"top")
    sizes = _index_sizes(path)
    assert sizes and max(sizes.values()) <= LARGEST_INDEX, sizes
    with embedlog.open(path) as log:                  # and it restarts with it
        assert log.bookie.read_entry(lid, MAX_BOUNDED_ENTRY_ID).endswith(b"top")


def test_over_the_wire_an_add_at_2_40_is_refused_and_nothing_is_written(tmp_path):
    from embedlog.harness import LocalCluster
    from embedlog.harness.hostile import RawConnection
    from embedlog.net import protocol as P
    with LocalCluster(bookies=1, base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False) as cluster:
        client = cluster.client()
        w = client.create_ledger(1, 1, 1)             # the default (empty) password
        w.append(b"zero")
        lid = w.ledger_id.ledger_id
        conn = RawConnection(client._ctx.address_of(cluster.bookie_id(0)))
        try:
            for n, eid in enumerate(((1 << 40) - 1, MAX_BOUNDED_ENTRY_ID + 1)):
                entry = nf.encode_entry(0, lid, eid, 0, 4, CRC32C, b"evil")
                conn.send(P.add_request(n, 0, lid, nf.master_key(b""), [entry]))
                resp = conn.recv_response()
                assert resp is not None and resp.status != P.EOK
                assert "over 4294967295" in bytes(resp.body).decode(errors="replace")
        finally:
            conn.close()
        assert w.append(b"one") == 1                    # the bookie goes on
        w.close()
        cluster.stop_bookie(0)                          # its closing checkpoint flushed the index
        sizes = _index_sizes(cluster.bookie_dir(0))
        assert sizes and max(sizes.values()) < 1 << 20, sizes


def test_a_streams_positions_keep_the_whole_range(tmp_path):
    """A stream is one ledger for its whole life, its positions that ledger's entry ids:
    its adds (they carry its term) still go up to MAX_ENTRY_ID."""
    with embedlog.open(tmp_path / "d") as log:
        s = log.open_stream("s")
        s.take_over()
        assert s.append(b"first") == 0
        b = log.bookie
        lid = s.ledger_id
        key = b.master_key_of(lid)
        far = MAX_BOUNDED_ENTRY_ID + 10
        seq = b.add_entries([nf.encode_entry(lid.scope_id, lid.ledger_id, far, 0, 1, CRC32C,
                                             b"far")], key, term=s.term)
        b.wait_durable(seq)
        assert b.read_entry(lid, far).endswith(b"far")
        with pytest.raises(IllegalOpError, match="over 1099511627775"):
            b.add_entries([nf.encode_entry(lid.scope_id, lid.ledger_id, 1 << 40, 0, 1, CRC32C,
                                           b"x")], key, term=s.term)
