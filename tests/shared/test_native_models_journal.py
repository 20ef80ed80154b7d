"""Model-based tests of the journal buffer and scanner (issue 25, item 3).

Records of every type (entries V1/V2 of every digest, meta records, unknown types) are framed
into a ``JournalBuffer`` (small capacities, so it grows; leads, swaps), written to a file
behind a journal header and scanned back: every record must come back byte for byte, and
``replay_entries`` must put exactly the entries into a memtable. A cut or a flipped byte in
the tail must be reported ("torn", or "corrupt" with good records after it), with every
record before the damage intact and nothing after it misread.

EMBEDLOG_HYPOTHESIS_EXAMPLES=2000 runs longer (random, not the default fixed examples).
"""
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedlog._native import format as nf
from embedlog._native import (journal_format as jformat, journal_buffer as jbuffer,
                              journal_scan as jscan, journal_kernels as jkernels)
from embedlog._native import memtable as nm
from embedlog._native.format import MAX_ENTRY_ID

EXAMPLES = int(os.environ.get("EMBEDLOG_HYPOTHESIS_EXAMPLES", "0"))
FAST = settings(max_examples=EXAMPLES or 80, deadline=None, derandomize=not EXAMPLES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

U64 = (1 << 64) - 1
MAC_KEY = nf.mac_key(b"pw")
REC_HEADER = 9
META = [jformat.LEDGER_KEY, jformat.FENCE, jformat.EXPLICIT_LAC, jformat.TERM, jformat.TRUNCATE, jformat.DELETE_LEDGER, jformat.TRIM]

ledgers = st.sampled_from([(0, 1), (0, (1 << 63) - 1), (1, 0), (U64, U64), (7, 3)])
entry_ids = st.one_of(st.integers(0, 200), st.integers(MAX_ENTRY_ID - 5, MAX_ENTRY_ID))


@st.composite
def records(draw):
    """(record type, body): an entry (framed as ENTRY, as add_encoded_entries does) or not."""
    kind = draw(st.sampled_from(["entry", "entry", "entry", "meta", "unknown"]))
    if kind == "entry":
        scope, lid = draw(ledgers)
        d = draw(st.sampled_from(["crc32c", "crc32", "dummy", "mac"]))
        size = draw(st.one_of(st.integers(0, 50), st.integers(0, 5000),
                              st.sampled_from([0, 70000])))
        payload = draw(st.binary(min_size=min(size, 20), max_size=min(size, 20))) * (size // 20 + 1)
        e = nf.encode_entry(scope, lid, draw(entry_ids), -1, 0, nf.digest_code(d),
                            payload[:size], MAC_KEY if d == "mac" else None)
        return jformat.ENTRY, e
    if kind == "meta":
        return draw(st.sampled_from(META)), draw(st.binary(min_size=16, max_size=24))
    return draw(st.integers(10, 255)), draw(st.binary(min_size=1, max_size=100))


def _frame(recs, capacity, lead, swap):
    jb = jbuffer.JournalBuffer(capacity)
    jb.set_lead(lead)
    for rtype, body in recs:
        nb = jb.nbytes
        jb.add_record(rtype, body)
        assert jb.nbytes == nb + REC_HEADER + len(body)
    assert jb.nrecords == len(recs)
    if swap:
        other = jbuffer.JournalBuffer(16)
        jb.swap(other)
        assert jb.nrecords == 0 and jb.nbytes == 0
        jb = other
    return jb


def _write(jb, prealloc):
    fd, path = tempfile.mkstemp(prefix="jmodel-")
    try:
        os.write(fd, jformat.file_header(5, 4))
        n = jb.write_to(fd, jformat.HEADER_SIZE)
        assert n == jb.nbytes
        if prealloc:
            jbuffer.write_zeros(fd, jformat.HEADER_SIZE + n, prealloc)
        os.close(fd)
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def _check_prefix(data, got, recs):
    """Every record scanned is the record framed at that place."""
    assert len(got) <= len(recs)
    off = jformat.HEADER_SIZE
    for i in range(len(got)):
        rtype, body = recs[i]
        assert got[i] == (off, rtype, off + REC_HEADER, len(body))
        assert data[off + REC_HEADER:off + REC_HEADER + len(body)] == body
        off += REC_HEADER + len(body)


@FAST
@given(recs=st.lists(records(), min_size=0, max_size=40),
       capacity=st.sampled_from([16, 1000, 1 << 20]), lead=st.integers(0, 8191),
       swap=st.booleans(), prealloc=st.sampled_from([0, 0, 7, 4096, 70000]))
def test_records_round_trip_and_replay(recs, capacity, lead, swap, prealloc):
    jb = _frame(recs, capacity, lead, swap)
    want_ids = [tuple(nf.parse_entry_header(b)[1:4]) for t, b in recs if t == jformat.ENTRY]
    assert jb.entry_ids() == want_ids
    data = _write(jb, prealloc)
    assert jformat.check_file_header(data) == 5 and jformat.file_chain(data) == 4
    got, end, status, skipped = jscan.scan(data)
    assert status == "clean" and skipped == []
    assert len(got) == len(recs)
    assert end == jformat.HEADER_SIZE + jb.nbytes
    _check_prefix(data, [got[i] for i in range(len(got))], recs)
    for rtype, body in recs:
        if rtype in jformat.RECORD_TYPES and rtype not in jformat.ENTRY_TYPES:
            try:
                jformat.decode_record(rtype, body)
            except jformat.JournalCorruptedError:
                pass
    # replay: the runs of entries, as the bookie's replay walks them
    mt, seen, i, model = nm.MemTable(1 << 30), {}, 0, {}
    while i < len(got):
        if got[i][1] in jformat.ENTRY_TYPES:
            j = jkernels.replay_entries(data, got, i, mt, seen)
            assert j > i
            for k in range(i, j):
                body = recs[k][1]
                model[tuple(nf.parse_entry_header(body)[1:4])] = body
            i = j
        else:
            i += 1
    for (s, l, e), body in model.items():
        assert mt.get_encoded(s, l, e) == body
    assert mt.count == len(model)
    for (s, l, e) in model:
        assert seen[(s, l)] >= e


@FAST
@given(recs=st.lists(records(), min_size=1, max_size=20), data=st.data(),
       prealloc=st.sampled_from([0, 4096]))
def test_damaged_tails_are_reported_not_misread(recs, data, prealloc):
    jb = _frame(recs, 1 << 16, 0, False)
    clean = _write(jb, prealloc)
    end = jformat.HEADER_SIZE + jb.nbytes
    damaged = bytearray(clean)
    how = data.draw(st.sampled_from(["cut", "flip", "flip_then_good", "zero_len"]))
    starts = []
    off = jformat.HEADER_SIZE
    for _t, body in recs:
        starts.append(off)
        off += REC_HEADER + len(body)
    victim = data.draw(st.integers(0, len(recs) - 1))
    lo, hi = starts[victim], starts[victim] + REC_HEADER + len(recs[victim][1])
    if how == "cut":
        at = data.draw(st.integers(lo, hi - 1))
        damaged = damaged[:at]
    elif how == "zero_len":
        damaged[lo:lo + 4] = b"\0\0\0\0"
    else:
        at = data.draw(st.integers(lo, hi - 1))
        damaged[at] ^= 1 << data.draw(st.integers(0, 7))
        if how == "flip_then_good" and victim == len(recs) - 1:     # a good record after it
            extra = jbuffer.JournalBuffer(64)
            extra.add_record(jformat.FENCE, bytes(16))
            tmp = tempfile.TemporaryFile()
            extra.write_to(tmp.fileno(), 0)
            tmp.seek(0)
            damaged[end:end + extra.nbytes] = tmp.read()
            tmp.close()
    got, scan_end, status, skipped = jscan.scan(bytes(damaged))
    got = [got[i] for i in range(len(got))]
    # everything before the damaged record is read, nothing at or after it is misread
    assert len(got) == victim, (how, victim, len(got))
    _check_prefix(damaged, got, recs)
    assert scan_end == starts[victim]
    last = victim == len(recs) - 1 and how != "flip_then_good"
    if how == "cut" or (how in ("zero_len", "flip") and last):
        # a length that became 0 ends the log; otherwise a torn tail
        assert status in ("torn", "clean"), (how, status)
    else:
        assert status == "corrupt", (how, status)     # good records follow the damage
    # skip_corrupt steps over a corrupt region and reads the good records after it
    got2, _end, status2, skipped2 = jscan.scan(bytes(damaged), skip_corrupt=True)
    if status == "corrupt":
        assert skipped2 and status2 != "corrupt"
