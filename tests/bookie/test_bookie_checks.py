"""What a served bookie checks before it stores anything: the ledger's metadata exists
and the request's master key is the one its password gives (no squatting), bounded
ledgers take no term, entries carry a known digest code and a payload within the limit."""
import pytest

from embedlog._native.format import LedgerId, encode_entry, master_key
from embedlog.errors import (EmbedlogError, IllegalOpError,
                             NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError)
from embedlog.harness import LocalCluster
from embedlog.net import protocol as P


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, base_dir=str(tmp_path_factory.mktemp("c")), autorecovery=False,
                      bookie_config={"max_entry_size_bytes": 4096}) as lc:
        yield lc


def call(client, bookie, build):
    return client._ctx.run(client._ctx.call(bookie, build, 10))


def holds(client, bookie, lid, eid) -> bool:
    try:
        resp = call(client, bookie, lambda rid: P.read_request(rid, lid.scope_id, lid.ledger_id, eid))
        return bool(P.parse_read_body(resp.body)[1])
    except (NoSuchEntryError, NoSuchLedgerError):
        return False


def test_no_squatting_on_ledger_ids_not_yet_created(cluster):
    """Ids are sequential: an attacker who writes (or fences) the next ids first, with a
    key of its own, must not lock the real owner out of them."""
    owner, attacker = cluster.client("owner"), cluster.client("attacker")
    first = owner.create_ledger(3, 3, 2).ledger_id.ledger_id
    bogus = master_key(b"not the password")
    for lid in range(first + 1, first + 4):
        entry = encode_entry(0, lid, 0, -1, 3, 3, b"bad", None)
        for i in range(3):
            b = cluster.bookie_id(i)
            with pytest.raises((NoSuchLedgerError, UnauthorizedAccessError)):
                call(attacker, b, lambda rid: P.add_request(rid, 0, lid, bogus, [entry]))
            with pytest.raises((NoSuchLedgerError, UnauthorizedAccessError)):
                call(attacker, b, lambda rid: P.read_lac_request(rid, 0, lid, P.FLAG_FENCE, bogus))
    for _ in range(3):
        w = owner.create_ledger(3, 3, 2)
        assert first < w.ledger_id.ledger_id <= first + 3
        assert w.append_many([b"mine"] * 5) == 4
        w.close()
    # once the ledger exists, a wrong key is still refused
    w = owner.create_ledger(3, 3, 2, password=b"secret")
    lid = w.ledger_id
    with pytest.raises(UnauthorizedAccessError):
        call(attacker, w.metadata.fragments[0][1][0], lambda rid: P.add_request(
            rid, 0, lid.ledger_id, bogus, [encode_entry(0, lid.ledger_id, 0, -1, 1, 3, b"x", None)]))
    assert w.append(b"ok") == 0


def test_a_bounded_ledger_refuses_a_term(cluster):
    c = cluster.client("w")
    w = c.create_ledger(3, 3, 2)
    w.append(b"0")
    lid, key = w.ledger_id, master_key(b"")
    entry = encode_entry(0, lid.ledger_id, 1, 0, 2, 3, b"1", None)
    with pytest.raises(IllegalOpError, match="bounded"):
        call(c, w.metadata.fragments[0][1][0], lambda rid: P.add_request(
            rid, 0, lid.ledger_id, key, [entry], 0, 5))
    assert w.append(b"1") == 1          # the writer goes on (it failed for ever before)
    w.close()


@pytest.mark.parametrize("code", [0, 5, 0xF])
def test_entries_with_an_unknown_digest_code_are_refused(cluster, code):
    c = cluster.client("w")
    w = c.create_ledger(3, 3, 3, scope_id=77)         # scope != 0: entry format V2
    w.append(b"0")
    lid = w.ledger_id
    entry = bytearray(encode_entry(lid.scope_id, lid.ledger_id, 1, 0, 2, 3, b"1", None))
    entry[0] = 0x80 | (2 << 4) | code
    b = w.metadata.fragments[0][1][0]
    with pytest.raises(EmbedlogError, match="unknown digest code"):     # EIO on the wire
        call(c, b, lambda rid: P.add_request(rid, lid.scope_id, lid.ledger_id, master_key(b""),
                                             [bytes(entry)]))
    assert not holds(c, b, lid, 1)


def test_the_payload_limit_is_the_documented_one(cluster):
    c = cluster.client("w")
    for scope, digest in ((0, "crc32c"), (0, "mac"), (9, "crc32")):
        w = c.create_ledger(3, 3, 3, scope_id=scope, digest=digest)
        assert w.append(bytes(4096)) == 0             # exactly max_entry_size_bytes
        lid = w.ledger_id
        from embedlog._native.format import digest_code, mac_key
        code = digest_code(digest)
        big = encode_entry(lid.scope_id, lid.ledger_id, 1, 0, 4096 + 4097, code, bytes(4097),
                           mac_key(b"") if digest == "mac" else None)
        with pytest.raises(IllegalOpError, match="over max_entry_size_bytes"):   # EBADREQ
            call(c, w.metadata.fragments[0][1][0], lambda rid: P.add_request(
                rid, lid.scope_id, lid.ledger_id, master_key(b""), [big]))
        w.close()
