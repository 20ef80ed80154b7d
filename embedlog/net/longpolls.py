"""Long polls: reads that wait for a ledger's LAC to pass the one their reader knows
(embedlog's READ with FLAG_LONG_POLL, BookKeeper's v3 READ with previousLAC), answered when
an add or a WRITE_LAC moves it, at their timeout, or when their connection goes.

Bounds (docs/SECURITY.md): at most max_long_polls wait on a bookie and
max_long_polls_per_connection on one connection; past either, the poll is answered at once,
as at its timeout. While it waits, a poll holds no share of the in-flight limits (its
reply's ``park``): adds are never held back by long polls, as BookKeeper counts reads apart
from adds.
"""
from __future__ import annotations

import asyncio
import logging

from embedlog._native.format import LedgerId
from embedlog.errors import EmbedlogError

log = logging.getLogger("embedlog.server")
WAKE_BATCH = 256            # polls answered in one loop step; the rest in the next ones


class _Poll:
    """A long poll waiting for the LAC of ledger ``key`` to pass ``previous``."""
    __slots__ = ("key", "previous", "conn", "answer", "timer")

    def __init__(self, key, previous: int, conn, answer):
        self.key, self.previous, self.conn, self.answer = key, previous, conn, answer
        self.timer = None


class LongPolls:
    """The long polls of one server. ``conn.polls`` (a dict) holds a connection's own, so
    that they end with it (``end``); ``stats`` counts those past the bounds."""

    def __init__(self, bookie, max_polls: int, max_per_connection: int, stats: dict):
        self.bookie = bookie
        self.max_polls, self.max_per_connection = max_polls, max_per_connection
        self.stats = stats
        self.count = 0                 # polls waiting, all connections
        self.by_ledger: dict = {}      # (scope, lid) -> {_Poll: None}

    def park(self, conn, reply, key, previous_lac: int, timeout_ms: int, answer) -> bool:
        """Park a poll of ledger ``key`` (scope, id) until its LAC passes ``previous_lac`` or
        ``timeout_ms`` pass; ``answer()`` answers it then. False, nothing parked, past a
        bound: the caller answers at once, as at a timeout."""
        if self.count >= self.max_polls or (
                conn is not None and len(conn.polls) >= self.max_per_connection):
            self.stats["long_polls_over_bound"] += 1
            return False
        park = getattr(reply, "park", None)
        if park is not None:
            park()
        poll = _Poll(key, previous_lac, conn, answer)
        self.by_ledger.setdefault(key, {})[poll] = None
        if conn is not None:
            conn.polls[poll] = None
        self.count += 1
        poll.timer = asyncio.get_running_loop().call_later(timeout_ms / 1000.0, self._end, poll)
        return True

    def wake(self, key) -> None:
        """Ledger ``key``'s LAC may have moved: answer the polls it passed."""
        waiting = self.by_ledger.get(key)
        if not waiting:
            return
        try:
            # a LedgerId: the bookie refuses the (scope, id) key (IllegalOpError, below)
            lac, _ = self.bookie.last_add_confirmed(LedgerId(*key))
        except EmbedlogError:
            return
        self.end([poll for poll in waiting if lac > poll.previous])

    def end(self, polls) -> None:
        """Answer ``polls`` now (as at their timeout when the LAC has not moved): a few hundred
        per loop step, the rest after the reads and answers waiting meanwhile, so thousands
        of polls of one ledger never stall the adds of one loop step."""
        for poll in polls[:WAKE_BATCH]:
            self._end(poll)
        if len(polls) > WAKE_BATCH:
            asyncio.get_running_loop().call_soon(self.end, polls[WAKE_BATCH:])

    def _end(self, poll) -> None:
        waiting = self.by_ledger.get(poll.key)
        if waiting is None or waiting.pop(poll, False) is False:
            return                                  # ended already
        if not waiting:
            del self.by_ledger[poll.key]
        poll.timer.cancel()
        self.count -= 1
        if poll.conn is not None:
            poll.conn.polls.pop(poll, None)
        try:
            poll.answer()
        except Exception:
            log.exception("answering a long poll failed")
