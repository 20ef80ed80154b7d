"""Ranged reads into Arrow, stream entry times and the search over them, and links (entries
of closed ledgers that become rows of a stream without a copy), on real bookie processes."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

import embedlog
from embedlog import LedgerId
from embedlog.client.scan import pack_rows
from embedlog.errors import (CorruptedDataError, EmbedlogError, IllegalOpError, NoSuchEntryError, NoSuchLedgerError,
                             UnauthorizedAccessError)
from embedlog.harness import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, base_dir=str(tmp_path_factory.mktemp("reads")),
                      autorecovery=False) as lc:
        yield lc


@pytest.fixture
def client(cluster):
    c = cluster.client()
    yield c
    c.close()
    cluster.faults.clear()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def next_ms(after: int) -> int:
    """Wait for the clock to pass ``after`` (a condition, not a sleep)."""
    while now_ms() <= after:
        pass
    return now_ms()


@pytest.mark.parametrize("ensemble", [(3, 3, 2), (3, 2, 2)])
def test_read_arrow_is_read_batch(client, cluster, ensemble):
    h = client.create_ledger(*ensemble, password=b"pw")
    payloads = [b"%d-" % i * (i % 50) for i in range(3000)]
    h.append_many(payloads)
    h.close()
    r = client.open_ledger(h.ledger_id, b"pw")
    arr = r.read_arrow(0, 2999)
    assert isinstance(arr, pa.BinaryArray)
    assert arr.to_pylist() == payloads == r.read_batch(0, 2999)
    assert r.read_arrow(1000, 1000).to_pylist() == [payloads[1000]]
    # one replica refuses every read: the windows it had are read from the others
    victim = h.metadata.fragments[0][1][0]
    cluster.faults.fail("EIO", bookie=victim, op="read")
    assert r.read_arrow(0, 2999).to_pylist() == payloads
    cluster.faults.fail("EIO", op="read")                  # and then every replica
    with pytest.raises(EmbedlogError, match="status 101"):
        r.read_arrow(0, 10)
    cluster.faults.clear()
    with pytest.raises(NoSuchEntryError):
        r.read_arrow(0, 3000)                                  # past the LAC


def test_appends_carry_their_time_and_position_at_finds_it(client, name="timed"):
    s = client.open_stream(name)
    marks = []                                     # (time the batch was appended, its positions)
    t = now_ms()
    for k in range(6):
        t = next_ms(t)
        first = s.append_many([b"b%d-%d" % (k, i) for i in range(50)]) - 49
        marks.append((t, first))
        if k == 2:
            s.take_over()                          # a no-op stands between batches 2 and 3
    rows = list(s.read(0))
    times = [e.timestamp for e in rows]
    assert times == sorted(times) and None not in times
    assert marks[0][0] <= times[0] and times[-1] <= now_ms()
    arrow = s.read_arrow(0, s.last_position())
    assert arrow.links == []
    assert arrow.rows.column("data").to_pylist() == [e.data for e in rows]
    assert arrow.rows.column("position").to_pylist() == [e.position for e in rows]
    assert [v.value for v in arrow.rows.column("timestamp")] == times
    by_batch = {}
    for e in rows:
        by_batch.setdefault(int(e.data[1:e.data.index(b"-")]), []).append(e)
    for k, batch in by_batch.items():
        # the first position at or after the batch's time is where the batch (or the no-op
        # just before it, which holds no row) begins
        assert s.position_at(batch[0].timestamp) in (batch[0].position, batch[0].position - 1)
    assert s.position_at(0) == 0
    assert s.position_at(times[-1] + 1) == s.last_position() + 1
    s.close()


def test_links_are_rows_of_the_stream(client, name="linked"):
    h = client.create_ledger(3, 3, 2, password=b"pw", scope_id=0x535041524B000002)
    h.append_many([b"L%d" % i for i in range(2500)])
    h.close()
    s = client.open_stream(name, password=b"pw")
    assert not s.has_links
    s.append(b"before")
    last = s.append_links([(h.ledger_id, 100, 2000), (h.ledger_id, 0, 1)])
    s.append(b"after")
    rows = list(s.read(0))
    assert [e.data for e in rows] == [b"before"] + [b"L%d" % i for i in range(100, 2100)] + [b"L0", b"after"]
    link_rows = rows[1:2001]
    assert {e.position for e in link_rows} == {last - 1}
    assert [e.index for e in link_rows] == list(range(2000))
    assert rows[2001].position == last and rows[2001].index == 0
    batch = s.read_arrow(0, s.last_position())
    assert batch.rows.column("data").to_pylist() == [b"before", b"after"]
    assert [(lk.position, lk.ledger_id, lk.first, lk.count) for lk in batch.links] == [
        (last - 1, h.ledger_id, 100, 2000), (last, h.ledger_id, 0, 1)]
    assert batch.links[0].timestamp == link_rows[0].timestamp
    assert client.open_stream(name, create=False, password=b"pw").has_links
    # what cannot be linked
    other = client.create_ledger(3, 3, 2, password=b"other")
    other.append(b"x")
    other.close()
    with pytest.raises(UnauthorizedAccessError):
        s.append_links([(other.ledger_id, 0, 1)])
    still_open = client.create_ledger(3, 3, 2, password=b"pw")
    still_open.append(b"x")
    with pytest.raises(IllegalOpError, match="closed"):
        s.append_links([(still_open.ledger_id, 0, 1)])
    with pytest.raises(IllegalOpError, match="entries 0..2499"):
        s.append_links([(h.ledger_id, 2000, 501)])
    with pytest.raises(NoSuchLedgerError):
        s.append_links([(LedgerId(0x535041524B000002, 12345678), 0, 1)])
    # a linked ledger deleted under a reader: the read fails, naming the position
    client.delete_ledger(h.ledger_id)
    with pytest.raises(NoSuchLedgerError, match=f"linked at position {last - 1}"):
        list(s.read(0))
    still_open.close()
    s.close()


def test_packed_links(client, name="packed"):
    rows = [b"row-%d-" % i * (i % 300) for i in range(5000)]
    h = client.create_ledger(3, 3, 2, scope_id=0x535041524B000002)
    counts = []
    for payload, n in pack_rows(pa.array(rows, pa.binary()), max_bytes=64 * 1024):
        h.append(payload)
        counts.append(n)
    h.close()
    assert len(counts) > 20 and sum(counts) == 5000
    r = client.open_ledger(h.ledger_id)
    assert r.read_arrow(0, len(counts) - 1, packed=True).to_pylist() == rows
    s = client.open_stream(name)
    half = len(counts) // 2
    s.append_links([(h.ledger_id, 0, half, sum(counts[:half])),
                    (h.ledger_id, half, len(counts) - half, sum(counts[half:]))], packed=True)
    got = list(s.read(0))
    assert [e.data for e in got] == rows
    assert [e.index for e in got] == list(range(sum(counts[:half]))) + list(range(sum(counts[half:])))
    links = s.read_arrow(0, s.last_position()).links
    assert [(lk.packed, lk.rows) for lk in links] == [(True, sum(counts[:half])), (True, sum(counts[half:]))]
    # a link that names more rows than its entries pack is refused by readers
    s.append_links([(h.ledger_id, 0, 1, counts[0] + 1)], packed=True)
    with pytest.raises(CorruptedDataError, match="names"):
        list(s.read(0))
    s.close()


def test_embedded_stream_times_and_links(tmp_path):
    with embedlog.open(tmp_path) as log:
        h = log.create_ledger()
        h.append_many([b"a", b"b"])
        h.close()
        s = log.open_stream("local")
        s.append(b"x")
        s.append_links([(h.ledger_id, 0, 2)])
        rows = list(s.read(0))
        assert [e.data for e in rows] == [b"x", b"a", b"b"]
        assert all(e.timestamp for e in rows)
        assert s.position_at(rows[0].timestamp) == 0


def test_a_stream_taken_over_often_still_rolls_over(client, name="often"):
    """Rollover counts the entries the last fragment holds, not those of one leader: a
    stream that each writer takes over for a few appends (a commit log) still rolls over,
    so its retention can remove old fragments."""
    client.open_stream(name, rollover_entries=10, retention_entries=10).close()
    for k in range(12):
        s = client.open_stream(name, create=False)
        s.append_many([b"%d-a" % k, b"%d-b" % k])
        s.close()
    md = client.open_stream(name, create=False).metadata
    assert md.first_entry_id > 0 and len(md.fragments) <= 3
    rows = list(client.open_stream(name, create=False).read(md.first_entry_id))
    assert rows[-1].data == b"11-b"
