"""Ledger recovery as a reader: fence, find the last entry, write it back, close.

Seed 004 plus what BookKeeper learned later (BOOKKEEPER.md sections 2.4 and 6):
- the metadata goes to IN_RECOVERY first, then the last fragment's bookies are fenced;
  fencing is done once (Qw - Qa) + 1 bookies of every write quorum have answered;
- recovery reads fence too (#2614), and the read forward starts no lower than the last
  fragment's first entry - 1 (#2615), on the ensemble recovery started with;
- an entry is absent once (Qw - Qa) + 1 bookies of its write set say so; a read that
  can neither find nor rule out an entry (timeouts) aborts recovery instead of closing;
- entries found are written back to their whole write quorum with the recovery flag,
  then the ledger is CLOSED by CAS; concurrent recoveries converge on one last entry.
"""
from __future__ import annotations

import asyncio

from embedlog._native.format import decode_entry, master_key, parse_entry_header
from embedlog.errors import (BadVersionError, EmbedlogError, LedgerRecoveryError,
                             NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError)
from embedlog.meta.api import LedgerState
from embedlog.net import protocol as P

_ABSENT = (NoSuchEntryError, NoSuchLedgerError)


def _settle(tasks) -> None:
    """Cancel the reads still running once the answer is known. Their errors are looked at,
    so asyncio does not report them as unhandled: one that already failed, and one whose
    answer arrives as it is cancelled (wait_for then returns the answer, not CancelledError)."""
    for t in tasks:
        if not t.done():
            t.cancel()
        t.add_done_callback(_retrieve)


def _retrieve(task) -> None:
    if not task.cancelled():
        task.exception()


def _quorum_covered(md, ensemble, answered: set) -> bool:
    """Every write quorum of the ensemble has (Qw - Qa) + 1 members in ``answered``."""
    need = md.write_quorum - md.ack_quorum + 1
    e = md.ensemble_size
    for start in range(e):
        wq = [ensemble[(start + k) % e] for k in range(md.write_quorum)]
        if sum(1 for b in wq if b in answered) < need:
            return False
    return True


async def recover(ctx, versioned, password: bytes):
    """Recover an OPEN or IN_RECOVERY ledger and return its CLOSED metadata."""
    from embedlog.client.write import WriteHandle
    loop = asyncio.get_running_loop()
    lm = ctx.metadata.ledger_manager
    md, version = versioned.value, versioned.version
    lid = md.ledger_id
    for _ in range(64):
        if md.state == LedgerState.CLOSED:
            return md
        if md.state == LedgerState.OPEN:
            try:
                v = await loop.run_in_executor(None, lm.write_ledger_metadata,
                                               md.with_(state=LedgerState.IN_RECOVERY), version)
                md, version = v.value, v.version
            except BadVersionError:
                v = await loop.run_in_executor(None, lm.read_ledger_metadata, lid)
                md, version = v.value, v.version
                continue
        break
    key = master_key(password)
    scope, ledger = lid.scope_id, lid.ledger_id
    first_of_last, ensemble = md.fragments[-1]
    timeout = ctx.config.read_timeout_s

    # 1. fence the last fragment and learn the LAC (a fencing LAC read)
    answered, lacs = set(), []

    async def fence(b):
        try:
            resp = await ctx.call(b, lambda rid: P.read_lac_request(rid, scope, ledger, P.FLAG_FENCE, key),
                                  timeout)
            lacs.append(P.parse_read_lac_body(resp.body)[0])
            answered.add(b)
        except _ABSENT:
            answered.add(b)          # never saw the ledger: fenced by creating it empty
        except UnauthorizedAccessError:
            raise
        except EmbedlogError:
            pass

    await asyncio.gather(*(fence(b) for b in set(ensemble)))
    if not _quorum_covered(md, ensemble, answered):
        raise LedgerRecoveryError(
            f"could not fence ledger {lid!r}: too few bookies of the last fragment answered "
            f"({sorted(answered)} of {list(ensemble)})")
    start = max(max(lacs, default=-1), first_of_last - 1)

    # 2. read forward with fencing recovery reads; 3. write back what is found
    writer = WriteHandle(ctx, type(versioned)(md, version), password, recovery=True)
    writer._lac, writer._next = start, start + 1
    need_absent = md.write_quorum - md.ack_quorum + 1
    eid = start + 1
    last, last_length = start, None
    futures, waited = [], 0
    while True:
        ws = [ensemble[(eid + k) % md.ensemble_size] for k in range(md.write_quorum)]
        found, absent, failed = None, 0, 0

        async def rread(b, e=eid):
            resp = await ctx.call(b, lambda rid: P.read_request(rid, scope, ledger, e, flags=P.FLAG_FENCE,
                                                                 master_key=key), timeout)
            _lac, entries = P.parse_read_body(resp.body)
            if not entries:
                raise NoSuchEntryError(f"no entry {e}")
            return entries[0][1]

        tasks = [asyncio.ensure_future(rread(b)) for b in ws]
        for fut in asyncio.as_completed(tasks):
            try:
                data = await fut
                decode_entry(data, scope, ledger, eid, int(md.digest_type),
                             writer._mac_key)          # only an intact copy counts
                found = data
                break
            except _ABSENT:
                absent += 1
                if absent >= need_absent:
                    break
            except EmbedlogError:
                failed += 1
        _settle(tasks)
        if found is None:
            if absent >= need_absent:
                break
            raise LedgerRecoveryError(
                f"recovery of ledger {lid!r} cannot tell whether entry {eid} exists "
                f"({absent} bookies said no, {failed} did not answer); not closing it")
        length = parse_entry_header(found)[5]
        futures.extend(writer.submit_recovered([(eid, found, length)]))
        while len(futures) - waited > 1000:       # bounded write-back in flight
            await asyncio.wrap_future(futures[waited])
            waited += 1
        last, last_length = eid, length
        eid += 1
    for f in futures:
        await asyncio.wrap_future(f)
    if last_length is None:
        last_length = 0 if last < 0 else await _length_of(ctx, md, scope, ledger, last)
    md, version = writer._md, writer._version

    # 4. close by CAS; another recovery may have won: converge on its result
    for _ in range(64):
        if md.state == LedgerState.CLOSED:
            return md            # closed by a concurrent recovery: its last entry is the answer
        try:
            v = await loop.run_in_executor(None, lm.write_ledger_metadata,
                                           md.with_(state=LedgerState.CLOSED, last_entry_id=last,
                                                    length=last_length), version)
            return v.value
        except BadVersionError:
            v = await loop.run_in_executor(None, lm.read_ledger_metadata, lid)
            md, version = v.value, v.version
    raise BadVersionError(f"could not close ledger {lid!r} after recovery")


async def _length_of(ctx, md, scope, ledger, entry_id) -> int:
    """The cumulative length carried by an entry (when recovery wrote nothing back)."""
    from embedlog.client.read import write_set
    for b in write_set(md, entry_id):
        try:
            resp = await ctx.call(b, lambda rid: P.read_request(rid, scope, ledger, entry_id),
                                  ctx.config.read_timeout_s)
            _lac, entries = P.parse_read_body(resp.body)
            if entries:
                return parse_entry_header(entries[0][1])[5]
        except EmbedlogError:
            continue
    raise LedgerRecoveryError(f"cannot read entry {entry_id} to learn the ledger length")
