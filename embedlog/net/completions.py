"""Completions handed from the journal's thread to a server's event loop, and the answers
they write.

The journal thread calls ``complete`` once per durable add (or fence); the loop is woken
only when no drain is due yet, so a group commit's callbacks cost one wake-up together. A
drain runs them all in one callback, and the answers they ``send`` to one connection go out
in one write, in the order they were made; a drain of one completion (a lone add) writes its
answer at once, before the rest of that completion's work (metrics, long-poll wake-ups).
"""
from __future__ import annotations

import collections
import logging

log = logging.getLogger("embedlog.server")


class Completions:
    """The queue between the journal's thread and the loop (``loop`` is set once known)."""

    def __init__(self, loop=None):
        self.loop = loop
        self._done = collections.deque()  # (fn, args) from the journal thread
        self._drain_due = False           # a _drain is scheduled on the loop
        self._out: dict | None = None     # writer -> parts, while a drain gathers them

    def complete(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the loop (from any thread)."""
        self._done.append((fn, args))
        if not self._drain_due:
            self._drain_due = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:      # the loop closed: its connections are gone
                pass

    def _drain(self) -> None:
        # cleared before popping: what is appended after this line is popped here or by
        # the drain its append schedules
        self._drain_due = False
        done = self._done
        if len(done) == 1:
            # a lone completion (a lone add): its answer goes out at once, before the work
            # that follows it in the completion (the server's metrics, long-poll wake-ups)
            fn, args = done.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("completion %r failed", fn)
            if not done:
                return
        out = self._out = {}
        try:
            while done:
                fn, args = done.popleft()
                try:
                    fn(*args)
                except Exception:         # one completion's bug must not strand the others
                    log.exception("completion %r failed", fn)
        finally:
            self._out = None
            for writer, parts in out.items():
                _write(writer, parts)

    def send(self, writer, *parts) -> None:
        """Write one answer's parts: at once, or, inside a drain, gathered with the other
        answers of the drain to the same connection (one write each, in order)."""
        out = self._out
        if out is None:
            _write(writer, parts)
            return
        got = out.get(writer)
        if got is None:
            out[writer] = list(parts)
        else:
            got.extend(parts)


def _write(writer, parts) -> None:
    if not writer.is_closing():
        if len(parts) == 1:
            writer.write(parts[0])
        else:
            writer.writelines(parts)
