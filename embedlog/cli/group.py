"""`embedlog group ...`: consumer groups (kafka-consumer-groups.sh's counterpart).

Written against embedlog.client.group (the group's record in the metadata store) and the
streams' LACs: ``list`` and ``describe`` show each group's committed positions, the streams'
end positions (LAC + 1) and the lag between; ``reset`` moves committed positions (a dry run
unless --execute, as Kafka's --reset-offsets); ``delete`` removes an inactive group.
"""
from __future__ import annotations

import datetime

import click

from embedlog.cli.common import (EmbedlogGroup, confirm_delete, emit, json_option, metadata_option,
                                 open_client, table)
from embedlog.client import group as G
from embedlog.errors import GroupIdNotFoundError, IllegalOpError, NoSuchLedgerError


def end_positions(client):
    """stream name -> its end position (LAC + 1), None for a stream that is gone; each
    stream's LAC read once per command."""
    cache: dict = {}

    def end(name: str):
        if name not in cache:
            try:
                cache[name] = client.open_stream(name, create=False).last_position() + 1
            except NoSuchLedgerError:
                cache[name] = None
        return cache[name]
    return end


@click.group(cls=EmbedlogGroup)
def group():
    """List, describe, reset and delete consumer groups (committed positions and lag)."""


@group.command("list")
@metadata_option
@json_option
def group_list(metadata_uri, as_json):
    """List consumer groups: state, members, streams and total lag."""
    with open_client(metadata_uri) as client:
        end = end_positions(client)
        rows = []
        for gid in G.list_groups(client.metadata):
            try:
                d = G.describe(client.metadata, gid, end)
            except GroupIdNotFoundError:
                continue                         # deleted meanwhile
            lags = [r["lag"] for r in d["streams"] if r["lag"] is not None]
            rows.append({"group": gid, "state": d["state"], "generation": d["generation"],
                         "members": len(d["members"]), "streams": len(d["streams"]),
                         "lag": sum(lags) if lags else None})
    if as_json:
        emit(True, rows)
        return
    table(["group", "state", "members", "streams", "lag"],
          [[r["group"], r["state"], r["members"], r["streams"], r["lag"]] for r in rows],
          f"{len(rows)} groups", right=("members", "streams", "lag"))


@group.command("describe")
@metadata_option
@click.argument("group_id")
@json_option
def group_describe(metadata_uri, group_id, as_json):
    """Show GROUP_ID's members and, per stream, its committed position, end position
    (LAC + 1), lag (end - committed) and owner."""
    with open_client(metadata_uri) as client:
        d = G.describe(client.metadata, group_id, end_positions(client))
    if as_json:
        emit(True, d)
        return
    click.echo(f"group {group_id!r}: {d['state']}, generation {d['generation']}, "
               f"{len(d['members'])} members")
    hosts = {m["member_id"]: f"{m.get('host')}/{m.get('pid')}" for m in d["members"]}
    table(["stream", "committed", "end", "lag", "member", "host"],
          [[r["stream"], r["committed"], r["end"], r["lag"], r["member"], hosts.get(r["member"])]
           for r in d["streams"]], None, right=("committed", "end", "lag"))


@group.command("reset")
@metadata_option
@click.argument("group_id")
@click.option("--stream", "streams", multiple=True, metavar="NAME",
              help="A stream to reset (repeat); default: every stream the group has a position for.")
@click.option("--to-earliest", is_flag=True, help="The stream's first kept position.")
@click.option("--to-latest", is_flag=True, help="The stream's end (LAC + 1): skip everything.")
@click.option("--to-position", type=click.IntRange(min=0), default=None, help="This position.")
@click.option("--to-datetime", default=None, metavar="ISO8601",
              help="The first position appended at or after this time (e.g. 2026-11-29T03:00:00Z).")
@click.option("--shift-by", type=int, default=None, help="Move the committed position by N (may be < 0).")
@click.option("--execute", is_flag=True, help="Apply the reset (without it: show what it would do).")
@click.option("--force", is_flag=True,
              help="Reset while members run: their commits of older positions are refused and "
                   "their next poll reads from the new position.")
@json_option
def group_reset(metadata_uri, group_id, streams, to_earliest, to_latest, to_position, to_datetime,
                shift_by, execute, force, as_json):
    """Move GROUP_ID's committed positions (a dry run unless --execute, as Kafka's
    kafka-consumer-groups --reset-offsets). Refused (exit 4) while the group has live
    members, unless --force."""
    chosen = [x for x in (to_earliest, to_latest, to_position is not None, to_datetime is not None,
                          shift_by is not None) if x]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-position, "
                               "--to-datetime, --shift-by")
    when_ms = None
    if to_datetime is not None:
        try:
            when = datetime.datetime.fromisoformat(to_datetime.replace("Z", "+00:00"))
        except ValueError:
            raise click.UsageError(f"--to-datetime: {to_datetime!r} is not an ISO 8601 time") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        when_ms = int(when.timestamp() * 1000)
    with open_client(metadata_uri) as client:
        rec, _ = G.read_group(client.metadata, group_id)
        if rec is None and not streams:
            raise GroupIdNotFoundError(f"no consumer group {group_id!r} (name --stream to make "
                                       f"one with positions)")
        names = list(streams) or sorted(set((rec or {}).get("committed", {}))
                                        | set((rec or {}).get("assignment", {})))
        plan = {}
        for name in names:
            s = client.open_stream(name, create=False)
            first, end = s.refresh().first_entry_id, s.last_position() + 1
            current = (rec or {}).get("committed", {}).get(name, {}).get("position")
            if to_earliest:
                new = first
            elif to_latest:
                new = end
            elif to_position is not None:
                new = to_position
            elif when_ms is not None:
                new = s.position_at(when_ms)
            else:
                if current is None:
                    raise IllegalOpError(f"--shift-by: group {group_id!r} has no committed "
                                         f"position on stream {name!r}")
                new = current + shift_by
            plan[name] = {"previous": current, "position": max(first, min(end, new)),
                          "first": first, "end": end}
        if execute:
            G.reset_group(client.metadata, group_id,
                          {n: p["position"] for n, p in plan.items()}, force=force)
    out = {"group": group_id, "executed": execute, "streams": plan}
    if as_json:
        emit(True, out)
        return
    table(["stream", "previous", "new position", "first", "end"],
          [[n, p["previous"], p["position"], p["first"], p["end"]] for n, p in plan.items()],
          f"group {group_id!r}: " + ("reset" if execute else
                                     "dry run (nothing changed; add --execute to apply)"),
          right=("previous", "new position", "first", "end"))


@group.command("delete")
@metadata_option
@click.argument("group_id")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def group_delete(metadata_uri, group_id, yes, as_json):
    """Delete GROUP_ID's record (refused, exit 4, while it has live members)."""
    confirm_delete(f"consumer group {group_id!r}", yes, as_json)
    with open_client(metadata_uri) as client:
        if not G.delete_group(client.metadata, group_id):
            raise GroupIdNotFoundError(f"no consumer group {group_id!r}")
    emit(as_json, {"group": group_id, "deleted": True}, f"deleted consumer group {group_id!r}")
