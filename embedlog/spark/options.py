"""The options of the "embedlog" Spark data source, parsed and checked once, on the driver.

Every bad value is an ``IllegalOpError`` naming the option, raised while Spark plans the
query (DataSource creation, ``reader()``, ``writer()``), never from an executor. Spark
hands options case-insensitively (lower-cased keys); the canonical spellings below are
what docs/SPARK.md documents.

Read (batch and streaming):
  metadataServiceUri     required; BookKeeper's metadataServiceUri (sqlite:///..., zk+..., etcd://...)
  ledgers                comma-separated ledger ids (decimal, scope 0) or qualified names (32 hex)
  scope                  every ledger of this scope id (decimal, 0 <= scope < 2^64)
  streams                comma-separated stream names
  streamPattern          a glob over stream names (fnmatch, case-sensitive)
                         (exactly one of ledgers / scope / streams / streamPattern;
                          streaming reads take streams or streamPattern only)
  startingOffsets        "earliest" (default) | "latest" (streams) | JSON {name: position},
                         inclusive; name is a stream name or a ledger qualified name
  endingOffsets          batch only: "latest" (default, the LAC when planned) | JSON {name: position},
                         exclusive
  maxEntriesPerTrigger   streaming: at most this many positions per micro-batch (a limit, > 0)
  entriesPerPartition    entries per Spark partition (default 100000)
  password               the ledgers' / streams' password (default empty)
Write (batch and streaming):
  metadataServiceUri     required
  stream                 required: the target stream (created if absent)
  sinkId                 the writer's identity for exactly-once (required for streaming writes;
                         batch writes may give it with batchId, e.g. inside foreachBatch)
  batchId                batch writes only, with sinkId: a replayed (sinkId, batchId) is skipped
  ensembleSize, writeQuorum, ackQuorum   of the task ledgers (default 3, 3, 2)
  password
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from embedlog._native.format import LedgerId
from embedlog.errors import IllegalOpError

READ_KEYS = ("metadataServiceUri", "ledgers", "scope", "streams", "streamPattern",
             "startingOffsets", "endingOffsets", "maxEntriesPerTrigger", "entriesPerPartition",
             "password")
WRITE_KEYS = ("metadataServiceUri", "stream", "sinkId", "batchId", "ensembleSize",
              "writeQuorum", "ackQuorum", "password")
# keys Spark itself may pass through to a source or sink
SPARK_KEYS = ("path", "checkpointLocation", "queryName")
DEFAULT_ENTRIES_PER_PARTITION = 100_000
MAX_ENTRIES_PER_PARTITION = 10_000_000


def _canonical(options, allowed) -> dict:
    known = {k.lower(): k for k in allowed + SPARK_KEYS}
    out = {}
    for key, value in dict(options).items():
        canon = known.get(key.lower())
        if canon is None:
            raise IllegalOpError(f"embedlog: unknown option {key!r}; known options: "
                                 f"{', '.join(allowed)}")
        out[canon] = value
    return out


def _int(opts, key, default, lo, hi):
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise IllegalOpError(f"embedlog: option {key} must be an integer, got {raw!r}") from None
    if not lo <= v <= hi:
        raise IllegalOpError(f"embedlog: option {key} must be in {lo}..{hi}, got {v}")
    return v


def _uri(opts) -> str:
    uri = opts.get("metadataServiceUri")
    if not uri or "://" not in str(uri):
        raise IllegalOpError("embedlog: option metadataServiceUri is required "
                             "(e.g. sqlite:///abs/meta.db, zk+hierarchical://host:2181/ledgers)")
    return str(uri)


def parse_ledger(text: str) -> LedgerId:
    text = text.strip()
    try:
        if text.isdigit():
            return LedgerId.coerce(int(text))
        return LedgerId.parse(text.lower())
    except Exception as exc:
        raise IllegalOpError(f"embedlog: {text!r} is not a ledger id (a decimal scope-0 id "
                             f"or a 32-hex-digit qualified name): {exc}") from None


def parse_positions(raw, what: str, words: tuple) -> str | dict:
    """"earliest"/"latest" or a JSON object {name: non-negative int}."""
    if raw is None:
        return words[0]
    text = str(raw).strip()
    if text in words:
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):          # RecursionError: nesting too deep
        value = None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()):
        raise IllegalOpError(f"embedlog: option {what} is {' or '.join(map(repr, words))} or a JSON "
                             f"object of name -> non-negative position, got {text!r}")
    return value


@dataclass(frozen=True)
class ReadOptions:
    uri: str
    ledgers: tuple = ()            # LedgerId, in the order given
    scope: int | None = None
    streams: tuple = ()
    stream_pattern: str | None = None
    starting: object = "earliest"
    ending: object = "latest"
    max_entries_per_trigger: int | None = None
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION
    password: bytes = b""

    @property
    def over_streams(self) -> bool:
        return bool(self.streams) or self.stream_pattern is not None


def read_options(options) -> ReadOptions:
    opts = _canonical(options, READ_KEYS)
    chosen = [k for k in ("ledgers", "scope", "streams", "streamPattern") if opts.get(k)]
    if len(chosen) != 1:
        raise IllegalOpError("embedlog: give exactly one of the options ledgers, scope, streams, "
                             f"streamPattern (got {', '.join(chosen) or 'none'})")
    ledgers = streams = ()
    scope = pattern = None
    if "ledgers" in chosen:
        ledgers = tuple(parse_ledger(t) for t in str(opts["ledgers"]).split(",") if t.strip())
        if not ledgers:
            raise IllegalOpError("embedlog: option ledgers names no ledger")
    elif "scope" in chosen:
        scope = _int(opts, "scope", 0, 0, (1 << 64) - 1)
    elif "streams" in chosen:
        streams = tuple(dict.fromkeys(s.strip() for s in str(opts["streams"]).split(",") if s.strip()))
        if not streams:
            raise IllegalOpError("embedlog: option streams names no stream")
    else:
        pattern = str(opts["streamPattern"])
    over_streams = bool(streams) or pattern is not None
    starting = parse_positions(opts.get("startingOffsets"), "startingOffsets",
                               ("earliest", "latest") if over_streams else ("earliest",))
    ending = parse_positions(opts.get("endingOffsets"), "endingOffsets", ("latest",))
    return ReadOptions(
        uri=_uri(opts), ledgers=ledgers, scope=scope, streams=streams, stream_pattern=pattern,
        starting=starting, ending=ending,
        max_entries_per_trigger=_int(opts, "maxEntriesPerTrigger", None, 1, 1 << 62),
        entries_per_partition=_int(opts, "entriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION,
                                   1, MAX_ENTRIES_PER_PARTITION),
        password=str(opts.get("password", "")).encode())


@dataclass(frozen=True)
class WriteOptions:
    uri: str
    stream: str
    sink_id: str | None = None
    batch_id: int | None = None
    ensemble: tuple = field(default=(3, 3, 2))
    password: bytes = b""


def write_options(options, streaming: bool) -> WriteOptions:
    opts = _canonical(options, WRITE_KEYS)
    stream = opts.get("stream")
    if not stream:
        raise IllegalOpError("embedlog: option stream (the target stream) is required for writes")
    sink_id = opts.get("sinkId") or None
    batch_id = _int(opts, "batchId", None, 0, 1 << 62)
    if streaming:
        if sink_id is None:
            raise IllegalOpError("embedlog: a streaming write needs option sinkId: the identity under "
                                 "which its batch ids are remembered for exactly-once output "
                                 "(one per query checkpoint)")
        if batch_id is not None:
            raise IllegalOpError("embedlog: option batchId is for batch writes; a streaming write "
                                 "uses Spark's batch ids")
    elif (sink_id is None) != (batch_id is None):
        raise IllegalOpError("embedlog: a batch write takes sinkId and batchId together (or neither)")
    e = _int(opts, "ensembleSize", 3, 1, 64)
    qw = _int(opts, "writeQuorum", min(e, 3), 1, 64)
    qa = _int(opts, "ackQuorum", min(qw, 2), 1, 64)
    if not e >= qw >= qa:
        raise IllegalOpError(f"embedlog: need ensembleSize >= writeQuorum >= ackQuorum, got {e}, {qw}, {qa}")
    return WriteOptions(uri=_uri(opts), stream=str(stream), sink_id=sink_id, batch_id=batch_id,
                        ensemble=(e, qw, qa), password=str(opts.get("password", "")).encode())
