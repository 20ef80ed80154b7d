"""The job commit of a Spark write into a stream: task ledgers, an intent record, roll-forward.

Tasks never touch the target stream (a stream has one writer at a time). Each task
appends its rows to a ledger of its own, in the task scope TASK_SCOPE_ID, tagged with the
job in the ledger's custom metadata. The driver's commit then **appends** (copies) the
task ledgers' entries to the target stream in task (partition) order; nothing is linked.

The commit log of a target stream T is the stream ``__spark_commits__/T``. A commit:

1. takes over the commit log (a new term fences any other committer of T), then T;
2. looks at the log's last record: an ``intent`` without its ``done`` is a commit that
   was decided and interrupted: it is rolled forward (step 5) first;
3. if the record's ``sinks`` map says this sink already committed this batch id (or a
   later one), the new task ledgers are deleted and nothing is appended (a replay);
4. appends the intent: {"intent": sink, "batch": id, "start": first position of the
   batch in T, "ledgers": [[qualified name, entries], ...], "sinks": {...}}. This append
   is the commit point: once durable, the batch will be in T exactly once;
5. counts the data entries of T at positions >= start (a prefix of the batch that an
   interrupted commit got in), appends the rest from the task ledgers, appends
   {"done": ...}, then deletes the task ledgers.

So readers of T can see a batch's entries arrive (not isolated), but never a batch twice,
never a part of an aborted job, and never lose a decided one. The target stream must
be written only through this package (an application appending to T between an intent
and its done would be counted as part of the batch).
"""
from __future__ import annotations

import json

from embedlog._native.format import LedgerId
from embedlog.errors import IllegalOpError, NoSuchLedgerError

TASK_SCOPE_ID = 0x535041524B000001          # b"SPARK" + 1: the scope of task ledgers
JOB_KEY, TARGET_KEY, SINK_KEY = "spark.job", "spark.target", "spark.sink"
COMMIT_LOG_PREFIX = "__spark_commits__/"
APPEND_CHUNK_ENTRIES = 8192
LOOKBACK_POSITIONS = 64


def commit_log_name(target: str) -> str:
    return COMMIT_LOG_PREFIX + target


def last_record(log) -> dict | None:
    """The last data entry of the commit log (take-overs leave no-ops behind it)."""
    last = log.last_position()
    first = log.refresh().first_entry_id
    hi = last
    while hi >= first:
        lo = max(first, hi - LOOKBACK_POSITIONS + 1)
        entries = list(log.read(lo, hi))
        if entries:
            return json.loads(entries[-1].data)
        hi = lo - 1
    return None


def _copy(client, target, ledgers, skip: int, password: bytes) -> int:
    """Append the entries of ``ledgers`` (in order) to ``target`` after skipping ``skip``.

    Appends go out asynchronously, a frame at a time, while the next chunk is read; at
    most two chunks are unacknowledged (Stream.append_many waits for each frame in turn,
    which halves the rate)."""
    from embedlog.spark._scan import scan
    frame = client._ctx.config.max_entries_per_frame
    appended = 0
    in_flight: list = []

    def wait(futures):
        for f in futures:
            f.result()

    for qname, count in ledgers:
        if skip >= count:
            skip -= count
            continue
        md = client.open_ledger(LedgerId.parse(qname), password, recovery=True).metadata
        pos = skip
        skip = 0
        while pos < count:
            end = min(count - 1, pos + APPEND_CHUNK_ENTRIES - 1)
            rows = scan(client, md, password, pos, end)
            futures = []
            for i in range(0, len(rows), frame):
                futures.extend(target.append_many_async(rows[i:i + frame]))
            wait(in_flight)
            in_flight = futures
            appended += end - pos + 1
            pos = end + 1
    wait(in_flight)
    return appended


def delete_ledgers(client, qnames) -> None:
    for q in qnames:
        try:
            client.delete_ledger(LedgerId.parse(q))
        except NoSuchLedgerError:
            pass


def sweep_job(client, job_id: str, keep=(), sink_id: str | None = None) -> int:
    """Delete the task ledgers of ``job_id`` (failed or speculative attempts too) but ``keep``;
    with ``sink_id``, also those of earlier runs of that streaming sink (a task killed when its
    query stopped may have made its ledger after that run's last sweep). Only after a commit:
    an earlier run's interrupted intent must have been rolled forward from its ledgers first."""
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
        if mine and lid.qualified_name not in keep:
            delete_ledgers(client, [lid.qualified_name])
            n += 1
    return n


def _roll_forward(client, target, record, password) -> None:
    present = sum(1 for _ in target.read(record["start"]))
    total = sum(c for _q, c in record["ledgers"])
    if present > total:
        raise IllegalOpError(f"stream {target.name!r} holds {present} entries after the start of "
                             f"batch {record['batch']} of sink {record['intent']!r}, more than its "
                             f"{total}: something else appended to it")
    _copy(client, target, record["ledgers"], present, password)


def commit_job(client, target_name: str, sink_id: str, batch_id: int, ledgers: list,
               password: bytes = b"", *, _crash_after_entries: int | None = None) -> bool:
    """Make the task ledgers' entries part of ``target_name``; True if this call appended
    them, False if (sink_id, batch_id) was already committed (the ledgers are deleted
    either way). ``_crash_after_entries`` is a test hook: raise after that many appends."""
    log = client.open_stream(commit_log_name(target_name), create=True)
    target = client.open_stream(target_name, create=True)
    try:
        log.take_over()
        target.take_over()
        rec = last_record(log)
        if rec is not None and "intent" in rec:
            _roll_forward(client, target, rec, password)
            log.append(json.dumps({"done": rec["intent"], "batch": rec["batch"],
                                   "sinks": rec["sinks"]}).encode())
            delete_ledgers(client, [q for q, _ in rec["ledgers"]])
            rec = {"sinks": rec["sinks"]}
        sinks = dict(rec["sinks"]) if rec else {}
        mine = [q for q, _ in ledgers]
        if sinks.get(sink_id, -1) >= batch_id:
            delete_ledgers(client, mine)
            return False
        if not any(c for _q, c in ledgers):
            delete_ledgers(client, mine)
            return True
        sinks[sink_id] = batch_id
        intent = {"intent": sink_id, "batch": batch_id, "start": target.last_position() + 1,
                  "ledgers": [[q, c] for q, c in ledgers], "sinks": sinks}
        log.append(json.dumps(intent).encode())            # the commit point
        if _crash_after_entries is not None:
            _copy(client, target, _first_n(ledgers, _crash_after_entries), 0, password)
            raise RuntimeError(f"test hook: commit stopped after {_crash_after_entries} entries")
        _copy(client, target, ledgers, 0, password)
        log.append(json.dumps({"done": sink_id, "batch": batch_id, "sinks": sinks}).encode())
        delete_ledgers(client, mine)
        return True
    finally:
        target.close()
        log.close()


def _first_n(ledgers, n):
    out = []
    for q, c in ledgers:
        if n <= 0:
            break
        out.append((q, min(c, n)))
        n -= c
    return out


def committed_batches(client, target_name: str) -> dict:
    """{sink id: last committed batch id} for a target stream (for operators and tests)."""
    try:
        log = client.open_stream(commit_log_name(target_name), create=False)
    except NoSuchLedgerError:
        return {}
    try:
        rec = last_record(log)
    finally:
        log.close()
    if rec is None:
        return {}
    sinks = dict(rec["sinks"])
    if "intent" in rec:          # decided but not yet rolled forward: still counts
        sinks[rec["intent"]] = rec["batch"]
    return sinks
