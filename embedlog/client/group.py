"""Consumer groups on streams: one record per group in the metadata store, changed only by
compare-and-set (meta/api.py's ConsumerGroupStore; the key layout is in docs/METADATA.md).

The record (JSON, ``format`` 1)::

    {"format": 1,
     "generation": 7,                          # raised by every rebalance and every reset
     "members": {"<member id>": {"client_id": ..., "host": ..., "pid": ...,
                                 "subscription": ["orders", "clicks-*"],
                                 "session_timeout_ms": 10000, "expires_ms": <wall ms>}},
     "assignment": {"<stream>": {"member": "<member id>", "generation": 5}},
     "committed": {"<stream>": {"position": 1234, "ms": <wall ms>, "member": "<member id>",
                                "generation": 5, "metadata": ""}}}

- A committed position is, as Kafka's offset, the next position to read (the last one
  processed + 1).
- One member owns a stream at a time (a stream is one Kafka partition). Every change of
  the members or of the streams their subscriptions match rebalances: the assignment is
  recomputed (sticky: a stream stays with a live owner that has no more than its share) and
  the group's generation is raised; a stream whose owner changed is stamped with the new
  generation.
- A commit names, for each stream, the generation the member was given the stream in. It
  is accepted only if the member is still in the group, still owns the stream and the
  stream's stamp is still that generation: a member evicted (its session expired: paused,
  SIGKILLed, partitioned), or whose stream was moved or reset, gets CommitFailedError, and
  a zombie can never move a position it no longer owns.
- Members heartbeat by writing their own ``expires_ms`` (wall clock: members on several
  hosts need clocks in step to within a fraction of the session timeout). Any member's
  heartbeat evicts the expired ones and rebalances; a member that finds itself evicted
  rejoins at its next poll and reads from the committed positions.
- A reset (``embedlog group reset``, ``reset_group``) sets committed positions; with
  members running, it also re-stamps the reset streams with a new generation, so the
  owners' commits of older positions are refused and their next poll reads from the reset
  position.
"""
from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import socket
import time
import uuid
from typing import Callable

from embedlog.errors import (BadVersionError, CommitFailedError, EmbedlogError,
                             GroupIdNotFoundError, GroupNotEmptyError, MetadataError)
from embedlog.meta.api import check_group_id

FORMAT = 1
_RETRIES = 200


def now_ms() -> int:
    return int(time.time() * 1000)


def empty_record() -> dict:
    return {"format": FORMAT, "generation": 0, "members": {}, "assignment": {}, "committed": {}}


def decode(group_id: str, data: bytes) -> dict:
    try:
        rec = json.loads(data)
        if not isinstance(rec, dict) or rec.get("format") != FORMAT:
            raise ValueError(f"unknown format {rec.get('format') if isinstance(rec, dict) else rec!r}")
        for key in ("members", "assignment", "committed"):
            rec.setdefault(key, {})
        rec.setdefault("generation", 0)
        return rec
    except (ValueError, TypeError) as exc:
        raise MetadataError(f"corrupted record of consumer group {group_id!r}: {exc}") from None


def encode(rec: dict) -> bytes:
    return json.dumps(rec, separators=(",", ":"), sort_keys=True).encode()


def read_group(metadata, group_id: str) -> tuple[dict | None, object]:
    """(record, version) of a group, or (None, None) if it has no record."""
    v = metadata.consumer_groups.read_group(check_group_id(group_id))
    return (None, None) if v is None else (decode(group_id, v.value), v.version)


def update_group(metadata, group_id: str, change: Callable[[dict], dict | None],
                 create: bool = True) -> dict:
    """Apply ``change`` to the group's record by compare-and-set, again on a conflict.
    ``change`` edits the record in place and returns it, or returns None to write nothing
    (the record read is returned); it may raise to refuse."""
    store = metadata.consumer_groups
    check_group_id(group_id)
    for _ in range(_RETRIES):
        v = store.read_group(group_id)
        if v is None and not create:
            raise GroupIdNotFoundError(f"no consumer group {group_id!r}")
        rec = empty_record() if v is None else decode(group_id, v.value)
        new = change(rec)
        if new is None:
            return rec
        try:
            store.write_group(group_id, encode(new), None if v is None else v.version)
            return new
        except BadVersionError:
            continue
    raise EmbedlogError(f"consumer group {group_id!r}: its record kept changing under "
                        f"{_RETRIES} writes")


def _matches(subscription, name: str) -> bool:
    return any(name == s or (any(c in s for c in "*?[") and fnmatch.fnmatchcase(name, s))
               or (s.startswith("^") and _regex(s, name)) for s in subscription)


def _regex(pattern: str, name: str) -> bool:
    try:
        return re.fullmatch(pattern[1:] if pattern.startswith("^") else pattern, name) is not None
    except re.error:
        return False


def expire_members(rec: dict, now: int) -> list[str]:
    gone = [m for m, info in rec["members"].items() if info.get("expires_ms", 0) < now]
    for m in gone:
        del rec["members"][m]
    return gone


def rebalance(rec: dict, streams: list[str]) -> bool:
    """Recompute the assignment of ``streams`` (every stream name that exists) to the live
    members whose subscriptions match them. Raises the generation and returns True if the
    assignment changed."""
    members = sorted(rec["members"])
    wanted = {s: [m for m in members if _matches(rec["members"][m].get("subscription", ()), s)]
              for s in sorted(streams)}
    wanted = {s: ms for s, ms in wanted.items() if ms}
    old = rec["assignment"]
    # balanced: every member holds floor(n / m) or ceil(n / m) streams, at most n % m of
    # them the ceiling; a stream stays with a live owner that has room (sticky)
    low, extra = divmod(len(wanted), len(members)) if members else (0, 0)
    load = {m: 0 for m in members}
    new: dict = {}

    def room(m) -> bool:
        at_ceiling = sum(1 for n in load.values() if n > low)
        return load[m] < low or (load[m] == low and at_ceiling < extra)

    for s, candidates in wanted.items():          # keep a live owner that has room
        owner = old.get(s, {}).get("member")
        if owner in candidates and room(owner):
            new[s] = owner
            load[owner] += 1
    for s, candidates in wanted.items():
        if s not in new:
            owner = min(candidates, key=lambda m: (not room(m), load[m], m))
            new[s] = owner
            load[owner] += 1
    if {s: old.get(s, {}).get("member") for s in old} == new:
        return False
    gen = rec["generation"] + 1
    rec["generation"] = gen
    rec["assignment"] = {s: (old[s] if old.get(s, {}).get("member") == m
                             else {"member": m, "generation": gen}) for s, m in new.items()}
    return True


def member_info(client_id: str, subscription, session_timeout_ms: int) -> dict:
    return {"client_id": client_id, "host": socket.gethostname(), "pid": os.getpid(),
            "subscription": list(subscription), "session_timeout_ms": int(session_timeout_ms),
            "expires_ms": now_ms() + int(session_timeout_ms)}


def new_member_id(client_id: str) -> str:
    return f"{client_id}-{uuid.uuid4().hex[:12]}"


def check_commit(rec: dict, group_id: str, member_id: str, held: dict, offsets: dict) -> None:
    """CommitFailedError unless ``member_id`` is in the group and owns each stream of
    ``offsets`` under the generation it holds it in (``held``: stream -> generation)."""
    if member_id not in rec["members"]:
        raise CommitFailedError(
            f"consumer group {group_id!r}: member {member_id} is no longer in the group (its "
            f"session expired or it left; generation now {rec['generation']}): commit refused; "
            f"the next poll rejoins and reads from the committed positions")
    for stream in offsets:
        a = rec["assignment"].get(stream)
        if a is None or a["member"] != member_id or a["generation"] != held.get(stream):
            now = "unassigned" if a is None else f"member {a['member']}, generation {a['generation']}"
            raise CommitFailedError(
                f"consumer group {group_id!r}: stream {stream!r} is not member {member_id}'s "
                f"under generation {held.get(stream)} any more (now {now}): commit refused")


def set_committed(rec: dict, offsets: dict, member_id: str | None = None,
                  metadata: dict | None = None) -> None:
    ms = now_ms()
    for stream, position in offsets.items():
        gen = rec["assignment"].get(stream, {}).get("generation", rec["generation"])
        rec["committed"][stream] = {"position": int(position), "ms": ms, "member": member_id,
                                    "generation": gen,
                                    "metadata": (metadata or {}).get(stream, "")}


def reset_group(metadata, group_id: str, positions: dict, force: bool = False) -> dict:
    """Set the committed positions of ``positions`` (stream -> next position to read).
    With live members, refused unless ``force``: then the reset streams are re-stamped with
    a new generation, so their owners' commits of older positions are refused and their
    next poll reads from here. Returns the record written."""
    def change(rec):
        live = {m for m, i in rec["members"].items() if i.get("expires_ms", 0) >= now_ms()}
        if live and not force:
            raise GroupNotEmptyError(
                f"consumer group {group_id!r} has {len(live)} live member(s) "
                f"({', '.join(sorted(live))}): stop them first, or force the reset (--force; "
                f"their commits of older positions are then refused and they read from the "
                f"reset position)")
        gen = rec["generation"] + 1
        rec["generation"] = gen
        for stream in positions:
            if stream in rec["assignment"]:
                rec["assignment"][stream] = {**rec["assignment"][stream], "generation": gen}
        set_committed(rec, positions, None)
        return rec
    return update_group(metadata, group_id, change)


def record_positions(metadata, group_id: str, positions: dict) -> dict:
    """Record positions in a group without a member's fencing: the Spark source's progress
    after each micro-batch (its checkpoint is the source of truth; the group is for the
    tools and the lag metric). Returns the record written."""
    def change(rec):
        set_committed(rec, {s: int(p) for s, p in positions.items()}, None)
        return rec
    return update_group(metadata, group_id, change)


def delete_group(metadata, group_id: str, force: bool = False) -> bool:
    rec, version = read_group(metadata, group_id)
    if rec is None:
        return False
    live = [m for m, i in rec["members"].items() if i.get("expires_ms", 0) >= now_ms()]
    if live and not force:
        raise GroupNotEmptyError(f"consumer group {group_id!r} has live members "
                                f"({', '.join(sorted(live))}): stop them first")
    return metadata.consumer_groups.remove_group(group_id, version)


def list_groups(metadata) -> list[str]:
    return metadata.consumer_groups.list_groups()


def describe(metadata, group_id: str, end_positions: Callable[[str], int | None]) -> dict:
    """What `embedlog group describe` shows: the group's state, members, and per stream its
    owner, committed position, end position (the stream's LAC + 1) and lag (end - committed)."""
    rec, _ = read_group(metadata, group_id)
    if rec is None:
        raise GroupIdNotFoundError(f"no consumer group {group_id!r}")
    now = now_ms()
    live = {m: i for m, i in rec["members"].items() if i.get("expires_ms", 0) >= now}
    streams = sorted(set(rec["committed"]) | set(rec["assignment"]))
    rows = []
    for s in streams:
        end = end_positions(s)
        c = rec["committed"].get(s, {}).get("position")
        owner = rec["assignment"].get(s, {}).get("member")
        rows.append({"stream": s, "member": owner if owner in live else None,
                     "committed": c, "end": end,
                     "lag": None if end is None or c is None else max(0, end - c)})
    state = "Stable" if live else "Empty"
    return {"group": group_id, "state": state, "generation": rec["generation"],
            "members": [{"member_id": m, **{k: i[k] for k in ("client_id", "host", "pid")
                                             if k in i},
                         "streams": sorted(s for s, a in rec["assignment"].items()
                                           if a["member"] == m)} for m, i in sorted(live.items())],
            "streams": rows}


def group_lags(metadata, end_positions: Callable[[str], int | None]) -> list[dict]:
    """Every group's committed position, end position and lag per stream (the /metrics
    figures): [{"group", "stream", "committed", "end", "lag"}]. A stream that is gone is
    left out; a group deleted meanwhile too."""
    out = []
    for gid in list_groups(metadata):
        try:
            rec, _ = read_group(metadata, gid)
        except MetadataError:
            continue
        if rec is None:
            continue
        for stream, c in sorted(rec["committed"].items()):
            end = end_positions(stream)
            if end is None:
                continue
            out.append({"group": gid, "stream": stream, "committed": c["position"], "end": end,
                        "lag": max(0, end - c["position"])})
    return out
