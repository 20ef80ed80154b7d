"""Reading ledgers and streams into Spark: batch (ranges of entries and links) and micro-batch.

Schema (docs/SPARK.md): scope_id, ledger_id are the two 64-bit halves of the ledger id as
Spark longs holding their two's-complement value (a half >= 2^63 reads negative);
qualified_name is the exact 32-hex-digit form; entry_id is the entry id; payload the
row's bytes; stream and position are set for stream rows (position == entry_id: stream
positions are entry ids) and null for plain ledgers; index numbers the rows of one entry
(a ledger a Spark write packed) or of one position (a link): 0 otherwise; timestamp is
the append time of stream rows (null for ledgers and for entries written before times).

Reading a split is here; planning the splits (and the segments a split is made of) is
planning.py's.

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
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from embedlog._native.format import LedgerId
from embedlog.client.group import record_positions
from embedlog.errors import EmbedlogError, IllegalOpError, NoSuchEntryError, NoSuchLedgerError
from embedlog.spark.options import client_for
from embedlog.spark.planning import (CHUNK_POSITIONS, Source, Split, check_keys, data_loss,
                                     plan_batch, plan_range, resolve_streams, start_of,
                                     stream_source, with_min_partitions)

log = logging.getLogger("embedlog.spark")

SCHEMA = ("scope_id long, ledger_id long, qualified_name string, entry_id long, "
          "payload binary, stream string, position long, index long, timestamp timestamp")
ARROW_SCHEMA = pa.schema([("scope_id", pa.int64()), ("ledger_id", pa.int64()),
                          ("qualified_name", pa.string()), ("entry_id", pa.int64()),
                          ("payload", pa.binary()), ("stream", pa.string()),
                          ("position", pa.int64()), ("index", pa.int64()),
                          ("timestamp", pa.timestamp("us", tz="UTC"))])
CHUNK_BYTES = 8 << 20              # packed entries per ranged read: about this many bytes
PREFETCH_BATCHES = 2               # batches read ahead of Spark in each task


def signed64(v: int) -> int:
    """A 64-bit unsigned half as the Spark long holding the same bits."""
    return v - (1 << 64) if v >= 1 << 63 else v


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
        data_loss(opts, f"stream {out.split.stream!r}: the ledger linked at position {position} "
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
            data_loss(opts, f"stream {stream.name!r}: positions {lo}..{min(kept, last + 1) - 1} were "
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


def admit(src: Source, pos: int, stop: int, rows: int) -> int:
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
        self._waiting: set = set()   # named streams not there yet (logged once each)
        self._recorded: dict = {}    # what groupId was last given
        client = client_for(opts)
        try:
            # unknown streams fail while planning with failOnMissingStreams; else, as Kafka's
            # source does with a topic, the query waits for them
            names = resolve_streams(client, opts, missing_ok=not opts.fail_on_missing_streams)
            for what, value in (("startingOffsets", opts.starting),
                                ("startingOffsetsByTimestamp", opts.starting_times)):
                check_keys(value, list(names) + list(opts.streams), what)
        finally:
            client.close()

    def _sources(self, client, known) -> dict:
        """{name: Source} of the subscribed streams and those in ``known``; a named stream
        that does not exist (yet) is left out, and read from its beginning once it does."""
        names = resolve_streams(client, self.opts, missing_ok=True)
        for name in set(self.opts.streams) - set(names) - self._waiting:
            log.warning("embedlog: stream %r does not exist yet; the query reads it once it "
                        "does (failOnMissingStreams=true fails instead)", name)
            self._waiting.add(name)
        out = {n: stream_source(client, self.opts, n) for n in names}
        for name in known:
            if name not in out:
                out[name] = stream_source(client, self.opts, name)
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
        # Spark plans batch N + 1 only once batch N is done and in the commit log, and it
        # calls commit() for batch N only when it constructs batch N + 1 with data: the group
        # learns the last batch's end here, so an idle query's group shows no stale lag
        self._record(start)
        return self._with_sources(start, lambda sources: self._latest_offset(sources, start, limit))

    def _latest_offset(self, sources: dict, start: dict, limit) -> dict:
        cur, end = {}, {}
        for name, src in sorted(sources.items()):
            pos = start.get(name, src.lowest)   # a stream new to the pattern starts at its beginning
            if pos < src.lowest:
                data_loss(self.opts, f"stream {name!r}: positions {pos}..{src.lowest - 1} were "
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
                data_loss(self.opts, f"stream {name!r}: positions {first}..{src.lowest - 1} were "
                                      "removed by retention before this query read them")
                first = src.lowest
            splits.extend(plan_range(src, self.opts, first, stop))
        return with_min_partitions(splits, self.opts.min_partitions)

    def read(self, partition):
        return read_split(self.opts, partition)

    def commit(self, end):
        """Spark has recorded ``end`` in the checkpoint: with groupId, record the positions
        in that consumer group too, for `embedlog group describe` and the lag metric (the
        checkpoint stays the source of truth: a failure here is logged, never fatal)."""
        self._record(check_offset(end, "end"))

    def _record(self, positions: dict) -> None:
        if self.opts.group_id is None or not positions or positions == self._recorded:
            return
        client = client_for(self.opts)
        try:
            record_positions(client.metadata, self.opts.group_id, positions)
            self._recorded = dict(positions)
        except EmbedlogError as exc:
            log.warning("embedlog: could not record the query's positions in consumer group "
                        "%r: %s", self.opts.group_id, exc)
        finally:
            client.close()
