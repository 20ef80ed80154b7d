"""The embedlog server's connection reader: a StreamReader that hands a frame's message
over with at most one copy of its bytes."""
from __future__ import annotations

import asyncio

from embedlog._native.addpath import frame_buffer


class FrameReader(asyncio.StreamReader):
    """The embedlog server's StreamReader: ``read_frame`` hands a frame's message over with
    at most one copy of its bytes (StreamReader.readexactly makes two in Python 3.11: a
    slice of its buffer, then bytes of that). Everything else is StreamReader's, so a
    connection handed to BookKeeperSession reads as before.

    A frame not yet whole when ``read_frame`` asks for it is read straight into its own
    bytearray (``feed_data`` copies each read's bytes there once). Growing the buffer a
    read at a time instead reallocated and copied it over and over (a third of a bookie
    loop's samples with 1 KiB adds in frames of 100 KiB and more), and a frame over twice
    the limit paused and resumed the transport each time (two epoll_ctl calls). The frame's
    bytes are already counted against the server's in-flight limits, so they do not count
    against this reader's."""

    _frame: bytearray | None = None   # the frame a waiting read_frame is filled with
    _filled = 0                       # bytes of it received
    # set while the connection's task waits between frames: ``take_frames(data)`` answers
    # the whole frames at the front of a read at once and returns the bytes it took
    # (BookieServer._take_frames); what it leaves is buffered for the task as usual
    take_frames = None

    def feed_data(self, data) -> None:
        if self.take_frames is not None and data and not self._buffer and \
                self._waiter is not None and not self._waiter.done():
            taken = self.take_frames(data)
            if taken == len(data):
                return
            if taken:
                data = memoryview(data)[taken:]
        frame = self._frame
        if frame is None or not data:
            super().feed_data(data)
            return
        at, n = self._filled, len(data)
        k = min(n, len(frame) - at)
        if k == n:
            frame[at:at + k] = data
        else:
            with memoryview(data) as m:
                frame[at:at + k] = m[:k]
                super().feed_data(m[k:])   # what follows the frame: buffered as usual
        self._filled = at + k
        if self._filled == len(frame):
            self._wakeup_waiter()

    def has_data(self) -> bool:
        """Bytes are buffered: the next read may not wait for the socket."""
        return bool(self._buffer)

    async def read_frame(self, n: int):
        """readexactly(n) (same errors, same flow control), as a bytearray: the buffer
        itself when it holds exactly the frame, or with the smaller of the frame and what
        follows it copied out, or, when the frame is not whole yet, a bytearray of its own
        that the reads fill."""
        if n <= 0 or self._exception is not None:
            return await self.readexactly(n)
        buf = self._buffer
        if len(buf) < n:
            if self._eof:
                incomplete = bytes(buf)
                buf.clear()
                raise asyncio.IncompleteReadError(incomplete, n)
            return await self._fill_frame(n)
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
            data = frame_buffer(n)     # a spare one, its pages already in, where it can
            with memoryview(buf) as m:
                data[:] = m[:n]
            if rest:
                del buf[:n]
            else:
                buf.clear()
        self._maybe_resume_transport()
        return data

    async def _fill_frame(self, n: int) -> bytearray:
        buf = self._buffer
        frame = frame_buffer(n)       # every byte is written before it is handed over
        have = len(buf)
        frame[:have] = buf
        buf.clear()
        self._frame, self._filled = frame, have
        try:
            self._maybe_resume_transport()
            while self._filled < n:
                if self._eof:
                    raise asyncio.IncompleteReadError(bytes(frame[:self._filled]), n)
                await self._wait_for_data("readexactly")
        finally:
            self._frame = None
        return frame
