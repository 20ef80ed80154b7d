"""Named failure points on the durable path (bookie) and in the client protocol.

Production code calls ``hit("journal.before_sync")`` at each point; nothing
happens unless a test armed it. An armed point runs an action: a callable
(for example one that waits on an event, holding an fdatasync back), or
"crash" (the process dies at once, as with SIGKILL). Child processes arm
points through EMBEDLOG_FAILPOINTS="name=crash,name2=crash:3" (crash on the
third hit).

Message points ("bkserver.add", "bkserver.read": a request on a BookKeeper connection)
take one-message faults instead, through ``fault(name)``: "drop:N" (the Nth request's
answer is never sent), "error:N" (it is answered EIO, nothing done), "delay:N:MS" (its
answer is held back MS milliseconds); several for one point are joined by "|", e.g.
EMBEDLOG_FAILPOINTS="bkserver.add=delay:2:1500|error:5".

Client points sit where a client that dies leaves work half done: a metadata
write made (or not) with the messages around it unsent. They are hit from the
client's worker threads, never from its event loop, so a callable may block.
"""
from __future__ import annotations

import os
import signal

POINTS = (
    "journal.before_write", "journal.before_sync", "journal.after_sync",
    "journal.prealloc_before_zero",
    "journal.reuse_before_header",               # a kept journal picked, its new header not written
    "journal.reuse_before_rename",               # its new header synced, not yet renamed to a journal
    "journal.retire_before_rename",              # layout 2: a freed segment's map deleted, not yet kept
    "checkpoint.before_index_flush", "checkpoint.before_lastmark", "checkpoint.after_lastmark",
    "memtable.before_flush",
    # garbage collection (embedlog/bookie/gc.py) and compaction (compaction.py)
    "gc.before_delete_ledger", "gc.after_delete_ledger", "gc.before_delete_log",
    "gc.before_delete_segment",                  # layout 2: an unnamed journal segment
    "gc.before_absence_check",
    "compaction.during_copy", "compaction.after_write", "compaction.after_manifest",
    "compaction.after_rename", "compaction.after_index_flush", "compaction.after_delete_sources",
    # the client (embedlog/client/): around its metadata writes
    "client.ensemble_change.after_metadata",     # new fragment written, replacements not yet sent to
    "client.close.before_metadata",              # handle closed, CLOSED not yet written
    "client.recovery.before_close",              # entries written back, CLOSED not yet written
    "client.take_over.before_commit",            # no-op written, the term's fragments not yet written
    # one request on a BookKeeper connection (net/bkserver.py): faults of a message, fault()
    "bkserver.add", "bkserver.read",
)
FAULT_KINDS = ("drop", "error", "delay")

armed: dict[str, object] = {}     # name -> action; a hot path may test it for emptiness
_counts: dict[str, int] = {}


def arm(name: str, action) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown failure point {name!r}; known: {', '.join(POINTS)}")
    armed[name] = action
    _counts[name] = 0


def disarm(name: str | None = None) -> None:
    if name is None:
        armed.clear()
    else:
        armed.pop(name, None)


def active() -> bool:
    return bool(armed)


def hit(name: str) -> None:
    action = armed.get(name)
    if action is None:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if callable(action):
        action()
        return
    kind, _, nth = str(action).partition(":")
    if kind == "crash" and _counts[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def fault(name: str) -> tuple | None:
    """Count a hit of a message point; the fault armed for this hit: ("drop",), ("error",)
    or ("delay", seconds), else None (module doc)."""
    action = armed.get(name)
    if action is None:
        return None
    _counts[name] = n = _counts.get(name, 0) + 1
    for one in str(action).split("|"):
        kind, _, rest = one.partition(":")
        nth, _, ms = rest.partition(":")
        if kind not in FAULT_KINDS or not nth.isdigit() or (kind == "delay") != ms.isdigit():
            raise ValueError(f"failure point {name}: {one!r} is not drop:N, error:N or "
                             f"delay:N:MS")
        if int(nth) == n:
            return ("delay", int(ms) / 1000.0) if kind == "delay" else (kind,)
    return None


def _from_env() -> None:
    spec = os.environ.get("EMBEDLOG_FAILPOINTS", "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, action = item.partition("=")
        arm(name, action or "crash")


_from_env()
