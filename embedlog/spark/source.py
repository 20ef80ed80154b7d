"""Reading ledgers and streams into Spark: batch (by ledger and entry range) and micro-batch.

Schema (docs/SPARK.md): scope_id, ledger_id are the two 64-bit halves of the ledger id as
Spark longs holding their two's-complement value (a half >= 2^63 reads negative);
qualified_name is the exact 32-hex-digit form; entry_id is the entry id; payload the
entry's bytes; stream and position are set for stream entries (position == entry_id:
stream positions are entry ids) and null for plain ledgers.

Everything here is pickled to Spark's Python workers; clients are opened inside the
methods that run there and closed before they return.
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from embedlog._native.format import LedgerId
from embedlog.errors import IllegalOpError, NoSuchEntryError, NoSuchLedgerError

SCHEMA = ("scope_id long, ledger_id long, qualified_name string, entry_id long, "
          "payload binary, stream string, position long")
ARROW_BATCH_ENTRIES = 8192


def signed64(v: int) -> int:
    """A 64-bit unsigned half as the Spark long holding the same bits."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _arrow_schema():
    import pyarrow as pa
    return pa.schema([("scope_id", pa.int64()), ("ledger_id", pa.int64()),
                      ("qualified_name", pa.string()), ("entry_id", pa.int64()),
                      ("payload", pa.binary()), ("stream", pa.string()), ("position", pa.int64())])


class Split(InputPartition):
    """Entries first..last (inclusive) of one ledger or stream; ``stream`` None for a ledger."""

    def __init__(self, scope_id: int, ledger_id: int, first: int, last: int, stream=None):
        super().__init__((scope_id, ledger_id, first, last, stream))
        self.scope_id, self.ledger_id, self.first, self.last, self.stream = (
            scope_id, ledger_id, first, last, stream)

    def __repr__(self):
        return f"Split({self.stream or LedgerId(self.scope_id, self.ledger_id).qualified_name}, {self.first}..{self.last})"


def _splits(scope, ledger, first, last, size, stream=None) -> list:
    return [Split(scope, ledger, a, min(last, a + size - 1), stream)
            for a in range(first, last + 1, size)]


def _client(uri):
    from embedlog.client import Client
    return Client(uri)


def read_split(uri: str, password: bytes, split: Split):
    """Arrow record batches of one split, read straight from the bookies."""
    import pyarrow as pa
    from embedlog.client.stream import KIND_DATA, find_stream
    from embedlog.spark._scan import scan
    schema = _arrow_schema()
    lid = LedgerId(split.scope_id, split.ledger_id)
    qname = lid.qualified_name
    s64, l64 = signed64(split.scope_id), signed64(split.ledger_id)
    client = _client(uri)
    try:
        if split.stream is None:
            md = client.open_ledger(lid, password, recovery=False).metadata
        else:
            v, _ = find_stream(client.metadata, split.stream)
            if v is None or v.value.ledger_id != lid:
                raise NoSuchLedgerError(f"stream {split.stream!r} was deleted while being read")
            md = v.value
            if split.first < md.first_entry_id:
                raise NoSuchEntryError(f"stream {split.stream!r}: positions below "
                                       f"{md.first_entry_id} are gone (retention)")
        pos = split.first
        while pos <= split.last:
            end = min(split.last, pos + ARROW_BATCH_ENTRIES - 1)
            data = scan(client, md, password, pos, end)
            ids = range(pos, end + 1)
            if split.stream is not None:
                keep = [(e, d[1:]) for e, d in zip(ids, data) if d[:1] == KIND_DATA]
                ids = [e for e, _ in keep]
                data = [d for _, d in keep]
            n = len(data)
            if n:
                id_arr = pa.array(ids, pa.int64())
                yield pa.RecordBatch.from_arrays([
                    pa.array([s64] * n, pa.int64()), pa.array([l64] * n, pa.int64()),
                    pa.array([qname] * n, pa.string()), id_arr, pa.array(data, pa.binary()),
                    pa.array([split.stream] * n, pa.string()),
                    id_arr if split.stream is not None else pa.nulls(n, pa.int64())],
                    schema=schema)
            pos = end + 1
    finally:
        client.close()


# -- planning helpers (driver side) ----------------------------------------------------------

def resolve_streams(client, opts) -> list:
    """[(name, Versioned metadata)] of the streams the options name; unknown names fail."""
    from embedlog.client.stream import find_stream
    from embedlog.spark.commit import COMMIT_LOG_PREFIX
    if opts.streams:
        names = list(opts.streams)
    else:          # a pattern never picks up the commit logs of Spark writes
        names = [n for n in client.list_streams(opts.stream_pattern)
                 if not n.startswith(COMMIT_LOG_PREFIX)]
    out = []
    for name in names:
        v, _ = find_stream(client.metadata, name)
        if v is None:
            raise IllegalOpError(f"embedlog: no stream named {name!r} (option streams)")
        out.append((name, v.value))
    return out


def _stream_lac(client, name) -> int:
    s = client.open_stream(name, create=False)
    try:
        return s.last_position()
    finally:
        s.close()


def _check_keys(positions, known, what):
    if isinstance(positions, dict):
        unknown = sorted(set(positions) - set(known))
        if unknown:
            raise IllegalOpError(f"embedlog: option {what} names {unknown}, which the query does not read")


def plan_batch(opts) -> list:
    """Splits for a batch read: every ledger or stream from its start to its end position."""
    client = _client(opts.uri)
    try:
        targets = []          # (key, scope, ledger, lowest, lac, stream)
        if opts.over_streams:
            for name, md in resolve_streams(client, opts):
                targets.append((name, md.ledger_id.scope_id, md.ledger_id.ledger_id,
                                md.first_entry_id, _stream_lac(client, name), name))
        else:
            ids = opts.ledgers or client.list_ledgers(opts.scope)
            for lid in ids:
                lid = LedgerId.coerce(lid)
                try:
                    h = client.open_ledger(lid, opts.password, recovery=False)
                except NoSuchLedgerError:
                    raise IllegalOpError(f"embedlog: no ledger {lid.qualified_name} "
                                         f"(scope {lid.scope_id}, id {lid.ledger_id})") from None
                targets.append((lid.qualified_name, lid.scope_id, lid.ledger_id, 0,
                                h.last_add_confirmed, None))
        keys = [t[0] for t in targets]
        _check_keys(opts.starting, keys, "startingOffsets")
        _check_keys(opts.ending, keys, "endingOffsets")
        splits = []
        for key, scope, ledger, lowest, lac, stream in targets:
            first = opts.starting.get(key, lowest) if isinstance(opts.starting, dict) else lowest
            end = opts.ending.get(key, lac + 1) if isinstance(opts.ending, dict) else lac + 1
            if first < lowest:
                raise IllegalOpError(f"embedlog: {key}: start {first} is gone; it begins at {lowest}")
            if end > lac + 1:
                raise IllegalOpError(f"embedlog: {key}: endingOffsets {end} is past the LAC ({lac})")
            splits.extend(_splits(scope, ledger, first, end - 1, opts.entries_per_partition, stream))
        return splits
    finally:
        client.close()


class BatchReader(DataSourceReader):
    def __init__(self, opts):
        self.opts = opts
        self._planned = plan_batch(opts)        # planning errors surface here, on the driver

    def partitions(self):
        return self._planned

    def read(self, partition):
        return read_split(self.opts.uri, self.opts.password, partition)


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


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: {stream name: next position}. A micro-batch reads [start, end) of each stream,
    where end never passes the stream's LAC + 1."""

    def __init__(self, opts):
        if not opts.over_streams:
            raise IllegalOpError("embedlog: a streaming read takes option streams or streamPattern "
                                 "(ledgers and scopes are read in batch)")
        if isinstance(opts.ending, dict) or opts.ending != "latest":
            raise IllegalOpError("embedlog: endingOffsets is for batch reads")
        self.opts = opts
        self._target = None          # availableNow: the offsets to stop at
        client = _client(opts.uri)
        try:
            found = resolve_streams(client, opts)      # unknown streams fail while planning
            _check_keys(opts.starting, [n for n, _ in found], "startingOffsets")
        finally:
            client.close()

    def _available(self, client, known: dict) -> dict:
        """{name: (first kept position, LAC + 1)} for the subscribed streams and ``known``."""
        out = {}
        for name, md in resolve_streams(client, self.opts):
            out[name] = (md.first_entry_id, _stream_lac(client, name) + 1)
        for name in known:
            if name not in out:
                from embedlog.client.stream import find_stream
                v, _ = find_stream(client.metadata, name)
                if v is None:
                    raise IllegalOpError(f"embedlog: stream {name!r} in the checkpoint no longer exists")
                out[name] = (v.value.first_entry_id, _stream_lac(client, name) + 1)
        return out

    def initialOffset(self):
        client = _client(self.opts.uri)
        try:
            avail = self._available(client, {})
        finally:
            client.close()
        start = {}
        for name, (first, end) in avail.items():
            if isinstance(self.opts.starting, dict) and name in self.opts.starting:
                start[name] = self.opts.starting[name]
            else:
                start[name] = end if self.opts.starting == "latest" else first
        return start

    def getDefaultReadLimit(self):
        n = self.opts.max_entries_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self):
        client = _client(self.opts.uri)
        try:
            self._target = {n: end for n, (_f, end) in self._available(client, {}).items()}
        finally:
            client.close()

    def latestOffset(self, start, limit):
        start = check_offset(start, "start")
        client = _client(self.opts.uri)
        try:
            avail = self._available(client, start)
        finally:
            client.close()
        cur, end = {}, {}
        for name, (first, lac_end) in sorted(avail.items()):
            pos = start.get(name, first)   # a stream new to the pattern starts at its beginning
            if pos < first:
                raise IllegalOpError(f"embedlog: stream {name!r}: positions {pos}..{first - 1} were "
                                     "removed by retention before this query read them")
            stop = lac_end
            if self._target is not None:
                stop = min(stop, self._target.get(name, pos))
            cur[name], end[name] = pos, max(pos, stop)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if budget is None:
            return end
        # the limit is shared out evenly over the streams that have something to read
        pending = [n for n in cur if end[n] > cur[n]]
        while budget > 0 and pending:
            share = max(1, budget // len(pending))
            for name in list(pending):
                take = min(share, end[name] - cur[name], budget)
                cur[name] += take
                budget -= take
                if cur[name] == end[name]:
                    pending.remove(name)
                if budget == 0:
                    break
        return cur

    def reportLatestOffset(self):
        return None

    def partitions(self, start, end):
        start = check_offset(start, "start")
        end = check_offset(end, "end")
        client = _client(self.opts.uri)
        try:
            from embedlog.client.stream import find_stream
            splits = []
            for name, stop in sorted(end.items()):
                first = start.get(name)
                if first is None:
                    v0, _ = find_stream(client.metadata, name)
                    first = v0.value.first_entry_id if v0 is not None else stop
                if stop <= first:
                    continue
                v, _ = find_stream(client.metadata, name)
                if v is None:
                    raise IllegalOpError(f"embedlog: stream {name!r} no longer exists")
                lid = v.value.ledger_id
                splits.extend(_splits(lid.scope_id, lid.ledger_id, first, stop - 1,
                                      self.opts.entries_per_partition, name))
            return splits
        finally:
            client.close()

    def read(self, partition):
        return read_split(self.opts.uri, self.opts.password, partition)

    def commit(self, end):
        pass
