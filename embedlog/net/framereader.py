"""The embedlog server's connection reader: a StreamReader that hands a frame's message
over with at most one copy of its bytes."""
from __future__ import annotations

import asyncio


class FrameReader(asyncio.StreamReader):
    """The embedlog server's StreamReader: ``read_frame`` hands a frame's message over with
    at most one copy of its bytes (StreamReader.readexactly makes two in Python 3.11: a
    slice of its buffer, then bytes of that). Everything else is StreamReader's, so a
    connection handed to BookKeeperSession reads as before."""

    async def read_frame(self, n: int):
        """readexactly(n) (same errors, same flow control), as a bytearray: the buffer
        itself when it holds exactly the frame, or with the smaller of the frame and what
        follows it copied out."""
        if n <= 0 or self._exception is not None:
            return await self.readexactly(n)
        while len(self._buffer) < n:
            if self._eof:
                incomplete = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(incomplete, n)
            await self._wait_for_data("readexactly")
        buf = self._buffer
        rest = len(buf) - n
        if rest == 0 and buf.__alloc__() <= 2 * n + 64:
            # handed over only when it holds about the frame: a buffer grown earlier (and
            # read from its front since) would keep its whole allocation in flight
            self._buffer = bytearray()
            data = buf
        elif 0 < rest < n:            # the frame keeps the buffer; what follows moves
            with memoryview(buf) as m:
                self._buffer = bytearray(m[n:])
            del buf[n:]               # a major downsize reallocates (CPython: under half)
            data = buf
        else:
            with memoryview(buf) as m:
                data = bytearray(m[:n])
            if rest:
                del buf[:n]
            else:
                buf.clear()
        self._maybe_resume_transport()
        return data
