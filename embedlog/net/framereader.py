"""The embedlog server's connection reader: a StreamReader that hands a frame's message
over with at most one copy of its bytes."""
from __future__ import annotations

import asyncio

from embedlog._native.frames import frame_buffer


class FrameReader(asyncio.StreamReader):
    """The embedlog server's StreamReader: ``read_frame`` hands a frame's message over with
    at most one copy of its bytes (StreamReader.readexactly makes two in Python 3.11: a
    slice of its buffer, then bytes of that). Everything else is StreamReader's, so a
    connection reads as any StreamReader's.

    A frame not yet whole when ``read_frame`` asks for it is gathered as the socket's reads
    come (each read's bytes kept as they are, no copy) and copied once into the frame's own
    bytearray when its last byte is here. Growing one buffer a read at a time instead
    reallocated and copied it over and over (a third of a bookie loop's samples with 1 KiB
    adds in frames of 100 KiB and more), and a frame over twice the limit paused and
    resumed the transport each time (two epoll_ctl calls). Nothing of the frame's declared
    length is allocated before its bytes come: a length prefix alone holds no memory.

    While a frame is gathered, ``charge(k)`` (the server's) counts each read's k bytes
    against its limits as they arrive; when it answers False the transport is paused (the
    rest of the frame stays in the socket) until ``room()`` returns. The bytes of a frame
    count there, not against this reader's limit."""

    _parts: list | None = None        # the reads of the frame a waiting read_frame gathers
    _want = 0                         # its length
    _filled = 0                       # bytes of it received
    _held = False                     # the transport paused until room() returns
    charge = None                     # charge(k) -> bool: k more bytes of the frame arrived
    room = None                       # async room(): returns once more may be read
    # set while the connection's task waits between frames: ``take_frames(data)`` answers
    # the whole frames at the front of a read at once and returns the bytes it took
    # (BookieServer._take_frames, whatever the protocol); what it leaves is buffered for
    # the task as usual
    take_frames = None

    def feed_data(self, data) -> None:
        if self.take_frames is not None and data and not self._buffer and \
                self._waiter is not None and not self._waiter.done():
            taken = self.take_frames(data)
            if taken == len(data):
                return
            if taken:
                data = memoryview(data)[taken:]
        parts = self._parts
        if parts is None or not data:
            super().feed_data(data)
            return
        at, n = self._filled, len(data)
        k = min(n, self._want - at)
        if k == n:
            parts.append(data)
        else:
            m = memoryview(data)
            parts.append(m[:k])
            super().feed_data(m[k:])      # what follows the frame: buffered as usual
        self._filled = at + k
        ok = self.charge is None or self.charge(k)
        if self._filled == self._want:
            self._wakeup_waiter()
        elif not ok:
            self._hold()

    def _hold(self) -> None:
        if not self._held and self._transport is not None:
            self._held = True
            self._transport.pause_reading()
            self._wakeup_waiter()         # read_frame waits for room() instead

    def take_buffered(self, take) -> None:
        """``take(buffer)`` (take_frames' kind) on what is buffered, before the task reads
        on: the bytes it took are dropped from the buffer."""
        buf = self._buffer
        if buf:
            taken = take(buf)
            if taken:
                del buf[:taken]
                self._maybe_resume_transport()

    def frame_left(self) -> int:
        """Bytes of the frame read_frame gathers still to come (0 between frames)."""
        return self._want - self._filled if self._parts is not None else 0

    def has_data(self) -> bool:
        """Bytes are buffered: the next read may not wait for the socket."""
        return bool(self._buffer)

    async def read_frame(self, n: int, head=None):
        """readexactly(n) (same errors, same flow control), as a bytearray: the buffer
        itself when it holds exactly the frame, or with the smaller of the frame and what
        follows it copied out, or, when the frame is not whole yet, a bytearray of its own
        that its reads are copied into once it is. With ``head`` (bytes of the frame read
        and charged before), the frame is ``head`` and the next n - len(head) bytes."""
        if head:
            if self._exception is not None:
                raise self._exception
            return await self._fill_frame(n, head)
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

    async def _fill_frame(self, n: int, head=None) -> bytearray:
        buf = self._buffer
        parts = [head] if head else []
        done = len(head) if head else 0
        have = min(len(buf), n - done)
        if have == len(buf):
            if have:
                parts.append(buf)     # the buffer itself: the reader takes a new one
                self._buffer = bytearray()
        else:                         # a head and more than the rest of the frame buffered
            parts.append(bytes(buf[:have]))
            del buf[:have]
        self._parts, self._want, self._filled = parts, n, done + have
        try:
            self._maybe_resume_transport()
            if have and self.charge is not None and not self.charge(have) and self._filled < n:
                self._hold()
            while self._filled < n:
                if self._exception is not None:
                    raise self._exception
                if self._eof:
                    raise asyncio.IncompleteReadError(b"".join(parts), n)
                if self._held:
                    await self.room()
                    self._held = False
                    if not self._eof and self._exception is None:
                        self._transport.resume_reading()
                    continue
                await self._wait_for_data("readexactly")
        finally:
            self._parts = None
            if self._held:            # failed while held: the connection is going
                self._held = False
        frame = frame_buffer(n)       # every byte is written before it is handed over
        at = 0
        for part in parts:
            k = len(part)
            frame[at:at + k] = part
            at += k
        return frame
