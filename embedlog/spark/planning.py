"""Planning a read (driver side): the ledgers and streams it reads, where each starts and ends,
and the splits (Spark's partitions) that cover them.

A split is a list of *segments*: ("range", first, last, follow_links), entries first..last
of the split's ledger or positions of its stream, whose links are read in place unless
the planner listed them; or ("link", position, time_ms, scope, ledger, first, last, rows,
packed), the rows a link makes part of the stream. Planning knows a stream's links only
by reading its entries, which it does for streams that hold links (Stream.has_links):
then splits are cut by rows, links whole. Reading a split is source.py's.
"""
from __future__ import annotations

import logging

import numpy as np
from pyspark.sql.datasource import InputPartition

from embedlog._native.format import LedgerId
from embedlog.client.stream import find_stream
from embedlog.errors import IllegalOpError, NoSuchEntryError, NoSuchLedgerError
from embedlog.spark.commit import COMMIT_LOG_PREFIX, COMMITTED_KEY, JOB_KEY, PACKED_KEY, SCOPE_LOG_PREFIX
from embedlog.spark.options import EARLIEST, LATEST, client_for

log = logging.getLogger("embedlog.spark")

CHUNK_POSITIONS = 8192             # positions (or plain entries) per ranged read


class Split(InputPartition):
    """Rows of one ledger or stream (``stream`` None for a ledger), segment by segment."""

    def __init__(self, scope_id: int, ledger_id: int, stream, segments, packed: bool = False):
        super().__init__((scope_id, ledger_id, stream, tuple(segments), packed))
        self.scope_id, self.ledger_id, self.stream = scope_id, ledger_id, stream
        self.segments, self.packed = tuple(segments), packed

    @property
    def rows(self) -> int:
        """Rows at most (a range counts its positions, some of which may be no-ops)."""
        return sum(_seg_rows(s) for s in self.segments)

    def __repr__(self):
        name = self.stream or LedgerId(self.scope_id, self.ledger_id).qualified_name
        return f"Split({name}, {len(self.segments)} segments, {self.rows} rows)"


def _seg_rows(seg) -> int:
    return seg[2] - seg[1] + 1 if seg[0] == "range" else seg[7]


def data_loss(opts, message: str) -> None:
    """failOnDataLoss: fail with ``message``, or log it and go on."""
    if opts.fail_on_data_loss:
        raise NoSuchEntryError(f"embedlog: {message} (set failOnDataLoss=false to skip what is "
                               "gone and go on)")
    log.warning("embedlog: %s; skipped it (failOnDataLoss=false)", message)


class Source:
    """One ledger or stream to read: its key in offsets, ids, what is readable."""

    def __init__(self, key, lid, stream=None, lowest=0, lac=-1, has_links=False, packed=False):
        self.key, self.lid, self.stream = key, lid, stream
        self.lowest, self.lac, self.has_links, self.packed = lowest, lac, has_links, packed

    @property
    def name(self):
        return self.stream.name if self.stream is not None else None


def resolve_streams(client, opts, missing_ok: bool = False) -> list:
    """Names of the streams the options name; unknown names fail (or, ``missing_ok``, are
    left out: a streaming read waits for them)."""
    if opts.streams:
        names = list(opts.streams)
    else:          # a pattern never picks up the commit logs of Spark writes
        names = [n for n in client.list_streams(opts.stream_pattern)
                 if not n.startswith((COMMIT_LOG_PREFIX, SCOPE_LOG_PREFIX))]
    found = []
    for name in names:
        if find_stream(client.metadata, name)[0] is not None:
            found.append(name)
        elif not missing_ok:
            raise IllegalOpError(f"embedlog: no stream named {name!r} (option streams; a "
                                 f"streaming read waits for it unless failOnMissingStreams=true)"
                                 if opts.fail_on_missing_streams else
                                 f"embedlog: no stream named {name!r} (option streams)")
    return found


def stream_source(client, opts, name: str) -> Source:
    try:
        s = client.open_stream(name, create=False, password=opts.password)
    except NoSuchLedgerError:
        raise IllegalOpError(f"embedlog: stream {name!r} no longer exists") from None
    md = s.refresh()
    return Source(name, s.ledger_id, s, md.first_entry_id, s.last_position(), s.has_links)


def _sources(client, opts) -> list:
    if opts.over_streams:
        return [stream_source(client, opts, n) for n in resolve_streams(client, opts)]
    out = []
    listing = not opts.ledgers
    for lid in opts.ledgers or client.list_ledgers(opts.scope):
        lid = LedgerId.coerce(lid)
        try:
            h = client.open_ledger(lid, opts.password, recovery=False)
        except NoSuchLedgerError:
            if listing:
                continue                  # deleted while listed
            raise IllegalOpError(f"embedlog: no ledger {lid.qualified_name} "
                                 f"(scope {lid.scope_id}, id {lid.ledger_id})") from None
        tags = h.metadata.custom_metadata
        if listing and JOB_KEY in tags and COMMITTED_KEY not in tags and not h.metadata.unbounded:
            continue                      # a Spark job's output that is not committed (yet)
        if h.metadata.unbounded:
            continue                      # streams are read by name
        out.append(Source(lid.qualified_name, lid, None, 0, h.last_add_confirmed,
                           packed=tags.get(PACKED_KEY) == b"1"))
    return out


def check_keys(positions, known, what):
    if isinstance(positions, dict):
        unknown = sorted(set(positions) - set(known))
        if unknown:
            raise IllegalOpError(f"embedlog: option {what} names {unknown}, which the query does not read")


def _at_time(src: Source, time_ms: int, strategy: str | None) -> int:
    pos = src.stream.position_at(time_ms)
    if pos > src.lac and strategy == "error":
        raise IllegalOpError(f"embedlog: stream {src.key!r} has no position appended at or after "
                             f"{time_ms} (startingOffsetsByTimestampStrategy=latest starts such a "
                             "stream at its end instead)")
    return pos


def start_of(src: Source, opts) -> int:
    """The first position (entry) to read of ``src`` as the options say."""
    if src.stream is not None and opts.starting_time_ms is not None:
        return _at_time(src, opts.starting_time_ms, opts.starting_time_strategy)
    if src.stream is not None and opts.starting_times and src.key in opts.starting_times:
        return _at_time(src, opts.starting_times[src.key], opts.starting_time_strategy)
    if isinstance(opts.starting, dict) and src.key in opts.starting:
        v = opts.starting[src.key]
        return src.lowest if v == EARLIEST else src.lac + 1 if v == LATEST else v
    return src.lac + 1 if opts.starting == "latest" else src.lowest


def end_of(src: Source, opts) -> int:
    """The position to stop before (batch reads)."""
    if src.stream is not None and opts.ending_time_ms is not None:
        return src.stream.position_at(opts.ending_time_ms)
    if src.stream is not None and opts.ending_times and src.key in opts.ending_times:
        return src.stream.position_at(opts.ending_times[src.key])
    if isinstance(opts.ending, dict) and src.key in opts.ending and opts.ending[src.key] != LATEST:
        return opts.ending[src.key]
    return src.lac + 1


def _segments(src: Source, first: int, end: int) -> list:
    """Segments of positions first..end - 1, links listed (streams that hold links)."""
    if src.stream is None or not src.has_links:
        return [("range", first, end - 1, True)]
    out = []
    for lo in range(first, end, CHUNK_POSITIONS):
        hi = min(end - 1, lo + CHUNK_POSITIONS - 1)
        got = src.stream.read_arrow(lo, hi)
        positions = got.rows.column("position").to_numpy()
        done = 0
        for link in got.links + [None]:
            stop = len(positions) if link is None else int(np.searchsorted(positions, link.position))
            if stop > done:
                out.append(("range", int(positions[done]), int(positions[stop - 1]), False))
                done = stop
            if link is not None:
                out.append(("link", link.position, link.timestamp, link.ledger_id.scope_id,
                            link.ledger_id.ledger_id, link.first, link.last, link.rows, link.packed))
    return out


def _group(src: Source, segments: list, size: int) -> list:
    """Splits of about ``size`` rows from segments in order (a link is never cut)."""
    splits, cur, rows = [], [], 0

    def flush():
        nonlocal cur, rows
        if cur:
            splits.append(Split(src.lid.scope_id, src.lid.ledger_id, src.name, cur, src.packed))
        cur, rows = [], 0

    for seg in segments:
        if seg[0] == "range":
            a, b = seg[1], seg[2]
            while a <= b:
                take = min(b - a + 1, size - rows)
                cur.append(("range", a, a + take - 1, seg[3]))
                rows += take
                a += take
                if rows >= size:
                    flush()
        else:
            if rows and rows + seg[7] > size:
                flush()
            cur.append(seg)
            rows += seg[7]
            if rows >= size:
                flush()
    flush()
    return splits


def _halve(split: Split):
    segs = split.segments
    if len(segs) > 1:
        half, acc = split.rows / 2, 0
        for k in range(1, len(segs)):
            acc += _seg_rows(segs[k - 1])
            if acc >= half or k == len(segs) - 1:
                break
        parts = (segs[:k], segs[k:])
    elif segs[0][0] == "range" and segs[0][2] > segs[0][1]:
        _r, a, b, follow = segs[0]
        mid = (a + b) // 2
        parts = ((("range", a, mid, follow),), (("range", mid + 1, b, follow),))
    else:
        return None
    return [Split(split.scope_id, split.ledger_id, split.stream, p, split.packed) for p in parts]


def with_min_partitions(splits: list, n: int) -> list:
    """Split the largest splits in two until there are ``n`` (minPartitions), while they can be."""
    splits = list(splits)
    while len(splits) < n:
        if not splits:
            break
        k = max(range(len(splits)), key=lambda i: splits[i].rows)
        parts = _halve(splits[k])
        if parts is None:
            break
        splits[k:k + 1] = parts
    return splits


def plan_range(src: Source, opts, first: int, end: int) -> list:
    if end <= first:
        return []
    return _group(src, _segments(src, first, end), opts.entries_per_partition)


def plan_batch(opts) -> list:
    """Splits for a batch read: every ledger or stream from its start to its end position."""
    client = client_for(opts)
    sources: list = []
    try:
        sources = _sources(client, opts)
        keys = [s.key for s in sources]
        for what, value in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending),
                            ("startingOffsetsByTimestamp", opts.starting_times),
                            ("endingOffsetsByTimestamp", opts.ending_times)):
            check_keys(value, keys, what)
        splits = []
        for src in sources:
            first, end = start_of(src, opts), end_of(src, opts)
            if first < src.lowest:
                data_loss(opts, f"{src.key}: positions {first}..{src.lowest - 1} were removed by "
                                 f"retention; it begins at {src.lowest}")
                first = src.lowest
            if end > src.lac + 1:
                raise IllegalOpError(f"embedlog: {src.key}: endingOffsets {end} is past the LAC ({src.lac})")
            if first > end:
                raise IllegalOpError(f"embedlog: {src.key}: the start ({first}) is after the end ({end})")
            splits.extend(plan_range(src, opts, first, end))
        return with_min_partitions(splits, opts.min_partitions)
    finally:
        for src in sources:
            if src.stream is not None:
                src.stream.close()
        client.close()
