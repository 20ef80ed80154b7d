"""A consumer of streams in Kafka's shape (confluent-kafka's ``Consumer``), with consumer
groups (client/group.py: the record, rebalancing and fencing).

    c = embedlog.Consumer({"metadata.uri": uri, "group.id": "billing",
                           "auto.offset.reset": "earliest"})
    c.subscribe(["orders"])
    while True:
        msg = c.poll(1.0)            # None when nothing came within the timeout
        if msg is None:
            continue
        handle(msg.topic(), msg.offset(), msg.value())
    c.close()                        # commits (auto-commit on) and leaves the group

A stream is one Kafka partition (partition() is always 0); an offset is a stream position.
Auto-commit, as Kafka's, commits in poll()/consume() what the previous calls returned, so
every record is processed at least once; commit() commits now. A commit refused because
the group rebalanced raises CommitFailedError; the next poll rejoins and reads from the
committed positions. Not thread-safe (as Kafka's): one thread polls; a heartbeat thread
of its own keeps the member's session.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Iterable

from embedlog.client import group as G
from embedlog.client.client import Client
from embedlog.errors import (CommitFailedError, ConfigError, EmbedlogError, IllegalOpError,
                             NoSuchEntryError, NoSuchLedgerError)

log = logging.getLogger("embedlog.consumer")

OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_INVALID = -1001

_RESETS = {"earliest": "earliest", "smallest": "earliest", "beginning": "earliest",
           "latest": "latest", "largest": "latest", "end": "latest", "error": "error"}
# Kafka's settings that have no meaning here, and why (reported with the unknown ones)
_NO_MEANING = {
    "bootstrap.servers": "embedlog finds its bookies through the metadata store: give "
                         "metadata.uri (e.g. sqlite:///abs/meta.db or zk+hierarchical://h:2181/ledgers)",
    "key.deserializer": "stream entries have no key; values are bytes",
    "value.deserializer": "values are bytes: decode them in your code",
    "group.instance.id": "static membership is not implemented: members are dynamic",
    "partition.assignment.strategy": "one assignor: sticky, one member per stream",
    "isolation.level": "readers see only committed (LAC-covered) entries, as read_committed",
}
_DEFAULTS = {
    "metadata.uri": None, "group.id": None, "client.id": "embedlog-consumer",
    "enable.auto.commit": True, "auto.commit.interval.ms": 5000,
    "auto.offset.reset": "latest", "session.timeout.ms": 45000,
    "heartbeat.interval.ms": 3000, "max.poll.records": 500, "max.poll.interval.ms": 300000,
    "stream.password": b"",
}


class TopicPartition:
    """confluent-kafka's TopicPartition: a stream (``topic``), partition 0, an offset."""
    __slots__ = ("topic", "partition", "offset", "metadata", "error")

    def __init__(self, topic: str, partition: int = 0, offset: int = OFFSET_INVALID,
                 metadata: str | None = None):
        if partition != 0:
            raise IllegalOpError(f"a stream is one partition (0), got partition {partition}")
        self.topic, self.partition, self.offset = topic, 0, offset
        self.metadata, self.error = metadata, None

    def __repr__(self) -> str:
        return f"TopicPartition{{topic={self.topic},partition=0,offset={self.offset}}}"

    def __eq__(self, other) -> bool:
        return (isinstance(other, TopicPartition) and
                (self.topic, self.offset) == (other.topic, other.offset))

    def __hash__(self) -> int:
        return hash((self.topic, self.offset))


class Message:
    """confluent-kafka's Message: topic() is the stream, offset() the position."""
    __slots__ = ("_stream", "_position", "_value", "_timestamp", "_index")

    def __init__(self, stream: str, position: int, value: bytes, timestamp: int | None,
                 index: int = 0):
        self._stream, self._position, self._value = stream, position, value
        self._timestamp, self._index = timestamp, index

    def topic(self) -> str:
        return self._stream

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._position

    def value(self) -> bytes:
        return self._value

    def key(self) -> None:
        return None

    def headers(self) -> None:
        return None

    def error(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        """(TIMESTAMP_CREATE_TIME = 1, append ms) or (TIMESTAMP_NOT_AVAILABLE = 0, -1)."""
        return (1, self._timestamp) if self._timestamp is not None else (0, -1)

    def __len__(self) -> int:
        return len(self._value)

    def __repr__(self) -> str:
        return f"Message({self._stream!r}, position {self._position}, {len(self._value)} bytes)"


def parse_config(conf: dict) -> dict:
    """The consumer's settings: every unknown key reported at once (ConfigError)."""
    if not isinstance(conf, dict):
        raise ConfigError(f"a consumer's configuration is a dict, got {type(conf).__name__}")
    problems = []
    for key in conf:
        if key in _NO_MEANING:
            problems.append(f"{key!r}: {_NO_MEANING[key]}")
        elif key not in _DEFAULTS:
            problems.append(f"{key!r}: unknown")
    if problems:
        raise ConfigError("consumer configuration: " + "; ".join(problems)
                          + f" (known: {', '.join(sorted(_DEFAULTS))})")
    out = {**_DEFAULTS, **conf}
    reset = _RESETS.get(str(out["auto.offset.reset"]).lower())
    if reset is None:
        raise ConfigError(f"auto.offset.reset: {out['auto.offset.reset']!r} is not one of "
                          f"{', '.join(sorted(_RESETS))}")
    out["auto.offset.reset"] = reset
    for key in ("auto.commit.interval.ms", "session.timeout.ms", "heartbeat.interval.ms",
                "max.poll.records", "max.poll.interval.ms"):
        try:
            out[key] = int(out[key])
            if out[key] < 1:
                raise ValueError
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: a positive integer, got {out[key]!r}") from None
    if out["heartbeat.interval.ms"] >= out["session.timeout.ms"]:
        raise ConfigError(f"heartbeat.interval.ms ({out['heartbeat.interval.ms']}) must be "
                          f"below session.timeout.ms ({out['session.timeout.ms']})")
    v = out["enable.auto.commit"]
    out["enable.auto.commit"] = v if isinstance(v, bool) else str(v).lower() in ("true", "1")
    pw = out["stream.password"]
    out["stream.password"] = pw.encode() if isinstance(pw, str) else bytes(pw)
    return out


class Consumer:
    """See the module docstring. ``Consumer(conf)`` opens its own Client on
    ``conf["metadata.uri"]``; ``Consumer(conf, client=c)`` uses ``c`` (a Client, or an
    embedded log's streams: anything with ``metadata``, ``open_stream`` and
    ``list_streams``) and leaves it open."""

    def __init__(self, conf: dict, *, client=None):
        self._conf = parse_config(conf)
        self._own_client = client is None
        if client is None:
            if not self._conf["metadata.uri"]:
                raise ConfigError("consumer configuration: give metadata.uri (where the "
                                  "cluster's metadata is), or pass client=")
            client = Client(self._conf["metadata.uri"])
        self._client = client
        self._metadata = client.metadata
        self.group_id = self._conf["group.id"]
        if self.group_id is not None:
            G.check_group_id(self.group_id)
        self._client_id = str(self._conf["client.id"])
        self._member_id: str | None = None
        self._subscription: list[str] = []
        self._on_assign = self._on_revoke = None
        self._manual = False                      # assign() rather than subscribe()
        self._generation = -1
        self._assignment: dict[str, int] = {}     # stream -> generation it is held in
        self._positions: dict[str, int] = {}      # stream -> next position to deliver
        self._fetched: dict[str, int] = {}        # stream -> next position to fetch
        self._buffer: collections.deque = collections.deque()
        self._streams: dict = {}
        self._last_commit = time.monotonic()
        self._committed_sent: dict[str, int] = {}
        self._rotation = 0
        self._state = threading.Lock()            # _latest and _evicted, shared with heartbeats
        self._latest: dict | None = None
        self._evicted = False
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None
        self._closed = False
        self._last_poll = time.monotonic()

    # -- membership --------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str], on_assign: Callable | None = None,
                  on_revoke: Callable | None = None) -> None:
        """Join the group (``group.id``) for these streams: names, globs (``orders-*``) or
        regexes (``^orders-.*``, as Kafka's). Streams are shared out among the members, one
        member per stream; ``on_assign(consumer, [TopicPartition])`` and ``on_revoke`` run
        in poll() when the share changes. Streams created later that match join in."""
        self._check_open()
        if self.group_id is None:
            raise ConfigError("subscribe needs group.id in the consumer's configuration "
                              "(or use assign() to read streams without a group)")
        topics = [topics] if isinstance(topics, str) else list(topics)
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise IllegalOpError(f"subscribe takes stream names or patterns, got {topics!r}")
        self._subscription, self._on_assign, self._on_revoke = topics, on_assign, on_revoke
        self._manual = False
        if self._member_id is None:
            self._member_id = G.new_member_id(self._client_id)
        self._join()
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                                name=f"embedlog-consumer-heartbeat-{self.group_id}")
            self._heartbeats.start()

    def unsubscribe(self) -> None:
        self._check_open()
        self._leave()
        self._subscription = []
        self._apply_assignment({}, -1)

    def assign(self, partitions: Iterable[TopicPartition | str]) -> None:
        """Read these streams without a group's assignment (Kafka's assign): positions
        from each TopicPartition's offset, else the group's committed one (with a
        group.id), else auto.offset.reset. commit() still records positions in the group
        (unfenced: no member owns the streams)."""
        self._check_open()
        if self._member_id is not None:
            self._leave()
        self._manual = True
        tps = [p if isinstance(p, TopicPartition) else TopicPartition(p) for p in partitions]
        self._apply_assignment({tp.topic: -1 for tp in tps}, -1)
        for tp in tps:
            if tp.offset >= 0:
                self._set_position(tp.topic, tp.offset)

    def _streams_now(self) -> list[str]:
        return self._client.list_streams()

    def _join(self) -> None:
        streams = self._streams_now()
        me = self._member_id
        info = G.member_info(self._client_id, self._subscription, self._conf["session.timeout.ms"])

        def change(rec):
            G.expire_members(rec, G.now_ms())
            rec["members"][me] = info
            G.rebalance(rec, streams)
            return rec
        rec = G.update_group(self._metadata, self.group_id, change)
        with self._state:
            self._latest, self._evicted = rec, False
        self._sync()

    def _leave(self) -> None:
        if self._member_id is None or self.group_id is None:
            return
        self._stop.set()
        if self._heartbeats is not None and self._heartbeats is not threading.current_thread():
            self._heartbeats.join(timeout=30)
        self._heartbeats = None
        me = self._member_id
        self._member_id = None
        try:
            streams = self._streams_now()

            def change(rec):
                if me not in rec["members"]:
                    return None
                del rec["members"][me]
                G.expire_members(rec, G.now_ms())
                G.rebalance(rec, streams)
                return rec
            G.update_group(self._metadata, self.group_id, change, create=False)
        except EmbedlogError as exc:            # its session expires anyway
            log.warning("consumer group %r: member %s could not leave: %s", self.group_id, me, exc)
        self._stop = threading.Event()

    def _heartbeat_loop(self) -> None:
        interval = self._conf["heartbeat.interval.ms"] / 1000.0
        stop = self._stop
        while not stop.wait(interval):
            try:
                self._heartbeat()
            except Exception as exc:               # a store hiccup: try again next beat
                log.warning("consumer group %r: heartbeat failed: %s", self.group_id, exc)

    def _heartbeat(self) -> None:
        me = self._member_id
        if me is None:
            return
        streams = self._streams_now()
        session = self._conf["session.timeout.ms"]
        evicted = False
        # a member whose thread has not polled for max.poll.interval.ms stops keeping its
        # session, as Kafka's leaves the group: its streams move to members that poll, and
        # its next poll rejoins
        stalled = (time.monotonic() - self._last_poll) * 1000 > self._conf["max.poll.interval.ms"]
        if stalled:
            log.warning("consumer group %r: member %s has not polled for max.poll.interval.ms "
                        "(%d ms): letting its session expire", self.group_id, me,
                        self._conf["max.poll.interval.ms"])

        def change(rec):
            nonlocal evicted
            now = G.now_ms()
            if me not in rec["members"]:
                evicted = True
                return None
            if not stalled:
                rec["members"][me]["expires_ms"] = now + session
            G.expire_members(rec, now)
            G.rebalance(rec, streams)
            return rec
        rec = G.update_group(self._metadata, self.group_id, change)
        with self._state:
            self._latest = rec
            self._evicted = self._evicted or evicted
        if evicted or rec["generation"] != self._generation:
            self._changed.set()

    def _sync(self) -> None:
        """Apply in this (the polling) thread what the heartbeats saw: rejoin after an
        eviction; take up a new assignment."""
        if self._manual or self._member_id is None:
            return
        with self._state:
            evicted, rec = self._evicted, self._latest
        self._changed.clear()
        if evicted:
            log.info("consumer group %r: member %s was evicted; rejoining", self.group_id,
                     self._member_id)
            self._join()
            return
        if rec is None:
            rec, _ = G.read_group(self._metadata, self.group_id)
            with self._state:
                self._latest = rec
        if rec is None:
            return
        mine = {s: a["generation"] for s, a in rec["assignment"].items()
                if a["member"] == self._member_id}
        if mine != self._assignment:
            self._apply_assignment(mine, rec["generation"], rec)
        self._generation = rec["generation"]

    def _apply_assignment(self, mine: dict, generation: int, rec: dict | None = None) -> None:
        revoked = [s for s in self._assignment if mine.get(s) != self._assignment[s]]
        added = [s for s in mine if self._assignment.get(s) != mine[s]]
        if revoked and self._on_revoke is not None:
            self._on_revoke(self, [TopicPartition(s) for s in revoked])
        for s in revoked:
            self._positions.pop(s, None)
            self._fetched.pop(s, None)
        if revoked:
            gone = set(revoked)
            self._buffer = collections.deque(m for m in self._buffer if m._stream not in gone)
        self._assignment = dict(mine)
        self._generation = generation
        if added:
            committed = (rec or {}).get("committed", {})
            if rec is None and self.group_id is not None:
                found, _ = G.read_group(self._metadata, self.group_id)
                committed = (found or {}).get("committed", {})
            for s in added:
                c = committed.get(s)
                if c is not None:
                    self._set_position(s, c["position"])
                    self._committed_sent[s] = c["position"]
                else:
                    self._reset_position(s)
        if added and self._on_assign is not None:
            self._on_assign(self, [TopicPartition(s, 0, self._positions.get(s, OFFSET_INVALID))
                                   for s in added])

    def _stream(self, name: str):
        s = self._streams.get(name)
        if s is None:
            s = self._streams[name] = self._client.open_stream(
                name, create=False, password=self._conf["stream.password"])
        return s

    def _reset_position(self, name: str) -> None:
        how = self._conf["auto.offset.reset"]
        if how == "error":
            raise NoSuchEntryError(f"stream {name!r}: no committed position for group "
                                   f"{self.group_id!r} and auto.offset.reset is 'error'")
        try:
            s = self._stream(name)
        except NoSuchLedgerError:
            self._set_position(name, 0)
            return
        self._set_position(name, s.refresh().first_entry_id if how == "earliest"
                           else s.last_position() + 1)

    def _set_position(self, name: str, position: int) -> None:
        self._positions[name] = self._fetched[name] = int(position)
        self._buffer = collections.deque(m for m in self._buffer if m._stream != name)

    # -- reading ---------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """One message, or None if none came within ``timeout`` seconds (None: wait)."""
        got = self.consume(1, -1 if timeout is None else timeout)
        return got[0] if got else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` messages, as soon as there are some (or [] after
        ``timeout`` seconds; -1: wait)."""
        self._check_open()
        if not self._assignment and not self._subscription and not self._manual:
            raise IllegalOpError("consume: subscribe() or assign() first")
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        self._last_poll = time.monotonic()
        self._maybe_auto_commit()
        while True:
            self._sync()
            if not self._buffer:
                self._fetch()
            if self._buffer:
                out = []
                while self._buffer and len(out) < num_messages:
                    m = self._buffer.popleft()
                    nxt = self._buffer[0] if self._buffer else None
                    same = nxt is not None and nxt._stream == m._stream and nxt._position == m._position
                    self._positions[m._stream] = m._position if same else m._position + 1
                    out.append(m)
                self._last_poll = time.monotonic()
                return out
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            self._last_poll = time.monotonic()      # waiting in poll is polling
            self._wait(0.5 if left is None else min(left, 0.5))

    def _fetch(self) -> None:
        names = sorted(self._assignment)
        if not names:
            return
        budget = self._conf["max.poll.records"]
        for k in range(len(names)):
            name = names[(self._rotation + k) % len(names)]
            try:
                s = self._stream(name)
            except NoSuchLedgerError:
                continue                         # not yet (or no longer) there
            pos = self._fetched[name]
            last = s.last_position()
            if pos > last:
                continue
            end = min(last, pos + budget - 1)
            try:
                for e in s.read(pos, end):
                    self._buffer.append(Message(name, e.position, e.data, e.timestamp,
                                                getattr(e, "index", 0)))
            except NoSuchEntryError:
                if self._conf["auto.offset.reset"] == "error":
                    raise
                log.warning("stream %r: position %d is gone (retention); resetting to the %s "
                            "position", name, pos, self._conf["auto.offset.reset"])
                self._reset_position(name)
                continue
            self._fetched[name] = end + 1
            if self._buffer:
                self._rotation = (self._rotation + k + 1) % len(names)
                return

    def _wait(self, seconds: float) -> None:
        """Wait for an entry past the fetch position of one assigned stream (a long poll
        of its bookies), or a rebalance, at most ``seconds``."""
        names = sorted(self._assignment)
        if not names:
            self._changed.wait(seconds)
            return
        name = names[self._rotation % len(names)]
        self._rotation += 1
        try:
            s = self._stream(name)
            s.wait_for(self._fetched[name], max(1, int(seconds * 1000 / len(names))))
        except NoSuchLedgerError:
            self._changed.wait(seconds / len(names))
        except EmbedlogError:
            s.refresh()

    # -- positions -------------------------------------------------------------------------

    def _maybe_auto_commit(self) -> None:
        if (not self._conf["enable.auto.commit"] or self.group_id is None
                or time.monotonic() - self._last_commit < self._conf["auto.commit.interval.ms"] / 1000.0):
            return
        try:
            self.commit(asynchronous=False, _auto=True)
        except CommitFailedError as exc:
            log.warning("%s", exc)

    def commit(self, message: Message | None = None, offsets: Iterable[TopicPartition] | None = None,
               asynchronous: bool = False, _auto: bool = False) -> list[TopicPartition] | None:
        """Commit positions to the group: ``message``'s (its offset + 1), ``offsets``
        (TopicPartitions naming the next position to read), or every assigned stream's
        current position. Durable in the metadata store on return (``asynchronous`` is
        accepted and ignored: a commit is one compare-and-set). CommitFailedError if the
        group rebalanced or was reset since this member was given a stream."""
        self._check_open()
        if self.group_id is None:
            raise ConfigError("commit needs group.id in the consumer's configuration")
        if message is not None and offsets is not None:
            raise IllegalOpError("commit takes message or offsets, not both")
        if message is not None:
            offs = {message.topic(): message.offset() + 1}
        elif offsets is not None:
            offs = {tp.topic: int(tp.offset) for tp in offsets}
        else:
            offs = {s: p for s, p in self._positions.items() if s in self._assignment}
        self._last_commit = time.monotonic()
        if _auto:
            offs = {s: p for s, p in offs.items() if self._committed_sent.get(s) != p}
        if not offs:
            return [] if not _auto else None
        for s, p in offs.items():
            if not isinstance(p, int) or p < 0:
                raise IllegalOpError(f"commit: stream {s!r}: a position is an int >= 0, got {p!r}")
        held, me, manual = dict(self._assignment), self._member_id, self._manual
        session = self._conf["session.timeout.ms"]

        def change(rec):
            if not manual:
                G.check_commit(rec, self.group_id, me, held, offs)
                rec["members"][me]["expires_ms"] = G.now_ms() + session
            G.set_committed(rec, offs, me)
            return rec
        try:
            rec = G.update_group(self._metadata, self.group_id, change)
        except CommitFailedError:
            with self._state:
                self._latest = None                    # the next poll reads the group anew
                self._evicted = self._evicted or not manual and self._member_gone()
            raise
        with self._state:
            self._latest = rec
        self._committed_sent.update(offs)
        return [TopicPartition(s, 0, p) for s, p in sorted(offs.items())]

    def _member_gone(self) -> bool:
        rec, _ = G.read_group(self._metadata, self.group_id)
        return rec is None or self._member_id not in rec["members"]

    def committed(self, partitions: Iterable[TopicPartition | str], timeout: float | None = None
                  ) -> list[TopicPartition]:
        """The group's committed positions (OFFSET_INVALID where none)."""
        if self.group_id is None:
            raise ConfigError("committed needs group.id in the consumer's configuration")
        rec, _ = G.read_group(self._metadata, self.group_id)
        committed = (rec or {}).get("committed", {})
        out = []
        for p in partitions:
            name = p.topic if isinstance(p, TopicPartition) else p
            c = committed.get(name)
            out.append(TopicPartition(name, 0, OFFSET_INVALID if c is None else c["position"]))
        return out

    def position(self, partitions: Iterable[TopicPartition | str]) -> list[TopicPartition]:
        """This consumer's next position per stream (OFFSET_INVALID where not assigned)."""
        out = []
        for p in partitions:
            name = p.topic if isinstance(p, TopicPartition) else p
            out.append(TopicPartition(name, 0, self._positions.get(name, OFFSET_INVALID)))
        return out

    def seek(self, partition: TopicPartition) -> None:
        """Read an assigned stream from ``partition.offset`` on (OFFSET_BEGINNING,
        OFFSET_END or a position); committed only by the next commit."""
        self._check_open()
        name = partition.topic
        if name not in self._assignment:
            raise IllegalOpError(f"seek: stream {name!r} is not assigned to this consumer "
                                 f"(assigned: {sorted(self._assignment)})")
        if partition.offset == OFFSET_BEGINNING:
            self._set_position(name, self._stream(name).refresh().first_entry_id)
        elif partition.offset == OFFSET_END:
            self._set_position(name, self._stream(name).last_position() + 1)
        elif partition.offset >= 0:
            self._set_position(name, partition.offset)
        else:
            raise IllegalOpError(f"seek: offset {partition.offset} is not a position")

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(s) for s in sorted(self._assignment)]

    @property
    def member_id(self) -> str | None:
        return self._member_id

    @property
    def generation(self) -> int:
        return self._generation

    # -- closing ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalOpError("consumer is closed")

    def close(self) -> None:
        """Commit (auto-commit on) and leave the group, so its streams move to the other
        members at once rather than after the session timeout."""
        if self._closed:
            return
        try:
            if self._conf["enable.auto.commit"] and self.group_id is not None and self._assignment:
                try:
                    self.commit(_auto=True)
                except CommitFailedError as exc:
                    log.warning("%s", exc)
            self._leave()
        finally:
            self._closed = True
            for s in self._streams.values():
                try:
                    s.close()
                except EmbedlogError:
                    pass
            if self._own_client:
                self._client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
