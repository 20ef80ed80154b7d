"""Writing DataFrames to streams or ledgers: data ledgers on executors, the commit on the
driver (embedlog.spark.commit says how the commit stays atomic and exactly once)."""
from __future__ import annotations

import collections
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from embedlog.client.scan import pack_rows
from embedlog.errors import IllegalOpError
from embedlog.spark.commit import (DATA_KEY, JOB_KEY, LINK_ROWS, PACKED_KEY, SINK_KEY, TARGET_KEY,
                                   TASK_SCOPE_ID, Target, commit_job, data_scope, delete_ledgers,
                                   sweep)
from embedlog.spark.options import client_for

APPEND_GROUP_BYTES = 2 << 20       # payloads handed to the client at once (one frame a bookie)
IN_FLIGHT_GROUPS = 8               # at most this many groups unacknowledged per data ledger


@dataclass
class TaskOutput(WriterCommitMessage):
    """What one task wrote: per target, (Target, data ledger, marker, link slices), where a
    slice is (first entry, entries, rows)."""
    ledgers: list


def check_input_schema(schema, opts) -> tuple[str, str | None]:
    """(the payload column, the routing column or None). The payload is ``payload`` (binary or
    string), else ``value`` (Kafka's name); without option stream or scope, a string column
    ``stream`` names each row's stream (as Kafka's ``topic`` column; the option wins)."""
    fields = {f.name: f.dataType.typeName() for f in schema.fields}
    payload = None
    for name in ("payload", "value"):
        if name in fields:
            if fields[name] not in ("binary", "string"):
                raise IllegalOpError(f"embedlog: column {name!r} must be binary or string, "
                                     f"got {fields[name]}")
            payload = name
            break
    if payload is None:
        raise IllegalOpError("embedlog: a DataFrame written to embedlog needs a binary or string column "
                             f"named 'payload' (or 'value'); it has {sorted(fields)}")
    if opts.stream is not None or opts.scope is not None:
        return payload, None
    if fields.get("stream") != "string":
        raise IllegalOpError("embedlog: a write needs option stream, option scope, or a string column "
                             "'stream' naming each row's stream")
    return payload, "stream"


class _DataLedger:
    """One task's rows for one target: a marker first, then the data ledger, packed entries."""

    def __init__(self, client, opts, job_id: str, target: Target):
        self.client, self.target = client, target
        scope = data_scope(target)
        lid = client.metadata.id_generator.generate_ledger_id(scope)
        tags = {JOB_KEY: job_id, TARGET_KEY: target.key}
        if opts.sink_id is not None:
            tags[SINK_KEY] = opts.sink_id
        marker = client.create_ledger(1, 1, 1, scope_id=TASK_SCOPE_ID,
                                      custom_metadata={**tags, DATA_KEY: lid.qualified_name})
        marker.close()
        self.marker = marker.ledger_id.qualified_name
        e, qw, qa = opts.ensemble
        self.handle = client.create_ledger(e, qw, qa, password=opts.password, scope_id=scope,
                                           ledger_id=lid, custom_metadata={**tags, PACKED_KEY: "1"})
        self.slices: list = []
        self._entries = 0
        self._group: list = []
        self._group_bytes = 0
        self._in_flight: collections.deque = collections.deque()

    def write(self, column) -> None:
        for payload, rows in pack_rows(column):
            if self.slices and self.slices[-1][2] + rows <= LINK_ROWS:
                first, count, total = self.slices[-1]
                self.slices[-1] = (first, count + 1, total + rows)
            else:
                self.slices.append((self._entries, 1, rows))
            self._entries += 1
            self._group.append(payload)
            self._group_bytes += len(payload)
            if self._group_bytes >= APPEND_GROUP_BYTES:
                self._send()

    def _send(self) -> None:
        if self._group:
            self._in_flight.append(self.handle.append_many_async(self._group))
            self._group, self._group_bytes = [], 0
        while len(self._in_flight) > IN_FLIGHT_GROUPS:
            for f in self._in_flight.popleft():
                f.result()

    def finish(self) -> tuple:
        self._send()
        while self._in_flight:
            for f in self._in_flight.popleft():
                f.result()
        self.handle.close()
        return (self.target, self.handle.ledger_id.qualified_name, self.marker, self.slices)

    def discard(self) -> None:
        try:
            delete_ledgers(self.client, [self.handle.ledger_id.qualified_name, self.marker])
        except Exception:
            pass          # the job's abort sweeps it by its marker


def _groups(batch, payload: str, route: str | None, opts):
    """(Target, binary column) pairs of one Arrow batch."""
    col = batch.column(batch.schema.get_field_index(payload))
    if col.null_count:
        raise IllegalOpError(f"embedlog: column {payload!r} has null payloads")
    if route is None:
        yield Target(stream=opts.stream, scope=opts.scope), col
        return
    names = batch.column(batch.schema.get_field_index(route))
    if names.null_count:
        raise IllegalOpError("embedlog: a row's 'stream' is null and option stream is not set")
    for name in pc.unique(names).to_pylist():
        if not name:
            raise IllegalOpError("embedlog: a row's 'stream' is empty")
        yield Target(stream=name), col.filter(pc.equal(names, pa.scalar(name)))


def write_task(opts, job_id: str, payload: str, route: str | None, batches) -> TaskOutput:
    """Pack every row's payload into the task's data ledger of its target; on any failure,
    delete what this task made (the job's abort sweeps what a killed task leaves)."""
    client = client_for(opts)
    ledgers: dict = {}
    try:
        for batch in batches:
            for target, col in _groups(batch, payload, route, opts):
                if len(col):
                    if target not in ledgers:
                        ledgers[target] = _DataLedger(client, opts, job_id, target)
                    ledgers[target].write(col)
        return TaskOutput([w.finish() for w in ledgers.values()])
    except BaseException:
        for w in ledgers.values():
            w.discard()
        raise
    finally:
        client.close()


def _outputs(messages) -> dict:
    """{Target: [(data ledger, marker, slices)]} in task (partition) order."""
    out: dict = {}
    for m in messages:
        if isinstance(m, TaskOutput):
            for target, qname, marker, slices in m.ledgers:
                out.setdefault(target, []).append((qname, marker, slices))
    return out


def commit_write(opts, job_id: str, messages, sink_id: str, batch_id: int) -> None:
    """The job commit: each target on its own, in name order (a replay of the same sink and
    batch finishes the targets an interrupted commit did not reach)."""
    client = client_for(opts)
    try:
        for target, ledgers in sorted(_outputs(messages).items()):
            commit_job(client, target, sink_id, batch_id, ledgers, opts.password, opts.ensemble)
        # failed or speculative task attempts, and what earlier runs of this sink left
        sweep(client, job_id, sink_id=opts.sink_id)
    finally:
        client.close()


def abort_write(opts, job_id: str, messages) -> None:
    client = client_for(opts)
    try:
        for ledgers in _outputs(messages).values():
            delete_ledgers(client, [q for q, _m, _s in ledgers] + [m for _q, m, _s in ledgers])
        sweep(client, job_id)
    finally:
        client.close()


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts, schema):
        self.opts = opts
        self.payload, self.route = check_input_schema(schema, opts)
        self.job_id = "batch-" + uuid.uuid4().hex

    def write(self, iterator):
        return write_task(self.opts, self.job_id, self.payload, self.route, iterator)

    def commit(self, messages):
        sink = self.opts.sink_id or self.job_id
        batch = self.opts.batch_id if self.opts.batch_id is not None else 0
        commit_write(self.opts, self.job_id, messages, sink, batch)

    def abort(self, messages):
        abort_write(self.opts, self.job_id, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts, schema):
        self.opts = opts
        self.payload, self.route = check_input_schema(schema, opts)
        self.job_id = "stream-" + uuid.uuid4().hex     # this run of the query

    def write(self, iterator):
        return write_task(self.opts, self.job_id, self.payload, self.route, iterator)

    def commit(self, messages, batchId):
        commit_write(self.opts, self.job_id, messages, self.opts.sink_id, batchId)

    def abort(self, messages, batchId):
        abort_write(self.opts, self.job_id, messages)
