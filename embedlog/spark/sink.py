"""Writing DataFrames into a stream: task ledgers on executors, the commit on the driver
(embedlog.spark.commit says how the commit stays atomic and exactly once)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from embedlog.errors import IllegalOpError
from embedlog.spark.commit import (JOB_KEY, SINK_KEY, TARGET_KEY, TASK_SCOPE_ID, commit_job,
                                   delete_ledgers, sweep_job)

APPEND_CHUNK_ENTRIES = 8192


@dataclass
class TaskLedger(WriterCommitMessage):
    """What one task wrote: its ledger's qualified name (None if it had no rows) and count."""
    qualified_name: str | None
    entries: int


def check_input_schema(schema) -> str:
    """The payload column: ``payload`` (binary or string), else ``value`` (Kafka's name)."""
    fields = {f.name: f.dataType.typeName() for f in schema.fields}
    for name in ("payload", "value"):
        if name in fields:
            if fields[name] not in ("binary", "string"):
                raise IllegalOpError(f"embedlog: column {name!r} must be binary or string, "
                                     f"got {fields[name]}")
            return name
    raise IllegalOpError("embedlog: a DataFrame written to embedlog needs a binary or string column "
                         f"named 'payload' (or 'value'); it has {sorted(fields)}")


def write_task(opts, job_id: str, column: str, batches) -> TaskLedger:
    """Append every row's payload to a new ledger of this task; delete it if anything fails."""
    import pyarrow as pa
    from embedlog.client import Client
    client = Client(opts.uri)
    handle = None
    count = 0
    try:
        for batch in batches:
            col = batch.column(batch.schema.get_field_index(column))
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                col = col.cast(pa.binary())
            if col.null_count:
                raise IllegalOpError(f"embedlog: column {column!r} has null payloads")
            rows = col.to_pylist()
            if not rows:
                continue
            if handle is None:
                e, qw, qa = opts.ensemble
                tags = {JOB_KEY: job_id, TARGET_KEY: opts.stream}
                if opts.sink_id is not None:
                    tags[SINK_KEY] = opts.sink_id
                handle = client.create_ledger(e, qw, qa, password=opts.password, scope_id=TASK_SCOPE_ID,
                                              custom_metadata=tags)
            for i in range(0, len(rows), APPEND_CHUNK_ENTRIES):
                handle.append_many(rows[i:i + APPEND_CHUNK_ENTRIES])
            count += len(rows)
        if handle is None:
            return TaskLedger(None, 0)
        handle.close()
        return TaskLedger(handle.ledger_id.qualified_name, count)
    except BaseException:
        if handle is not None:
            try:
                delete_ledgers(client, [handle.ledger_id.qualified_name])
            except Exception:
                pass          # the job's abort sweeps it by its tag
        raise
    finally:
        client.close()


def _ledgers(messages) -> list:
    return [(m.qualified_name, m.entries) for m in messages
            if isinstance(m, TaskLedger) and m.qualified_name is not None]


def _commit(opts, job_id, messages, sink_id, batch_id) -> bool:
    from embedlog.client import Client
    client = Client(opts.uri)
    try:
        ledgers = _ledgers(messages)
        done = commit_job(client, opts.stream, sink_id, batch_id, ledgers, opts.password)
        # failed or speculative task attempts, and what earlier runs of this sink left
        sweep_job(client, job_id, sink_id=opts.sink_id)
        return done
    finally:
        client.close()


def _abort(opts, job_id, messages) -> None:
    from embedlog.client import Client
    client = Client(opts.uri)
    try:
        delete_ledgers(client, [q for q, _ in _ledgers(messages)])
        sweep_job(client, job_id)
    finally:
        client.close()


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts, schema):
        self.opts = opts
        self.column = check_input_schema(schema)
        self.job_id = "batch-" + uuid.uuid4().hex

    def write(self, iterator):
        return write_task(self.opts, self.job_id, self.column, iterator)

    def commit(self, messages):
        sink = self.opts.sink_id or self.job_id
        batch = self.opts.batch_id if self.opts.batch_id is not None else 0
        _commit(self.opts, self.job_id, messages, sink, batch)

    def abort(self, messages):
        _abort(self.opts, self.job_id, messages)


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts, schema):
        self.opts = opts
        self.column = check_input_schema(schema)
        self.job_id = "stream-" + uuid.uuid4().hex     # this run of the query

    def write(self, iterator):
        return write_task(self.opts, self.job_id, self.column, iterator)

    def commit(self, messages, batchId):
        _commit(self.opts, self.job_id, messages, self.opts.sink_id, batchId)

    def abort(self, messages, batchId):
        _abort(self.opts, self.job_id, messages)
