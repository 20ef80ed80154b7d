"""The options of the "embedlog" Spark data source, parsed and checked once, on the driver.

Every bad value is an ``IllegalOpError`` naming the option, raised while Spark plans the
query: when ``load()`` is called (the data source's schema), and by ``reader()``,
``streamReader()``, ``writer()`` and ``streamWriter()`` for what depends on the kind of
query; never from an executor. Spark hands options case-insensitively (lower-cased keys);
the canonical spellings below are what docs/SPARK.md documents (its table maps Spark's
Kafka options to these). Secrets (password, authToken) never appear in a repr, a plan or
an error message.

Read (batch and streaming):
  metadataServiceUri     required; BookKeeper's metadataServiceUri (sqlite:///..., zk+..., etcd://...)
  ledgers                comma-separated ledger ids (decimal, scope 0) or qualified names (32 hex)
  scope                  every ledger of this scope id (decimal, 0 <= scope < 2^64)
  streams                comma-separated stream names
  streamPattern          a glob over stream names (fnmatch, case-sensitive)
                         (exactly one of ledgers / scope / streams / streamPattern;
                          streaming reads take streams or streamPattern only)
  startingOffsets        "earliest" (default) | "latest" | JSON {name: position}, inclusive;
                         a name is a stream name or a ledger qualified name; -2 = earliest,
                         -1 = latest
  endingOffsets          batch only: "latest" (default, the LAC when planned) | JSON {name:
                         position}, exclusive; -1 = latest
  startingTimestamp      streams: start every stream at its first position appended at or after
                         this time (ms since the epoch); before startingOffsetsByTimestamp and
                         startingOffsets
  startingOffsetsByTimestamp  streams: JSON {name: ms}; before startingOffsets
  startingOffsetsByTimestampStrategy  "error" (default: no position at or after the time is an
                         error) | "latest"
  endingTimestamp, endingOffsetsByTimestamp   batch, streams: end before the first position
                         appended at or after the time
  failOnDataLoss         "true" (default): a start that retention removed (or a linked ledger
                         deleted) fails the query; "false": skip ahead and log how much
  failOnMissingStreams   streaming: "false" (default): a stream named in streams that does not
                         exist yet is waited for (read from its beginning once it exists), as
                         Kafka's source waits for a topic; "true": the query fails at start
  groupId                streaming: a consumer group (client/group.py) the query records its
                         progress in after each micro-batch, for `embedlog group describe`
                         and the lag metric (Kafka's kafka.group.id, accepted as its alias);
                         the checkpoint stays the source of truth for exactly-once
  includeHeaders         "false" only: stream entries carry no headers (Kafka's option)
  maxEntriesPerTrigger   streaming: at most this many rows per micro-batch (shared by lag)
  minEntriesPerTrigger   streaming: wait for this many rows, up to maxTriggerDelay
  maxTriggerDelay        streaming, with minEntriesPerTrigger: "15m" (default), "30s", "500ms"
  entriesPerPartition    rows per Spark partition (default 100000)
  minPartitions          at least this many Spark partitions (ranges are split further)
  password, passwordFile the ledgers' / streams' password (default empty), or a file holding it
  tlsCaFile, tlsCertFile, tlsKeyFile, tlsCheckHostname   TLS to the bookies (docs/SECURITY.md)
  authToken, authTokenFile                               the bookies' shared token
Write (batch and streaming):
  metadataServiceUri     required
  stream                 the target stream (created if absent); without it, the rows' ``stream``
                         column names each row's stream
  scope                  instead of a stream: each task's rows become one ledger of this scope
  sinkId                 the writer's identity for exactly-once (required for streaming writes;
                         batch writes may give it with batchId, e.g. inside foreachBatch)
  batchId                batch writes only, with sinkId: a replayed (sinkId, batchId) is skipped
  ensembleSize, writeQuorum, ackQuorum   of the ledgers written (default 3, 3, 2)
  password, passwordFile, TLS and token options as for reads
"""
from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field

from embedlog._native.format import LedgerId
from embedlog.client import Client
from embedlog.errors import IllegalOpError
from embedlog.meta.api import check_group_id

CLIENT_KEYS = ("password", "passwordFile", "tlsCaFile", "tlsCertFile", "tlsKeyFile",
               "tlsCheckHostname", "authToken", "authTokenFile")
READ_KEYS = ("metadataServiceUri", "ledgers", "scope", "streams", "streamPattern",
             "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
             "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
             "startingOffsetsByTimestampStrategy", "failOnDataLoss",
             "maxEntriesPerTrigger", "minEntriesPerTrigger", "maxTriggerDelay",
             "entriesPerPartition", "minPartitions", "failOnMissingStreams", "groupId",
             "includeHeaders") + CLIENT_KEYS
WRITE_KEYS = ("metadataServiceUri", "stream", "scope", "sinkId", "batchId", "ensembleSize",
              "writeQuorum", "ackQuorum") + CLIENT_KEYS
SECRET_KEYS = ("password", "authToken")
# Spark's Kafka options that docs/SPARK.md maps to embedlog's (refused with "did you mean")
KAFKA_NAMES = {"kafka.bootstrap.servers": "metadataServiceUri", "subscribe": "streams",
               "subscribePattern": "streamPattern", "assign": "ledgers or scope",
               "maxOffsetsPerTrigger": "maxEntriesPerTrigger",
               "minOffsetsPerTrigger": "minEntriesPerTrigger", "topic": "stream",
               "kafka.ssl.truststore.location": "tlsCaFile",
               "kafka.sasl.jaas.config": "authToken or authTokenFile"}
# Kafka's names embedlog takes as they are: the same meaning under another spelling
KAFKA_ALIASES = {"kafka.group.id": "groupId"}
# Kafka's options with no meaning here, and why (refused, every one in one message)
KAFKA_REFUSED = {
    "groupIdPrefix": "embedlog makes no group ids: a query records its progress in a group only "
                     "when groupId (kafka.group.id) names one; its checkpoint is the source of "
                     "truth either way",
    "kafka.isolation.level": "readers see only committed (LAC-covered) entries, as read_committed",
    "fetchOffset.numRetries": "reads retry on other bookies of the ensemble by themselves",
    "fetchOffset.retryIntervalMs": "reads retry on other bookies of the ensemble by themselves",
    "kafkaConsumer.pollTimeoutMs": "there is no consumer to poll: tasks read the bookies directly",
}
# read options that only a batch read can use (docs/SPARK.md: an error in a streaming read)
BATCH_ONLY_KEYS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
# keys Spark itself may pass through to a source or sink
SPARK_KEYS = ("path", "checkpointLocation", "queryName")
DEFAULT_ENTRIES_PER_PARTITION = 100_000
MAX_ENTRIES_PER_PARTITION = 10_000_000
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
EARLIEST, LATEST = -2, -1          # Kafka's JSON offsets for "earliest" and "latest"
_UNITS_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
             "d": 86_400_000}


def _canonical(options, allowed) -> dict:
    """Options by their canonical names; every unknown or refused one is reported in one
    error (a job with four Kafka options learns of all four from one run)."""
    known = {k.lower(): k for k in allowed + SPARK_KEYS}
    aliases = {k.lower(): v for k, v in KAFKA_ALIASES.items() if v in allowed}
    out = {}
    problems = []
    for key, value in dict(options).items():
        canon = known.get(key.lower()) or aliases.get(key.lower())
        if canon is None:
            problems.append(_unknown(key, allowed))
            continue
        if canon in out and out[canon] != value:
            problems.append(f"embedlog: option {canon} is given twice (as {canon} and as "
                            f"Kafka's {key}) with different values")
        out[canon] = value
    if len(problems) == 1:
        raise IllegalOpError(problems[0])
    if problems:
        raise IllegalOpError(f"embedlog: {len(problems)} options are not embedlog's: "
                             + "; ".join(p.removeprefix("embedlog: ").split(" Known options:")[0]
                                         .rstrip(".") for p in problems)
                             + f". Known options: {', '.join(allowed)}")
    return out


def _unknown(key: str, allowed) -> str:
    """The message for an unknown option: Kafka's names (docs/SPARK.md's table) and near
    misses get "did you mean"; Kafka's names with no meaning here say why. Spark hands a
    Python data source its option names lower-cased (the original spelling never reaches
    it), so a Kafka name is echoed in Kafka's spelling."""
    kafka = {k.lower(): (k, v) for k, v in KAFKA_NAMES.items()}.get(key.lower())
    if kafka is not None and kafka[1].split(" or ")[0] in allowed:
        return (f"embedlog: option {kafka[0]!r} is Kafka's; did you mean {kafka[1]}? "
                "(docs/SPARK.md, For Kafka users)")
    refused = {k.lower(): (k, v) for k, v in KAFKA_REFUSED.items()}.get(key.lower())
    if refused is not None:
        return f"embedlog: option {refused[0]!r} is Kafka's and has no meaning here: {refused[1]}"
    lower = {k.lower(): k for k in allowed}
    near = difflib.get_close_matches(key.lower(), list(lower), n=1)
    hint = f" Did you mean {lower[near[0]]}?" if near else ""
    return (f"embedlog: unknown option {key!r} (Spark passes option names lower-cased).{hint} "
            f"Known options: {', '.join(allowed)}")


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


def _bool(opts, key, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise IllegalOpError(f"embedlog: option {key} is true or false, got {raw!r}")
    return text == "true"


def duration_ms(raw, key: str) -> int:
    """Spark's time strings, as the Kafka source takes them: "15m", "30s", "500ms", "2h";
    a bare number is milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", str(raw).lower())
    if m is None or m.group(2) not in ("",) + tuple(_UNITS_MS):
        raise IllegalOpError(f"embedlog: option {key} is a duration such as 15m, 30s or 500ms, "
                             f"got {raw!r}")
    return int(m.group(1)) * _UNITS_MS.get(m.group(2), 1)


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


def parse_positions(raw, what: str, words: tuple, allowed: tuple) -> str | dict:
    """A word of ``words`` or a JSON object {name: position}, where a position is an int >= 0
    or one of ``allowed`` (EARLIEST, LATEST)."""
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
            isinstance(k, str) and type(v) is int and (v >= 0 or v in allowed) for k, v in value.items()):
        special = " (or " + ", ".join(f"{v} for {'earliest' if v == EARLIEST else 'latest'}"
                                      for v in allowed) + ")" if allowed else ""
        raise IllegalOpError(f"embedlog: option {what} is {' or '.join(map(repr, words))} or a JSON "
                             f"object of name -> non-negative position{special}, got {text!r}")
    return value


def parse_times(raw, what: str) -> dict | None:
    if raw is None:
        return None
    try:
        value = json.loads(str(raw))
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()):
        raise IllegalOpError(f"embedlog: option {what} is a JSON object of stream name -> time "
                             f"(ms since the epoch, >= 0), got {raw!r}")
    return value


def _client_config(opts) -> tuple[bytes, dict]:
    """(password, ClientConfig options): files are checked to exist here, on the driver; a
    password file is read here and travels with the options (never printed)."""
    if opts.get("password") is not None and opts.get("passwordFile") is not None:
        raise IllegalOpError("embedlog: give option password or passwordFile, not both")
    if opts.get("authToken") is not None and opts.get("authTokenFile") is not None:
        raise IllegalOpError("embedlog: give option authToken or authTokenFile, not both")
    password = str(opts.get("password", "")).encode()
    if opts.get("passwordFile") is not None:
        path = str(opts["passwordFile"])
        try:
            with open(path, "rb") as f:
                password = f.read().rstrip(b"\r\n")
        except OSError as exc:
            raise IllegalOpError(f"embedlog: option passwordFile: cannot read {path!r}: "
                                 f"{exc.strerror}") from None
    config: dict = {}
    for key, name in (("tlsCaFile", "tls_ca_file"), ("tlsCertFile", "tls_cert_file"),
                      ("tlsKeyFile", "tls_key_file"), ("authTokenFile", "auth_token_file")):
        if opts.get(key) is not None:
            path = str(opts[key])
            if not os.path.isfile(path):
                raise IllegalOpError(f"embedlog: option {key}: no file {path!r}")
            config[name] = path
    if opts.get("tlsCheckHostname") is not None:
        config["tls_check_hostname"] = _bool(opts, "tlsCheckHostname", True)
    if opts.get("authToken") is not None:
        token = str(opts["authToken"]).strip().encode()
        if not token:
            raise IllegalOpError("embedlog: option authToken is empty")
        config["auth_token"] = token
    if config.get("tls_key_file") and not config.get("tls_cert_file"):
        raise IllegalOpError("embedlog: option tlsKeyFile needs tlsCertFile")
    return password, config


@dataclass(frozen=True)
class ReadOptions:
    uri: str
    ledgers: tuple = ()            # LedgerId, in the order given
    scope: int | None = None
    streams: tuple = ()
    stream_pattern: str | None = None
    starting: object = "earliest"
    ending: object = "latest"
    starting_time_ms: int | None = None
    starting_times: dict | None = None
    starting_time_strategy: str = "error"
    ending_time_ms: int | None = None
    ending_times: dict | None = None
    fail_on_data_loss: bool = True
    fail_on_missing_streams: bool = False
    group_id: str | None = None
    max_entries_per_trigger: int | None = None
    min_entries_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION
    min_partitions: int = 1
    password: bytes = field(default=b"", repr=False)
    client_config: dict = field(default_factory=dict, repr=False)

    @property
    def over_streams(self) -> bool:
        return bool(self.streams) or self.stream_pattern is not None


def read_options(options, streaming: bool = False) -> ReadOptions:
    opts = _canonical(options, READ_KEYS)
    ending = [k for k in BATCH_ONLY_KEYS if opts.get(k) is not None]
    if streaming and ending:
        raise IllegalOpError(f"embedlog: option {ending[0]} is for batch reads; a streaming read "
                             "goes on as the streams grow (stop the query, or use "
                             "trigger(availableNow=True) to read what is there and stop)")
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
                               ("earliest", "latest"), (EARLIEST, LATEST))
    ending = parse_positions(opts.get("endingOffsets"), "endingOffsets", ("latest",), (LATEST,))
    timed = [k for k in ("startingTimestamp", "startingOffsetsByTimestamp", "endingTimestamp",
                         "endingOffsetsByTimestamp") if opts.get(k) is not None]
    if timed and not over_streams:
        raise IllegalOpError(f"embedlog: option {timed[0]} needs streams (only stream entries "
                             "carry their append time)")
    strategy = str(opts.get("startingOffsetsByTimestampStrategy", "error")).strip().lower()
    if strategy not in ("error", "latest"):
        raise IllegalOpError("embedlog: option startingOffsetsByTimestampStrategy is error or "
                             f"latest, got {opts['startingOffsetsByTimestampStrategy']!r}")
    max_trigger = _int(opts, "maxEntriesPerTrigger", None, 1, 1 << 62)
    min_trigger = _int(opts, "minEntriesPerTrigger", None, 1, 1 << 62)
    if max_trigger is not None and min_trigger is not None and min_trigger > max_trigger:
        raise IllegalOpError(f"embedlog: minEntriesPerTrigger ({min_trigger}) is above "
                             f"maxEntriesPerTrigger ({max_trigger})")
    delay = DEFAULT_MAX_TRIGGER_DELAY_MS
    if opts.get("maxTriggerDelay") is not None:
        delay = duration_ms(opts["maxTriggerDelay"], "maxTriggerDelay")
    if _bool(opts, "includeHeaders", False):
        raise IllegalOpError("embedlog: option includeHeaders=true: stream entries carry no "
                             "headers (a value and its append time only; the rows have no "
                             "headers column): put what headers held in the payload")
    group_id = opts.get("groupId")
    if group_id is not None:
        if not over_streams:
            raise IllegalOpError("embedlog: option groupId needs streams (a group's positions "
                                 "are stream positions)")
        try:
            group_id = check_group_id(str(group_id))
        except IllegalOpError as exc:
            raise IllegalOpError(f"embedlog: option groupId: {exc}") from None
    password, config = _client_config(opts)
    return ReadOptions(
        uri=_uri(opts), ledgers=ledgers, scope=scope, streams=streams, stream_pattern=pattern,
        starting=starting, ending=ending,
        starting_time_ms=_int(opts, "startingTimestamp", None, 0, 1 << 62),
        starting_times=parse_times(opts.get("startingOffsetsByTimestamp"), "startingOffsetsByTimestamp"),
        starting_time_strategy=strategy,
        ending_time_ms=_int(opts, "endingTimestamp", None, 0, 1 << 62),
        ending_times=parse_times(opts.get("endingOffsetsByTimestamp"), "endingOffsetsByTimestamp"),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        fail_on_missing_streams=_bool(opts, "failOnMissingStreams", False), group_id=group_id,
        max_entries_per_trigger=max_trigger, min_entries_per_trigger=min_trigger,
        max_trigger_delay_ms=delay,
        entries_per_partition=_int(opts, "entriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION,
                                   1, MAX_ENTRIES_PER_PARTITION),
        min_partitions=_int(opts, "minPartitions", 1, 1, 1 << 20),
        password=password, client_config=config)


@dataclass(frozen=True)
class WriteOptions:
    uri: str
    stream: str | None = None          # None: the rows' stream column routes them (or scope)
    scope: int | None = None           # ledgers instead of a stream
    sink_id: str | None = None
    batch_id: int | None = None
    ensemble: tuple = field(default=(3, 3, 2))
    password: bytes = field(default=b"", repr=False)
    client_config: dict = field(default_factory=dict, repr=False)


def write_options(options, streaming: bool) -> WriteOptions:
    opts = _canonical(options, WRITE_KEYS)
    stream = opts.get("stream") or None
    scope = _int(opts, "scope", None, 0, (1 << 64) - 1)
    if stream is not None and scope is not None:
        raise IllegalOpError("embedlog: a write goes to option stream or to option scope, not both")
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
    password, config = _client_config(opts)
    return WriteOptions(uri=_uri(opts), stream=None if stream is None else str(stream), scope=scope,
                        sink_id=sink_id, batch_id=batch_id, ensemble=(e, qw, qa),
                        password=password, client_config=config)


def check_at_load(options) -> None:
    """What can be checked when ``load()`` is called, before Spark knows whether the query
    reads or writes, batch or streaming: the syntax of a read's options (a write's are
    checked by writer()/streamWriter(), which Spark calls when the write starts)."""
    keys = {k.lower() for k in dict(options)}
    write_only = {k.lower() for k in WRITE_KEYS} - {k.lower() for k in READ_KEYS}
    if keys & write_only:
        _canonical(options, WRITE_KEYS)
        return
    read_options(options)


def client_for(opts) -> Client:
    """A client of the options' metadata service, with their TLS and token settings."""
    return Client(opts.uri, **opts.client_config)
