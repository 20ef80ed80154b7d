"""The metadata interfaces (BookKeeper's, in embedlog's words) and ledger metadata.

A driver (SQLite, ZooKeeper, etcd) implements ``MetadataStore``: a bundle of the
managers below. Every write of ledger metadata is a compare-and-set on a
version; versions are opaque to callers (an int for SQLite, the znode version
for ZooKeeper, the key's mod revision for etcd).

Ledger metadata serialisation (documented in docs/METADATA.md)::

    b"embedlog-ledger-metadata\\t" + str(format_version) + b"\\n" + json_body

The text header mirrors BookKeeper's ``BookieMetadataFormatVersion\\t<v>\\n``; the
body is UTF-8 JSON with bytes fields in lowercase hex. Readers refuse an unknown
format version with MetadataError instead of guessing.
"""

from __future__ import annotations

import enum
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from embedlog._native.format import LedgerId
from embedlog.errors import IllegalOpError, MetadataError

METADATA_MAGIC = b"embedlog-ledger-metadata\t"
METADATA_FORMAT_VERSION = 1


class LedgerState(enum.IntEnum):
    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


class DigestType(enum.IntEnum):
    """BookKeeper's persisted digest codes (DataFormats.proto)."""
    CRC32 = 1
    MAC = 2
    CRC32C = 3
    DUMMY = 4


@dataclass(frozen=True)
class LedgerMetadata:
    """What the metadata store knows of one ledger (BookKeeper's fields, plus scope and term).

    ``fragments`` maps the first entry id of each fragment to its ensemble
    (bookie ids), in entry order. ``last_entry_id`` is -1 until the ledger is
    CLOSED with entries. ``term`` is the fencing term of unbounded ledgers. ``password`` is
    stored and checked but never shown: the repr leaves it out (a weak password is found
    from its key by trying a dictionary), as views.py does.
    """
    ledger_id: LedgerId
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest_type: DigestType = DigestType.CRC32C
    password: bytes = field(default=b"", repr=False)
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    fragments: tuple[tuple[int, tuple[str, ...]], ...] = ()
    ctime_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    term: int = 0
    unbounded: bool = False
    # streams: when each fragment began (ms, aligned with fragments) and the first entry
    # retention kept; fragments wholly below it are gone from this list and the bookies
    fragment_ctimes_ms: tuple[int, ...] = ()
    first_entry_id: int = 0
    # what a foreign format stored that embedlog has no field for (BookKeeper's cToken,
    # whether it stored ctime, protobuf fields a newer BookKeeper added): opaque, set by
    # that format's reader and carried by with_() so a rewrite keeps it. Not part of
    # equality, and never in embedlog's own format.
    preserved: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if not (self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1):
            raise MetadataError(
                f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                f"{self.ensemble_size}, {self.write_quorum}, {self.ack_quorum}")

    @property
    def is_closed(self) -> bool:
        return self.state == LedgerState.CLOSED

    def with_(self, **changes) -> "LedgerMetadata":
        return replace(self, **changes)

    def to_bytes(self) -> bytes:
        body = {
            "scope_id": self.ledger_id.scope_id,
            "ledger_id": self.ledger_id.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "digest_type": int(self.digest_type),
            "password": self.password.hex(),
            "state": self.state.name,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "fragments": [[first, list(bookies)] for first, bookies in self.fragments],
            "ctime_ms": self.ctime_ms,
            "custom_metadata": {k: v.hex() for k, v in self.custom_metadata.items()},
            "term": self.term,
            "unbounded": self.unbounded,
            "fragment_ctimes_ms": list(self.fragment_ctimes_ms),
            "first_entry_id": self.first_entry_id,
        }
        return (METADATA_MAGIC + str(METADATA_FORMAT_VERSION).encode() + b"\n"
                + json.dumps(body, separators=(",", ":"), sort_keys=True).encode())

    @classmethod
    def from_bytes(cls, data: bytes) -> "LedgerMetadata":
        try:
            if not data.startswith(METADATA_MAGIC):
                raise ValueError("missing the embedlog-ledger-metadata header")
            header, _, body = data[len(METADATA_MAGIC):].partition(b"\n")
            version = int(header)
            if version != METADATA_FORMAT_VERSION:
                raise MetadataError(f"unknown ledger metadata format version {version}")
            d = json.loads(body)

            def num(value):
                # JSON numbers may be floats (or bools, in Python): only integers are ids
                if type(value) is not int:
                    raise MetadataError(f"corrupted ledger metadata: {value!r:.40} is not an integer")
                return value

            if type(d.get("unbounded", False)) is not bool:
                raise MetadataError("corrupted ledger metadata: unbounded is not a boolean")
            return cls(
                ledger_id=LedgerId(num(d["scope_id"]), num(d["ledger_id"])),
                ensemble_size=num(d["ensemble_size"]), write_quorum=num(d["write_quorum"]),
                ack_quorum=num(d["ack_quorum"]), digest_type=DigestType(num(d["digest_type"])),
                password=bytes.fromhex(d["password"]), state=LedgerState[d["state"]],
                last_entry_id=num(d["last_entry_id"]), length=num(d["length"]),
                fragments=tuple((num(f), tuple(str(b) for b in bs)) for f, bs in d["fragments"]),
                ctime_ms=num(d["ctime_ms"]),
                custom_metadata={k: bytes.fromhex(v) for k, v in d["custom_metadata"].items()},
                term=num(d["term"]), unbounded=d.get("unbounded", False),
                fragment_ctimes_ms=tuple(num(t) for t in d.get("fragment_ctimes_ms", ())),
                first_entry_id=num(d.get("first_entry_id", 0)),
            )
        except MetadataError:
            raise
        except Exception as exc:
            raise MetadataError(f"corrupted ledger metadata: {exc}") from exc


@dataclass(frozen=True)
class DeletionRecord:
    """What a store keeps of a deleted ledger: when, and which ledger of that id it was
    (its ctime; -1 in records written before they kept it). A bookie holding data of
    another ledger of the id (a store restored from an older backup handed the id out
    again) keeps it: this record is not about its ledger (bookie/rollback.py)."""
    deleted_at_ms: int
    ctime_ms: int = -1

    def encode(self) -> str:
        return f"{self.deleted_at_ms} {self.ctime_ms}"

    @classmethod
    def decode(cls, lid: LedgerId, data) -> DeletionRecord:
        """Either form: "deleted_at_ms" (before the ctime was kept) or "deleted_at_ms ctime_ms"."""
        text = data.decode("ascii", "replace") if isinstance(data, (bytes, bytearray)) else str(data)
        try:
            return cls(*(int(f) for f in text.split(None, 1)))
        except (ValueError, TypeError):
            raise MetadataError(f"corrupted deletion record of ledger {lid}: {text[:40]!r}") from None


@dataclass(frozen=True)
class Versioned:
    value: Any
    version: Any


class LedgerManager(ABC):
    """Ledger metadata by 128-bit id; every write is a CAS on the version."""

    @abstractmethod
    def create_ledger_metadata(self, metadata: LedgerMetadata) -> Versioned:
        """Create if absent; LedgerExistsError if the id is taken, or was deleted and its
        deletion record is still kept (bookies still refuse it: a deleted id is not reused)."""

    # Stores that can tell a reader when a ledger's metadata changes set this and take
    # ``read_ledger_metadata(ledger_id, watch=callback)``: ``callback(True)`` is called once,
    # on the store's own thread, at the next change or deletion of that ledger's metadata,
    # or ``callback(False)`` if the connection drops first (the watch is gone). A watch lives
    # at most as long as the store's session: ``watch_epoch()`` names the session, and a
    # reader treats facts read in another epoch as unwatched. A bookie drops what it
    # cached of a ledger when its watch fires (bookie/descriptors.py).
    watches_ledgers = False

    def watch_epoch(self) -> Any:
        """The session the store's watches live in (None where there are none)."""
        return None

    @abstractmethod
    def read_ledger_metadata(self, ledger_id: LedgerId) -> Versioned:
        """NoSuchLedgerError if absent."""

    @abstractmethod
    def write_ledger_metadata(self, metadata: LedgerMetadata, version: Any) -> Versioned:
        """CAS: BadVersionError if the stored version differs, NoSuchLedgerError if gone."""

    @abstractmethod
    def remove_ledger_metadata(self, ledger_id: LedgerId, version: Any = None) -> None:
        """Delete (CAS when a version is given) and, in the same atomic write, leave a
        deletion record; NoSuchLedgerError if absent.

        Deletion is positive (docs/METADATA.md): a bookie removes a ledger's data only
        when its deletion record says it was deleted, never because it is missing."""

    @abstractmethod
    def ledger_deletion(self, ledger_id: LedgerId) -> DeletionRecord | None:
        """The ledger's deletion record, if one is kept."""

    def ledger_deleted_at(self, ledger_id: LedgerId) -> int | None:
        """When the ledger was deleted (ms since the epoch), if its deletion record is kept."""
        record = self.ledger_deletion(ledger_id)
        return None if record is None else record.deleted_at_ms

    @abstractmethod
    def purge_deletions(self, before_ms: int) -> int:
        """Forget deletion records made before ``before_ms``; returns how many went."""

    @abstractmethod
    def iterate_ledgers(self, scope_id: int | None = 0) -> Iterator[LedgerId]:
        """Ledger ids in ascending order, of one scope (None: every scope).

        Tolerates concurrent creates and deletes. Raises MetadataError if the
        listing cannot be completed (GC must never take a partial list as whole).
        """

    def ledger_partitions(self, scope_id: int | None = None) -> Iterator[tuple[Any, list[LedgerId]]]:
        """(partition key, ids) in ascending order; drivers with a hierarchical layout
        override this to list one (level1, level2) partition at a time."""
        yield None, list(self.iterate_ledgers(scope_id))


class LedgerIdGenerator(ABC):
    @abstractmethod
    def generate_ledger_id(self, scope_id: int | None = 0) -> LedgerId:
        """A new ledger id, unique across processes. Scope-0 ids stay below 2^63.

        ``scope_id=None`` asks for a decentralised 128-bit id: a random (version 4)
        UUID split into scope id (high 64 bits, never 0) and ledger id (low 64 bits),
        made without a round trip to the store.
        """


@dataclass(frozen=True)
class BookieRegistration:
    bookie_id: str          # "host:port", where clients connect
    read_only: bool
    info: dict = field(default_factory=dict)


class RegistrationManager(ABC):
    """The bookie's side: register while alive, deregister when stopped."""

    @abstractmethod
    def register_bookie(self, bookie_id: str, read_only: bool, info: dict | None = None) -> None:
        ...

    @abstractmethod
    def unregister_bookie(self, bookie_id: str, read_only: bool) -> None:
        ...


class RegistrationClient(ABC):
    """The client's side: list and watch the registered bookies."""

    @abstractmethod
    def get_all_bookies(self) -> list[BookieRegistration]:
        """Writable, then read-only bookies, from one consistent read: a bookie moving
        between the states is listed once (two reads could straddle the move)."""

    def get_writable_bookies(self) -> list[BookieRegistration]:
        return [r for r in self.get_all_bookies() if not r.read_only]

    def get_readonly_bookies(self) -> list[BookieRegistration]:
        return [r for r in self.get_all_bookies() if r.read_only]

    def watch_bookies(self, callback: Callable[[list[BookieRegistration]], None]) -> Callable[[], None]:
        """Call ``callback`` with all bookies whenever the set changes; returns a cancel function."""
        raise NotImplementedError


class LayoutExistsError(MetadataError):
    """create_layout found a layout already stored."""


class LayoutManager(ABC):
    @abstractmethod
    def read_layout(self) -> bytes | None:
        ...

    @abstractmethod
    def create_layout(self, layout: bytes) -> None:
        """Create if absent; LayoutExistsError (a MetadataError) if present."""

    @abstractmethod
    def delete_layout(self) -> None:
        ...


class CookieStore(ABC):
    @abstractmethod
    def read_cookie(self, bookie_id: str) -> Versioned:
        """NoSuchLedgerError-free: MetadataError subclass CookieNotFound semantics -> returns None."""

    @abstractmethod
    def write_cookie(self, bookie_id: str, data: bytes, version: Any = None) -> Versioned:
        """Create (version None) or CAS-update a cookie."""

    @abstractmethod
    def remove_cookie(self, bookie_id: str, version: Any = None) -> None:
        ...

    @abstractmethod
    def list_cookies(self) -> list[str]:
        """The names of every cookie record, sorted: each bookie that ever started here and
        was not decommissioned (BookKeeper's "all bookies"), and the auditor's lease."""


class UnderreplicationManager(ABC):
    """Records of under-replicated ledgers for autorecovery."""

    @abstractmethod
    def mark_ledger_underreplicated(self, ledger_id: LedgerId, missing_bookies: list[str]) -> None:
        ...

    @abstractmethod
    def mark_ledger_replicated(self, ledger_id: LedgerId) -> None:
        ...

    @abstractmethod
    def list_underreplicated(self) -> dict[LedgerId, list[str]]:
        ...


def check_group_id(group_id) -> str:
    """A consumer group id: a non-empty string of at most 255 characters, no control
    characters (Kafka allows any string; these keep the tools' output readable)."""
    if (not isinstance(group_id, str) or not group_id or len(group_id) > 255
            or any(ord(ch) < 32 or ord(ch) == 127 for ch in group_id)):
        raise IllegalOpError(f"a consumer group id is a non-empty string of at most 255 "
                             f"printable characters, got {group_id!r:.80}")
    return group_id


class ConsumerGroupStore(ABC):
    """Consumer groups' records (client/group.py): one record per group id, its bytes
    opaque to the store (the group's members, generation, assignment and committed
    positions, as JSON); every write is a compare-and-set on the record's version, as
    ledger metadata's are. Group ids are checked by ``check_group_id`` (below) and
    kept percent-encoded where a path or key names them (docs/METADATA.md)."""

    @abstractmethod
    def read_group(self, group_id: str) -> Versioned | None:
        """The group's record, or None if the group has none."""

    @abstractmethod
    def write_group(self, group_id: str, data: bytes, version: Any = None) -> Versioned:
        """Create (``version`` None) or CAS-update the record: BadVersionError if it exists
        (create), or is gone or stored at another version (update)."""

    @abstractmethod
    def remove_group(self, group_id: str, version: Any = None) -> bool:
        """Delete the record (CAS when ``version`` is given): False if it was absent,
        BadVersionError if stored at another version."""

    @abstractmethod
    def list_groups(self) -> list[str]:
        """Every group id with a record, sorted."""


class MetadataStore(ABC):
    """A metadata driver: one connection to one metadata service."""

    uri: str
    instance_id: str
    ledger_manager: LedgerManager
    id_generator: LedgerIdGenerator
    registration_manager: RegistrationManager
    registration_client: RegistrationClient
    layout_manager: LayoutManager
    cookies: CookieStore
    underreplication: UnderreplicationManager
    consumer_groups: ConsumerGroupStore

    @abstractmethod
    def close(self) -> None:
        ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
