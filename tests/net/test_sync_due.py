"""RequestProcessor._sync_due: the adds a loop step reads, from any number of connections, wait
for one fdatasync together; with the journal idle it runs on the loop (a lone add crosses no
thread), and with a group in flight the journal's thread syncs and answers them."""
from __future__ import annotations

import asyncio
import threading

import pytest

from embedlog import fileio
from embedlog.net import protocol as P
from support.serving import add_frame, answers, bookie_server, connection, serve_all

pytestmark = pytest.mark.usefixtures("any_disk_is_quick")      # (conftest.py)


def test_adds_of_one_loop_step_share_one_sync_on_the_loop(tmp_path, monkeypatch):
    bookie, loop, server = bookie_server(tmp_path)
    synced_by = []
    real_sync, real_synced = fileio.sync, fileio.write_direct_synced

    def sync(fd, path, length, **kw):
        if length is not None:        # not the preallocator's zeros (its thread, any time)
            synced_by.append(threading.get_ident())
        return real_sync(fd, path, length, **kw)

    def write_synced(*a):             # a group's write and sync in one request
        synced_by.append(threading.get_ident())
        return real_synced(*a)
    monkeypatch.setattr(fileio, "sync", sync)
    monkeypatch.setattr(fileio, "write_direct_synced", write_synced)
    try:
        serve_all(server, loop, [add_frame(7, 0)])                # the journal's first group
        groups = bookie.journal.stats["groups"]
        synced_by.clear()
        # eight connections, and one connection with eight adds in a row
        writers = serve_all(server, loop, [add_frame(100 + i, 0) for i in range(8)]
                             + [b"".join(add_frame(200, eid) for eid in range(8))])
        got = [answers(w.out) for w in writers]
        assert all(len(a) == 1 and a[0].status == P.EOK for a in got[:8])
        assert [a.status for a in got[8]] == [P.EOK] * 8
        assert bookie.journal.stats["groups"] == groups + 1
        assert synced_by == [threading.get_ident()]          # the loop's thread, once
    finally:
        loop.close()
        bookie.close()


def test_with_a_group_in_flight_the_journal_threadanswers(tmp_path):
    bookie, loop, server = bookie_server(tmp_path)
    try:
        serve_all(server, loop, [add_frame(7, 0)])
        with bookie.cv:
            bookie.journal._syncing = True                   # as if the thread were writing

        def finish_the_group():
            with bookie.cv:
                bookie.journal._syncing = False
                bookie.journal.cv.notify_all()
                bookie.journal._writer_cv.notify_all()
        writers = serve_all(server, loop, [add_frame(300 + i, 0) for i in range(4)])
        assert not any(w.out for w in writers)               # left to the journal's thread
        finish_the_group()

        async def answered():
            while not all(w.out for w in writers):
                await asyncio.sleep(0.001)
        loop.run_until_complete(asyncio.wait_for(answered(), 10))
        assert [answers(w.out)[0].status for w in writers] == [P.EOK] * 4
        assert bookie.journal.synced_seq >= bookie.journal.appended_seq
    finally:
        bookie.journal._syncing = False                      # (a failed assertion's close)
        loop.close()
        bookie.close()


def test_a_lone_add_is_synced_before_its_connection_waits_again(tmp_path):
    """sync_before_read: the add of a connection that then waits for its socket, with
    nothing else left in the loop step, is synced and answered before the loop polls again;
    the call_soon that would have done it a step later is cancelled."""
    bookie, loop, server = bookie_server(tmp_path)
    try:
        serve_all(server, loop, [add_frame(7, 0)])                # the journal's first group
        groups = bookie.journal.stats["groups"]

        async def main():
            reader, w, answered, task = connection(server, loop)
            await asyncio.sleep(0)                            # it waits for its first frame
            reader.feed_data(add_frame(400, 0))
            await asyncio.wait_for(answered, 30)   # (outside the loop's ready queue meanwhile)
            answered_in_step = bytes(w.out)
            handle = server.processor.due_handle
            reader.feed_eof()
            await asyncio.wait_for(task, 10)
            return answered_in_step, handle
        out, handle = loop.run_until_complete(main())
        assert [a.status for a in answers(out)] == [P.EOK]
        assert handle is not None and handle.cancelled()
        assert bookie.journal.stats["groups"] == groups + 1
    finally:
        loop.close()
        bookie.close()


def test_a_failing_answer_does_not_end_the_connection_that_synced_it(tmp_path, monkeypatch, caplog):
    """sync_before_read runs the answers of the step's adds inside one connection's task; an
    answer that raises is logged, as the loop would have logged it, and that connection
    still serves its next frame."""
    bookie, loop, server = bookie_server(tmp_path)
    try:
        serve_all(server, loop, [add_frame(7, 0)])
        real = server.requests._durable_reply
        failed = loop.create_future()

        def first_fails(writer, data):
            if not failed.done():
                failed.set_result(data)
                raise RuntimeError("an answer's callback failed")
            real(writer, data)
        monkeypatch.setattr(server.requests, "_durable_reply", first_fails)

        async def main():
            reader, w, answered, task = connection(server, loop)
            await asyncio.sleep(0)
            reader.feed_data(add_frame(500, 0))             # its answer fails
            await asyncio.wait_for(failed, 30)   # (outside the loop's ready queue meanwhile)
            reader.feed_data(add_frame(500, 1))             # the connection still serves
            await asyncio.wait_for(answered, 30)
            reader.feed_eof()
            await asyncio.wait_for(task, 10)
            return bytes(w.out)
        with caplog.at_level("ERROR", logger="embedlog.server"):
            out = loop.run_until_complete(main())
        assert [(a.status, a.request_id) for a in answers(out)] == [(P.EOK, 2)]   # entry 1's
        assert "answering a loop step's adds failed" in caplog.text
    finally:
        loop.close()
        bookie.close()
