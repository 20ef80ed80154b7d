"""Open logs and clients are unusable in a forked child.

A child made by os.fork() (or multiprocessing's fork start method) inherits the parent's
open EmbeddedLog, Client and their handles, but not their threads: the journal writer, the
event loop, the GC. Its adds would be framed with entry ids the parent already used and
written over the parent's journal, and a close would wait for threads that do not exist.
So, in the child, every tracked object gets ``_after_fork(gone)``: it drops what the parent
owns (a bookie, a metadata store, a loop) for ``gone``, on which every attribute raises
ForkedProcessError, and makes its close() a no-op that touches no file, lock or thread.
"""
from __future__ import annotations

import os
import weakref

from embedlog.errors import ForkedProcessError

_live: "weakref.WeakSet" = weakref.WeakSet()     # objects with an _after_fork(gone) method
_parent = os.getpid()


def track(obj) -> None:
    """Give ``obj._after_fork(gone)`` a call in every forked child while obj is alive."""
    _live.add(obj)


def error(what: str, owner: int) -> ForkedProcessError:
    return ForkedProcessError(
        f"{what} was opened in process {owner}; this process ({os.getpid()}) is a fork of "
        f"it and may not use it (its bookie, journal, connections and threads are the "
        f"parent's). Use it in the parent only, or open one here: embedlog.open(path, "
        f"read_only=True) reads a log another process writes, a Client of its own reaches "
        f"served bookies; multiprocessing's 'spawn' or 'forkserver' start method inherits none")


class Gone:
    """Stands, in a forked child, for something the parent owns: every attribute raises
    ForkedProcessError, except close, which does nothing."""

    def __init__(self, what: str, owner: int):
        self._what, self._owner = what, owner

    def __getattr__(self, name):
        if name == "close":
            return _nothing
        raise error(self._what, self._owner)

    def error(self) -> ForkedProcessError:
        return error(self._what, self._owner)

    def refuse(self):
        """A function that raises this ForkedProcessError whatever it is called with."""
        def refused(*_args, **_kwargs):
            raise self.error()
        return refused

    def __repr__(self) -> str:
        return f"<{self._what}, unusable in forked process {os.getpid()}>"


def _nothing(*_args, **_kwargs) -> None:
    return None


def _after_fork_in_child() -> None:
    global _parent
    owner, _parent = _parent, os.getpid()
    objs = list(_live)
    _live.clear()
    for obj in objs:
        try:
            obj._after_fork(Gone(repr(obj), owner))
        except Exception:            # one object's trouble must not leave the others usable
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)
