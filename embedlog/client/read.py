"""Reading a ledger from its bookies: entries by write set, the LAC, long-poll tailing."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Iterator

from embedlog._native.arrowread import packed_arrays, payload_arrays
from embedlog._native.format import decode_entry, mac_key
from embedlog.errors import (EmbedlogError, IllegalOpError, NoSuchEntryError, NoSuchLedgerError,
                             TimeoutError, UnauthorizedAccessError)
from embedlog.meta.api import DigestType, LedgerState
from embedlog.client.scan import binary_array, read_runs
from embedlog.client.schedule import write_set
from embedlog.net import protocol as P

if TYPE_CHECKING:
    from embedlog._native.format import LedgerId
    from embedlog._types import Stop
    from embedlog.meta.api import LedgerMetadata

log = logging.getLogger("embedlog.client")


class LedgerEntry:
    __slots__ = ("ledger_id", "entry_id", "data")

    def __init__(self, ledger_id: LedgerId, entry_id: int, data: bytes):
        self.ledger_id, self.entry_id, self.data = ledger_id, entry_id, data

    def __repr__(self):
        return f"LedgerEntry(entry_id={self.entry_id}, {len(self.data)} bytes)"


async def read_range(ctx, md, mac_key, first: int, last: int) -> list:
    """Checked payloads of first..last, one bytes object each: the client's one ranged read
    (client/scan.py: windows of up to 1024 entries, failing over entry by entry)."""
    out = []
    for run in await read_runs(ctx, md, mac_key, first, last):
        # run by run (each at most 1024 entries and half a frame): the arrays' int32 offsets
        # never overflow, however large the range
        offsets, values = payload_arrays([run], int(md.digest_type))
        view = memoryview(values)
        out.extend(bytes(view[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1))
    return out


async def read_lac(ctx, md, what: str) -> int:
    """The LAC as the bookies of ``md``'s last fragment report it: each is asked, the highest
    answer wins, and a bookie without the ledger or its entries counts as -1. No answer at
    all is a TimeoutError (naming ``what``), or the UnauthorizedAccessError every bookie
    gave. A ledger's readers and a stream's (client/stream_read.py) read it so.

    Never past the entries that exist: not above the last entry any answering bookie holds
    (or the entry before the last fragment's first). A writer's LAC is always below that (its
    entry is on an ack quorum of the fragment); a higher one is a WRITE_LAC no entry backs,
    which would lead readers to entries nobody has."""
    lid = md.ledger_id

    async def one(b):
        try:
            resp = await ctx.call(b, lambda rid: P.read_lac_request(rid, lid.scope_id, lid.ledger_id),
                                  ctx.config.read_timeout_s)
            return P.parse_read_lac_body(resp.body)[:2]
        except (NoSuchLedgerError, NoSuchEntryError):
            return -1, -1
        except EmbedlogError as exc:
            errors.append(exc)
            return None

    errors: list = []
    answers = [a for a in await asyncio.gather(*(one(b) for b in md.fragments[-1][1])) if a is not None]
    if not answers:
        if errors and all(isinstance(e, UnauthorizedAccessError) for e in errors):
            raise errors[0]            # a refused token or certificate says so
        raise TimeoutError(f"no bookie of {what} answered a LAC read"
                           + (f" (last error: {errors[-1]})" if errors else ""))
    lac = max(a[0] for a in answers)
    held = max(max(a[1] for a in answers), md.fragments[-1][0] - 1)
    if lac > held:
        log.debug("%s: LAC %d is past every entry its bookies hold (%d): %d taken", what,
                  lac, held, held)
        return held
    return lac


UNBACKED_POLL_PAUSE_S = 0.1     # a long poll answered with a LAC no entry backs: the pause
                                # before the reader asks again (a bookie answers such a poll
                                # at once, every time)


async def backed_poll_lac(ctx, md, lac: int, previous_lac: int, what: str) -> int:
    """A LAC a long poll answered, above ``previous_lac``, as far as entries back it
    (read_lac); when they back none of it, ``previous_lac`` after UNBACKED_POLL_PAUSE_S."""
    if lac <= previous_lac:
        return lac
    try:
        backed = min(lac, await read_lac(ctx, md, what))
    except EmbedlogError:
        backed = previous_lac
    if backed <= previous_lac:
        await asyncio.sleep(UNBACKED_POLL_PAUSE_S)
        return previous_lac
    return backed


class ReadHandle:
    def __init__(self, ctx: Any, md: LedgerMetadata, password: bytes):
        self._ctx = ctx
        self._md = md
        self.ledger_id = md.ledger_id
        self._scope, self._lid = md.ledger_id.scope_id, md.ledger_id.ledger_id
        self._digest = int(md.digest_type)
        self._mac_key = mac_key(password) if md.digest_type == DigestType.MAC else None
        self._lac = md.last_entry_id if md.state == LedgerState.CLOSED else -1
        if md.state != LedgerState.CLOSED:
            self.read_lac()

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    def close(self) -> None:
        """Nothing to release (connections belong to the client); for ``with``."""

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReadHandle({self.ledger_id!r}, {self._md.state.name}, last_add_confirmed={self._lac})"

    @property
    def length(self) -> int:
        return self._md.length

    @property
    def is_closed(self) -> bool:
        return self._md.state == LedgerState.CLOSED

    # -- LAC -----------------------------------------------------------------------------

    def read_lac(self) -> int:
        """Ask the last fragment's bookies for the LAC; the highest answer wins."""
        if self.is_closed:
            return self._lac
        self._lac = max(self._lac, self._ctx.run(self._read_lac()))
        return self._lac

    async def _read_lac(self) -> int:
        return await read_lac(self._ctx, self._md, f"ledger {self.ledger_id}")

    # -- entries --------------------------------------------------------------------------

    async def _read_one(self, entry_id: int) -> bytes:
        ws = write_set(self._md, entry_id)
        start = entry_id % len(ws)
        last_error: BaseException = NoSuchEntryError(f"no entry {entry_id} in ledger {self.ledger_id}")
        for k in range(len(ws)):
            b = ws[(start + k) % len(ws)]
            try:
                resp = await self._ctx.call(
                    b, lambda rid: P.read_request(rid, self._scope, self._lid, entry_id),
                    self._ctx.config.read_timeout_s)
                _lac, entries = P.parse_read_body(resp.body)
                if not entries or entries[0][0] != entry_id:
                    raise NoSuchEntryError(f"bookie {b} has no entry {entry_id}")
                return decode_entry(entries[0][1], self._scope, self._lid, entry_id,
                                    self._digest, self._mac_key)
            except EmbedlogError as exc:
                # a digest mismatch or a missing entry on one bookie: try the next replica
                last_error = exc
        raise last_error

    async def _read_range(self, first: int, last: int) -> list:
        return await read_range(self._ctx, self._md, self._mac_key, first, last)

    def _check_range(self, first, last, unconfirmed=False):
        if not isinstance(first, int) or not isinstance(last, int):
            raise IllegalOpError("entry ids are integers")
        if first < 0 or last < first:
            raise IllegalOpError(f"bad entry range {first}..{last}")
        if not unconfirmed and last > self._lac:
            raise NoSuchEntryError(f"entry {last} of ledger {self.ledger_id} is past the LAC ({self._lac})")

    def read_entry(self, entry_id: int) -> bytes:
        self._check_range(entry_id, entry_id)
        return self._ctx.run(self._read_one(entry_id))

    def read_batch(self, first: int, last: int) -> list[bytes]:
        self._check_range(first, last)
        return self._ctx.run(self._read_range(first, last))

    async def read_entry_async(self, entry_id: int) -> bytes:
        """read_entry() as a coroutine of the client's event loop (ClientContext.submit;
        embedlog.aio awaits it from the caller's own loop)."""
        self._check_range(entry_id, entry_id)
        return await self._read_one(entry_id)

    async def read_batch_async(self, first: int, last: int) -> list[bytes]:
        """read_batch() as a coroutine of the client's event loop."""
        self._check_range(first, last)
        return await self._read_range(first, last)

    def read_arrow(self, first: int, last: int, packed: bool = False) -> Any:
        """Payloads of entries first..last (inclusive, up to the LAC) as one
        pyarrow.BinaryArray: ranged reads of up to 1024 entries a request, every digest
        checked, one copy of each payload and no Python object per entry
        (embedlog.client.scan). With ``packed``, the rows the entries pack
        (scan.pack_rows' format), in order. Needs pyarrow (the ``spark`` extra)."""
        if packed:
            return binary_array(*self.read_packed(first, last)[:2])
        return binary_array(*payload_arrays(self._runs(first, last), self._digest))

    def read_packed(self, first: int, last: int) -> tuple[Any, Any, Any]:
        """(offsets int32[n + 1], values uint8[m], rows per entry int32[last - first + 1]): the
        n rows packed in entries first..last, as numpy arrays (no pyarrow needed)."""
        return packed_arrays(self._runs(first, last), self._digest)

    def _runs(self, first: int, last: int) -> list:
        self._check_range(first, last)
        return self._ctx.run(read_runs(self._ctx, self._md, self._mac_key, first, last))

    def read(self, first: int, last: int, batch_size: int = 1024) -> Iterator[LedgerEntry]:
        self._check_range(first, last)
        pos = first
        while pos <= last:
            end = min(last, pos + batch_size - 1)
            for i, data in enumerate(self._ctx.run(self._read_range(pos, end))):
                yield LedgerEntry(self.ledger_id, pos + i, data)
            pos = end + 1

    def read_unconfirmed(self, first: int, last: int) -> list[bytes]:
        """Entries past the LAC too (they may not be durable on Qa bookies yet)."""
        self._check_range(first, last, unconfirmed=True)
        return self._ctx.run(self._read_range(first, last))

    def tail(self, start: int = 0, poll_timeout_ms: int = 1000, stop: Stop = None) -> Iterator[LedgerEntry]:
        """Yield entries from ``start`` on as the LAC passes them, long-polling the bookies.

        Ends when the ledger is closed and read to its end, or when ``stop()`` is true."""
        pos = start
        while stop is None or not stop():
            batch = self._ctx.run(self.next_entries(pos, 1024, poll_timeout_ms))
            if batch is None:
                return
            yield from batch
            pos += len(batch)

    async def next_entries(self, start: int, max_count: int = 1024,
                           poll_timeout_ms: int = 1000) -> list[LedgerEntry] | None:
        """The tail's step, a coroutine of the client's event loop: the entries from
        ``start`` up to the LAC (at most ``max_count``); when there are none yet, waits for
        the LAC to pass ``start - 1`` (one long poll of the bookies, up to
        ``poll_timeout_ms``), so it may return []. None once the ledger is closed and
        ``start`` is past its last entry."""
        if start > self._lac:
            if await self._ctx.offload(self._refresh_closed):
                if start > self._lac:
                    return None
            else:
                self._lac = max(self._lac, await self._long_poll(start - 1, poll_timeout_ms))
                if start > self._lac:
                    return []
        end = min(self._lac, start + max_count - 1)
        data = await self._read_range(start, end)
        return [LedgerEntry(self.ledger_id, start + i, d) for i, d in enumerate(data)]

    def _refresh_closed(self) -> bool:
        if self.is_closed:
            return True
        v = self._ctx.metadata.ledger_manager.read_ledger_metadata(self.ledger_id)
        if v.value.state == LedgerState.CLOSED:
            self._md = v.value
            self._lac = v.value.last_entry_id
            return True
        self._md = v.value
        return False

    async def _long_poll(self, previous_lac: int, timeout_ms: int) -> int:
        bookies = self._md.fragments[-1][1]

        async def one(b):
            try:
                resp = await self._ctx.call(
                    b, lambda rid: P.read_request(rid, self._scope, self._lid, previous_lac + 1,
                                                  flags=P.FLAG_LONG_POLL, previous_lac=previous_lac,
                                                  timeout_ms=timeout_ms),
                    self._ctx.config.read_timeout_s + timeout_ms / 1000.0)
                return P.parse_read_body(resp.body)[0]
            except EmbedlogError:
                return -1

        tasks = [asyncio.ensure_future(one(b)) for b in bookies]
        best = -1
        try:
            for fut in asyncio.as_completed(tasks):
                lac = await fut
                if lac > previous_lac:
                    # an answer is taken as far as entries back it; one they do not back at
                    # all (a WRITE_LAC past the entries) waits for the other bookies' answers
                    lac = await backed_poll_lac(self._ctx, self._md, lac, previous_lac,
                                                f"ledger {self.ledger_id}")
                best = max(best, lac)
                if best > previous_lac:
                    break
        finally:
            for t in tasks:
                t.cancel()
        return best
