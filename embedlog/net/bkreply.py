"""Where the answer of one BookKeeper request goes (net/bkserver.py): the first write
releases the request's share of the server's in-flight limits, even when its connection is
gone; an answer told to the server's observers (the metrics); and the answer a test's
message failpoint drops or holds back (failpoints.fault)."""
from __future__ import annotations

import struct
import time

from embedlog._native import bkwire as W
from embedlog.errors import V3_TO_EMBEDLOG

_V2_CODE = struct.Struct(">i")    # a v2 response's errorCode, after its length and header


class Reply:
    """One request's answer, sent once."""
    __slots__ = ("server", "conn", "nbytes", "answered")

    def __init__(self, server, conn, nbytes: int):
        self.server, self.conn, self.nbytes, self.answered = server, conn, nbytes, False

    def send(self, *parts) -> None:
        if self.answered:
            return
        self.answered = True
        if self.nbytes is not None:
            self.server.release_many(self.conn, 1, self.nbytes)
        self.server.send(self.conn.writer, *parts)

    def park(self) -> None:
        """The request waits without its share of the in-flight limits (a long poll): given
        back now, not again at the answer."""
        if not self.answered and self.nbytes is not None:
            self.server.release_many(self.conn, 1, self.nbytes)
            self.nbytes = None


class ObservedReply(Reply):
    """An answer whose status, time and entries go to the server's observers
    (BookieServer.observe) as it is sent: ``op`` as embedlog names it, ``seconds`` None for
    a long poll."""
    __slots__ = ("op", "key", "entries", "started", "v2")

    def __init__(self, server, conn, nbytes: int, op: str, key, entries: int, v2: bool,
                 timed: bool = True):
        super().__init__(server, conn, nbytes)
        self.op, self.key, self.entries, self.v2 = op, key, entries, v2
        self.started = time.perf_counter() if timed else None

    def send(self, *parts) -> None:
        if self.answered:
            return
        Reply.send(self, *parts)
        head = parts[0] if parts else b""
        if self.v2:
            status = _V2_CODE.unpack_from(head, 8)[0] if len(head) >= 12 else 101
        elif len(parts) > 1:          # an entry follows its head: only an EOK carries one
            status = 0
        else:
            resps = W.decode_responses(head)[0] if head else None
            status = V3_TO_EMBEDLOG.get(resps[0].status, 101) if resps else 101
        seconds = None if self.started is None else time.perf_counter() - self.started
        self.server.observe(self.op, status, seconds, self.key,
                            self.entries if status == 0 else 0)


class FaultyReply(Reply):
    """An answer a test's failpoint drops (("drop",)) or holds back (("delay", seconds))."""
    __slots__ = ("fault", "loop")

    def __init__(self, reply: Reply, fault: tuple, loop):
        super().__init__(reply.server, reply.conn, reply.nbytes)
        self.fault, self.loop = fault, loop

    def send(self, *parts) -> None:
        if self.answered:
            return
        if self.fault[0] == "delay":
            fault, self.fault = self.fault, ("none",)
            self.loop.call_later(fault[1], self.send, *parts)
            return
        if self.fault[0] == "drop":
            self.answered = True
            if self.nbytes is not None:
                self.server.release_many(self.conn, 1, self.nbytes)
            return
        Reply.send(self, *parts)
