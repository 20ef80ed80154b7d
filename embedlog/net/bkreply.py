"""Where the answer of one BookKeeper request goes (net/bkserver.py): the first write
releases the request's share of the server's in-flight limits, even when its connection is
gone; and the answer a test's message failpoint drops or holds back (failpoints.fault)."""
from __future__ import annotations


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
