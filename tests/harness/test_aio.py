"""Issue 17: the asyncio API (embedlog.aio) on the embedded log and on a real cluster, awaited
from the test's own event loop, which must stay free while the client works."""
from __future__ import annotations

import asyncio

import pytest

import embedlog
import embedlog.aio
from embedlog.errors import ClientClosedError, NoSuchEntryError
from embedlog.harness import LocalCluster


async def ticking():
    """Counts the loop's turns: a loop that is never blocked turns every few ms."""
    turns = [0]

    async def tick():
        while True:
            turns[0] += 1
            await asyncio.sleep(0.005)
    return turns, asyncio.ensure_future(tick())


async def loop_turns(turns, n=3):
    """Waits until the loop has turned n more times: with a tail pending beside it, this
    proves the tail waits without holding the loop (a blocked loop never gets here)."""
    start = turns[0]
    while turns[0] < start + n:
        await asyncio.sleep(0.001)


def test_embedded(tmp_path):
    async def main():
        turns, ticker = await ticking()
        async with embedlog.aio.open(tmp_path / "log") as log:
            async with await log.create_ledger() as w:
                ids = [await w.append(b"first")]
                ids.append(await w.append_many([b"a", b"b", b"c"]))
                results = await asyncio.gather(*(w.append(b"x%d" % i) for i in range(50)))
                assert ids == [0, 3] and sorted(results) == list(range(4, 54))
            r = await log.open_ledger(w.ledger_id)
            assert await r.read_entry(0) == b"first"
            assert await r.read_batch(1, 3) == [b"a", b"b", b"c"]
            assert [e.entry_id async for e in r.read(0, 53)] == list(range(54))
            with pytest.raises(NoSuchEntryError):
                await r.read_entry(54)
            # a tail of a closed ledger ends at its last entry
            assert [e.entry_id async for e in r.tail(50)] == [50, 51, 52, 53]
            # a tail follows a live writer
            w2 = await log.create_ledger()
            got = []

            async def follow():
                r2 = await log.open_ledger(w2.ledger_id, recovery=False)
                async for e in r2.tail(0):
                    got.append(e.data)
            follower = asyncio.ensure_future(follow())
            await asyncio.wait_for(loop_turns(turns), 30)
            for i in range(5):
                await w2.append(b"live %d" % i)
            await w2.close()
            await asyncio.wait_for(follower, 30)
            assert got == [b"live %d" % i for i in range(5)]
            # streams
            async with await log.open_stream("events") as s:
                first = await s.append(b"e1")
                assert await s.append_many([b"e2", b"e3"]) == first + 2
            s = await log.open_stream("events")
            assert [e.data async for e in s.read(0)] == [b"e1", b"e2", b"e3"]
            assert await log.list_streams() == ["events"]
            assert w.ledger_id in await log.list_ledgers()
            assert "AsyncEmbeddedLog" in repr(log)
        ticker.cancel()
        return turns[0]
    assert asyncio.run(main()) >= 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, base_dir=str(tmp_path_factory.mktemp("aio")), autorecovery=False) as c:
        yield c


def test_cluster(cluster):
    async def main():
        turns, ticker = await ticking()
        async with embedlog.aio.Client(cluster.metadata_uri) as client:
            w = await client.create_ledger(3, 2, 2)
            last = await w.append_many([b"m%d" % i for i in range(100)])
            assert last == 99 and await w.append(b"one more") == 100
            # a tail running beside the writer, on the same loop
            r = await client.open_ledger(w.ledger_id, recovery=False)
            got = []

            async def follow():
                async for e in r.tail(95):
                    got.append(e.entry_id)
            follower = asyncio.ensure_future(follow())
            await asyncio.wait_for(loop_turns(turns), 30)
            for i in range(3):
                await w.append(b"after %d" % i)
            await w.close()
            await asyncio.wait_for(follower, 30)
            assert got == list(range(95, 104))
            r = await client.open_ledger(w.ledger_id)
            assert await r.read_entry(100) == b"one more"
            assert len(await r.read_batch(0, 103)) == 104
            assert [e.entry_id async for e in r.read(0, 9)] == list(range(10))
            md = await client.ledger_metadata(w.ledger_id)
            assert md.last_entry_id == 103
            infos = await client.bookie_info()
            assert len(infos) == 3 and all(i and i["free_bytes"] > 0 for i in infos.values())
            s = await client.open_stream("orders")
            p = await s.append(b"order 1")
            tail = s.tail(p)
            assert (await tail.__anext__()).data == b"order 1"
            await tail.aclose()
            await s.close()
            await client.delete_ledger(w.ledger_id)
            assert w.ledger_id not in await client.list_ledgers()
        with pytest.raises(ClientClosedError):
            await client.open_ledger(0)
        ticker.cancel()
        return turns[0]
    assert asyncio.run(main()) >= 3


def test_reprs_context_managers_and_the_embedded_tail(tmp_path, cluster):
    """Issue 17: every handle is a context manager, every tail an iterator, and a repr says
    what an object is."""
    with embedlog.open(tmp_path / "log") as log:
        assert repr(log) == f"EmbeddedLog({str(tmp_path / 'log')!r})"
        assert repr(log.bookie).startswith("Bookie('bookie-") and "writable" in repr(log.bookie)
        with log.create_ledger() as w:
            w.append_many([b"a", b"b", b"c"])
            assert "open" in repr(w) and repr(w.ledger_id) in repr(w)
        assert "closed" in repr(w) and "last_add_confirmed=2" in repr(w)
        with log.open_ledger(w.ledger_id) as r:
            assert "CLOSED" in repr(r)
            assert [e.data for e in r.tail(1)] == [b"b", b"c"]          # ends: closed and read
    assert "closed" in repr(log)
    with cluster.client() as c:
        assert repr(c).startswith("Client('sqlite://")
        with c.create_ledger(3, 2, 2) as w:
            w.append(b"x")
            assert "E/Qw/Qa 3/2/2" in repr(w)
        with c.open_ledger(w.ledger_id) as r:
            assert "CLOSED" in repr(r) and [e.data for e in r.tail(0)] == [b"x"]
        with c.open_stream("repr") as s:
            s.append(b"y")
            assert repr(s) == "Stream('repr', term 1, leader)"
        assert "reader" in repr(s)
    assert "3 bookies, 3 running" in repr(cluster)
