"""BookieServer._sync_due: the adds a loop step reads, from any number of connections, wait
for one fdatasync together; with the journal idle it runs on the loop (a lone add crosses no
thread), and with a group in flight the journal's thread syncs and answers them."""
from __future__ import annotations

import asyncio
import threading

import pytest

from embedlog import fileio
from embedlog._native import format as F
from embedlog.bookie.bookie import Bookie
from embedlog.config import BookieConfig
from embedlog.net import protocol as P
from embedlog.net.framereader import FrameReader
from embedlog.net.server import READ_BUFFER_BYTES, BookieServer

KEY = F.master_key(b"sync-due")


pytestmark = pytest.mark.usefixtures("any_disk_is_quick")      # (conftest.py)


class Writer:
    class _Transport:
        def get_write_buffer_size(self):
            return 0

    def __init__(self):
        self.out = bytearray()
        self.transport = self._Transport()

    def get_extra_info(self, name, default=None):
        return ("198.51.100.7", 40000) if name == "peername" else default

    def write(self, data):
        self.out += data

    def writelines(self, parts):
        for part in parts:
            self.out += part

    def is_closing(self):
        return False

    def close(self):
        pass

    async def wait_closed(self):
        pass

    async def drain(self):
        pass


def _answers(out: bytes) -> list:
    got, pos = [], 0
    while pos < len(out):
        (n,) = P.LENGTH.unpack_from(out, pos)
        got.append(P.parse_response(out[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return got


def _add(lid: int, eid: int) -> bytes:
    e = F.encode_entry(0, lid, eid, eid - 1, 10 * (eid + 1), "crc32c", b"entry %d" % eid)
    return P.add_request(eid + 1, 0, lid, KEY, [e])


def _serve_all(server, loop, streams: list[bytes]) -> list[Writer]:
    """One connection per stream, all read in the same loop step, each to its end."""
    async def main():
        writers, tasks = [], []
        for stream in streams:
            reader = FrameReader(limit=READ_BUFFER_BYTES, loop=loop)
            reader.feed_data(stream)
            reader.feed_eof()
            w = Writer()
            writers.append(w)
            tasks.append(loop.create_task(server._serve(reader, w)))
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return writers
    return loop.run_until_complete(main())


def _connection(server, loop):
    """A connection ``server`` serves: its reader, its Writer, the future of its first answer
    (awaiting it keeps a test out of the loop's ready queue) and its task."""
    reader = FrameReader(limit=READ_BUFFER_BYTES, loop=loop)
    w = Writer()
    answered = loop.create_future()
    w.write = lambda data: (w.out.extend(data), answered.done() or answered.set_result(None))
    return reader, w, answered, loop.create_task(server._serve(reader, w))


def _server(tmp_path):
    bookie = Bookie(str(tmp_path), BookieConfig(journal_pre_alloc_size_mb=1))
    loop = asyncio.new_event_loop()
    server = BookieServer(bookie, loop=loop)
    server._room_freed = asyncio.Event()
    return bookie, loop, server


def test_adds_of_one_loop_step_share_one_sync_on_the_loop(tmp_path, monkeypatch):
    bookie, loop, server = _server(tmp_path)
    synced_by = []
    real_sync = fileio.sync
    monkeypatch.setattr(fileio, "sync", lambda *a, **k: (synced_by.append(threading.get_ident()),
                                                         real_sync(*a, **k))[1])
    try:
        _serve_all(server, loop, [_add(7, 0)])                # the journal's first group
        groups = bookie.journal.stats["groups"]
        synced_by.clear()
        # eight connections, and one connection with eight adds in a row
        writers = _serve_all(server, loop, [_add(100 + i, 0) for i in range(8)]
                             + [b"".join(_add(200, eid) for eid in range(8))])
        got = [_answers(w.out) for w in writers]
        assert all(len(a) == 1 and a[0].status == P.EOK for a in got[:8])
        assert [a.status for a in got[8]] == [P.EOK] * 8
        assert bookie.journal.stats["groups"] == groups + 1
        assert synced_by == [threading.get_ident()]          # the loop's thread, once
    finally:
        loop.close()
        bookie.close()


def test_with_a_group_in_flight_the_journal_thread_answers(tmp_path):
    bookie, loop, server = _server(tmp_path)
    try:
        _serve_all(server, loop, [_add(7, 0)])
        with bookie.cv:
            bookie.journal._syncing = True                   # as if the thread were writing

        def finish_the_group():
            with bookie.cv:
                bookie.journal._syncing = False
                bookie.journal.cv.notify_all()
                bookie.journal._writer_cv.notify_all()
        writers = _serve_all(server, loop, [_add(300 + i, 0) for i in range(4)])
        assert not any(w.out for w in writers)               # left to the journal's thread
        finish_the_group()

        async def answered():
            while not all(w.out for w in writers):
                await asyncio.sleep(0.001)
        loop.run_until_complete(asyncio.wait_for(answered(), 10))
        assert [_answers(w.out)[0].status for w in writers] == [P.EOK] * 4
        assert bookie.journal.synced_seq >= bookie.journal.appended_seq
    finally:
        bookie.journal._syncing = False                      # (a failed assertion's close)
        loop.close()
        bookie.close()


def test_a_lone_add_is_synced_before_its_connection_waits_again(tmp_path):
    """sync_before_read: the add of a connection that then waits for its socket, with
    nothing else left in the loop step, is synced and answered before the loop polls again;
    the call_soon that would have done it a step later is cancelled."""
    bookie, loop, server = _server(tmp_path)
    try:
        _serve_all(server, loop, [_add(7, 0)])                # the journal's first group
        groups = bookie.journal.stats["groups"]

        async def main():
            reader, w, answered, task = _connection(server, loop)
            await asyncio.sleep(0)                            # it waits for its first frame
            reader.feed_data(_add(400, 0))
            await asyncio.wait_for(answered, 30)   # (outside the loop's ready queue meanwhile)
            answered_in_step = bytes(w.out)
            handle = server._due_handle
            reader.feed_eof()
            await asyncio.wait_for(task, 10)
            return answered_in_step, handle
        out, handle = loop.run_until_complete(main())
        assert [a.status for a in _answers(out)] == [P.EOK]
        assert handle is not None and handle.cancelled()
        assert bookie.journal.stats["groups"] == groups + 1
    finally:
        loop.close()
        bookie.close()


def test_a_failing_answer_does_not_end_the_connection_that_synced_it(tmp_path, monkeypatch, caplog):
    """sync_before_read runs the answers of the step's adds inside one connection's task; an
    answer that raises is logged, as the loop would have logged it, and that connection
    still serves its next frame."""
    bookie, loop, server = _server(tmp_path)
    try:
        _serve_all(server, loop, [_add(7, 0)])
        real = server._durable_reply
        failed = loop.create_future()

        def first_fails(writer, data, after):
            if not failed.done():
                failed.set_result(data)
                raise RuntimeError("an answer's callback failed")
            real(writer, data, after)
        monkeypatch.setattr(server, "_durable_reply", first_fails)

        async def main():
            reader, w, answered, task = _connection(server, loop)
            await asyncio.sleep(0)
            reader.feed_data(_add(500, 0))             # its answer fails
            await asyncio.wait_for(failed, 30)   # (outside the loop's ready queue meanwhile)
            reader.feed_data(_add(500, 1))             # the connection still serves
            await asyncio.wait_for(answered, 30)
            reader.feed_eof()
            await asyncio.wait_for(task, 10)
            return bytes(w.out)
        with caplog.at_level("ERROR", logger="embedlog.server"):
            out = loop.run_until_complete(main())
        assert [(a.status, a.request_id) for a in _answers(out)] == [(P.EOK, 2)]   # entry 1's
        assert "answering a loop step's adds failed" in caplog.text
    finally:
        loop.close()
        bookie.close()
