"""A ledger's metadata through its life: the compare-and-set loops a writer's close and a
recovery make (seed 004's rules), shared by the replicated client and the embedded log.

Each function takes ``write(kind, md, version) -> Versioned`` and ``read(ledger_id) ->
Versioned`` (blocking calls: the client passes its fault-injectable seam, the embedded
log its store), so the rules live here once:

- a writer closes by CAS at its LAC; on a conflict it rereads and retries while the
  ledger is OPEN and still the same ledger (its ctime: a ledger deleted and its id used
  again is another one, LedgerFencedError); CLOSED at the same entry is success, CLOSED elsewhere LedgerClosedError,
  IN_RECOVERY LedgerFencedError (another client is recovering it);
- a recovery first turns OPEN into IN_RECOVERY (a CLOSED ledger is the answer as it is);
- a recovery closes with its last entry and its own ensemble changes in one CAS; CLOSED
  by a concurrent recovery is the answer; earlier fragments' members swapped meanwhile
  (autorecovery) are merged; anything else fails with LedgerRecoveryError.
"""
from __future__ import annotations

from embedlog.errors import (BadVersionError, LedgerClosedError, LedgerFencedError,
                             LedgerRecoveryError)
from embedlog.meta.api import LedgerState

CAS_RETRIES = 64


def check_incarnation(mine, current) -> None:
    """LedgerFencedError when ``current`` (the store's metadata now) is of another ledger
    than ``mine`` under the same id: ours was deleted and its id given to a new one, whose
    metadata a writer of ours must never change (its ctime tells them apart)."""
    if current.ctime_ms != mine.ctime_ms:
        raise LedgerFencedError(f"ledger {mine.ledger_id} was deleted and its id given to "
                                f"another ledger (created at {current.ctime_ms} ms, ours at "
                                f"{mine.ctime_ms} ms)")


def close_ledger(versioned, last: int, length: int, write, read, before_write=None):
    """A writer's close at ``last`` (its LAC), from the metadata it last knew."""
    md, version = versioned.value, versioned.version
    lid = md.ledger_id
    for _ in range(CAS_RETRIES):
        if md.state == LedgerState.CLOSED:
            if md.last_entry_id == last:
                return type(versioned)(md, version)
            raise LedgerClosedError(f"ledger {lid} was closed by another client at entry "
                                    f"{md.last_entry_id}, not {last}")
        if md.state == LedgerState.IN_RECOVERY:
            raise LedgerFencedError(f"ledger {lid} is being recovered by another client")
        if before_write is not None:
            before_write()
        try:
            return write("close", md.with_(state=LedgerState.CLOSED, last_entry_id=last,
                                           length=length), version)
        except BadVersionError:
            v = read(lid)
            check_incarnation(md, v.value)
            md, version = v.value, v.version
    raise BadVersionError(f"could not close ledger {lid}: its metadata kept changing")


def begin_recovery(versioned, write, read):
    """OPEN -> IN_RECOVERY by CAS; the metadata recovery starts from (CLOSED: nothing to do)."""
    md, version = versioned.value, versioned.version
    for _ in range(CAS_RETRIES):
        if md.state != LedgerState.OPEN:
            return type(versioned)(md, version)
        try:
            return write("recovery", md.with_(state=LedgerState.IN_RECOVERY), version)
        except BadVersionError:
            v = read(md.ledger_id)
            md, version = v.value, v.version
    raise BadVersionError(f"could not recover ledger {md.ledger_id}: its metadata kept changing")


def close_recovered(base, local, version, last: int, length: int, write, read):
    """A recovery's close: CLOSED at ``last`` with ``local``'s fragments (the recovery's
    ensemble changes, made from ``base``), at ``version``. Returns the CLOSED metadata."""
    lid = base.ledger_id
    target = local
    for _ in range(CAS_RETRIES):
        try:
            return write("close", target.with_(state=LedgerState.CLOSED, last_entry_id=last,
                                               length=length), version).value
        except BadVersionError:
            v = read(lid)
        if v.value.ctime_ms != base.ctime_ms:
            raise LedgerRecoveryError(f"ledger {lid} was deleted and its id given to another "
                                      "ledger while it was recovered")
        if v.value.state == LedgerState.CLOSED:
            return v.value            # closed by a concurrent recovery: its last entry is the answer
        target = merge_local_fragments(base, local, v.value)
        if v.value.state != LedgerState.IN_RECOVERY or target is None:
            raise LedgerRecoveryError(f"ledger {lid} changed while it was recovered "
                                      f"({v.value.state.name}); recover it again")
        version = v.version
    raise BadVersionError(f"could not close ledger {lid} after recovery")


def merge_local_fragments(base, local, current):
    """``current`` (the store's metadata now) with the fragments a recovery commits: those
    of ``local`` (the recovery writer's metadata, which started from ``base``). Fragments
    before the first one the recovery added or replaced may have had members swapped
    meanwhile (autorecovery) and are kept; from there on ``current`` must still be what
    ``base`` was, or the result is None (a conflict: recover again)."""
    ours = [f for f in local.fragments if f not in base.fragments]
    if not ours:
        return current
    cut = ours[0][0]

    def starts(md, below):
        return [f[0] for f in md.fragments if (f[0] < cut) == below]

    if (starts(current, True) != starts(base, True)
            or [f for f in current.fragments if f[0] >= cut] != [f for f in base.fragments if f[0] >= cut]):
        return None
    keep = sum(1 for f in current.fragments if f[0] < cut)
    mine = [k for k, f in enumerate(local.fragments) if f[0] >= cut]
    times = ()
    if current.unbounded:
        times = tuple(current.fragment_ctimes_ms[:keep]) + tuple(local.fragment_ctimes_ms[k] for k in mine)
    return current.with_(fragments=tuple(current.fragments[:keep]) + tuple(local.fragments[k] for k in mine),
                         fragment_ctimes_ms=times)
