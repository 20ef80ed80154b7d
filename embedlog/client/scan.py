"""Ranged reads for scans: a ledger's entries first..last as checked READ responses.

The bookie's READ takes a count and answers with the contiguous run of entries it holds
(up to its MAX_READ_ENTRIES, 1024, and at most half a frame). Where a fragment's write
quorum is its whole ensemble (E == Qw: streams and the ledgers embedlog.spark writes) one
bookie holds every entry, so a window of 1024 entries is one request, to a replica chosen
in rotation so that windows in flight spread over the ensemble. Each entry's ids and
digest are checked in place, in the frame it came in (embedlog._native.arrowread); a
window that comes back short (a bookie missing entries, a bad copy, a striped fragment
where E > Qw) is finished from the next replica, then one entry at a time over the
entry's write set, and fails only when no replica has a good copy.

The result is a list of *runs* (READ body, first entry id, count) in entry order. The
arrowread builders turn runs into the two buffers of a pyarrow BinaryArray (one copy of
each payload, no Python object per entry); ``binary_array`` wraps them for pyarrow.
"""
from __future__ import annotations

import asyncio

import numpy as np

from embedlog._native import arrowread
from embedlog._native.format import decode_entry
from embedlog.client.schedule import MAX_READ_ENTRIES, fragment_index, fragment_last, write_set
from embedlog.errors import EmbedlogError, NoSuchEntryError
from embedlog.meta.api import LedgerState
from embedlog.net import protocol as P

WINDOW_ENTRIES = MAX_READ_ENTRIES   # the most entries a bookie returns for one READ
WINDOW_BYTES = 1 << 20         # a window of large entries holds about this much
WINDOWS_IN_FLIGHT = 4          # per read: about 4 MiB in flight


def _window_entries(md) -> int:
    """Entries per window: 1024, fewer for a closed ledger of large entries (its length
    tells their mean size), so that big entries still spread over the replicas."""
    if md.state != LedgerState.CLOSED or md.last_entry_id < 0 or md.length <= 0:
        return WINDOW_ENTRIES
    mean = md.length / (md.last_entry_id + 1)
    return max(1, min(WINDOW_ENTRIES, int(WINDOW_BYTES // max(1.0, mean))))


def _windows(md, first: int, last: int) -> list:
    """(lo, hi) windows that never cross a fragment boundary."""
    size = _window_entries(md)
    out = []
    pos = first
    while pos <= last:
        end = min(last, pos + size - 1)
        frag_end = fragment_last(md, fragment_index(md, pos))
        if frag_end is not None:
            end = min(end, frag_end)
        out.append((pos, end))
        pos = end + 1
    return out


async def read_run(ctx, md, bookie: str, first: int, count: int):
    scope, ledger = md.ledger_id.scope_id, md.ledger_id.ledger_id
    resp = await ctx.call(bookie, lambda rid: P.read_request(rid, scope, ledger, first, count),
                          ctx.config.read_timeout_s)
    return resp.body


async def _one_entry(ctx, md, mac_key, eid: int) -> tuple:
    """A run of the single entry ``eid`` from any replica of its write set."""
    scope, ledger = md.ledger_id.scope_id, md.ledger_id.ledger_id
    digest = int(md.digest_type)
    ws = write_set(md, eid)
    error: BaseException = NoSuchEntryError(f"no entry {eid} in ledger {md.ledger_id}")
    for k in range(len(ws)):
        try:
            body = await read_run(ctx, md, ws[(eid + k) % len(ws)], eid, 1)
        except EmbedlogError as exc:
            error = exc
            continue
        if arrowread.verify_run(body, scope, ledger, eid, eid, digest, mac_key) == 1:
            return (body, eid, 1)
        entries = P.parse_read_body(body)[1]
        if entries and entries[0][0] == eid:
            try:          # the per-entry decoder says what is wrong with this copy
                decode_entry(entries[0][1], scope, ledger, eid, digest, mac_key)
            except EmbedlogError as exc:
                error = exc
    raise error


async def _window(ctx, md, mac_key, lo: int, hi: int) -> list:
    scope, ledger = md.ledger_id.scope_id, md.ledger_id.ledger_id
    digest = int(md.digest_type)
    runs = []
    pos = lo
    if md.write_quorum == md.ensemble_size:        # every bookie of the fragment holds every entry
        ws = write_set(md, lo)
        start = lo // max(1, hi - lo + 1)
        for k in range(len(ws)):
            b = ws[(start + k) % len(ws)]
            while pos <= hi:       # a bookie answers at most half a frame: ask it again for the rest
                try:
                    body = await read_run(ctx, md, b, pos, hi - pos + 1)
                except EmbedlogError:
                    break
                n = arrowread.verify_run(body, scope, ledger, pos, hi, digest, mac_key)
                if n == 0:
                    break
                runs.append((body, pos, n))
                pos += n
            if pos > hi:
                return runs
    # a striped fragment, or what no replica answered in one run: entry by entry
    runs.extend(await asyncio.gather(*(_one_entry(ctx, md, mac_key, e) for e in range(pos, hi + 1))))
    return runs


async def read_runs(ctx, md, mac_key, first: int, last: int) -> list:
    """Checked runs covering entries first..last (inclusive) of the ledger ``md`` describes,
    in entry order; the caller has checked that ``last`` is confirmed (at or below the LAC)."""
    if last < first:
        return []
    sem = asyncio.Semaphore(WINDOWS_IN_FLIGHT)

    async def one(lo, hi):
        async with sem:
            return await _window(ctx, md, mac_key, lo, hi)

    parts = await asyncio.gather(*(one(lo, hi) for lo, hi in _windows(md, first, last)))
    return [r for p in parts for r in p]


def binary_array(offsets, values):
    """A pyarrow.BinaryArray over the buffers arrowread built (no copy)."""
    import pyarrow as pa          # optional: only scans that return Arrow need it (spark extra)
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(values)])


PACK_BYTES = 256 * 1024        # a packed entry holds rows up to about this much


def pack_rows(column, max_bytes: int = PACK_BYTES):
    """Entry payloads packing the rows of a pyarrow binary (or string) array, in order:
    ``count:u32 size:u32[count] rows`` (embedlog._native.arrowread), each at most
    ``max_bytes`` unless one row alone is larger. Yields (payload, rows in it). Appending
    them to a ledger and linking it with ``Stream.append_links(..., packed=True)`` pays the
    per-entry costs of the add and read paths once per payload instead of once per row."""
    import pyarrow as pa          # optional: the caller holds an Arrow array (spark extra)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) \
            or pa.types.is_large_binary(column.type):
        column = column.cast(pa.binary())
    n = len(column)
    if n == 0:
        return
    _validity, offs_buf, vals_buf = column.buffers()
    offsets = np.frombuffer(offs_buf, np.int32)[column.offset:column.offset + n + 1]
    values = np.frombuffer(vals_buf, np.uint8) if vals_buf is not None else np.empty(0, np.uint8)
    start = 0
    while start < n:
        payload, end = arrowread.pack_rows(offsets, values, start, n, max_bytes)
        yield payload, end - start
        start = end
