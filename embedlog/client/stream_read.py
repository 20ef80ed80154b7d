"""Reading a stream, as anyone may: the LAC, rows by position (a link's rows read from its
ledger), Arrow batches, the position of a time, tailing. Every read checks that the
fragments it read from are still the stream's once it is done (a take-over may have
replaced a bookie holding an older term's dirty copy)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Iterator

from embedlog._native.arrowread import stream_arrays
from embedlog._native.format import mac_key
from embedlog.client.read import ReadHandle, backed_poll_lac, read_lac
from embedlog.client.scan import binary_array, read_runs
from embedlog.client.schedule import write_set
from embedlog.client.stream_format import StreamBatch, StreamEntry, StreamLink, link_fields
from embedlog.errors import (CorruptedDataError, EmbedlogError, IllegalOpError, NoSuchEntryError,
                             NoSuchLedgerError)
from embedlog.meta.api import DigestType
from embedlog.net import protocol as P

if TYPE_CHECKING:
    from embedlog._types import Stop


class StreamReading:
    """The reads of a Stream (client/stream.py), which supplies ``name``, ``_ctx``, ``_md``
    (the metadata last read), ``_password``, ``_lac`` (the highest LAC seen) and
    ``refresh()``."""

    # -- reading --------------------------------------------------------------------------------

    def last_position(self) -> int:
        """The highest committed position (the stream's LAC), -1 if none."""
        self._lac = max(self._lac, self._ctx.run(self._read_lac()))
        return self._lac

    async def _read_lac(self) -> int:
        return await read_lac(self._ctx, self._md, f"stream {self.name!r}")

    def read(self, from_position: int = 0, to_position: int | None = None,
             batch: int = 1024) -> Iterator[StreamEntry]:
        """Rows from ``from_position`` up to ``to_position`` (default: the LAC now), in
        position order, a link's rows in their ledger's order (StreamEntry)."""
        md = self.refresh()
        if from_position < md.first_entry_id:
            raise NoSuchEntryError(f"stream {self.name!r}: position {from_position} is gone "
                                   f"(retention); the stream starts at {md.first_entry_id}")
        last = self.last_position() if to_position is None else min(to_position, self.last_position())
        pos = from_position
        while pos <= last:
            end = min(last, pos + batch - 1)
            digest, runs = self._runs_checked(pos, end)
            positions, times, timed, offsets, values, links = stream_arrays(runs, digest)
            k = 0
            for i in range(len(positions)):
                p = int(positions[i])
                while k < len(links) and links[k][0] < p:
                    yield from self._linked_rows(StreamLink(*link_fields(links[k])))
                    k += 1
                yield StreamEntry(p, values[offsets[i]:offsets[i + 1]].tobytes(),
                                  int(times[i]) if timed[i] else None)
            for link in links[k:]:
                yield from self._linked_rows(StreamLink(*link_fields(link)))
            pos = end + 1

    def read_arrow(self, first: int, last: int) -> StreamBatch:
        """Positions first..last (inclusive, at or below the LAC) in one ranged read: the plain
        rows as a pyarrow.RecordBatch (no Python object per entry, every digest checked) and
        the links, whose rows the caller reads from their ledgers (``ReadHandle.read_arrow``).
        Needs pyarrow (the ``spark`` extra)."""
        import pyarrow as pa          # optional: only Arrow reads need it (spark extra)
        md = self.refresh()
        if first < md.first_entry_id:
            raise NoSuchEntryError(f"stream {self.name!r}: position {first} is gone (retention); "
                                   f"the stream starts at {md.first_entry_id}")
        if last > self._lac and last > self.last_position():
            raise NoSuchEntryError(f"stream {self.name!r}: position {last} is past the LAC ({self._lac})")
        digest, runs = self._runs_checked(first, last)
        positions, times, timed, offsets, values, links = stream_arrays(runs, digest)
        stamp = pa.timestamp("ms", tz="UTC")
        rows = pa.RecordBatch.from_arrays(
            [pa.array(positions), pa.array(times, stamp, mask=~timed), binary_array(offsets, values)],
            names=["position", "timestamp", "data"])
        return StreamBatch(rows, [StreamLink(*link_fields(t)) for t in links])

    def position_at(self, timestamp_ms: int) -> int:
        """The first position appended at or after ``timestamp_ms`` (ms since the epoch), or
        the LAC + 1 when none was: a binary search over positions, a few point reads.
        Positions written before entries had times count as older than any time. It assumes
        append times do not go backwards from one position to the next: each writer keeps
        its own in order; writers that take over from one another need clocks in step."""
        if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
            raise IllegalOpError(f"a time is an int of ms since the epoch, got {timestamp_ms!r}")
        lo, hi = self.refresh().first_entry_id, self.last_position() + 1
        while lo < hi:
            mid = (lo + hi) // 2
            found = self._first_time_from(mid, hi - 1)
            if found is None or found[0] >= timestamp_ms:
                hi = mid
            else:
                lo = found[1] + 1
        return lo

    def _first_time_from(self, first: int, last: int):
        """(append time, position) of the first row at or after ``first`` (no-ops have none)."""
        pos = first
        while pos <= last:
            end = min(last, pos + 15)
            digest, runs = self._runs_checked(pos, end)
            positions, times, timed, _o, _v, links = stream_arrays(runs, digest)
            found = [(int(p), int(t) if ok else -1) for p, t, ok in zip(positions, times, timed)]
            found += [(link[0], link[1]) for link in links]
            if found:
                p, t = min(found)
                return t, p
            pos = end + 1
        return None

    def _linked_rows(self, link: StreamLink):
        h = self._linked_handle(link)
        if not link.packed:
            for e in h.read(link.first, link.last):
                yield StreamEntry(link.position, e.data, link.timestamp, e.entry_id - link.first)
            return
        index = 0
        for lo in range(link.first, link.last + 1, 64):
            offsets, values, _per_entry = h.read_packed(lo, min(link.last, lo + 63))
            for i in range(len(offsets) - 1):
                yield StreamEntry(link.position, values[offsets[i]:offsets[i + 1]].tobytes(),
                                  link.timestamp, index)
                index += 1
        if index != link.rows:
            raise CorruptedDataError(f"stream {self.name!r}: the link at position {link.position} "
                                     f"names {link.rows} rows; its entries pack {index}")

    def _linked_handle(self, link: StreamLink) -> ReadHandle:
        try:
            md = self._ctx.metadata.ledger_manager.read_ledger_metadata(link.ledger_id).value
        except NoSuchLedgerError:
            raise NoSuchLedgerError(f"stream {self.name!r}: the ledger linked at position "
                                    f"{link.position} ({link.ledger_id.qualified_name}) was deleted") from None
        return ReadHandle(self._ctx, md, self._password)

    def _runs_checked(self, first: int, last: int) -> tuple:
        """(digest code, checked runs of positions first..last), read on the fragments the
        store still holds once the read is done. A take-over may have committed a fragment
        meanwhile that replaced a bookie holding an older term's dirty copy of these
        positions; such copies are never served."""
        mk = mac_key(self._password) if self._md.digest_type == DigestType.MAC else None
        for _ in range(16):
            md = self._md
            runs = self._ctx.run(read_runs(self._ctx, md, mk, first, last))
            fresh = self.refresh()
            if fresh.fragments == md.fragments or all(
                    write_set(md, e) == write_set(fresh, e) for e in range(first, last + 1)):
                return int(md.digest_type), runs
        raise EmbedlogError(f"stream {self.name!r}: its fragments kept changing during a read")

    def tail(self, from_position: int = 0, poll_timeout_ms: int = 500,
             stop: Stop = None) -> Iterator[StreamEntry]:
        """Data entries from ``from_position`` on, waiting for new ones (until ``stop()``)."""
        pos = from_position
        while stop is None or not stop():
            last = self.last_position()
            if pos <= last:
                for e in self.read(pos, last):
                    yield e
                pos = last + 1
                continue
            self._ctx.run(asyncio.sleep(0))
            self._lac = max(self._lac, self._ctx.run(self._long_poll(pos - 1, poll_timeout_ms)))
            if self._lac < pos:
                self.refresh()          # the last fragment may have rolled over

    def wait_for(self, position: int, timeout_ms: int = 500) -> int:
        """Wait until ``position`` is committed (a long poll of the last fragment's
        bookies), at most ``timeout_ms``; returns the highest LAC seen (below ``position``
        when it timed out)."""
        if self._lac < position:
            self._lac = max(self._lac, self._ctx.run(self._long_poll(position - 1, timeout_ms)))
            if self._lac < position:
                self.refresh()          # the last fragment may have rolled over
        return self._lac

    async def _long_poll(self, previous_lac: int, timeout_ms: int) -> int:
        md = self._md

        async def one(b):
            try:
                resp = await self._ctx.call(b, lambda rid: P.read_request(
                    rid, md.ledger_id.scope_id, md.ledger_id.ledger_id, previous_lac + 1,
                    flags=P.FLAG_LONG_POLL, previous_lac=previous_lac, timeout_ms=timeout_ms),
                    self._ctx.config.read_timeout_s + timeout_ms / 1000.0)
                return P.parse_read_body(resp.body)[0]
            except EmbedlogError:
                return -1

        results = await asyncio.gather(*(one(b) for b in md.fragments[-1][1]))
        # only as far as entries back it: a WRITE_LAC past them would lead the tail astray
        return await backed_poll_lac(self._ctx, md, max(results), previous_lac,
                                     f"stream {self.name!r}")
