"""The embedlog server's FrameReader (net/framereader.py): read_frame gives what readexactly
gives (the same bytes, errors and flow control), with fewer copies, whatever the frames'
and the reads' sizes: a frame alone in the buffer, followed by a shorter or a longer rest,
spread over many reads, larger than the buffer's limit; EOF in a frame; an error set."""
from __future__ import annotations

import asyncio
import os

import pytest

from embedlog.net.framereader import FrameReader


class Transport:
    """Counts pause_reading/resume_reading, as a socket transport takes them."""

    def __init__(self):
        self.paused = False
        self.pauses = self.resumes = 0

    def pause_reading(self):
        assert not self.paused
        self.paused, self.pauses = True, self.pauses + 1

    def resume_reading(self):
        assert self.paused
        self.paused, self.resumes = False, self.resumes + 1


def _reader(limit=64):
    r = FrameReader(limit=limit, loop=asyncio.get_running_loop())
    t = Transport()
    r.set_transport(t)
    return r, t


@pytest.mark.parametrize("seed", range(6))
def test_frames_come_out_as_readexactly_gives_them_whatever_the_reads(seed):
    rnd = __import__("random").Random(seed)
    sizes = [rnd.choice([1, 3, 40, 64, 100, 129, 500, 2000]) for _ in range(200)]
    data = os.urandom(sum(sizes))

    async def main():
        r, t = _reader()

        async def feed():
            pos = 0
            while pos < len(data):
                k = rnd.choice([1, 7, 64, 128, 300, 5000])
                r.feed_data(data[pos:pos + k])
                pos += k
                if rnd.random() < 0.5:
                    await asyncio.sleep(0)
                while t.paused:             # a paused transport delivers nothing
                    await asyncio.sleep(0)
            r.feed_eof()

        feeder = asyncio.get_running_loop().create_task(feed())
        out, pos = [], 0
        for i, n in enumerate(sizes):
            got = await (r.read_frame(n) if i % 3 else r.readexactly(n))
            assert isinstance(got, bytearray if i % 3 else bytes)
            out.append(bytes(got))
            assert got == data[pos:pos + n]
            pos += n
        with pytest.raises(asyncio.IncompleteReadError) as e:
            await r.read_frame(5)
        assert e.value.partial == b""
        await feeder
        assert not t.paused and t.pauses == t.resumes
        return out

    assert b"".join(asyncio.run(main())) == data


def test_the_three_cases_of_what_follows_a_frame():
    async def main():
        r, _t = _reader(limit=1 << 20)
        r.feed_data(b"a" * 10)
        whole = r._buffer
        got = await r.read_frame(10)
        assert got is whole and got == b"a" * 10 and len(r._buffer) == 0    # handed over
        r.feed_data(b"b" * 10 + b"c" * 3)
        assert await r.read_frame(10) == b"b" * 10                    # the rest moved out
        assert await r.readexactly(3) == b"ccc"
        r.feed_data(b"d" * 3 + b"e" * 10)
        assert await r.read_frame(3) == b"ddd"                        # the frame copied out
        got = await r.read_frame(10)
        assert got == b"e" * 10
        got[0] = 0                          # the caller's own: the reader is untouched
        r.feed_data(b"f")
        assert await r.readexactly(1) == b"f"

    asyncio.run(main())


def test_eof_inside_a_frame_and_a_set_error_fail_as_readexactly_does():
    async def main():
        r, _t = _reader()
        r.feed_data(b"xyz")
        r.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError) as e:
            await r.read_frame(10)
        assert e.value.partial == b"xyz" and e.value.expected == 10
        r2, _t = _reader()
        waiting = asyncio.get_running_loop().create_task(r2.read_frame(10))
        await asyncio.sleep(0)
        r2.set_exception(ConnectionResetError("gone"))
        with pytest.raises(ConnectionResetError):
            await waiting
        with pytest.raises(ConnectionResetError):
            await r2.read_frame(1)

    asyncio.run(main())


def test_a_frame_larger_than_the_limit_resumes_a_paused_transport():
    async def main():
        r, t = _reader(limit=16)
        r.feed_data(b"x" * 40)             # over 2 * limit: paused
        assert t.paused
        task = asyncio.get_running_loop().create_task(r.read_frame(100))
        await asyncio.sleep(0)
        assert not t.paused                # waiting for more resumes it (no deadlock)
        r.feed_data(b"y" * 70)
        got = await task
        assert got == b"x" * 40 + b"y" * 60
        assert t.paused == (len(r._buffer) > 16)

    asyncio.run(main())


def test_a_frame_never_keeps_much_more_memory_than_its_bytes():
    """In flight, a frame counts its n bytes against the limits: what read_frame returns
    holds about that, never a buffer that grew large earlier."""
    async def main():
        r, _t = _reader(limit=1 << 24)
        r.feed_data(os.urandom(1 << 20))
        await r.readexactly((1 << 20) - 100)       # the buffer's allocation stays ~1 MiB
        for n in (100, 50, 30):
            if n != 100:
                r.feed_data(os.urandom(n))
            got = await r.read_frame(n)
            assert len(got) == n and got.__alloc__() <= 2 * n + 64
        r.feed_data(os.urandom(1 << 20))
        await r.readexactly((1 << 20) - 1000)
        r.feed_data(b"z" * 10)
        got = await r.read_frame(600)               # frame keeps the buffer; rest moves
        assert got.__alloc__() <= 2 * 600 + 64
        assert len(r._buffer) == 410

    asyncio.run(main())


def test_a_frame_still_arriving_is_gathered_without_pausing_and_copied_once():
    """The frame's reads are kept as they come (no buffer grown a read at a time, nothing of
    its declared length allocated before its bytes) and copied into the bytearray read_frame
    returns once it is whole; the transport is not paused for the frame's bytes, only for
    what follows it."""
    async def main():
        r, t = _reader(limit=16)
        data = os.urandom(10_000)
        r.feed_data(data[:5])                       # part of it was buffered before
        task = asyncio.get_running_loop().create_task(r.read_frame(10_000))
        await asyncio.sleep(0)
        assert r._parts is not None and len(r._buffer) == 0
        for pos in range(5, 9_990, 997):
            r.feed_data(data[pos:min(pos + 997, 9_990)])
            assert not t.paused                     # 10 KB in, limit 16: not paused
            await asyncio.sleep(0)
            assert not task.done()
        assert sum(len(p) for p in r._parts) == 9_990
        r.feed_data(data[9_990:] + b"next" * 10)    # the end, and 40 bytes of the next frame
        got = await task
        assert got == data and isinstance(got, bytearray) and r._parts is None
        assert t.paused and bytes(r._buffer) == b"next" * 10
        assert await r.read_frame(40) == b"next" * 10
        assert not t.paused and t.pauses == t.resumes == 1

    asyncio.run(main())


def test_a_frame_is_charged_as_it_arrives_and_held_until_there_is_room():
    """charge(k) sees each read's bytes of a frame (the buffered ones first); when it says
    no, the transport is paused and read_frame waits for room() before reading on."""
    async def main():
        r, t = _reader(limit=16)
        charged, room = [], asyncio.Event()
        budget = [25]

        def charge(k):
            charged.append(k)
            return sum(charged) < budget[0]

        async def wait_room():
            await room.wait()
        r.charge, r.room = charge, wait_room
        data = os.urandom(100)
        r.feed_data(data[:10])
        task = asyncio.get_running_loop().create_task(r.read_frame(100))
        await asyncio.sleep(0)
        assert charged == [10] and not t.paused
        r.feed_data(data[10:30])                   # 30 charged: no room, the reads stop
        assert charged == [10, 20] and t.paused
        await asyncio.sleep(0)
        assert not task.done() and t.paused
        budget[0] = 1000
        room.set()                                 # room again: read on
        await asyncio.sleep(0)
        assert not t.paused
        r.feed_data(data[30:] + b"tail")
        assert await task == data and charged == [10, 20, 70]
        assert bytes(r._buffer) == b"tail"

    asyncio.run(main())


def test_a_length_prefix_alone_allocates_nothing_of_the_frame():
    async def main():
        r, _t = _reader(limit=16)
        r.charge = lambda k: True
        task = asyncio.get_running_loop().create_task(r.read_frame(1 << 30))   # 1 GiB declared
        await asyncio.sleep(0)
        assert r._parts == [] and r._want == 1 << 30
        r.feed_data(b"x" * 10)
        r.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError) as e:
            await task
        assert e.value.partial == b"x" * 10

    asyncio.run(main())


def test_eof_or_an_error_while_a_frame_is_being_filled():
    async def main():
        r, _t = _reader()
        task = asyncio.get_running_loop().create_task(r.read_frame(100))
        await asyncio.sleep(0)
        r.feed_data(b"x" * 30)
        r.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError) as e:
            await task
        assert e.value.partial == b"x" * 30 and e.value.expected == 100
        r2, _t = _reader()
        task = asyncio.get_running_loop().create_task(r2.read_frame(100))
        await asyncio.sleep(0)
        r2.feed_data(b"y" * 30)
        r2.set_exception(ConnectionResetError("gone"))
        with pytest.raises(ConnectionResetError):
            await task
        assert r2._parts is None

    asyncio.run(main())


def test_a_frame_buffer_is_its_size_and_refuses_a_negative_one():
    """read_frame's bytearray is not zero-filled (frames.frame_buffer): what a read has not
    filled is never handed over (the EOF case above gives only the bytes received)."""
    from embedlog._native.frames import frame_buffer
    assert len(frame_buffer(0)) == 0 and len(frame_buffer(1 << 20)) == 1 << 20
    with pytest.raises(ValueError):
        frame_buffer(-1)


def test_a_spare_frame_is_handed_out_again_only_once_nobody_holds_it():
    """frame_buffer keeps the large frames it handed out (their pages already faulted in)
    and hands one out again only when no frame, memoryview or entry view holds it."""
    from embedlog._native.frames import frame_buffer, split_add_body
    n = 3 << 20                        # no spare of another test's size takes it
    first = frame_buffer(n)
    first[:] = b"a" * n
    kept = id(first)
    view = memoryview(first)[100:200]
    del first
    second = frame_buffer(n)
    assert id(second) != kept and view.obj is not second
    second[:] = b"b" * n
    assert view == b"a" * 100          # the held frame was not written over
    view.release()
    del view
    third = frame_buffer(n - 1000)     # nobody holds the first one now: it comes back
    assert id(third) == kept and len(third) == n - 1000 and third[1000:2000] == b"a" * 1000
    # an entry view of split_add_body holds its frame as well
    body = (1).to_bytes(4, "big") + (70_000).to_bytes(4, "big") + b"x" * 70_000
    frame = frame_buffer(len(body))
    frame[:] = body
    entries = split_add_body(memoryview(frame))
    held = id(frame)
    del frame
    assert all(id(frame_buffer(len(body))) != held for _ in range(8))
    assert bytes(entries[0]) == b"x" * 70_000
    assert len(frame_buffer(0)) == 0 and len(frame_buffer(9 << 20)) == 9 << 20


def test_large_frames_read_while_earlier_ones_are_held_keep_their_bytes():
    """Frames of 64 KiB and more come from frame_buffer's spares: one a server still holds
    (its request in the journal's queue) is never filled with a later frame's bytes."""
    sizes = [70_000, 300_000, 1 << 20, 200_000, 70_000, 500_000] * 3
    datas = [os.urandom(n) for n in sizes]

    async def main():
        r, _t = _reader(limit=1 << 16)
        held = []
        for i, (n, data) in enumerate(zip(sizes, datas)):
            task = asyncio.get_running_loop().create_task(r.read_frame(n))
            await asyncio.sleep(0)
            for k in range(0, n, 60_000):            # spread over reads: _fill_frame
                r.feed_data(data[k:k + 60_000])
            got = await task
            assert got == data
            if i % 2:
                held.append((memoryview(got)[n // 2:], data[n // 2:]))
            del got
        for view, data in held:
            assert view == data

    asyncio.run(main())
