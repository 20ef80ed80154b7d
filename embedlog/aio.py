"""The asyncio API: the same ledgers and streams as ``embedlog.open`` and ``embedlog.Client``,
awaited from the caller's event loop.

    async with embedlog.aio.open("./data") as log:
        w = await log.create_ledger()
        await w.append(b"event")                 # durable when it returns
        r = await log.open_ledger(w.ledger_id)
        await r.read_entry(0)
        async for e in r.tail():                 # entries as the writer's LAC passes them
            ...

    async with embedlog.aio.Client("zk+hierarchical://127.0.0.1:2181/ledgers") as client:
        s = await client.open_stream("orders")
        await s.append(b"order 1")

Nothing here blocks the caller's loop, and no thread is wrapped around a blocking call: the
work runs where the synchronous API runs it, on the client's own machinery
(ClientContext), and the caller awaits its futures (``asyncio.wrap_future``):

- an append completes the future the write path already completes when the add is
  durable (``append_async``: Qa acknowledgements, or the embedded journal's group commit);
- reads of a cluster's ledgers and the long poll of a tail are the client's coroutines,
  run on its event loop (``ReadHandle.read_batch_async``, ``next_entries``); an embedded
  log's local reads are memory reads (mmap) made in the caller's loop, and its tail runs
  the same client coroutines over the in-process connection to its bookie;
- metadata steps (create, open with recovery, delete, list) and the streams' steps block
  on the metadata store or wait for their writer: they run on the client's worker threads
  (``ClientContext.offload``), where the synchronous API already runs metadata calls.

Handles are async context managers (a writer is closed at the end of the block) and
tails are async iterators; ``aclose()`` (or leaving ``async for``) ends a tail.
"""
from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, Optional

import embedlog
from embedlog.client import Client as SyncClient
from embedlog.errors import IllegalOpError

if TYPE_CHECKING:
    from embedlog._native.format import LedgerId
    from embedlog._types import LedgerRef, Payload
    from embedlog.client.read import LedgerEntry
    from embedlog.client.stream import Stream
    from embedlog.client.stream_format import StreamEntry
    from embedlog.embedded import EmbeddedLog
    from embedlog.meta.api import LedgerMetadata

__all__ = ["open", "Client", "AsyncEmbeddedLog", "AsyncWriteHandle", "AsyncReadHandle",
           "AsyncStream"]

READ_BATCH = 1024                # entries per step of read() and tail()
EMBEDDED_POLL_MS = 200           # an embedded tail's long poll (local adds wake no poller)


class _Bridge:
    """Awaiting the client's machinery from the caller's loop."""

    def __init__(self, ctx):
        self.ctx = ctx

    async def run(self, coro):
        """A coroutine of the client's event loop."""
        return await asyncio.wrap_future(self.ctx.submit(coro))

    async def call(self, fn, *args):
        """A blocking step, on the client's worker threads."""
        return await self.run(self.ctx.offload(fn, *args))


async def _gather_last(futures) -> int:
    results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    return results[-1]


def _take(iterator, n: int) -> list:
    out = []
    for item in iterator:
        out.append(item)
        if len(out) >= n:
            break
    return out


# -- ledgers ----------------------------------------------------------------------------------------

class _Handle:
    """What both async handles show of the synchronous handle underneath."""

    _h = None

    @property
    def ledger_id(self) -> LedgerId:
        return self._h.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._h.last_add_confirmed

    @property
    def handle(self) -> Any:
        """The synchronous handle underneath."""
        return self._h


class AsyncWriteHandle(_Handle):
    """The writer of one ledger; ``await append(data)`` returns the entry id once durable."""

    def __init__(self, handle: Any, bridge: _Bridge):
        self._h = handle
        self._bridge = bridge


    async def append(self, data: Payload) -> int:
        return await asyncio.wrap_future(self._h.append_async(data))

    async def append_many(self, items: Iterable[Payload]) -> int:
        """Append in order; the last entry id once all are durable."""
        items = list(items)
        if not items:
            raise IllegalOpError("append_many needs at least one entry")
        many = getattr(self._h, "append_many_async", None)
        if many is not None:                      # a cluster's writer: one future per entry
            return await _gather_last(many(items))
        # the embedded writer frames a list under one group commit; it waits for it
        return await self._bridge.call(self._h.append_many, items)

    async def close(self) -> None:
        """Close the ledger at its last acknowledged entry."""
        closing = getattr(self._h, "close_async", None)
        if closing is not None:
            await self._bridge.run(closing())
        else:
            await self._bridge.call(self._h.close)

    async def __aenter__(self) -> AsyncWriteHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncWriteHandle({self._h!r})"


class AsyncReadHandle(_Handle):
    """Reads of one ledger: ``await read_entry(i)``, ``await read_batch(a, b)``,
    ``async for e in read(a, b)`` and ``async for e in tail(start)``."""

    def __init__(self, handle: Any, bridge: _Bridge, remote: Any, poll_timeout_ms: int = 1000):
        self._h = handle                # the synchronous ReadHandle
        self._bridge = bridge
        self._remote = remote           # a client ReadHandle (cluster), or a factory of one
        self._poll_timeout_ms = poll_timeout_ms


    async def read_entry(self, entry_id: int) -> bytes:
        if self._h is self._remote:
            return await self._bridge.run(self._h.read_entry_async(entry_id))
        return self._h.read_entry(entry_id)        # embedded: a memory read

    async def read_batch(self, first: int, last: int) -> list[bytes]:
        if self._h is self._remote:
            return await self._bridge.run(self._h.read_batch_async(first, last))
        return self._h.read_batch(first, last)

    async def read(self, first: int, last: int) -> AsyncIterator[_Entry]:
        """Entries (``.entry_id``, ``.data``) first..last inclusive, a batch at a time."""
        pos = first
        while pos <= last:
            end = min(last, pos + READ_BATCH - 1)
            batch = await self.read_batch(pos, end)
            for i, data in enumerate(batch):
                yield _Entry(self.ledger_id, pos + i, data)
            pos = end + 1

    async def read_lac(self) -> int:
        return await self._bridge.call(self._h.read_lac)

    async def tail(self, start: int = 0, poll_timeout_ms: int | None = None) -> AsyncIterator[LedgerEntry]:
        """Entries from ``start`` on as the writer's LAC passes them, long-polling the
        bookies; ends when the ledger is closed and read to its end. (An embedded writer's
        LAC travels in its next entry, as BookKeeper's does without explicit LAC: its last
        entry shows once it writes another or closes the ledger.)"""
        remote = self._remote if self._h is self._remote else await self._bridge.call(self._remote)
        timeout_ms = poll_timeout_ms or self._poll_timeout_ms
        pos = start
        while True:
            batch = await self._bridge.run(remote.next_entries(pos, READ_BATCH, timeout_ms))
            if batch is None:
                return
            for e in batch:
                yield e
            pos += len(batch)

    async def __aenter__(self) -> AsyncReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    def __repr__(self) -> str:
        return f"AsyncReadHandle({self._h!r})"


class _Entry:
    __slots__ = ("ledger_id", "entry_id", "data")

    def __init__(self, ledger_id: LedgerId, entry_id: int, data: bytes):
        self.ledger_id, self.entry_id, self.data = ledger_id, entry_id, data

    def __repr__(self):
        return f"LedgerEntry(entry_id={self.entry_id}, {len(self.data)} bytes)"


# -- streams ------------------------------------------------------------------------------------------

class AsyncStream:
    """A stream (an unbounded ledger): ``await append(data)`` returns the position once
    durable; ``async for e in read(p)`` / ``tail(p)`` yield ``.position`` and ``.data``."""

    def __init__(self, stream: Stream, bridge: _Bridge):
        self._s = stream
        self._bridge = bridge

    @property
    def name(self) -> str:
        return self._s.name

    @property
    def stream(self) -> Stream:
        """The synchronous Stream underneath."""
        return self._s

    async def append(self, data: Payload) -> int:
        # the first append takes the stream over (metadata, recovery): the stream's own
        # steps, on the client's worker threads
        return await self._bridge.call(self._s.append, data)

    async def append_many(self, items: Iterable[Payload]) -> int:
        return await self._bridge.call(self._s.append_many, list(items))

    async def take_over(self) -> int:
        return await self._bridge.call(self._s.take_over)

    async def last_position(self) -> int:
        return await self._bridge.call(self._s.last_position)

    async def truncate_before(self, position: int) -> int:
        return await self._bridge.call(self._s.truncate_before, position)

    async def read(self, from_position: int = 0,
                   to_position: int | None = None) -> AsyncIterator[StreamEntry]:
        it = iter(self._s.read(from_position, to_position))
        while True:
            batch = await self._bridge.call(_take, it, READ_BATCH)
            if not batch:
                return
            for e in batch:
                yield e

    async def tail(self, from_position: int = 0, poll_timeout_ms: int = 500) -> AsyncIterator[StreamEntry]:
        """Entries from ``from_position`` on, waiting for new ones, until the loop that
        iterates stops (``break``, ``aclose()``, cancellation)."""
        stopped = []
        it = iter(self._s.tail(from_position, poll_timeout_ms=poll_timeout_ms,
                               stop=lambda: bool(stopped)))
        try:
            while True:
                batch = await self._bridge.call(_take, it, 1)
                if not batch:
                    return
                yield batch[0]
        finally:
            stopped.append(True)          # the step under way ends within one poll

    async def close(self) -> None:
        """Stop writing (and release the stream when every append was acknowledged)."""
        await self._bridge.call(self._s.close)

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncStream({self._s!r})"


# -- the embedded log ---------------------------------------------------------------------------------

class AsyncEmbeddedLog:
    """``embedlog.open(path)`` for asyncio; an async context manager (closed at the end)."""

    def __init__(self, log: EmbeddedLog):
        self._log = log
        self._bridge = _Bridge(log.client_context())

    @property
    def log(self) -> EmbeddedLog:
        """The synchronous EmbeddedLog underneath."""
        return self._log

    async def create_ledger(self, digest: str = "crc32c", password: bytes | str = b"",
                            scope_id: int = 0) -> AsyncWriteHandle:
        w = await self._bridge.call(self._log.create_ledger, digest, password, scope_id)
        return AsyncWriteHandle(w, self._bridge)

    async def open_ledger(self, ledger_id: LedgerRef, password: bytes | str = b"",
                          recovery: bool = True) -> AsyncReadHandle:
        r = await self._bridge.call(self._log.open_ledger, ledger_id, password, recovery)

        def remote():
            # the tail: the client's read path over the in-process connection to this bookie
            from embedlog.client.read import ReadHandle
            return ReadHandle(self._bridge.ctx, self._log.ledger_metadata(r.ledger_id), password)

        return AsyncReadHandle(r, self._bridge, remote, EMBEDDED_POLL_MS)

    async def delete_ledger(self, ledger_id: LedgerRef) -> None:
        await self._bridge.call(self._log.delete_ledger, ledger_id)

    async def list_ledgers(self, scope_id: int = 0) -> list[LedgerId]:
        return await self._bridge.call(self._log.list_ledgers, scope_id)

    async def open_stream(self, name: str, **options: Any) -> AsyncStream:
        s = await self._bridge.call(lambda: self._log.open_stream(name, **options))
        return AsyncStream(s, self._bridge)

    async def list_streams(self, pattern: str | None = None) -> list[str]:
        return await self._bridge.call(self._log.list_streams, pattern)

    async def delete_stream(self, name: str) -> None:
        await self._bridge.call(self._log.delete_stream, name)

    def statistics(self) -> dict[str, Any]:
        return self._log.statistics()

    async def close(self) -> None:
        # not on the client's workers: closing the log stops them and waits for them
        await asyncio.get_running_loop().run_in_executor(None, self._log.close)

    async def __aenter__(self) -> AsyncEmbeddedLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncEmbeddedLog({self._log.path!r})"


def open(path: str | os.PathLike[str], **config: Any) -> AsyncEmbeddedLog:
    """``embedlog.open(path, **config)`` for asyncio. Opening (which replays the journal)
    happens here, in the calling thread, as a program's start-up; use ``async with`` to close."""
    return AsyncEmbeddedLog(embedlog.open(path, **config))


# -- a cluster --------------------------------------------------------------------------------------

class Client:
    """``embedlog.Client(metadata_uri, **config)`` for asyncio; an async context manager.
    Connecting to the metadata store happens in the constructor, in the calling thread."""

    def __init__(self, metadata_uri: str, **config: Any):
        self._c = SyncClient(metadata_uri, **config)
        self._bridge = _Bridge(self._c.context)

    @property
    def client(self) -> SyncClient:
        """The synchronous Client underneath."""
        return self._c

    @property
    def metadata_uri(self) -> str:
        return self._c.metadata_uri

    async def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                            digest: str = "crc32c", password: bytes | str = b"", scope_id: int = 0,
                            ledger_id: LedgerRef | None = None,
                            custom_metadata: dict[str, bytes | str] | None = None) -> AsyncWriteHandle:
        w = await self._bridge.call(lambda: self._c.create_ledger(
            ensemble_size, write_quorum, ack_quorum, digest, password, scope_id=scope_id,
            ledger_id=ledger_id, custom_metadata=custom_metadata))
        return AsyncWriteHandle(w, self._bridge)

    async def open_ledger(self, ledger_id: LedgerRef, password: bytes | str = b"",
                          recovery: bool = True) -> AsyncReadHandle:
        r = await self._bridge.call(self._c.open_ledger, ledger_id, password, recovery)
        return AsyncReadHandle(r, self._bridge, r)

    async def delete_ledger(self, ledger_id: LedgerRef) -> None:
        await self._bridge.call(self._c.delete_ledger, ledger_id)

    async def list_ledgers(self, scope_id: int | None = 0) -> list[LedgerId]:
        return await self._bridge.call(self._c.list_ledgers, scope_id)

    async def ledger_metadata(self, ledger_id: LedgerRef) -> LedgerMetadata:
        return await self._bridge.call(self._c.ledger_metadata, ledger_id)

    async def open_stream(self, name: str, **options: Any) -> AsyncStream:
        s = await self._bridge.call(lambda: self._c.open_stream(name, **options))
        return AsyncStream(s, self._bridge)

    async def list_streams(self, pattern: str | None = None) -> list[str]:
        return await self._bridge.call(self._c.list_streams, pattern)

    async def delete_stream(self, name: str) -> None:
        await self._bridge.call(self._c.delete_stream, name)

    async def bookie_info(self, bookie_ids: Iterable[str] | None = None,
                          timeout_s: float = 2.0) -> dict[str, Optional[dict[str, Any]]]:
        return await self._bridge.run(self._c.bookie_info_async(bookie_ids, timeout_s))

    async def close(self) -> None:
        # not on the client's workers: closing stops them and waits for them
        await asyncio.get_running_loop().run_in_executor(None, self._c.close)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"embedlog.aio.Client({self._c.metadata_uri!r})"
