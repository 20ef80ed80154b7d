"""The job commit of a Spark write: task ledgers, an intent record, links, roll-forward.

Tasks never touch the target (a stream has one writer at a time). Each task writes, for
each target it has rows for, one **data ledger** of its own, whose entries pack rows
(about 256 KiB an entry, embedlog.client.scan.pack_rows). Before it creates the data
ledger it creates a **marker**: an empty ledger in TASK_SCOPE_ID whose custom metadata
names the data ledger, the job, the sink and the target. Markers are what an abort or a
sweep looks for; a data ledger whose marker is gone belongs to a committed batch.

A stream target's data ledgers live in the scope ``data_scope(stream)``; the commit makes
them part of the stream by **linking** them (``Stream.append_links(packed=True)``): one
stream position per slice of at most LINK_ROWS rows, in task (partition) order. Nothing
is copied; readers read a link's rows from its ledger. A scope target's data ledgers are
created in that scope; the commit **publishes** them (custom metadata ``spark.committed``);
readers of the scope skip a Spark job's ledgers until then.

The commit log of a target is a stream (``commit_log_name``). A commit:

1. takes over the commit log (a new term fences any other committer of the target),
   then the target stream;
2. looks at the log's last record: an ``intent`` without its ``done`` is a commit that
   was decided and interrupted: it is rolled forward (step 5) first;
3. if the record's ``sinks`` map says this sink already committed this batch id (or a
   later one), the new ledgers and markers are deleted and nothing changes (a replay);
4. appends the intent: {"intent": sink, "batch": id, "mode": "link" | "publish",
   "start": first position of the batch in the stream, "ledgers": [[data ledger, marker,
   [[first entry, entries, rows], ...]], ...], "sinks": {...}}. This append is the commit
   point: once durable, the batch will be in the target exactly once;
5. applies it: appends the links the stream does not hold yet at positions >= start
   (those it holds must be the intent's first links, in order), records in each data
   ledger's metadata where its links end (``spark.link``), or publishes the ledgers;
   deletes the markers; removes the data ledgers of links that the stream's retention has
   passed; then appends {"done": ...}. Every step can be done twice.

The commit log is created with rollover and retention (LOG_ROLLOVER_ENTRIES), so it keeps
only its last records: the last one holds everything a commit needs. Readers of a target
can see a batch's links arrive (not isolated), but never a batch twice, never a part of an
aborted job, and never lose a decided one. Write a target only through this package while
such jobs run: an application appending to it between an intent and its done fails the
roll-forward (it finds rows it did not write).
"""
from __future__ import annotations

import hashlib
import json
import logging

from embedlog._native.format import LedgerId
from embedlog.errors import BadVersionError, IllegalOpError, NoSuchLedgerError

log = logging.getLogger("embedlog.spark")

TASK_SCOPE_ID = 0x535041524B000001          # b"SPARK" + 1: markers (and older task ledgers)
DATA_SCOPE_BASE = 0x535041524B000000        # + 2 .. 2^24 - 1: data ledgers of stream targets
JOB_KEY, TARGET_KEY, SINK_KEY = "spark.job", "spark.target", "spark.sink"
DATA_KEY = "spark.data"                     # on a marker: the data ledger it stands for
PACKED_KEY = "spark.packed"                 # on a data ledger: its entries pack rows
COMMITTED_KEY = "spark.committed"           # on a scope target's data ledger, once published
LINK_KEY = "spark.link"                     # on a linked data ledger: stream:ctime:last position
COMMIT_LOG_PREFIX = "__spark_commits__/"
SCOPE_LOG_PREFIX = "__spark_scope_commits__/"
LINK_ROWS = 8192                            # rows per link (a link is never split)
LOG_ROLLOVER_ENTRIES = 16                   # the commit log keeps its last 16..32 positions
LOOKBACK_POSITIONS = 64


class Target:
    """Where a write goes: a stream (by name) or a scope (ledgers)."""
    __slots__ = ("stream", "scope")

    def __init__(self, stream: str | None = None, scope: int | None = None):
        if (stream is None) == (scope is None):
            raise IllegalOpError("a target is a stream or a scope")
        self.stream, self.scope = stream, scope

    @property
    def key(self) -> str:
        return self.stream if self.stream is not None else f"scope:{self.scope}"

    def __eq__(self, other):
        return isinstance(other, Target) and (self.stream, self.scope) == (other.stream, other.scope)

    def __hash__(self):
        return hash((self.stream, self.scope))

    def __lt__(self, other):
        return self.key < other.key

    def __repr__(self):
        return f"Target({self.key!r})"

    def __reduce__(self):
        return (Target, (self.stream, self.scope))


def data_scope(target: Target) -> int:
    """The scope of a target's data ledgers: a stream's own in the SPARK range (targets that
    share one are told apart by the ledgers' custom metadata), or the target scope."""
    if target.scope is not None:
        return target.scope
    h = int.from_bytes(hashlib.blake2b(target.stream.encode(), digest_size=8).digest(), "big")
    return DATA_SCOPE_BASE | (2 + h % ((1 << 24) - 2))


def commit_log_name(target) -> str:
    if isinstance(target, str):
        return COMMIT_LOG_PREFIX + target
    if target.stream is not None:
        return COMMIT_LOG_PREFIX + target.stream
    return SCOPE_LOG_PREFIX + str(target.scope)


def last_record(log_stream) -> dict | None:
    """The last data entry of the commit log (take-overs leave no-ops behind it)."""
    last = log_stream.last_position()
    first = log_stream.refresh().first_entry_id
    hi = last
    while hi >= first:
        lo = max(first, hi - LOOKBACK_POSITIONS + 1)
        entries = list(log_stream.read(lo, hi))
        if entries:
            return json.loads(entries[-1].data)
        hi = lo - 1
    return None


# -- ledgers, markers, sweeps ---------------------------------------------------------------

def delete_ledgers(client, qnames) -> None:
    for q in qnames:
        try:
            client.delete_ledger(LedgerId.parse(q))
        except NoSuchLedgerError:
            pass


def _update_tags(client, qname: str, add: dict) -> None:
    """Set custom metadata of a (closed) ledger by compare-and-set; done twice is harmless."""
    lm = client.metadata.ledger_manager
    lid = LedgerId.parse(qname)
    for _ in range(16):
        v = lm.read_ledger_metadata(lid)
        tags = dict(v.value.custom_metadata)
        want = {k: (val.encode() if isinstance(val, str) else val) for k, val in add.items()}
        if all(tags.get(k) == val for k, val in want.items()):
            return
        tags.update(want)
        try:
            lm.write_ledger_metadata(v.value.with_(custom_metadata=tags), v.version)
            return
        except BadVersionError:
            continue
    raise BadVersionError(f"could not tag ledger {qname}: its metadata kept changing")


def sweep(client, job_id: str, keep=(), sink_id: str | None = None) -> int:
    """Delete the markers of ``job_id`` (failed or speculative attempts too), with the data
    ledgers they name, but those in ``keep``; with ``sink_id`` also those of earlier runs of
    that sink (a task killed when its query stopped may have made its ledger after that
    run's last sweep). Only after a commit or an abort of that job: an earlier run's decided
    intent must have been rolled forward (which deletes its markers) first. Ledgers of
    earlier versions, which had no marker, are recognised by their job tag."""
    keep = set(keep)
    sink = sink_id.encode() if sink_id is not None else None
    n = 0
    for lid in client.list_ledgers(TASK_SCOPE_ID):
        lid = LedgerId.coerce(lid)
        try:
            md = client.ledger_metadata(lid)
        except NoSuchLedgerError:
            continue
        tags = md.custom_metadata
        mine = tags.get(JOB_KEY) == job_id.encode() or (sink is not None and tags.get(SINK_KEY) == sink)
        data = tags.get(DATA_KEY, b"").decode()
        if not mine or lid.qualified_name in keep or data in keep:
            continue
        if data:
            delete_ledgers(client, [data])
        delete_ledgers(client, [lid.qualified_name])
        n += 1
    return n


# kept for the name earlier versions exported
sweep_job = sweep


# -- applying an intent ---------------------------------------------------------------------

def _links(record) -> list:
    """(ledger id, first, entries, rows) of an intent's links, in order."""
    return [(LedgerId.parse(q), first, count, rows)
            for q, _marker, slices in record["ledgers"] for first, count, rows in slices]


def _apply_links(client, target_stream, record) -> dict:
    """Links of the intent the stream does not hold yet; returns {data ledger: last position}."""
    want = _links(record)
    start = record["start"]
    end = target_stream.last_position()
    present = target_stream.read_arrow(start, end) if end >= start else None
    have = present.links if present is not None else []
    if present is not None and present.rows.num_rows:
        raise IllegalOpError(f"stream {target_stream.name!r} holds rows after the start of batch "
                             f"{record['batch']} of sink {record['intent']!r} that the batch did "
                             "not link: something else appended to it")
    for k, link in enumerate(have):
        if k >= len(want) or (link.ledger_id, link.first, link.count, link.rows) != want[k]:
            raise IllegalOpError(f"stream {target_stream.name!r}: the link at position {link.position} "
                                 f"is not link {k} of batch {record['batch']} of sink {record['intent']!r}")
    positions = [link.position for link in have]
    rest = want[len(have):]
    if rest:
        last = target_stream.append_links(rest, packed=True)
        positions += list(range(last - len(rest) + 1, last + 1))
    ends: dict = {}
    for (lid, *_), pos in zip(want, positions):
        ends[lid.qualified_name] = pos
    return ends


def _apply(client, target: Target, target_stream, record, password: bytes) -> None:
    mode = record.get("mode")
    if mode is None:                 # an intent of an earlier version: entries were copied
        _copy_legacy(client, target_stream, record, password)
        delete_ledgers(client, [q for q, _c in record["ledgers"]])
        return
    if mode == "link":
        md = target_stream.metadata
        stamp = f"{md.ledger_id.qualified_name}:{md.ctime_ms}"
        for qname, last in _apply_links(client, target_stream, record).items():
            _update_tags(client, qname, {LINK_KEY: f"{stamp}:{last}"})
    else:
        for qname, _marker, _slices in record["ledgers"]:
            _update_tags(client, qname, {COMMITTED_KEY: "1"})
    delete_ledgers(client, [marker for _q, marker, _s in record["ledgers"]])


def _copy_legacy(client, target_stream, record, password: bytes) -> None:
    """Roll forward an intent written by a version that copied entries into the stream."""
    present = sum(1 for _ in target_stream.read(record["start"]))
    skip = present
    for qname, count in record["ledgers"]:
        if skip >= count:
            skip -= count
            continue
        h = client.open_ledger(LedgerId.parse(qname), password, recovery=True)
        for lo in range(skip, count, 8192):
            target_stream.append_many(h.read_arrow(lo, min(count - 1, lo + 8191)).to_pylist())
        skip = 0


def expire_links(client, target: Target, target_stream, below: int) -> int:
    """Delete the data ledgers linked into ``target_stream`` whose links all stand below
    ``below`` (retention removed them), and those linked into an earlier stream of the same
    name (deleted, then created again). Returns how many."""
    md = target_stream.metadata
    me = md.ledger_id.qualified_name.encode()
    stamp = me + b":" + str(md.ctime_ms).encode()
    gone = []
    for lid in client.list_ledgers(data_scope(target)):
        lid = LedgerId.coerce(lid)
        try:
            tag = client.ledger_metadata(lid).custom_metadata.get(LINK_KEY)
        except NoSuchLedgerError:
            continue
        if tag is None or not tag.startswith(me + b":"):
            continue
        owner, _, last = tag.rpartition(b":")
        if owner != stamp or int(last) < below:
            gone.append(lid.qualified_name)
    delete_ledgers(client, gone)
    if gone:
        log.info("embedlog: stream %r: deleted %d data ledgers whose links retention removed",
                 target_stream.name, len(gone))
    return len(gone)


# -- the commit -----------------------------------------------------------------------------

def _open_target(client, target: Target, password: bytes, ensemble):
    if target.stream is None:
        return None
    e, qw, qa = ensemble
    return client.open_stream(target.stream, create=True, password=password, ensemble_size=e,
                              write_quorum=qw, ack_quorum=qa)


def commit_job(client, target, sink_id: str, batch_id: int, ledgers: list, password: bytes = b"",
               ensemble=(3, 3, 2), *, _crash_after_links: int | None = None) -> bool:
    """Make the data ledgers part of ``target`` (a Target, or a stream name); True if this
    call did, False if (sink_id, batch_id) was already committed (the ledgers and markers
    are deleted then). ``ledgers``: [(data ledger, marker, [(first, entries, rows), ...])]
    in task order. ``_crash_after_links`` is a test hook: raise after that many links."""
    if isinstance(target, str):
        target = Target(stream=target)
    # the commit log keeps a stream's default two copies, or fewer when the write asks for
    # fewer (a one-bookie cluster could not create it with two)
    log_e, log_qw, log_qa = (min(2, n) for n in ensemble)
    log_stream = client.open_stream(commit_log_name(target), create=True,
                                    ensemble_size=log_e, write_quorum=log_qw, ack_quorum=log_qa,
                                    rollover_entries=LOG_ROLLOVER_ENTRIES,
                                    retention_entries=LOG_ROLLOVER_ENTRIES)
    stream = None
    try:
        stream = _open_target(client, target, password, ensemble)
        log_stream.take_over()
        if stream is not None:
            stream.take_over()
        rec = last_record(log_stream)
        expired = rec.get("expired_below", 0) if rec else 0
        if rec is not None and "intent" in rec:
            _apply(client, target, stream, rec, password)
            expired = _expire(client, target, stream, expired)
            log_stream.append(json.dumps({"done": rec["intent"], "batch": rec["batch"],
                                          "sinks": rec["sinks"], "expired_below": expired}).encode())
            rec = {"sinks": rec["sinks"]}
        sinks = dict(rec["sinks"]) if rec else {}
        everything = [q for q, m, _s in ledgers] + [m for q, m, _s in ledgers]
        if sinks.get(sink_id, -1) >= batch_id:
            delete_ledgers(client, everything)
            return False
        if not any(rows for _q, _m, slices in ledgers for _f, _c, rows in slices):
            delete_ledgers(client, everything)
            return True
        sinks[sink_id] = batch_id
        intent = {"intent": sink_id, "batch": batch_id,
                  "mode": "link" if stream is not None else "publish",
                  "start": stream.last_position() + 1 if stream is not None else 0,
                  "ledgers": [[q, m, [list(s) for s in slices]] for q, m, slices in ledgers],
                  "sinks": sinks}
        log_stream.append(json.dumps(intent).encode())            # the commit point
        if _crash_after_links is not None:
            stream.append_links(_links(intent)[:_crash_after_links], packed=True)
            raise RuntimeError(f"test hook: commit stopped after {_crash_after_links} links")
        _apply(client, target, stream, intent, password)
        expired = _expire(client, target, stream, expired)
        log_stream.append(json.dumps({"done": sink_id, "batch": batch_id, "sinks": sinks,
                                      "expired_below": expired}).encode())
        return True
    finally:
        if stream is not None:
            stream.close()
        log_stream.close()


def _expire(client, target: Target, stream, expired: int) -> int:
    """Retention's follow-up, run only when the stream's first position moved since the last."""
    if stream is None:
        return 0
    first = stream.refresh().first_entry_id
    if first > expired:
        expire_links(client, target, stream, first)
    return max(first, expired)


def committed_batches(client, target) -> dict:
    """{sink id: last committed batch id} for a target stream (or Target)."""
    try:
        log_stream = client.open_stream(commit_log_name(target), create=False)
    except NoSuchLedgerError:
        return {}
    try:
        rec = last_record(log_stream)
    finally:
        log_stream.close()
    if rec is None:
        return {}
    sinks = dict(rec["sinks"])
    if "intent" in rec:          # decided but not yet rolled forward: still counts
        sinks[rec["intent"]] = rec["batch"]
    return sinks


def delete_stream(client, name: str, password: bytes = b"") -> None:
    """Delete a stream that embedlog.spark wrote, with its commit log and the data ledgers its
    links name (``client.delete_stream`` would leave those behind)."""
    target = Target(stream=name)
    try:
        s = client.open_stream(name, create=False, password=password)
    except NoSuchLedgerError:
        s = None
    if s is not None:
        try:
            expire_links(client, target, s, 1 << 62)
        finally:
            s.close()
        client.delete_stream(name)
    try:
        client.delete_stream(commit_log_name(target))
    except NoSuchLedgerError:
        pass


