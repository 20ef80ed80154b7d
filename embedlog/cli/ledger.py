"""`embedlog ledger ...`: ledgers of a cluster, through its metadata service URI.

Every command that names a ledger takes LEDGER_ID with --ledger-scope-id (default 0), or
--ledger-qualified-name (32 hex digits), as BP-35 asks of BookKeeper's tools.
"""
from __future__ import annotations

import sys

import click

from embedlog._native.wire_sizes import MAX_FRAME_BYTES
from embedlog.cli.common import (EXIT_INTERRUPTED, U64_MAX, EmbedlogGroup, Progress,
                                 StopOnInterrupt, confirm_delete, emit, follow, format_option,
                                 json_option, ledger_id_options, metadata_option, open_client,
                                 print_entry, progress_option, resolve_ledger_id, table)
from embedlog.errors import EmbedlogError, NoSuchLedgerError
from embedlog.meta.api import LedgerState
from embedlog.meta.views import ledger_ref, metadata_dict

DIGESTS = ["crc32", "crc32c", "mac", "dummy"]
BATCH_ENTRIES = 1000      # entries per append_many while --entries runs: the Ctrl-C granularity


def password_option(f):
    return click.option("--password", default="", envvar="EMBEDLOG_LEDGER_PASSWORD",
                        show_envvar=True, help="The ledger's password (default: empty).")(f)


def generated_entry(entry_id: int, size: int) -> bytes:
    """Payload of entry ``entry_id`` written by `ledger create --entries`: its id in 12 digits,
    padded to ``size`` bytes, so a reader can check it."""
    head = b"%012d" % entry_id
    return (head + b"." * max(0, size - len(head)))[:max(size, 1)]


@click.group(cls=EmbedlogGroup)
def ledger():
    """Create, list, inspect, read, tail, delete and recover ledgers."""


@ledger.command("create")
@metadata_option
@click.option("-e", "--ensemble-size", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("-w", "--write-quorum", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("-a", "--ack-quorum", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--digest", type=click.Choice(DIGESTS), default="crc32c", show_default=True)
@password_option
@click.option("--ledger-scope-id", "scope_id", type=click.IntRange(0, U64_MAX), default=0,
              show_default=True, help="Scope of the new ledger (ids are generated in it).")
@click.option("--ledger-id", "ledger_id", type=click.IntRange(0, U64_MAX), default=None,
              help="Create with this ledger id (in --ledger-scope-id) instead of a generated one.")
@click.option("--ledger-qualified-name", "qualified_name", default=None, metavar="HEX32",
              help="Create with this 128-bit id (32 hex digits).")
@click.option("--uuid", "use_uuid", is_flag=True,
              help="A decentralised 128-bit id from a random UUID (BP-35), no round trip.")
@click.option("--custom", multiple=True, metavar="KEY=VALUE", help="Custom metadata (repeatable).")
@click.option("--entries", type=click.IntRange(min=0), default=0, show_default=True,
              help="Write this many generated entries (see --entry-size), then close.")
@click.option("--entry-size", type=click.IntRange(1, MAX_FRAME_BYTES), default=100, show_default=True)
@click.option("--input", "input_file", type=click.File("rb"), default=None,
              help="Write each line of this file ('-' for stdin) as an entry, then close.")
@click.option("--keep-open", is_flag=True, help="Leave the ledger OPEN (for another writer's recovery).")
@progress_option
@json_option
def ledger_create(metadata_uri, ensemble_size, write_quorum, ack_quorum, digest, password,
                  scope_id, ledger_id, qualified_name, use_uuid, custom, entries, entry_size,
                  input_file, keep_open, progress, as_json):
    """Create a ledger; optionally write entries into it and close it.

    Ctrl-C while writing stops after the batch under way and closes the ledger at its
    last acknowledged entry (exit code 130): nothing is left half-written."""
    given = [name for name, v in (("--ledger-id", ledger_id), ("--ledger-qualified-name", qualified_name),
                                  ("--uuid", use_uuid or None)) if v is not None]
    if len(given) > 1:
        raise click.UsageError(f"give at most one of --ledger-id, --ledger-qualified-name, --uuid "
                               f"(got {', '.join(given)})")
    if entries and input_file is not None:
        raise click.UsageError("give --entries or --input, not both")
    explicit = None
    if qualified_name is not None:
        explicit = resolve_ledger_id(None, scope_id or None, qualified_name)
    elif ledger_id is not None:
        explicit = resolve_ledger_id(ledger_id, scope_id, None)
    custom_md = {}
    for pair in custom:
        k, sep, v = pair.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"want KEY=VALUE, got {pair!r}", param_hint="--custom")
        custom_md[k] = v
    with open_client(metadata_uri) as client:
        w = client.create_ledger(ensemble_size, write_quorum, ack_quorum, digest, password,
                                 scope_id=None if use_uuid else scope_id, ledger_id=explicit,
                                 custom_metadata=custom_md)
        lid = w.ledger_id
        if not as_json:
            click.echo(f"created ledger {lid.qualified_name} (scope {lid.scope_id}, "
                       f"ledger id {lid.ledger_id}) on {', '.join(w.metadata.fragments[0][1])}")
            sys.stdout.flush()
        done = [0]
        with StopOnInterrupt("closing the ledger at its last acknowledged entry") as stop:
            try:
                _write_entries(w, entries, entry_size, input_file, progress, stop, done)
            except EmbedlogError as exc:
                # close at the last acknowledged entry if the handle still can; else the
                # ledger stays OPEN and `ledger recover` closes it
                try:
                    w.close()
                except EmbedlogError:
                    pass
                fate = ""
                if not done[0]:
                    # nothing acknowledged: the failed command leaves no empty ledger behind
                    try:
                        client.delete_ledger(lid)
                        fate = "; the empty ledger was deleted"
                    except EmbedlogError as gone:
                        fate = f"; the empty ledger is left (deleting it failed: {gone})"
                click.echo(f"ledger {lid}: {done[0]} entries acknowledged before: {exc}{fate}",
                           err=True)
                raise
            written = done[0]
            if not keep_open:
                w.close()
            interrupted = stop()
        state = "OPEN" if keep_open else client.ledger_metadata(lid).state.name
    out = {**ledger_ref(lid), "entries": written, "last_entry_id": written - 1, "state": state,
           "interrupted": interrupted}
    emit(as_json, out, f"ledger {lid.qualified_name}: {written} entries, "
                       f"last entry id {written - 1}, {state}")
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)


def _write_entries(w, entries, entry_size, input_file, progress, stop, done: list) -> None:
    """Append generated entries or input lines in batches until done or stop(); done[0]
    counts the acknowledged ones (kept when an append fails)."""
    if entries:
        with Progress(progress, "writing", entries) as bar:
            while done[0] < entries and not stop():
                n = min(BATCH_ENTRIES, entries - done[0])
                w.append_many([generated_entry(done[0] + k, entry_size) for k in range(n)])
                done[0] += n
                bar.update(done[0])
    elif input_file is not None:
        batch = []
        for line in input_file:
            batch.append(line.rstrip(b"\r\n"))
            if len(batch) >= BATCH_ENTRIES:
                w.append_many(batch)
                done[0] += len(batch)
                batch = []
            if stop():
                return
        if batch:
            w.append_many(batch)
            done[0] += len(batch)


@ledger.command("list")
@metadata_option
@click.option("--ledger-scope-id", "scope_id", type=click.IntRange(0, U64_MAX), default=0,
              show_default=True, help="The scope to list.")
@click.option("--all-scopes", is_flag=True, help="List every scope.")
@click.option("-m", "--print-metadata", "details", is_flag=True,
              help="Show each ledger's state, quorums and last entry.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many ledgers.")
@json_option
def ledger_list(metadata_uri, scope_id, all_scopes, details, limit, as_json):
    """List ledgers of one scope (default 0), or of every scope."""
    out = []
    with open_client(metadata_uri) as client:
        for lid in client.list_ledgers(None if all_scopes else scope_id):
            if limit is not None and len(out) >= limit:
                break
            row = ledger_ref(lid)
            if details:
                try:
                    row = metadata_dict(client.ledger_metadata(lid))
                except NoSuchLedgerError:
                    continue                 # deleted while we listed
            out.append(row)
    if as_json:
        emit(True, out)
        return
    header = ["qualified name", "scope", "ledger id"]
    rows = [[r["ledger_qualified_name"], r["ledger_scope_id"], r["ledger_id"]] for r in out]
    if details:
        header += ["state", "E/Qw/Qa", "last entry", "bytes"]
        rows = [row + [r["state"], f"{r['ensemble_size']}/{r['write_quorum']}/{r['ack_quorum']}",
                       r["last_entry_id"], r["length"]] for row, r in zip(rows, out)]
    table(header, rows, f"{len(out)} ledgers", right=("scope", "ledger id", "last entry", "bytes"))


@ledger.command("metadata")
@metadata_option
@ledger_id_options
@json_option
def ledger_metadata(metadata_uri, ledger_id, scope_id, qualified_name, as_json):
    """Show a ledger's metadata: state, quorums, fragments and their ensembles."""
    lid = resolve_ledger_id(ledger_id, scope_id, qualified_name)
    with open_client(metadata_uri) as client:
        md = metadata_dict(client.ledger_metadata(lid))
    if as_json:
        emit(True, md)
        return
    for key, value in md.items():
        if key == "fragments":
            click.echo("fragments:")
            for f in value:
                click.echo(f"  from entry {f['first_entry_id']}: {', '.join(f['ensemble'])}")
        else:
            click.echo(f"{key}: {value}")


@ledger.command("read")
@metadata_option
@ledger_id_options
@password_option
@click.option("--first", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--last", type=click.IntRange(min=0), default=None,
              help="Last entry to read (default: the LAC).")
@click.option("--recovery", is_flag=True,
              help="Fence and close an OPEN ledger first (stops its writer), as BookKeeper's open does.")
@format_option
@json_option
def ledger_read(metadata_uri, ledger_id, scope_id, qualified_name, password, first, last,
                recovery, fmt, as_json):
    """Print entries FIRST..LAST, one per line ("ENTRY_ID<TAB>DATA"; JSON lines with --json).

    An OPEN ledger is read up to its LAC without disturbing its writer."""
    lid = resolve_ledger_id(ledger_id, scope_id, qualified_name)
    with open_client(metadata_uri) as client:
        r = client.open_ledger(lid, password, recovery=recovery)
        end = r.last_add_confirmed if last is None else last
        if end < first:
            return
        with StopOnInterrupt("stopping after the batch under way") as stop:
            for e in r.read(first, end, batch_size=256):
                print_entry("entry_id", e.entry_id, e.data, fmt, as_json)
                if stop():
                    sys.exit(EXIT_INTERRUPTED)


@ledger.command("tail")
@metadata_option
@ledger_id_options
@password_option
@click.option("--from", "start", type=click.IntRange(min=0), default=0, show_default=True,
              help="First entry to print.")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="Stop after this many entries.")
@format_option
@json_option
def ledger_tail(metadata_uri, ledger_id, scope_id, qualified_name, password, start, count, fmt,
                as_json):
    """Follow a ledger: print entries as its writer's LAC passes them.

    Ends (exit 0) when the ledger is closed and read to its end, or after --count entries;
    Ctrl-C ends it with exit code 130."""
    lid = resolve_ledger_id(ledger_id, scope_id, qualified_name)
    with open_client(metadata_uri) as client:
        r = client.open_ledger(lid, password, recovery=False)
        with StopOnInterrupt("stopping") as stop:
            follow(r.tail(start, poll_timeout_ms=500, stop=stop), stop, count,
                   lambda e: print_entry("entry_id", e.entry_id, e.data, fmt, as_json))


@ledger.command("delete")
@metadata_option
@ledger_id_options
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def ledger_delete(metadata_uri, ledger_id, scope_id, qualified_name, yes, as_json):
    """Delete a ledger's metadata; its bookies then collect its data (garbage collection)."""
    lid = resolve_ledger_id(ledger_id, scope_id, qualified_name)
    confirm_delete(f"ledger {lid.qualified_name}", yes, as_json)
    with open_client(metadata_uri) as client:
        client.delete_ledger(lid)
    emit(as_json, {**ledger_ref(lid), "deleted": True}, f"deleted ledger {lid.qualified_name}")


@ledger.command("recover")
@metadata_option
@ledger_id_options
@password_option
@json_option
def ledger_recover(metadata_uri, ledger_id, scope_id, qualified_name, password, as_json):
    """Recover an OPEN ledger: fence its bookies, find its last entry, close it.

    Its writer, if still alive, can add no more. A CLOSED ledger is left as it is."""
    lid = resolve_ledger_id(ledger_id, scope_id, qualified_name)
    with open_client(metadata_uri) as client:
        was = client.ledger_metadata(lid).state
        r = client.open_ledger(lid, password, recovery=True)
        md = r.metadata
    out = {**ledger_ref(lid), "state": md.state.name, "last_entry_id": md.last_entry_id,
           "length": md.length, "recovered": was != LedgerState.CLOSED}
    what = "recovered and closed" if out["recovered"] else "already closed"
    emit(as_json, out, f"ledger {lid.qualified_name} {what}: last entry id {md.last_entry_id}, "
                       f"{md.length} bytes")
