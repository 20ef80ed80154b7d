"""Bookie.add_entries' per-entry checks run in one C pass (journal_kernels.
check_encoded_entries): every bad entry is refused with the error and message the Python
loop it replaced raised (that loop is kept here as the reference), nothing of a refused
batch is stored, and long runs of gapped (striped) entry ids across ledgers store and
read back, with each ledger's last entry and LAC noted (and, at 300,000 entries over layout
2, again after a reopen)."""
import array
import struct

import pytest

import embedlog
from embedlog._native import format as nf, journal_kernels as jk
from embedlog.bookie.descriptors import LedgerFacts
from embedlog.errors import (CorruptedDataError, DigestMismatchError, EntryTooLargeError,
                             IllegalOpError)

CRC32C, CRC32, MAC = nf.digest_code("crc32c"), nf.digest_code("crc32"), nf.digest_code("mac")
MAX = 4096


def _reference(entries, ledger, facts, max_size):
    """The per-entry loop Bookie.add_entries ran before the kernel (with
    LedgerDescriptors.check_entry and bookie._check_entry_id inlined): raises what it
    raised; returns ({key: [top eid, top lac]}, bytes)."""
    runs, nbytes = {}, 0
    for e in entries:
        v, scope, lid, eid, lac, _len, d = nf.parse_entry_header(e)
        if ledger is not None and (scope, lid) != ledger:
            raise IllegalOpError(f"entry of ledger {nf.LedgerId(scope, lid)} in an add for "
                                 f"{nf.LedgerId(*ledger)}")
        if eid < 0:
            raise IllegalOpError(f"entry ids are not negative, got {eid}")
        if eid > nf.MAX_ENTRY_ID:
            raise IllegalOpError(f"entry id {eid} is over {nf.MAX_ENTRY_ID}, the highest a "
                                 f"bookie's index addresses (2^40 - 1): roll over to a new ledger")
        key = (scope, lid)
        f = facts.get(key)
        if v == 2 and d not in nf.DIGEST_SIZES:
            raise CorruptedDataError(f"entry of ledger {nf.LedgerId(*key)} has unknown digest "
                                     f"code {d} (known: {sorted(nf.DIGEST_SIZES)})")
        if f is not None and v == 2 and d != f.digest:
            raise CorruptedDataError(f"entry of ledger {nf.LedgerId(*key)} has digest code "
                                     f"{d}, the ledger's is {f.digest}")
        code = f.digest if f is not None else d
        overhead = (41 if v == 2 else 32) + nf.DIGEST_SIZES.get(code, 0 if code else 20)
        if len(e) - overhead > max_size:
            raise EntryTooLargeError(f"entry with a payload of {len(e) - overhead} bytes is "
                                     f"over max_entry_size_bytes ({max_size})")
        r = runs.setdefault(key, [eid, lac])
        r[0], r[1] = max(r[0], eid), max(r[1], lac)
        nbytes += len(e)
    return runs, nbytes


class _All:
    def __contains__(self, key):
        return True


def _kernel(entries, ledger, facts, max_size, checked=None):
    runs, nbytes, pos, stops = {}, 0, 0, []
    checked = _All() if checked is None else checked
    while True:
        pos, key, k = jk.check_encoded_entries(entries, pos, ledger, facts, checked, runs, max_size)
        nbytes += k
        if key is None:
            return runs, nbytes, stops
        stops.append((pos, key))
        checked.add(key)


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as exc:            # noqa: BLE001 -- the type and message are compared
        return (type(exc), str(exc))


def _same(entries, ledger=None, facts=None, max_size=MAX):
    facts = facts or {}
    want = _outcome(lambda: _reference(entries, ledger, facts, max_size))
    got = _outcome(lambda: _kernel(entries, ledger, facts, max_size)[:2])
    assert got == want
    return got


def enc(scope, lid, eid, lac=-1, payload=b"x", digest=CRC32C):
    return nf.encode_entry(scope, lid, eid, lac, len(payload), digest, payload,
                           nf.mac_key(b"") if digest == MAC else None)


def _v1_with_id(lid, eid):
    """A V1 entry carrying an id encode_entry would refuse to write."""
    e = bytearray(enc(0, lid, 0))
    e[8:16] = struct.pack(">q", eid)
    return bytes(e)


def _v2_with_code(code):
    e = bytearray(enc(7, 3, 0))
    e[0] = 0x80 | (2 << 4) | code
    return bytes(e)


GOOD = [enc(0, 5, 0), enc(0, 5, 1, 0)]
BAD = {
    "empty": [b""],
    "empty after good ones": GOOD + [memoryview(b"")],
    "v1 truncated": GOOD + [enc(0, 5, 2)[:31]],
    "v2 truncated": [enc(7, 3, 0)[:40]],
    "v2 unknown version": [bytes([0x80 | (3 << 4) | CRC32C]) + enc(7, 3, 0)[1:]],
    "v2 scope 0": [bytes([0x80 | (2 << 4) | CRC32C]) + bytes(8) + enc(7, 3, 0)[9:]],
    "negative id": GOOD + [_v1_with_id(5, -1)],
    "id past the index": [_v1_with_id(5, nf.MAX_ENTRY_ID + 1)],
    "id 2^63": [_v1_with_id(5, -(1 << 63))],
    "id 2^63-1": [_v1_with_id(5, (1 << 63) - 1)],
    "unknown digest 0": [_v2_with_code(0)],
    "unknown digest 15": [enc(7, 3, 0), _v2_with_code(15)],
    "too large crc32c": [enc(0, 5, 0, payload=bytes(MAX + 17))],   # V1: reckoned as MAC
    "too large crc32 v2": [enc(7, 3, 0, payload=bytes(MAX + 1), digest=CRC32)],
    "too large mac": [enc(0, 5, 0, payload=bytes(MAX + 1), digest=MAC)],
    "not bytes": GOOD + ["a str"],
    "ints": [array.array("i", enc(0, 5, 0, payload=b"wxyz"))],
    "not contiguous": [memoryview(enc(0, 5, 0) * 2)[::2]],
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_entries_fail_as_the_python_loop_did(name):
    got = _same(BAD[name])
    assert got[0] != "ok", got


def test_sizes_at_the_limit_and_good_batches_agree():
    for digest in (CRC32C, CRC32, MAC, nf.digest_code("dummy")):
        for scope in (0, 9):
            at = [enc(scope, 4, 0, payload=bytes(MAX), digest=digest),
                  enc(scope, 4, 1, 0, payload=b"", digest=digest)]
            assert _same(at)[0] == "ok"
            assert _same(at, ledger=(scope, 4))[0] == "ok"
    assert _same([bytearray(GOOD[0]), memoryview(GOOD[1])], ledger=(0, 5))[1] == (
        {(0, 5): [1, 0]}, sum(map(len, GOOD)))


def test_the_wrong_ledger_is_refused():
    _same(GOOD, ledger=(0, 6))
    _same(GOOD, ledger=(1, 5))
    _same([enc(7, 3, 0), enc(7, 4, 1)], ledger=(7, 3))
    _same(GOOD, ledger=(0, -5))                     # what no entry carries
    _same(GOOD, ledger=(0, 5.0))                    # compared as Python compares it
    _same(GOOD, ledger=[0, 5])
    for ledger in ((0, 5), (0, 6), (0, -5), (0, 5.0)):
        _same(BAD["v1 truncated"], ledger=ledger)   # the header is parsed first


def test_the_ledgers_facts_decide_the_digest_and_the_size():
    facts = {(7, 3): LedgerFacts(b"k" * 20, CRC32, False), (0, 5): LedgerFacts(b"k" * 20, MAC, False)}
    _same([enc(7, 3, 0, digest=CRC32)], facts=facts)
    _same([enc(7, 3, 0, digest=CRC32C)], facts=facts)              # not the ledger's digest
    _same([enc(7, 3, 0, payload=bytes(MAX + 1), digest=CRC32)], facts=facts)
    # a V1 entry's size is reckoned with the ledger's digest (MAC: 20 bytes)
    _same([enc(0, 5, 0, payload=bytes(MAX + 16), digest=CRC32C)], facts=facts)
    _same([enc(0, 5, 0, payload=bytes(MAX + 17), digest=CRC32C)], facts=facts)
    odd = {(7, 3): LedgerFacts(b"k" * 20, 99, False), (0, 5): LedgerFacts(b"k" * 20, 0, False)}
    _same([enc(7, 3, 0, digest=CRC32)], facts=odd)
    _same([enc(0, 5, 0, payload=bytes(MAX + 12))], facts=odd)
    _same([enc(0, 5, 0, payload=bytes(MAX + 13))], facts=odd)


def test_a_bad_checksum_is_stored_as_sent_and_found_by_readers():
    """The add path never checked digests (readers do): a corrupted payload passes."""
    bad = bytearray(enc(0, 5, 0, payload=b"hello"))
    bad[-1] ^= 1
    assert _same([bytes(bad)])[0] == "ok"
    with pytest.raises(DigestMismatchError):
        nf.decode_entry(bytes(bad), 0, 5, 0, CRC32C, None)


def test_the_kernel_stops_at_each_new_ledger_and_aggregates_runs():
    entries = [enc(0, 1, 0), enc(0, 1, 3, 0), enc(0, 2, 5, 4), enc(0, 1, 6, 3), enc(0, 2, 2, 1)]
    runs, nbytes, stops = _kernel(entries, None, {}, MAX, checked=set())
    assert stops == [(1, (0, 1)), (3, (0, 2))]
    assert runs == {(0, 1): [6, 3], (0, 2): [5, 4]}
    assert nbytes == sum(map(len, entries))
    with pytest.raises(ValueError):
        jk.check_encoded_entries(entries, 6, None, {}, set(), {}, MAX)


def test_a_refused_batch_stores_nothing(tmp_path):
    with embedlog.open(str(tmp_path / "d"), max_entry_size_bytes=MAX) as log:
        w = log.create_ledger()
        w.append(b"zero")
        b, lid, key = log.bookie, w.ledger_id.ledger_id, nf.master_key(b"")
        before = b.statistics()["adds"] if "adds" in b.statistics() else None
        for bad in (enc(0, lid, 3)[:20], _v1_with_id(lid, -1), enc(0, lid + 1, 3),
                    enc(0, lid, 3, payload=bytes(MAX + 17))):
            with pytest.raises((CorruptedDataError, IllegalOpError)):
                b.add_entries([enc(0, lid, 1, 0), enc(0, lid, 2, 0), bad], key, ledger=(0, lid))
        with pytest.raises(Exception):
            b.read_entry(w.ledger_id, 1)
        assert b.descriptors.last_entry_id((0, lid)) == 0
        if before is not None:
            assert b.statistics()["adds"] == before


def test_thousands_of_striped_entries_across_ledgers_store_and_read_back(tmp_path):
    # a small memtable: the batch spans several memtable flushes (make_room mid-batch)
    with embedlog.open(str(tmp_path / "d"), skip_list_size_limit=1 << 18) as log:
        b, key = log.bookie, nf.master_key(b"")
        lids = [log.create_ledger().ledger_id.ledger_id for _ in range(3)]
        v2 = log.create_ledger(scope_id=11).ledger_id
        sent = {}
        # one ledger per frame (the embedlog protocol's ADD), ids striped 3 apart
        for k, lid in enumerate(lids):
            batch = [enc(0, lid, k + 3 * i, k + 3 * i - 1, payload=bytes([i % 251]) * (i % 700))
                     for i in range(3000)]
            b.wait_durable(b.add_entries(batch, key, ledger=(0, lid)))
            sent.update({(0, lid, k + 3 * i): e for i, e in enumerate(batch)})
        # several ledgers in one batch (a BookKeeper client's run; no ``ledger``)
        mixed = []
        for i in range(3000):
            lid = lids[i % 3]
            mixed.append(enc(0, lid, 9000 + 2 * i, 8000 + i, payload=b"m" * (i % 300)))
            mixed.append(enc(11, v2.ledger_id, 5 * i, 5 * i - 5, payload=b"v" * (i % 50)))
        b.wait_durable(b.add_entries(mixed, key))
        for e in mixed:
            _v, s, l, eid, *_ = nf.parse_entry_header(e)
            sent[(s, l, eid)] = e
        for (s, l, eid), e in sent.items():
            assert b.read_entry(nf.LedgerId(s, l), eid) == e
        d = b.descriptors
        for lid in lids:
            assert d.last_entry_id((0, lid)) == max(eid for s, l, eid in sent if l == lid and s == 0)
        assert d.last_entry_id((11, v2.ledger_id)) == 5 * 2999
        assert d.lac((11, v2.ledger_id)) == 5 * 2999 - 5
        assert d.lac((0, lids[0])) == 8000 + 2997


def test_hundreds_of_thousands_of_striped_ids_of_interleaved_ledgers_over_layout_2(tmp_path):
    """What a bookie of a striped ensemble (E > Qw) stores, at volume, over layout 2: 24
    ledgers of E = 3, 4 or 5 and Qw = 2, each holding 2 ids out of every E (this bookie's
    share), 300,000 entries in calls of 12,000 that interleave all 24 ledgers (a BookKeeper
    client's runs). Small memtables and 2 MiB journals: flushes fall mid-call and most
    entries end in segments. Every entry reads back as sent, the ids in the gaps are absent,
    before and after a reopen (index into the segments, replay of the rest)."""
    from embedlog.errors import NoSuchEntryError
    cfg = dict(storage_layout=2, skip_list_size_limit=1 << 20, journal_max_size_mb=2,
               journal_pre_alloc_size_mb=1)
    per_ledger, per_call = 12_500, 500             # ids held per ledger; per ledger in a call
    path = str(tmp_path / "d")
    with embedlog.open(path, **cfg) as log:
        b, key = log.bookie, nf.master_key(b"")
        assert b.layout == 2
        ledgers = []                                # (scope, lid, held ids)
        for k in range(24):
            lid = log.create_ledger(scope_id=11 if k % 4 == 0 else 0).ledger_id
            e = 3 + k % 3
            ids = [i for i in range(per_ledger * e // 2 + e) if (k - i) % e < 2][:per_ledger]
            ledgers.append((lid.scope_id, lid.ledger_id, ids))

        def entry(s, l, i):
            return enc(s, l, i, i - 1, payload=(b"%d/%d/%d;" % (s, l, i)) * (i % 12))
        for first in range(0, per_ledger, per_call):
            batch = [entry(s, l, ids[j]) for j in range(first, first + per_call)
                     for s, l, ids in ledgers]
            b.wait_durable(b.add_entries(batch, key))
        b.checkpoint()

        def check(b):
            for s, l, ids in ledgers:
                lid = nf.LedgerId(s, l)
                for i in ids:
                    assert b.read_entry(lid, i) == entry(s, l, i), (s, l, i)
                gaps = sorted(set(range(ids[-1])) - set(ids))
                for i in gaps[:: max(1, len(gaps) // 50)]:
                    with pytest.raises(NoSuchEntryError):
                        b.read_entry(lid, i)
                assert b.descriptors.last_entry_id((s, l)) == ids[-1]
        check(b)
        where = [b.storage.location((s, l), ids[0]) >> 63 for s, l, ids in ledgers]
        assert all(where), where                    # the first ids live in segments
    with embedlog.open(path, **cfg) as log:
        assert log.bookie.layout == 2
        check(log.bookie)
