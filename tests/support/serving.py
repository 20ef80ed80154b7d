"""A BookieServer's connections driven by hand on a loop of the test's own: frames fed to a
FrameReader, answers gathered by a Writer, no socket (tests/net/test_sync_due.py and
test_take_frames.py)."""
from __future__ import annotations

import asyncio

from embedlog._native import format as F
from embedlog.bookie.bookie import Bookie
from embedlog.config import BookieConfig
from embedlog.net import protocol as P
from embedlog.net.framereader import FrameReader
from embedlog.net.server import READ_BUFFER_BYTES, BookieServer

KEY = F.master_key(b"sync-due")


class Writer:
    """A connection's StreamWriter: what the server writes is kept in ``out``."""

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


def answers(out: bytes) -> list:
    got, pos = [], 0
    while pos < len(out):
        (n,) = P.LENGTH.unpack_from(out, pos)
        got.append(P.parse_response(out[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return got


def add_frame(lid: int, eid: int) -> bytes:
    """An ADD frame of entry ``eid`` of ledger ``lid``, request id eid + 1."""
    e = F.encode_entry(0, lid, eid, eid - 1, 10 * (eid + 1), "crc32c", b"entry %d" % eid)
    return P.add_request(eid + 1, 0, lid, KEY, [e])


def serve_all(server, loop, streams: list[bytes]) -> list[Writer]:
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


def connection(server, loop):
    """A connection ``server`` serves: its reader, its Writer, the future of its first answer
    (awaiting it keeps a test out of the loop's ready queue) and its task."""
    reader = FrameReader(limit=READ_BUFFER_BYTES, loop=loop)
    w = Writer()
    answered = loop.create_future()
    w.write = lambda data: (w.out.extend(data), answered.done() or answered.set_result(None))
    return reader, w, answered, loop.create_task(server._serve(reader, w))


def bookie_server(tmp_path, **server_args):
    """(bookie, loop, server): a BookieServer that does not listen, on a new loop."""
    bookie = Bookie(str(tmp_path), BookieConfig(journal_pre_alloc_size_mb=1))
    loop = asyncio.new_event_loop()
    server = BookieServer(bookie, loop=loop, **server_args)
    server._room_freed = asyncio.Event()
    return bookie, loop, server
