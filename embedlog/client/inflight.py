"""Adds in flight: the future each add is handed, and the bound on how many there are.

Both are on the path of every add, so both avoid what the standard library builds per
call: a ``concurrent.futures.Future`` makes a ``threading.Condition`` (an RLock and
half a dozen bound methods) when created and enters it when completed, and a
``threading.BoundedSemaphore`` enters a Condition on every acquire and release.
"""
from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures._base import FINISHED, RUNNING

from embedlog.errors import IllegalOpError

# Guards a future's first condition against its completion without one. Held only for a
# few bytecodes, never while taking another lock.
_MADE = threading.Lock()


class AddFuture(concurrent.futures.Future):
    """The future of one add: a ``concurrent.futures.Future``, handed out running.

    An add handed in cannot be taken back, so ``cancel()`` is refused (a cancelled future
    made set_result raise where the add completed, and the journal's writer thread or
    the acknowledgement loop died on it). The condition the base class waits on is made
    only when someone blocks on it (``result()`` before completion, ``wait()``,
    ``as_completed()``); a future completed with nobody waiting, the common case under
    ``add_done_callback`` or ``asyncio.wrap_future``, never makes one.
    """

    def __init__(self, on_done=None):    # the base __init__ would make the condition
        self._made = None
        self._state = RUNNING
        self._result = None
        self._exception = None
        self._waiters = []
        # a callback given here is in place before any thread can complete the future,
        # so it needs none of add_done_callback's locking
        self._done_callbacks = [] if on_done is None else [on_done]

    @property
    def _condition(self) -> threading.Condition:
        cond = self._made
        if cond is None:
            with _MADE:
                if self._made is None:
                    self._made = threading.Condition()
                cond = self._made
        return cond

    # A finished add never changes again (cancel() refuses a running future, and nothing
    # cancels one before it runs), so asking a finished one needs no condition: Stream's
    # own done-callback asks every add for its exception, and the base class made a
    # Condition for each of them (10% of a streaming producer's samples).
    def done(self) -> bool:
        return self._state == FINISHED or super().done()

    def cancelled(self) -> bool:
        return False if self._state in (RUNNING, FINISHED) else super().cancelled()

    def exception(self, timeout=None):
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def result(self, timeout=None):
        if self._state == FINISHED:
            if self._exception is not None:
                raise self._exception
            return self._result
        return super().result(timeout)

    def add_done_callback(self, fn) -> None:
        with _MADE:
            if self._made is None and self._state == RUNNING:
                self._done_callbacks.append(fn)
                return
        super().add_done_callback(fn)

    def set_result(self, result) -> None:
        if not self._finish(result, None):
            super().set_result(result)

    def set_exception(self, exception) -> None:
        if not self._finish(None, exception):
            super().set_exception(exception)

    def _finish(self, result, exception) -> bool:
        """Complete without a condition if none was made; False to go the base class's way."""
        with _MADE:
            if self._made is not None or self._state != RUNNING:
                return False
            self._result, self._exception = result, exception
            self._state = FINISHED
        self._invoke_callbacks()         # no callback is added after FINISHED (see above)
        return True


class InFlight:
    """At most ``limit`` adds in flight: callers block in ``take`` at the bound (the
    back-pressure of append_async), ``give`` hands a slot back."""

    def __init__(self, limit: int):
        if limit < 1:
            raise IllegalOpError(f"max_pending_adds must be at least 1, got {limit}")
        self._limit = limit
        self._free = limit
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._blocked = 0

    def take(self, most: int = 1, block: bool = True) -> int:
        """Take between 1 and ``most`` slots, as many as are free, blocking until one is
        (without ``block``, 0 when none is free)."""
        with self._lock:
            if not block and self._free <= 0:
                return 0
            while self._free <= 0:
                self._blocked += 1
                try:
                    self._room.wait()
                finally:
                    self._blocked -= 1
            n = min(most, self._free)
            self._free -= n
            return n

    def give(self, n: int = 1) -> None:
        with self._lock:
            self._free += n
            if self._free > self._limit:
                raise RuntimeError("InFlight.give: more slots given back than taken")
            if self._blocked:
                self._room.notify(n)
