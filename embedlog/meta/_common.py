"""Pieces every metadata driver shares: id helpers, the layout record, bookie records.

Nothing here talks to a server; the drivers (sqlite, zookeeper, etcd) import it.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import uuid
from typing import Callable
from urllib.parse import quote, unquote

from embedlog._native.format import LedgerId
from embedlog.errors import MetadataError
from embedlog.meta.api import BookieRegistration, check_group_id

log = logging.getLogger("embedlog.meta")

U64_MAX = (1 << 64) - 1
SCOPE0_LIMIT = 1 << 63          # scope-0 ids stay below 2^63 (BookKeeper's range)

# The layout record each driver writes once under LAYOUT; a store opened with another
# ledger layout than the one recorded refuses to start, as BookKeeper's LayoutManager
# does, because a flat reader would see none of a hierarchical writer's ledgers.
LAYOUT_MAGIC = b"embedlog-layout\t"
LAYOUT_FORMAT_VERSION = 1


def layout_record(ledger_layout: str) -> bytes:
    return (LAYOUT_MAGIC + str(LAYOUT_FORMAT_VERSION).encode() + b"\n"
            + f"ledger_manager={ledger_layout}\n".encode())


def check_layout(stored: bytes | None, ledger_layout: str, where: str) -> None:
    """MetadataError if ``stored`` is an embedlog layout naming another ledger layout.

    A foreign record (not starting with the magic) is left alone: the layout manager is a
    public interface and an operator may keep their own bytes there.
    """
    if stored is None or not stored.startswith(LAYOUT_MAGIC):
        return
    header, _, body = stored[len(LAYOUT_MAGIC):].partition(b"\n")
    try:
        version = int(header)
    except ValueError:
        raise MetadataError(f"corrupted layout record at {where}: {stored[:80]!r}") from None
    if version != LAYOUT_FORMAT_VERSION:
        raise MetadataError(f"unknown layout format version {version} at {where}")
    fields = dict(line.split("=", 1) for line in body.decode("utf-8", "replace").splitlines()
                  if "=" in line)
    found = fields.get("ledger_manager")
    if found != ledger_layout:
        raise MetadataError(
            f"{where} holds ledgers in the {found!r} layout; this store was opened as "
            f"{ledger_layout!r} and would not see them")


def recorded_layout(stored: bytes | None) -> str | None:
    """The ledger layout an embedlog layout record names (None for any other record)."""
    if stored is None or not stored.startswith(LAYOUT_MAGIC):
        return None
    body = stored[len(LAYOUT_MAGIC):].partition(b"\n")[2].decode("utf-8", "replace")
    fields = dict(line.split("=", 1) for line in body.splitlines() if "=" in line)
    return fields.get("ledger_manager")


def coerce_ledger_id(ledger_id) -> LedgerId:
    """An int means scope 0, as everywhere a ledger id is taken (LedgerId.coerce)."""
    return ledger_id if isinstance(ledger_id, LedgerId) else LedgerId.coerce(ledger_id)


def deleted_id_message(lid: LedgerId, deleted_at_ms) -> str:
    when = datetime.datetime.fromtimestamp(int(deleted_at_ms) / 1000, datetime.timezone.utc)
    return (f"ledger id {lid} was deleted at {when:%Y-%m-%d %H:%M:%S} UTC; a deleted id is not "
            "reused while its deletion record is kept (bookies refuse it)")


def decentralised_ledger_id() -> LedgerId:
    """A 128-bit id from a random UUID: the high 64 bits are the scope id, the low 64 the
    ledger id (``LedgerId.from_uuid``). Version-4 UUIDs carry the version nibble 0100 in
    the high half, so the scope id is never 0 and such ids never enter scope 0's range."""
    return LedgerId.from_uuid(uuid.uuid4())


def check_scope(scope_id: int) -> int:
    if not isinstance(scope_id, int) or not 0 <= scope_id <= U64_MAX:
        raise MetadataError(f"scope id must be an unsigned 64-bit integer, got {scope_id!r}")
    return scope_id


def owner_token() -> str:
    """Who holds a registration: host, pid and a random part (two stores in one process
    are two owners)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def owner_is_dead_local_process(owner: str) -> bool:
    """True only when ``owner`` names a process on this host that no longer exists.

    PID reuse can only make a dead owner look alive, which falls back to waiting for
    the expiry: the check never shortens a live registration."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def encode_bookie_info(info: dict | None) -> bytes:
    return json.dumps(info or {}, sort_keys=True, separators=(",", ":")).encode()


def decode_bookie(bookie_id: str, read_only: bool, data: bytes | str | None) -> BookieRegistration:
    # A registration whose body cannot be read is still a live bookie: keep it, without info.
    try:
        info = json.loads(data) if data else {}
        if not isinstance(info, dict):
            info = {}
    except (ValueError, RecursionError):
        info = {}
    return BookieRegistration(bookie_id=bookie_id, read_only=read_only, info=info)


def decode_underreplicated(data: bytes | str, where: str, bare_list: bool = False) -> list[str]:
    """The missing bookies of an under-replication record: JSON {"missing": [...], ...}
    (ZooKeeper, etcd), or a bare JSON list (``bare_list``: SQLite's column)."""
    try:
        record = json.loads(data)
        missing = record if bare_list else record["missing"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise MetadataError(f"corrupted under-replication record {where}: {exc}") from None
    if not isinstance(missing, list) or not all(isinstance(b, str) for b in missing):
        raise MetadataError(f"corrupted under-replication record {where}: "
                            f"missing bookies are not a list of names: {missing!r:.80}")
    return missing


def check_bookie_id(bookie_id: str) -> str:
    if not isinstance(bookie_id, str) or not bookie_id or "/" in bookie_id:
        raise MetadataError(f"bad bookie id {bookie_id!r}: a non-empty string without '/'")
    return bookie_id


def bookie_set(bookies: list[BookieRegistration]) -> frozenset:
    return frozenset((b.bookie_id, b.read_only, json.dumps(b.info, sort_keys=True))
                     for b in bookies)


class PollingWatch:
    """Calls ``callback(list)`` at once and then whenever ``fetch()`` changes.

    SQLite has no cross-process change notification, so it only polls; ZooKeeper and
    etcd call ``kick()`` from their server-side watches and keep the poll as a safety
    net (a one-shot znode watch re-armed late can miss a change; a polled list cannot).
    Errors while fetching are retried on the next tick; the callback's own errors are
    logged so one bad listener cannot stop the thread."""

    def __init__(self, fetch: Callable[[], list[BookieRegistration]],
                 callback: Callable[[list[BookieRegistration]], None], interval_s: float,
                 name: str = "embedlog-bookie-watch"):
        self._fetch, self._callback, self._interval_s = fetch, callback, interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._last: frozenset | None = None
        t = threading.Thread(target=self._run, name=name, daemon=True)
        t.start()
        self._thread = t                    # once started: cancel() joins only a started thread

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()           # before fetching: a kick during the fetch is kept
            try:
                bookies = self._fetch()
            except Exception as exc:   # the store may be briefly unavailable: next tick
                log.debug("bookie watch: listing failed, retrying: %s", exc)
                bookies = None
            if bookies is not None:
                current = bookie_set(bookies)
                if current != self._last:
                    self._last = current
                    try:
                        self._callback(bookies)
                    except Exception:
                        log.exception("bookie watch callback failed")
            self._wake.wait(self._interval_s)

    def kick(self) -> None:
        """Look again now (a server-side watch fired)."""
        self._wake.set()

    def cancel(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class StoreBase:
    """Mixin for drivers that implement every manager in one object: the MetadataStore
    attributes all point at the store itself."""

    def _bind_managers(self) -> None:
        self.ledger_manager = self
        self.id_generator = self
        self.registration_manager = self
        self.registration_client = self
        self.layout_manager = self
        self.cookies = self
        self.underreplication = self
        self.consumer_groups = self


def group_key(group_id: str) -> str:
    """The group id as one path or key component: percent-encoded (RFC 3986, nothing
    left unescaped but letters, digits and ``-_~``; '.' too, so "." and ".." are names),
    so '/' and '%' never split a path."""
    return quote(check_group_id(group_id), safe="").replace(".", "%2E")


def group_of_key(key: str) -> str:
    return unquote(key)


def merge_missing(old: list[str], new: list[str]) -> list[str]:
    """BookKeeper merges the missing replicas of repeated under-replication marks."""
    out = list(old)
    for b in new:
        if b not in out:
            out.append(b)
    return out
