"""BookieServer._take_frames: the whole frames of a read that comes while a connection waits
between frames are answered in the transport's callback (FrameReader.feed_data), with no
loop step for the connection's task; every frame it cannot take (one not whole, outside the
limits, without room in flight, malformed, before AUTH) goes to the task, in order, and is
handled as before."""
from __future__ import annotations

import asyncio

import pytest

from embedlog.net import protocol as P
from support.serving import add_frame, answers, bookie_server, connection

pytestmark = pytest.mark.usefixtures("any_disk_is_quick")      # (conftest.py)


def _run(tmp_path, test, **server_args):
    """``await test(server, reader, writer, task)`` on a connection whose first frame (an
    add of ledger 600, the journal's first group) has been answered."""
    bookie, loop, server = bookie_server(tmp_path, **server_args)

    async def main():
        reader, w, answered, task = connection(server, loop)
        await asyncio.sleep(0)
        reader.feed_data(add_frame(600, 0))
        await asyncio.wait_for(answered, 30)
        await test(server, reader, w, task)
        if not task.done():
            reader.feed_eof()
        await asyncio.wait_for(task, 10)
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        bookie.close()


async def _until(predicate, timeout=30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.001)


def test_a_lone_frame_is_answered_before_feed_data_returns(tmp_path):
    async def test(server, reader, w, task):
        reader.feed_data(add_frame(600, 1))
        # taken, added, synced on the loop and answered, all inside the read's callback
        assert [(a.status, a.request_id) for a in answers(w.out)] == [(P.EOK, 1), (P.EOK, 2)]
        assert not reader.has_data()
    _run(tmp_path, test)


def test_whole_frames_are_taken_and_the_rest_of_the_read_is_the_tasks(tmp_path):
    async def test(server, reader, w, task):
        last = add_frame(600, 3)
        read = bytearray(add_frame(600, 1) + add_frame(600, 2) + last[:30])
        reader.feed_data(read)
        assert server.stats["requests"] == 3          # the first frame and two taken
        assert reader.has_data()                      # the third's start, for the task
        read.clear()      # BufferError if a frame in flight still viewed the read it came in
        reader.feed_data(last[30:])
        await _until(lambda: len(answers(w.out)) == 4)
        assert [(a.status, a.request_id) for a in answers(w.out)] == [(P.EOK, i) for i in range(1, 5)]
        assert server.in_flight_requests == 0 and server.in_flight_bytes == 0
    _run(tmp_path, test)


@pytest.mark.parametrize("bad", ["malformed", "too large", "too small"])
def test_a_bad_frame_after_taken_ones_gets_its_error_from_the_task(tmp_path, bad):
    def frame():
        good = add_frame(600, 2)
        if bad == "malformed":                         # an unknown protocol version
            return good[:4] + b"\x09" + good[5:]
        if bad == "too large":
            return P.LENGTH.pack(P.DEFAULT_MAX_FRAME_BYTES + 1) + good[4:]
        return P.LENGTH.pack(P.REQ_HEAD.size - 1) + good[4:4 + P.REQ_HEAD.size - 1]

    async def test(server, reader, w, task):
        reader.feed_data(add_frame(600, 1) + frame() + add_frame(600, 3))
        await asyncio.wait_for(task, 30)                 # the bad frame ends the connection
        got = sorted((a.request_id, a.status) for a in answers(w.out))
        assert got == [(0, P.EBADREQ), (1, P.EOK), (2, P.EOK)]    # entry 3 never read
        assert server.stats["bad_frames"] == 1
    _run(tmp_path, test)


def test_a_frame_without_room_in_flight_waits_for_it_in_the_task(tmp_path):
    async def test(server, reader, w, task):
        server.max_requests_per_conn = 1
        reader.feed_data(add_frame(600, 1) + add_frame(600, 2))
        assert server.stats["requests"] == 2 and reader.has_data()   # the second waits
        await _until(lambda: len(answers(w.out)) == 3)
        assert [(a.status, a.request_id) for a in answers(w.out)] == [(P.EOK, i) for i in range(1, 4)]
        assert server.stats["rejected_requests"] == 0
    _run(tmp_path, test)


def test_a_full_write_buffer_leaves_the_frame_to_the_task_which_drains(tmp_path):
    async def test(server, reader, w, task):
        drained = []

        async def drain():
            drained.append(True)
        w.drain = drain
        w.transport.get_write_buffer_size = lambda: server.max_frame_bytes + 1
        reader.feed_data(add_frame(600, 1))
        assert reader.has_data()                      # not taken
        await _until(lambda: drained)
        await _until(lambda: len(answers(w.out)) == 2)
        assert [a.status for a in answers(w.out)] == [P.EOK, P.EOK]
    _run(tmp_path, test)


def test_before_auth_no_frame_is_taken(tmp_path):
    bookie, loop, server = bookie_server(tmp_path, auth_token=b"token")

    async def main():
        reader, w, answered, task = connection(server, loop)
        await asyncio.sleep(0)
        reader.feed_data(add_frame(600, 0))           # refused: not authenticated
        await asyncio.wait_for(answered, 30)
        await _until(lambda: reader._waiter is not None)
        assert reader.take_frames is None
        # a frame past the pre-AUTH limit, in one read: the task refuses it, with its reason
        big = P.LENGTH.pack(5000) + add_frame(600, 1)[4:] + bytes(5000)
        reader.feed_data(P.LENGTH.pack(5000) + big[4:5004])
        await asyncio.wait_for(task, 30)
        got = answers(w.out)
        assert [a.status for a in got] == [P.EUA, P.EBADREQ]
        assert "before AUTH" in bytes(got[1].body).decode()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        bookie.close()


@pytest.mark.parametrize("seed", range(40))
def test_any_split_of_a_stream_and_any_limits_answer_every_add_once(tmp_path, seed):
    """A connection's stream of adds cut into reads at random (a byte, a header, frames and
    pieces of frames), fed with random loop steps between, under random in-flight limits:
    each add is answered once with EOK, and nothing stays counted in flight. (Answers may
    come out of order: a group the journal's thread syncs answers through its completions,
    after a later group synced on the loop.)"""
    rnd = __import__("random").Random(seed)
    count = rnd.randint(1, 60)
    stream = b"".join(add_frame(600, eid) for eid in range(1, count + 1))

    async def test(server, reader, w, task):
        server.max_requests_per_conn = rnd.choice([1, 2, 3, 1000])
        server.max_requests = rnd.choice([1, 2, 1000])
        server.max_bytes = rnd.choice([200, 5000, 1 << 30])
        pos = 0
        while pos < len(stream):
            k = rnd.choice([1, 3, 4, 5, 60, 100, 150, 300, 1000, 5000])
            reader.feed_data(stream[pos:pos + k])
            pos += k
            for _ in range(rnd.choice([0, 0, 1, 2, 5])):
                await asyncio.sleep(0)
        await _until(lambda: len(answers(w.out)) == count + 1)
        got = sorted((a.request_id, a.status) for a in answers(w.out))
        assert got == [(rid, P.EOK) for rid in range(1, count + 2)]
        assert server.in_flight_requests == server.in_flight_bytes == server.reading_bytes == 0
    _run(tmp_path, test)
