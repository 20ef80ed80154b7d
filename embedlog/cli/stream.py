"""`embedlog stream ...`: streams (unbounded ledgers) of a cluster, by name.

Written against the client's stream API (embedlog.client.stream): ``client.open_stream(name)``
-> Stream with append / append_many / read / tail / take_over / truncate_before, and
``client.list_streams(pattern)``, ``client.delete_stream(name)``. Positions are entry ids.
"""
from __future__ import annotations

import sys

import click

from embedlog._native.wire_sizes import MAX_FRAME_BYTES
from embedlog.cli.common import (EXIT_INTERRUPTED, EmbedlogGroup, Progress, StopOnInterrupt,
                                 confirm_delete, emit, follow, format_option, json_option,
                                 metadata_option, open_client, print_entry, progress_option, table)
from embedlog.cli.ledger import BATCH_ENTRIES, DIGESTS, generated_entry, password_option
from embedlog.client.consumer import Consumer, TopicPartition
from embedlog.client.stream import find_stream
from embedlog.client.stream_format import StreamEntry
from embedlog.errors import EmbedlogError, IllegalOpError, LedgerExistsError, NoSuchLedgerError
from embedlog.meta.views import ledger_ref, metadata_dict


def _stream_dict(s) -> dict:
    md = s.metadata
    return {"name": s.name, **ledger_ref(s.ledger_id), "term": md.term,
            "first_position": getattr(md, "first_entry_id", 0), "fragments": len(md.fragments),
            "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum,
            "ack_quorum": md.ack_quorum}


@click.group(cls=EmbedlogGroup)
def stream():
    """Create, list, delete, append to, read, tail and take over streams."""


@stream.command("create")
@metadata_option
@click.argument("name")
@click.option("-e", "--ensemble-size", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Bookies per fragment. A lost bookie is replaced by a writable one outside "
                   "the ensemble: with E below the number of bookies, the stream survives it.")
@click.option("-w", "--write-quorum", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("-a", "--ack-quorum", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--digest", type=click.Choice(DIGESTS), default="crc32c", show_default=True)
@password_option
@click.option("--rollover-entries", type=click.IntRange(min=1), default=None,
              help="Start a new fragment after this many entries.")
@click.option("--rollover-bytes", type=click.IntRange(min=1), default=None,
              help="Start a new fragment after this many bytes.")
@click.option("--retention-ms", type=click.IntRange(min=1), default=None,
              help="Drop whole fragments older than this.")
@click.option("--retention-entries", type=click.IntRange(min=1), default=None,
              help="Keep about this many entries (whole fragments are dropped).")
@json_option
def stream_create(metadata_uri, name, ensemble_size, write_quorum, ack_quorum, digest, password,
                  rollover_entries, rollover_bytes, retention_ms, retention_entries, as_json):
    """Create the stream NAME (exit code 4 if it exists)."""
    policy = {k: v for k, v in (("rollover_entries", rollover_entries), ("rollover_bytes", rollover_bytes),
                                ("retention_ms", retention_ms), ("retention_entries", retention_entries))
              if v is not None}
    with open_client(metadata_uri) as client:
        try:
            client.open_stream(name, create=False, password=password)
            raise LedgerExistsError(f"stream {name!r} exists")
        except NoSuchLedgerError:
            pass
        s = client.open_stream(name, ensemble_size=ensemble_size, write_quorum=write_quorum,
                               ack_quorum=ack_quorum, digest=digest, password=password, **policy)
        out = _stream_dict(s)
        s.close()
    emit(as_json, out, f"created stream {name!r} (ledger {out['ledger_qualified_name']})")


@stream.command("list")
@metadata_option
@click.argument("pattern", required=False)
@click.option("-m", "--print-metadata", "details", is_flag=True,
              help="Show term, first and end positions, length and fragments.")
@json_option
def stream_list(metadata_uri, pattern, details, as_json):
    """List stream names, or those matching a glob PATTERN. With -m: each stream's term,
    first kept position, end position (its LAC + 1: the position the next entry gets, as
    Kafka's log end offset), length (end - first: positions kept, no-ops included) and
    fragments."""
    with open_client(metadata_uri) as client:
        names = client.list_streams(pattern)
        rows = []
        for n in names:
            if details:
                v, _ = find_stream(client.metadata, n)
                if v is None:
                    continue
                md = metadata_dict(v.value)
                first = md.get("first_entry_id", 0)
                try:
                    end = client.open_stream(n, create=False).last_position() + 1
                except NoSuchLedgerError:
                    continue                          # deleted meanwhile
                rows.append({"name": n, "ledger_qualified_name": md["ledger_qualified_name"],
                             "term": md["term"], "first_position": first,
                             "end_position": end, "length": max(0, end - first),
                             "fragments": md["fragments"]})
            else:
                rows.append({"name": n})
    if as_json:
        emit(True, rows)
        return
    if not details:
        for r in rows:
            click.echo(r["name"])
        return
    table(["stream", "ledger", "term", "first position", "end position", "length", "fragments"],
          [[r["name"], r["ledger_qualified_name"], r["term"], r["first_position"],
            r["end_position"], r["length"], len(r["fragments"])]
           for r in rows], f"{len(rows)} streams",
          right=("term", "first position", "end position", "length", "fragments"))


@stream.command("delete")
@metadata_option
@click.argument("name")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def stream_delete(metadata_uri, name, yes, as_json):
    """Delete the stream NAME (its bookies collect the data)."""
    confirm_delete(f"stream {name!r}", yes, as_json)
    with open_client(metadata_uri) as client:
        client.delete_stream(name)
    emit(as_json, {"name": name, "deleted": True}, f"deleted stream {name!r}")


@stream.command("append")
@metadata_option
@click.argument("name")
@click.argument("data", nargs=-1)
@password_option
@click.option("--input", "input_file", type=click.File("rb"), default=None,
              help="Append each line of this file ('-' for stdin).")
@click.option("--entries", type=click.IntRange(min=0), default=0,
              help="Append this many generated entries (see --entry-size).")
@click.option("--entry-size", type=click.IntRange(1, MAX_FRAME_BYTES), default=100, show_default=True)
@click.option("--create/--no-create", default=False, show_default=True,
              help="Create the stream if it does not exist.")
@progress_option
@json_option
def stream_append(metadata_uri, name, data, password, input_file, entries, entry_size, create,
                  progress, as_json):
    """Append DATA arguments (or --input lines, or --entries generated ones) to stream NAME.

    The command becomes the stream's writer, appends, and stops writing cleanly (it
    releases the stream): when the last writer released it too, the entries follow its
    last position; when another writer may still be writing, the command takes the stream
    over (a new term, a no-op position between). Ctrl-C stops after the batch under way
    (exit code 130)."""
    sources = sum(bool(x) for x in (data, input_file, entries))
    if sources != 1:
        raise click.UsageError("give DATA..., --input or --entries (exactly one)")
    first = last = None
    count = 0
    with open_client(metadata_uri) as client:
        s = client.open_stream(name, create=create, password=password)
        try:
            with StopOnInterrupt("stopping after the batch under way") as stop:
                def put(batch):
                    nonlocal first, last, count
                    try:
                        pos = s.append_many(batch)
                    except EmbedlogError as exc:
                        if not isinstance(exc, IllegalOpError):     # refused before sending
                            click.echo(f"stream {name!r}: {count} entries appended; the outcome "
                                       f"of the {len(batch)} under way is unknown (they may "
                                       "have been written: read the stream before appending "
                                       f"them again): {exc}", err=True)
                        raise
                    first = pos - len(batch) + 1 if first is None else first
                    last = pos
                    count += len(batch)

                if data:
                    put([d.encode() for d in data])
                elif entries:
                    with Progress(progress, "appending", entries) as bar:
                        while count < entries and not stop():
                            n = min(BATCH_ENTRIES, entries - count)
                            put([generated_entry(count + k, entry_size) for k in range(n)])
                            bar.update(count)
                else:
                    batch = []
                    for line in input_file:
                        batch.append(line.rstrip(b"\r\n"))
                        if len(batch) >= BATCH_ENTRIES:
                            put(batch)
                            batch = []
                        if stop():
                            break
                    if batch and not stop():
                        put(batch)
                interrupted = stop()
        finally:
            s.close()
    # positions are entry ids; a take-over's no-op leaves a gap, so first..last is a range
    out = {"name": name, "appended": count, "first_position": first, "last_position": last,
           "interrupted": interrupted}
    emit(as_json, out, f"stream {name!r}: appended {count} entries at positions {first}..{last}")
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)


@stream.command("read")
@metadata_option
@click.argument("name")
@password_option
@click.option("--from", "start", type=click.IntRange(min=0), default=None,
              help="First position (default: the stream's first kept position).")
@click.option("--to", "end", type=click.IntRange(min=0), default=None,
              help="Last position (default: the last committed one).")
@format_option
@json_option
def stream_read(metadata_uri, name, password, start, end, fmt, as_json):
    """Print the entries of stream NAME ("POSITION<TAB>DATA"; JSON lines with --json)."""
    with open_client(metadata_uri) as client:
        s = client.open_stream(name, create=False, password=password)
        if start is None:
            start = getattr(s.metadata, "first_entry_id", 0)
        with StopOnInterrupt("stopping") as stop:
            for e in s.read(start, end):
                print_entry("position", e.position, e.data, fmt, as_json)
                if stop():
                    sys.exit(EXIT_INTERRUPTED)


@stream.command("tail")
@metadata_option
@click.argument("name")
@password_option
@click.option("--from", "start", type=click.IntRange(min=0), default=None,
              help="First position (default: after the last committed one; with --group, "
                   "the group's committed position).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after this many entries.")
@click.option("--group", "group_id", default=None, metavar="GROUP_ID",
              help="Read as a member of this consumer group (Kafka's console consumer "
                   "--group): from its committed position (none: the end), committing what "
                   "was printed every second and at the end. Another member holding the "
                   "stream keeps it: this one waits.")
@format_option
@json_option
def stream_tail(metadata_uri, name, password, start, count, group_id, fmt, as_json):
    """Follow stream NAME, printing entries as they are committed, until Ctrl-C (exit 130)
    or --count entries (exit 0)."""
    with open_client(metadata_uri) as client:
        s = client.open_stream(name, create=False, password=password)
        show = lambda e: print_entry("position", e.position, e.data, fmt, as_json)  # noqa: E731
        if group_id is not None:
            with StopOnInterrupt("stopping") as stop:
                _tail_in_group(client, name, password, start, count, group_id, stop, show)
            return
        if start is None:
            start = s.last_position() + 1
        with StopOnInterrupt("stopping") as stop:
            follow(s.tail(start, poll_timeout_ms=500, stop=stop), stop, count, show)


def _tail_in_group(client, name, password, start, count, group_id, stop, show) -> None:
    consumer = Consumer({"group.id": group_id, "auto.offset.reset": "latest",
                         "auto.commit.interval.ms": 1000, "stream.password": password,
                         "client.id": "embedlog-stream-tail"}, client=client)
    try:
        consumer.subscribe([name])
        if start is not None:
            if not consumer.assignment():
                raise IllegalOpError(f"--from: stream {name!r} is another member's of group "
                                     f"{group_id!r}")
            consumer.seek(TopicPartition(name, 0, start))

        def entries():
            while not stop():
                for m in consumer.consume(1, 0.5):
                    yield StreamEntry(m.offset(), m.value(), m.timestamp()[1])
        follow(entries(), stop, count, show)
    finally:
        consumer.close()                 # commits what was printed, leaves the group


@stream.command("take-over")
@metadata_option
@click.argument("name")
@password_option
@json_option
def stream_take_over(metadata_uri, name, password, as_json):
    """Become the writer of stream NAME: raise its term and recover its tail, so the
    previous writer can add no more. Prints the new term and the next position."""
    with open_client(metadata_uri) as client:
        s = client.open_stream(name, create=False, password=password)
        try:
            before = s.term
            nxt = s.take_over()
            out = {**_stream_dict(s), "previous_term": before, "next_position": nxt}
        finally:
            s.close()
    emit(as_json, out, f"stream {name!r}: term {out['term']} (was {before}), "
                       f"next position {nxt}")
