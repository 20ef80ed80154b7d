"""A stream's entries: the kind byte each payload starts with and the records after it
(docs/STREAMS.md, "Entries"; arrowread.pyx reads them), and the rows readers get: a
StreamEntry per row, a StreamLink per link, a StreamBatch per Arrow read."""
from __future__ import annotations

import struct

from embedlog._native import arrowread
from embedlog._native.format import LedgerId

# the kind byte a stream entry's payload starts with, as the prefix a writer puts there: the
# values are arrowread.pyx's, whose grammar reads them (docs/STREAMS.md, "Entries")
KIND_UNTIMED, KIND_NOOP, KIND_DATA, KIND_LINK, KIND_PACKED_LINK = (bytes([kind]) for kind in (
    arrowread.KIND_DATA_UNTIMED, arrowread.KIND_NOOP, arrowread.KIND_DATA, arrowread.KIND_LINK,
    arrowread.KIND_PACKED_LINK))
TIME = struct.Struct(">q")                 # append time, ms since the epoch (kinds 2, 3, 4)
LINK = struct.Struct(">QQqI")              # linked ledger scope, ledger, first entry, count
PACKED_LINK = struct.Struct(">QQqIQ")      # ... and the rows those entries pack
MAX_LINK_ENTRIES = (1 << 32) - 1


class StreamEntry:
    """One row of a stream: ``data`` at ``position``, appended at ``timestamp`` (ms since the
    epoch; None for entries written before entries had times). A link's rows share its
    position and time; ``index`` numbers them (0 for a plain entry)."""
    __slots__ = ("position", "data", "timestamp", "index")

    def __init__(self, position: int, data: bytes, timestamp: int | None = None, index: int = 0):
        self.position, self.data, self.timestamp, self.index = position, data, timestamp, index

    def __repr__(self):
        extra = f", index={self.index}" if self.index else ""
        return f"StreamEntry(position={self.position}{extra}, {len(self.data)} bytes)"


class StreamLink:
    """Entries first..first + count - 1 of the closed ledger ``ledger_id``, linked into a
    stream at ``position`` at ``timestamp`` (ms since the epoch): ``rows`` rows, one per
    entry, or, when ``packed``, the rows those entries pack (embedlog.client.scan)."""
    __slots__ = ("position", "timestamp", "ledger_id", "first", "count", "rows", "packed")

    def __init__(self, position: int, timestamp: int, ledger_id, first: int, count: int,
                 rows: int | None = None, packed: bool = False):
        self.position, self.timestamp, self.first, self.count = position, timestamp, first, count
        self.ledger_id = LedgerId.coerce(ledger_id)
        self.rows = count if rows is None else rows
        self.packed = packed

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def __repr__(self):
        return (f"StreamLink(position={self.position}, {self.ledger_id.qualified_name} "
                f"{self.first}..{self.last})")


class StreamBatch:
    """What ``Stream.read_arrow`` returns: ``rows``, a pyarrow.RecordBatch of the plain
    entries (position int64, timestamp timestamp[ms, UTC] or null, data binary), and
    ``links``, the StreamLinks of the range, whose rows the caller reads from their ledgers."""
    __slots__ = ("rows", "links")

    def __init__(self, rows, links: list):
        self.rows, self.links = rows, links


def link_fields(t: tuple) -> tuple:
    """StreamLink's arguments from arrowread's (position, time, scope, ledger, first, count,
    rows, packed)."""
    position, time_ms, scope, ledger, first, count, rows, packed = t
    return position, time_ms, LedgerId(scope, ledger), first, count, rows, packed
