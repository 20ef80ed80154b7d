"""The client connection's framing (net/transport.py): responses are cut out of the bytes as
they arrive, in the read callback, whatever the reads' sizes: several answers in one read,
one answer over many reads, answers out of order; a bad frame fails what is in flight and
the next call reconnects; a call nobody answers times out and leaves nothing pending."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from embedlog.errors import CorruptedDataError, LedgerFencedError, TimeoutError
from embedlog.net import protocol as P
from embedlog.net.transport import BookieConnection, BookieUnavailableError


def _answer(req, body: bytes = b"") -> bytes:
    return P.response(req.op, req.flags, req.request_id, P.EOK, req.scope, req.ledger,
                      body or P.ADD_RESP.pack(req.ledger, 1))


class FakeBookie:
    """Reads request frames; ``answer(reqs, writer)`` decides what goes back, and when."""

    def __init__(self, answer):
        self.answer = answer
        self.connections = 0
        self.server = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        try:
            while True:
                (n,) = P.LENGTH.unpack(await reader.readexactly(4))
                await self.answer(P.parse_request(await reader.readexactly(n)), writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


@contextlib.asynccontextmanager
async def _connected(answer, **options):
    """A FakeBookie answering with ``answer`` and a BookieConnection to it, both closed after."""
    bookie = FakeBookie(answer)
    conn = BookieConnection(await bookie.start(), **options)
    try:
        yield bookie, conn
    finally:
        conn.close()
        await bookie.stop()


def _add(ledger: int):
    return lambda rid: P.add_request(rid, 0, ledger, b"k" * 20, [b"entry"], 0, 0)


def test_answers_in_one_read_over_many_reads_and_out_of_order():
    async def main():
        held = []

        async def answer(req, writer):
            held.append(req)
            if len(held) == 3:
                # the third answer first, a byte at a time; then the other two in one write
                for b in _answer(held[2]):
                    writer.write(bytes([b]))
                    await writer.drain()
                    await asyncio.sleep(0)
                writer.write(_answer(held[0]) + _answer(held[1]))

        async with _connected(answer) as (bookie, conn):
            got = await asyncio.gather(*(conn.call(_add(lid), 5) for lid in (7, 8, 9)))
            assert [r.ledger for r in got] == [7, 8, 9]
            assert [P.ADD_RESP.unpack(bytes(r.body))[0] for r in got] == [7, 8, 9]
            assert bookie.connections == 1

    asyncio.run(main())


def test_a_bad_frame_fails_what_is_in_flight_and_the_next_call_reconnects():
    async def main():
        async def answer(req, writer):
            if req.ledger == 1:
                writer.write(P.LENGTH.pack(3) + b"bad")       # shorter than any response
            else:
                writer.write(_answer(req))

        async with _connected(answer) as (bookie, conn):
            with pytest.raises(CorruptedDataError, match="bad response"):
                await conn.call(_add(1), 5)
            resp = await conn.call(_add(2), 5)
            assert resp.ledger == 2 and bookie.connections == 2

    asyncio.run(main())


def test_a_frame_over_the_limit_fails_the_call():
    async def main():
        async def answer(req, writer):
            writer.write(P.response(req.op, req.flags, req.request_id, P.EOK, req.scope,
                                    req.ledger, bytes(4096)))

        async with _connected(answer, max_frame_bytes=1024) as (bookie, conn):
            with pytest.raises(CorruptedDataError, match="exceeds max_frame_bytes"):
                await conn.call(_add(1), 5)

    asyncio.run(main())


def test_an_unanswered_call_times_out_and_leaves_nothing_pending():
    async def main():
        async def answer(req, writer):
            if req.ledger != 1:                              # ledger 1 is never answered
                writer.write(_answer(req))

        async with _connected(answer) as (bookie, conn):
            with pytest.raises(TimeoutError, match="did not answer"):
                await conn.call(_add(1), 0.2)
            assert not conn._wire.pending
            # the connection goes on: a later answer still finds its caller
            assert (await conn.call(_add(2), 5)).ledger == 2
            assert bookie.connections == 1

    asyncio.run(main())


# -- send(): the add path's call without a task (its outcome handed to a callback) -----------

def _outcomes():
    got = []
    return got, lambda resp, error: got.append((resp, error))


async def _until(cond, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


def test_send_needs_an_open_connection_and_hands_answers_to_the_callback():
    async def main():
        async def answer(req, writer):
            if req.ledger == 3:
                writer.write(P.error_response(req.op, req.flags, req.request_id, P.EFENCED,
                                              req.scope, req.ledger, "fenced"))
            else:
                writer.write(_answer(req))

        async with _connected(answer) as (bookie, conn):
            got, on_answer = _outcomes()
            assert conn.send(_add(1), 5, on_answer) is False      # not connected: nothing sent
            await conn.call(_add(1), 5)                            # connects
            assert conn.send(_add(2), 5, on_answer) and conn.send(_add(3), 5, on_answer)
            await _until(lambda: len(got) == 2)
            (ok, none), (nothing, fenced) = got
            assert ok.ledger == 2 and none is None and nothing is None
            assert isinstance(fenced, LedgerFencedError)         # call()'s error, not a status
            assert not conn._wire.pending and bookie.connections == 1

    asyncio.run(main())


def test_send_times_out_fails_on_a_lost_connection_and_survives_a_failing_callback():
    async def main():
        async def answer(req, writer):
            if req.ledger == 1:
                return                                  # never answered
            if req.ledger == 2:
                writer.close()                          # the connection is lost
                return
            writer.write(_answer(req))

        async with _connected(answer) as (bookie, conn):
            await conn.call(_add(9), 5)
            got, on_answer = _outcomes()
            assert conn.send(_add(1), 0.2, on_answer)
            await _until(lambda: got)
            assert isinstance(got[0][1], TimeoutError) and "did not answer in 0.2 s" in str(got[0][1])
            assert not conn._wire.pending

            # a callback that raises is logged; the answers after it in the same read still arrive
            def boom(resp, error):
                raise RuntimeError("a bug in the caller")
            got.clear()
            assert conn.send(_add(4), 5, boom) and conn.send(_add(5), 5, on_answer)
            await _until(lambda: got)
            assert got[0][0].ledger == 5

            got.clear()
            assert conn.send(_add(2), 5, on_answer)
            await _until(lambda: got)
            assert isinstance(got[0][1], BookieUnavailableError)
            assert conn.send(_add(6), 5, on_answer) is False        # call() reconnects
            assert (await conn.call(_add(6), 5)).ledger == 6 and bookie.connections == 2

    asyncio.run(main())
