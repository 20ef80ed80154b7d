"""Ledger recovery as a reader: fence, find the last entry, write it back, close.

Seed 004 plus what BookKeeper learned later (BOOKKEEPER.md sections 2.4 and 6;
docs/PROTOCOL.md, "Recovery"):

- the metadata goes to IN_RECOVERY first, then the last fragment's bookies are fenced;
  fencing is done, and recovery goes on, as soon as (Qw - Qa) + 1 bookies of every write
  quorum have answered (a hung bookie does not hold it up, as in BookKeeper);
- recovery reads fence too, and the read forward starts no lower than the last
  fragment's first entry - 1, on the ensembles committed before recovery began;
- an entry is absent once (Qw - Qa) + 1 bookies of its write set say so; a read that
  can neither find nor rule out an entry (timeouts) aborts recovery instead of closing;
- the read forward starts at the highest LAC the fencing answers give whose entry recovery
  can read (an intact copy): a LAC no bookie's entries back (a WRITE_LAC past the entries,
  sent by anyone with the ledger's key) is ignored and logged, as BookKeeper's recovery,
  which starts from the LAC in the entries and never from an explicit one, ends at the
  last entry it can read;
- entries found are written back to their write quorum with the recovery flag. Ensemble
  changes the write-back needs stay in memory and are written with the CLOSED state in
  one CAS: a recovery that fails leaves the metadata as it found it (BOOKKEEPER-355);
- concurrent recoveries converge on the one that closed first.

Streams (stream.py) recover the same way at the start of every term, with the term in
place of the fence flag.
"""
from __future__ import annotations

import asyncio
import logging

from embedlog._native.format import decode_entry, mac_key, master_key, parse_entry_header
from embedlog.errors import (EmbedlogError, InvalidTermError, LedgerRecoveryError,
                             NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError)
from embedlog.meta.api import DigestType, LedgerState, Versioned
from embedlog.client.schedule import quorum_covered, write_set
from embedlog.client.lifecycle import begin_recovery, close_recovered
from embedlog.client.write import WriteHandle
from embedlog.net import protocol as P

log = logging.getLogger("embedlog.client")

ABSENT = (NoSuchEntryError, NoSuchLedgerError)
FATAL = (UnauthorizedAccessError, InvalidTermError)    # recovery cannot go on at all
READ_AHEAD = 8                 # entries read at once while looking for the end
WRITE_BACK_IN_FLIGHT = 1000    # entries written back and not yet acknowledged


def settle(tasks) -> None:
    """Let tasks whose answer is no longer needed run out (a fence still reaching a bookie
    is useful) and look at their errors, so asyncio does not report them as unhandled."""
    for t in tasks:
        t.add_done_callback(_retrieve)


def cancel(tasks) -> None:
    for t in tasks:
        if not t.done():
            t.cancel()
    settle(tasks)


def _retrieve(task) -> None:
    if not task.cancelled():
        task.exception()


async def fence(ctx, md, build) -> list:
    """Send ``build`` (a fencing or term-carrying LAC read) to every bookie of the last
    fragment; return the LACs answered once the answers cover every write quorum. A bookie
    that never saw the ledger counts as fenced (it has nothing; its LAC is -1)."""
    ensemble = md.fragments[-1][1]
    timeout = ctx.config.read_timeout_s

    async def one(b):
        try:
            resp = await ctx.call(b, build, timeout)
            return b, P.parse_read_lac_body(resp.body)[0]
        except ABSENT:
            return b, -1

    tasks = {asyncio.ensure_future(one(b)) for b in set(ensemble)}
    answered, lacs, errors = set(), [], []
    waiting = set(tasks)
    try:
        while waiting and not quorum_covered(md, ensemble, answered):
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                exc = t.exception()
                if isinstance(exc, FATAL):
                    raise exc
                if exc is not None:
                    errors.append(str(exc))
                    continue
                b, lac = t.result()
                answered.add(b)
                lacs.append(lac)
    finally:
        settle(tasks)              # the rest go on fencing their bookies
    if not quorum_covered(md, ensemble, answered):
        raise LedgerRecoveryError(
            f"could not fence ledger {md.ledger_id}: too few bookies of the last fragment "
            f"answered ({sorted(answered)} of {list(ensemble)}; {errors})")
    return lacs


async def read_for_recovery(ctx, md, eid: int, build, mac) -> bytes | None:
    """Entry ``eid`` as recovery sees it, on the write set the committed metadata gives:
    an intact copy from any bookie, or None once (Qw - Qa) + 1 of them say they have none."""
    ws = write_set(md, eid)
    need_absent = md.write_quorum - md.ack_quorum + 1
    scope, ledger = md.ledger_id.scope_id, md.ledger_id.ledger_id

    async def one(b):
        resp = await ctx.call(b, lambda rid: build(rid, eid), ctx.config.read_timeout_s)
        entries = P.parse_read_body(resp.body)[1]
        if not entries or entries[0][0] != eid:
            raise NoSuchEntryError(f"no entry {eid}")
        data = entries[0][1]
        decode_entry(data, scope, ledger, eid, int(md.digest_type), mac)   # only an intact copy counts
        return data

    tasks = [asyncio.ensure_future(one(b)) for b in ws]
    absent, failed = 0, []
    try:
        for fut in asyncio.as_completed(tasks):
            try:
                return await fut
            except FATAL:
                raise
            except ABSENT:
                absent += 1
                if absent >= need_absent:
                    return None
            except EmbedlogError as exc:
                failed.append(str(exc))
    finally:
        cancel(tasks)
    raise LedgerRecoveryError(
        f"recovery of ledger {md.ledger_id} cannot tell whether entry {eid} exists "
        f"({absent} bookies said no, {len(failed)} failed: {failed})")


async def backed_start(ctx, md, lacs, build, mac) -> tuple[int, bytes | None]:
    """Where recovery reads forward from: the highest of ``lacs`` (the fencing answers)
    whose entry is not absent, with that entry when it was read; the last fragment's first
    entry - 1 and None when there is none above it. An entry is read only where a LAC is
    above that floor, one per distinct LAC from the top: a LAC the writer sent is always
    backed (its entry is on an ack quorum), a higher one is a WRITE_LAC no entry backs and
    would otherwise end recovery on an entry it cannot read, for ever."""
    floor = md.fragments[-1][0] - 1
    for lac in sorted({x for x in lacs if x > floor}, reverse=True):
        try:
            data = await read_for_recovery(ctx, md, lac, build, mac)
        except LedgerRecoveryError:
            # its bookies cannot tell (timeouts): the LAC is taken; only an entry they
            # agree is absent marks a LAC no entry backs
            return lac, None
        if data is not None:
            return lac, data
        log.warning("recovery of ledger %s: ignoring LAC %d, which no bookie's entries back "
                    "(entry %d is on none of its write set)", md.ledger_id, lac, lac)
    return floor, None


def start_length(start: int, data: bytes | None) -> int | None:
    """The ledger's length at entry ``start`` when backed_start read it, else None."""
    return None if data is None else parse_entry_header(data)[5]


async def read_forward(ctx, md, writer, start: int, build, mac) -> tuple[int, int | None]:
    """Read entries after ``start`` until one is absent, writing each back through
    ``writer`` (a recovery WriteHandle); returns (last entry, its length or None when
    nothing was found) once every write-back is acknowledged."""
    futures, waited = [], 0
    last, last_length = start, None
    eid = start + 1
    reads: dict = {}
    try:
        while True:
            for e in range(eid, eid + READ_AHEAD):
                if e not in reads:
                    reads[e] = asyncio.ensure_future(read_for_recovery(ctx, md, e, build, mac))
            data = await reads.pop(eid)
            if data is None:
                break
            last, last_length = eid, parse_entry_header(data)[5]
            futures.extend(writer.submit_recovered([(eid, data, last_length)]))
            while len(futures) - waited > WRITE_BACK_IN_FLIGHT:
                await asyncio.wrap_future(futures[waited])
                waited += 1
            eid += 1
    finally:
        cancel(reads.values())
    for f in futures[waited:]:
        await asyncio.wrap_future(f)
    return last, last_length


async def recover(ctx, versioned, password: bytes):
    """Recover an OPEN or IN_RECOVERY ledger and return its CLOSED metadata."""
    lm = ctx.metadata.ledger_manager
    v = await ctx.offload(begin_recovery, versioned, ctx.write_metadata_sync, lm.read_ledger_metadata)
    md, version = v.value, v.version
    lid = md.ledger_id
    if md.state == LedgerState.CLOSED:
        return md
    base = md                    # the fragments committed before recovery began
    key = master_key(password)
    mac = mac_key(password) if md.digest_type == DigestType.MAC else None
    scope, ledger = lid.scope_id, lid.ledger_id

    # 1. fence the last fragment and learn the LAC (fencing LAC reads), one an entry backs
    lacs = await fence(ctx, md, lambda rid: P.read_lac_request(rid, scope, ledger, P.FLAG_FENCE, key))
    read = lambda rid, e: P.read_request(rid, scope, ledger, e, flags=P.FLAG_FENCE,  # noqa: E731
                                         master_key=key)
    start, start_data = await backed_start(ctx, md, lacs, read, mac)

    # 2. read forward with fencing reads, 3. write back what is found
    writer = WriteHandle(ctx, Versioned(md, version), password, recovery=True)
    writer.start_recovered_range(start, 0)
    try:
        last, last_length = await read_forward(ctx, md, writer, start, read, mac)
        if last_length is None:
            last_length = start_length(start, start_data)
        if last_length is None:
            last_length = 0 if last < 0 else await _length_of(ctx, md, last)
        await ctx.offload(ctx.failpoint, "client.recovery.before_close")

        # 4. close by CAS, with the write-back's ensemble changes; converge on a winner
        return await ctx.offload(close_recovered, base, writer.local_metadata, version, last,
                                 last_length, ctx.write_metadata_sync, lm.read_ledger_metadata)
    finally:
        writer.abandon(LedgerRecoveryError(f"recovery of ledger {lid} is over"))


async def _length_of(ctx, md, entry_id: int) -> int:
    """The cumulative length carried by an entry (when recovery wrote nothing back)."""
    return parse_entry_header(await read_raw(ctx, md, entry_id))[5]


async def read_raw(ctx, md, entry_id: int) -> bytes:
    """One stored copy of an entry, as the bookie holds it (header included)."""
    scope, ledger = md.ledger_id.scope_id, md.ledger_id.ledger_id
    for b in write_set(md, entry_id):
        try:
            resp = await ctx.call(b, lambda rid: P.read_request(rid, scope, ledger, entry_id),
                                  ctx.config.read_timeout_s)
            entries = P.parse_read_body(resp.body)[1]
            if entries:
                return entries[0][1]
        except EmbedlogError:
            continue
    raise LedgerRecoveryError(f"cannot read entry {entry_id} of {md.ledger_id}")
