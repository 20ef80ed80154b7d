"""Reading ledgers and streams into Spark: batch (ranges of entries and links) and micro-batch.

Schema (docs/SPARK.md): scope_id, ledger_id are the two 64-bit halves of the ledger id as
Spark longs holding their two's-complement value (a half >= 2^63 reads negative);
qualified_name is the exact 32-hex-digit form; entry_id is the entry id; payload the
row's bytes; stream and position are set for stream rows (position == entry_id: stream
positions are entry ids) and null for plain ledgers; index numbers the rows of one entry
(a ledger a Spark write packed) or of one position (a link): 0 otherwise; timestamp is
the append time of stream rows (null for ledgers and for entries written before times).

A split is a list of *segments*: ("range", first, last, follow_links), entries first..last
of the split's ledger or positions of its stream, whose links are read in place unless
the planner listed them; or ("link", position, time_ms, scope, ledger, first, last, rows,
packed), the rows a link makes part of the stream. Planning knows a stream's links only
by reading its entries, which it does for streams that hold links (Stream.has_links):
then splits are cut by rows, links whole.

Everything here is pickled to Spark's Python workers; clients are opened inside the
methods that run there and closed before they return.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from embedlog._native.format import LedgerId
from embedlog.client.stream import find_stream
from embedlog.errors import IllegalOpError, NoSuchEntryError, NoSuchLedgerError
from embedlog.spark.commit import COMMIT_LOG_PREFIX, COMMITTED_KEY, JOB_KEY, PACKED_KEY, SCOPE_LOG_PREFIX
from embedlog.spark.options import EARLIEST, LATEST, client_for

log = logging.getLogger("embedlog.spark")

SCHEMA = ("scope_id long, ledger_id long, qualified_name string, entry_id long, "
          "payload binary, stream string, position long, index long, timestamp timestamp")
ARROW_SCHEMA = pa.schema([("scope_id", pa.int64()), ("ledger_id", pa.int64()),
                          ("qualified_name", pa.string()), ("entry_id", pa.int64()),
                          ("payload", pa.binary()), ("stream", pa.string()),
                          ("position", pa.int64()), ("index", pa.int64()),
                          ("timestamp", pa.timestamp("us", tz="UTC"))])
CHUNK_POSITIONS = 8192             # positions (or plain entries) per ranged read
CHUNK_BYTES = 8 << 20              # packed entries per ranged read: about this many bytes
PREFETCH_BATCHES = 2               # batches read ahead of Spark in each task


def signed64(v: int) -> int:
    """A 64-bit unsigned half as the Spark long holding the same bits."""
    return v - (1 << 64) if v >= 1 << 63 else v


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


def _data_loss(opts, message: str) -> None:
    """failOnDataLoss: fail with ``message``, or log it and go on."""
    if opts.fail_on_data_loss:
        raise NoSuchEntryError(f"embedlog: {message} (set failOnDataLoss=false to skip what is "
                               "gone and go on)")
    log.warning("embedlog: %s; skipped it (failOnDataLoss=false)", message)


# -- reading a split (executors) ---------------------------------------------------------------

def _const_str(text: str | None, n: int):
    if text is None:
        return pa.nulls(n, pa.string())
    raw = text.encode()
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(0, (n + 1) * len(raw),
                                                                             len(raw), dtype=np.int32)),
                                                  pa.py_buffer(raw * n)])


class _Batches:
    """Record batches of one split, built with its constant columns."""

    def __init__(self, split: Split, stream_ledger=None):
        self.split = split
        lid = stream_ledger or LedgerId(split.scope_id, split.ledger_id)
        self.scope, self.ledger = signed64(lid.scope_id), signed64(lid.ledger_id)
        self.qname = lid.qualified_name

    def make(self, entry_ids, payload, positions=None, index=None, times_ms=None, timed=None):
        n = len(payload)
        if times_ms is None:
            stamps = pa.nulls(n, pa.timestamp("us", tz="UTC"))
        else:
            us = np.asarray(times_ms, dtype=np.int64) * 1000
            stamps = pa.array(us, pa.timestamp("us", tz="UTC"),
                              mask=None if timed is None else ~np.asarray(timed, dtype=bool))
        return pa.RecordBatch.from_arrays([
            pa.array(np.full(n, self.scope, dtype=np.int64)),
            pa.array(np.full(n, self.ledger, dtype=np.int64)),
            _const_str(self.qname, n), pa.array(np.asarray(entry_ids, dtype=np.int64)), payload,
            _const_str(self.split.stream, n),
            pa.nulls(n, pa.int64()) if positions is None else pa.array(np.asarray(positions, dtype=np.int64)),
            pa.array(np.zeros(n, dtype=np.int64) if index is None else np.asarray(index, dtype=np.int64)),
            stamps], schema=ARROW_SCHEMA)


def _packed_chunk(md) -> int:
    if md.last_entry_id < 0 or md.length <= 0:
        return 64
    return max(1, int(CHUNK_BYTES // max(1.0, md.length / (md.last_entry_id + 1))))


def _ledger_rows(handle, split: Split, first: int, last: int, out: _Batches):
    if not split.packed:
        for lo in range(first, last + 1, CHUNK_POSITIONS):
            hi = min(last, lo + CHUNK_POSITIONS - 1)
            yield out.make(np.arange(lo, hi + 1), handle.read_arrow(lo, hi))
        return
    step = _packed_chunk(handle.metadata)
    for lo in range(first, last + 1, step):
        hi = min(last, lo + step - 1)
        offsets, values, per_entry = handle.read_packed(lo, hi)
        if len(offsets) > 1:
            starts = np.repeat(np.cumsum(per_entry) - per_entry, per_entry)
            yield out.make(np.repeat(np.arange(lo, hi + 1), per_entry), _binary(offsets, values),
                           index=np.arange(len(offsets) - 1) - starts)


def _binary(offsets, values):
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(values)])


def _link_rows(client, opts, seg, out: _Batches):
    _kind, position, time_ms, scope, ledger, first, last, rows, packed = seg
    try:
        handle = client.open_ledger(LedgerId(scope, ledger), opts.password, recovery=False)
    except NoSuchLedgerError:
        _data_loss(opts, f"stream {out.split.stream!r}: the ledger linked at position {position} "
                         f"({LedgerId(scope, ledger).qualified_name}) was deleted")
        return
    index = 0
    step = _packed_chunk(handle.metadata) if packed else CHUNK_POSITIONS
    for lo in range(first, last + 1, step):
        hi = min(last, lo + step - 1)
        if packed:
            offsets, values, _per_entry = handle.read_packed(lo, hi)
            payload = _binary(offsets, values)
        else:
            payload = handle.read_arrow(lo, hi)
        n = len(payload)
        if n:
            yield out.make(np.full(n, position), payload, np.full(n, position),
                           np.arange(index, index + n), np.full(n, time_ms))
        index += n


def _stream_rows(client, opts, stream, seg, out: _Batches):
    _kind, first, last, follow = seg
    lo = first
    while lo <= last:
        hi = min(last, lo + CHUNK_POSITIONS - 1)
        try:
            got = stream.read_arrow(lo, hi)
        except NoSuchEntryError:
            kept = stream.refresh().first_entry_id
            if lo >= kept:
                raise
            _data_loss(opts, f"stream {stream.name!r}: positions {lo}..{min(kept, last + 1) - 1} were "
                             "removed by retention before this query read them")
            lo = kept
            continue
        rows = got.rows
        positions = rows.column("position").to_numpy()
        stamps = rows.column("timestamp")
        times = stamps.cast(pa.int64()).fill_null(0).to_numpy()
        timed = stamps.is_valid().to_numpy(zero_copy_only=False)
        data = rows.column("data")
        links = got.links if follow else []
        done = 0
        for link in links + [None]:       # plain rows before each link, then the link's rows
            stop = len(positions) if link is None else int(np.searchsorted(positions, link.position))
            if stop > done:
                p = positions[done:stop]
                yield out.make(p, data.slice(done, stop - done), p, None, times[done:stop], timed[done:stop])
                done = stop
            if link is not None:
                yield from _link_rows(client, opts, ("link", link.position, link.timestamp,
                                                     link.ledger_id.scope_id, link.ledger_id.ledger_id,
                                                     link.first, link.last, link.rows, link.packed), out)
        lo = hi + 1


def read_split(opts, split):
    """Arrow record batches of one split, read straight from the bookies; the next batch is
    read while Spark takes the last one (PREFETCH_BATCHES ahead)."""
    if not isinstance(split, Split):
        return iter(())        # Spark hands a bare InputPartition when nothing was planned
    return _prefetched(_read_split(opts, split), PREFETCH_BATCHES)


def _prefetched(batches, depth: int):
    """Run the generator ``batches`` in a thread of its own, at most ``depth`` items ahead;
    an error there is raised here, and closing this generator stops that thread."""
    items: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def produce():
        try:
            for b in batches:
                while not stop.is_set():
                    try:
                        items.put((b, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
        except BaseException as exc:        # handed to the consumer, raised there
            items.put((done, exc))
            return
        finally:
            if stop.is_set():
                batches.close()
        items.put((done, None))

    t = threading.Thread(target=produce, name="embedlog-spark-read", daemon=True)
    t.start()
    try:
        while True:
            b, exc = items.get()
            if exc is not None:
                raise exc
            if b is done:
                return
            yield b
    finally:
        stop.set()
        while t.is_alive():               # unblock a producer waiting on a full queue
            try:
                items.get(timeout=0.1)
            except queue.Empty:
                pass
        t.join()


def _read_split(opts, split):
    client = client_for(opts)
    try:
        if split.stream is None:
            handle = client.open_ledger(LedgerId(split.scope_id, split.ledger_id), opts.password,
                                        recovery=False)
            out = _Batches(split)
            for seg in split.segments:
                yield from _ledger_rows(handle, split, seg[1], seg[2], out)
            return
        stream = client.open_stream(split.stream, create=False, password=opts.password)
        try:
            if stream.ledger_id != LedgerId(split.scope_id, split.ledger_id):
                raise NoSuchLedgerError(f"stream {split.stream!r} was deleted while being read")
            out = _Batches(split)
            for seg in split.segments:
                if seg[0] == "range":
                    yield from _stream_rows(client, opts, stream, seg, out)
                else:
                    yield from _link_rows(client, opts, seg, out)
        finally:
            stream.close()
    finally:
        client.close()


# -- planning (driver side) ----------------------------------------------------------------------

class _Source:
    """One ledger or stream to read: its key in offsets, ids, what is readable."""

    def __init__(self, key, lid, stream=None, lowest=0, lac=-1, has_links=False, packed=False):
        self.key, self.lid, self.stream = key, lid, stream
        self.lowest, self.lac, self.has_links, self.packed = lowest, lac, has_links, packed

    @property
    def name(self):
        return self.stream.name if self.stream is not None else None


def resolve_streams(client, opts) -> list:
    """Names of the streams the options name; unknown names fail."""
    if opts.streams:
        names = list(opts.streams)
    else:          # a pattern never picks up the commit logs of Spark writes
        names = [n for n in client.list_streams(opts.stream_pattern)
                 if not n.startswith((COMMIT_LOG_PREFIX, SCOPE_LOG_PREFIX))]
    for name in names:
        if find_stream(client.metadata, name)[0] is None:
            raise IllegalOpError(f"embedlog: no stream named {name!r} (option streams)")
    return names


def _stream_source(client, opts, name: str) -> _Source:
    try:
        s = client.open_stream(name, create=False, password=opts.password)
    except NoSuchLedgerError:
        raise IllegalOpError(f"embedlog: stream {name!r} no longer exists") from None
    md = s.refresh()
    return _Source(name, s.ledger_id, s, md.first_entry_id, s.last_position(), s.has_links)


def _sources(client, opts) -> list:
    if opts.over_streams:
        return [_stream_source(client, opts, n) for n in resolve_streams(client, opts)]
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
        out.append(_Source(lid.qualified_name, lid, None, 0, h.last_add_confirmed,
                           packed=tags.get(PACKED_KEY) == b"1"))
    return out


def _check_keys(positions, known, what):
    if isinstance(positions, dict):
        unknown = sorted(set(positions) - set(known))
        if unknown:
            raise IllegalOpError(f"embedlog: option {what} names {unknown}, which the query does not read")


def _at_time(src: _Source, time_ms: int, strategy: str | None) -> int:
    pos = src.stream.position_at(time_ms)
    if pos > src.lac and strategy == "error":
        raise IllegalOpError(f"embedlog: stream {src.key!r} has no position appended at or after "
                             f"{time_ms} (startingOffsetsByTimestampStrategy=latest starts such a "
                             "stream at its end instead)")
    return pos


def start_of(src: _Source, opts) -> int:
    """The first position (entry) to read of ``src`` as the options say."""
    if src.stream is not None and opts.starting_time_ms is not None:
        return _at_time(src, opts.starting_time_ms, opts.starting_time_strategy)
    if src.stream is not None and opts.starting_times and src.key in opts.starting_times:
        return _at_time(src, opts.starting_times[src.key], opts.starting_time_strategy)
    if isinstance(opts.starting, dict) and src.key in opts.starting:
        v = opts.starting[src.key]
        return src.lowest if v == EARLIEST else src.lac + 1 if v == LATEST else v
    return src.lac + 1 if opts.starting == "latest" else src.lowest


def end_of(src: _Source, opts) -> int:
    """The position to stop before (batch reads)."""
    if src.stream is not None and opts.ending_time_ms is not None:
        return src.stream.position_at(opts.ending_time_ms)
    if src.stream is not None and opts.ending_times and src.key in opts.ending_times:
        return src.stream.position_at(opts.ending_times[src.key])
    if isinstance(opts.ending, dict) and src.key in opts.ending and opts.ending[src.key] != LATEST:
        return opts.ending[src.key]
    return src.lac + 1


def _segments(src: _Source, first: int, end: int) -> list:
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


def _group(src: _Source, segments: list, size: int) -> list:
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


def plan_range(src: _Source, opts, first: int, end: int) -> list:
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
            _check_keys(value, keys, what)
        splits = []
        for src in sources:
            first, end = start_of(src, opts), end_of(src, opts)
            if first < src.lowest:
                _data_loss(opts, f"{src.key}: positions {first}..{src.lowest - 1} were removed by "
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


class BatchReader(DataSourceReader):
    def __init__(self, opts):
        self.opts = opts
        self._planned = plan_batch(opts)        # planning errors surface here, on the driver

    def partitions(self):
        return self._planned

    def read(self, partition):
        return read_split(self.opts, partition)


# -- Structured Streaming ------------------------------------------------------------------------

def check_offset(offset, what: str) -> dict:
    """An offset is {stream name: next position to read}; anything else is a clear error
    (a hand-edited or foreign checkpoint)."""
    if not isinstance(offset, dict) or not all(
            isinstance(k, str) and k and type(v) is int and v >= 0 for k, v in offset.items()):
        raise IllegalOpError(f"embedlog: malformed {what} offset {offset!r}: expected a JSON object "
                             "of stream name -> next position (a non-negative integer); is the "
                             "checkpoint from another source or edited?")
    return offset


def shares_by_lag(lags: dict, budget: int) -> dict:
    """``budget`` rows shared over streams in proportion to their lag (as Kafka's
    maxOffsetsPerTrigger): every stream with a backlog gets at least one while the budget
    allows, the total never exceeds it, the rest goes by largest remainder."""
    names = sorted(n for n, lag in lags.items() if lag > 0)
    total = sum(lags[n] for n in names)
    if total <= budget:
        return {n: lags[n] for n in names}
    share = {n: 0 for n in names}
    if budget >= len(names):
        share = {n: 1 for n in names}
    left = budget - sum(share.values())
    rest = {n: lags[n] - share[n] for n in names}
    rest_total = sum(rest.values())
    if left > 0 and rest_total > 0:
        exact = {n: left * rest[n] / rest_total for n in names}
        for n in names:
            share[n] += min(rest[n], int(exact[n]))
        spare = budget - sum(share.values())
        for n in sorted(names, key=lambda n: (-(exact[n] - int(exact[n])), n)):
            if spare <= 0:
                break
            if share[n] < lags[n]:
                share[n] += 1
                spare -= 1
    return share


def admit(src: _Source, pos: int, stop: int, rows: int) -> int:
    """The position after admitting at most ``rows`` rows from ``pos`` (at least one position,
    so a link larger than the budget still goes through), never past ``stop``."""
    if src.stream is None or not src.has_links:
        return min(stop, pos + rows)
    got = 0
    while pos < stop:
        hi = min(stop - 1, pos + CHUNK_POSITIONS - 1)
        chunk = src.stream.read_arrow(pos, hi)
        events = sorted([(int(p), 1) for p in chunk.rows.column("position").to_numpy()]
                        + [(link.position, link.rows) for link in chunk.links])
        for p, r in events:
            if got and got + r > rows:
                return p
            got += r
            if got >= rows:
                return p + 1
        pos = hi + 1
    return stop


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: {stream name: next position}. A micro-batch reads [start, end) of each stream,
    where end never passes the stream's LAC + 1."""

    def __init__(self, opts):
        if not opts.over_streams:
            raise IllegalOpError("embedlog: a streaming read takes option streams or streamPattern "
                                 "(ledgers and scopes are read in batch)")
        if isinstance(opts.ending, dict) or opts.ending != "latest" or opts.ending_time_ms is not None \
                or opts.ending_times is not None:
            raise IllegalOpError("embedlog: endingOffsets, endingTimestamp and endingOffsetsByTimestamp "
                                 "are for batch reads")
        self.opts = opts
        self._target = None          # availableNow: the offsets to stop at
        self._latest = None          # what the last latestOffset saw (reportLatestOffset)
        # minEntriesPerTrigger: when the last batch was let through (None: never, so the first
        # is not held back; Kafka compares with 0 on the wall clock, so its first batch runs)
        self._last_trigger_ms = None
        client = client_for(opts)
        try:
            names = resolve_streams(client, opts)      # unknown streams fail while planning
            for what, value in (("startingOffsets", opts.starting),
                                ("startingOffsetsByTimestamp", opts.starting_times)):
                _check_keys(value, names, what)
        finally:
            client.close()

    def _sources(self, client, known) -> dict:
        """{name: _Source} of the subscribed streams and those in ``known``."""
        out = {n: _stream_source(client, self.opts, n) for n in resolve_streams(client, self.opts)}
        for name in known:
            if name not in out:
                out[name] = _stream_source(client, self.opts, name)
        return out

    def _with_sources(self, known, fn):
        client = client_for(self.opts)
        sources = {}
        try:
            sources = self._sources(client, known)
            return fn(sources)
        finally:
            for src in sources.values():
                src.stream.close()
            client.close()

    def initialOffset(self):
        return self._with_sources({}, lambda sources: {n: start_of(s, self.opts) for n, s in sources.items()})

    def getDefaultReadLimit(self):
        n = self.opts.max_entries_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self):
        self._target = self._with_sources({}, lambda sources: {n: s.lac + 1 for n, s in sources.items()})

    def latestOffset(self, start, limit):
        start = check_offset(start, "start")
        return self._with_sources(start, lambda sources: self._latest_offset(sources, start, limit))

    def _latest_offset(self, sources: dict, start: dict, limit) -> dict:
        cur, end = {}, {}
        for name, src in sorted(sources.items()):
            pos = start.get(name, src.lowest)   # a stream new to the pattern starts at its beginning
            if pos < src.lowest:
                _data_loss(self.opts, f"stream {name!r}: positions {pos}..{src.lowest - 1} were "
                                      "removed by retention before this query read them")
                pos = src.lowest
            stop = src.lac + 1
            if self._target is not None:
                stop = min(stop, self._target.get(name, pos))
            cur[name], end[name] = pos, max(pos, stop)
        self._latest = {n: s.lac + 1 for n, s in sources.items()}
        lags = {n: end[n] - cur[n] for n in cur}
        now_ms = time.monotonic() * 1000
        wait_for = self.opts.min_entries_per_trigger
        if wait_for and self._target is None and 0 < sum(lags.values()) < wait_for \
                and self._last_trigger_ms is not None \
                and now_ms - self._last_trigger_ms < self.opts.max_trigger_delay_ms:
            return dict(start)              # too little yet: no batch (Kafka's minOffsetsPerTrigger)
        if sum(lags.values()) and self._target is None:
            self._last_trigger_ms = now_ms
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if budget is None:
            return end
        out = dict(cur)
        for name, rows in shares_by_lag(lags, budget).items():
            if rows:
                out[name] = admit(sources[name], cur[name], end[name], rows)
        return out

    def reportLatestOffset(self):
        return self._latest

    def partitions(self, start, end):
        start = check_offset(start, "start")
        end = check_offset(end, "end")
        return self._with_sources({n: None for n in end if end[n] > start.get(n, 0)},
                                  lambda sources: self._partitions(sources, start, end))

    def _partitions(self, sources: dict, start: dict, end: dict) -> list:
        splits = []
        for name, stop in sorted(end.items()):
            src = sources.get(name)
            first = start.get(name, src.lowest if src is not None else stop)
            if stop <= first:
                continue
            if first < src.lowest:
                _data_loss(self.opts, f"stream {name!r}: positions {first}..{src.lowest - 1} were "
                                      "removed by retention before this query read them")
                first = src.lowest
            splits.extend(plan_range(src, self.opts, first, stop))
        return with_min_partitions(splits, self.opts.min_partitions)

    def read(self, partition):
        return read_split(self.opts, partition)

    def commit(self, end):
        pass
