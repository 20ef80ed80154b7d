"""Which znodes of a ZooKeeper root in BookKeeper's format embedlog reads and writes, and in
what encoding. ``embedlog.meta.zookeeper.ZkMetadataStore`` does the ZooKeeper calls.

BookKeeper's own znodes, in BookKeeper's encodings (shared with Java clients and bookies)::

    LAYOUT                       layout.LedgerLayout
    INSTANCEID                   a UUID, as text
    available/<bookie id>        ephemeral, service_info (BookieServiceInfoFormat)
    available/readonly/<id>      the same, read-only bookies
    cookies/<bookie id>          cookie.Cookie text; an embedlog bookie's cookie record is
                                 written in it and read back (cookie.from_embedlog)
    idgen/ID-<seq>, idgen-long/HOB-%010d/ID-<seq>    ledger ids (LongZkLedgerIdGenerator)
    <ledger znodes>              layout.ledger_levels, ledger_metadata (v3, v2 kept as v2)

embedlog's own records, for which BookKeeper has no znode, live apart under
``embedlog/``, where no BookKeeper tool looks (BookKeeper's listings skip names that are
not 2 or 3 digits; its ``nukeexistingcluster`` refuses to delete a root it does not fully
know, which includes this one)::

    embedlog/deleted/<last 2 hex digits>/<qualified name>   deletion records
    embedlog/underreplication/ledgers/urL<qualified name>   embedlog's autorecovery marks
                                 (BookKeeper's auditor owns ROOT/underreplication, in its format)
    embedlog/cookies/auditor-lease                          embedlog's auditor lease, kept as a
                                 cookie record: under cookies/ BookKeeper's auditor would take
                                 it for a bookie that is gone

Only scope 0 exists here: ledger ids are BookKeeper's 63-bit ids. A scope other than 0,
a decentralised 128-bit id, or a stream is refused with MetadataError.
"""

from __future__ import annotations

from embedlog._native.format import LedgerId
from embedlog.errors import MetadataError
from embedlog.meta.api import BookieRegistration, LedgerMetadata
from embedlog.meta.bookkeeper import layout as bklayout
from embedlog.meta.bookkeeper import cookie, ledger_metadata, service_info

PRIVATE = "embedlog"
# cookie records that are embedlog's own, not a bookie's (client/autorecovery.py's lease)
PRIVATE_COOKIES = frozenset({"auditor-lease"})


class BookKeeperTree:
    name = "bookkeeper"

    def __init__(self, root: str, ledger_layout: str):
        bklayout.layout_for(ledger_layout)          # MetadataError unless one BookKeeper has
        self.root, self.layout = root, ledger_layout

    def p(self, *parts: str) -> str:
        return "/".join((self.root,) + parts)

    # what formatting a root makes, and how it is recognised

    def layout_record(self) -> bytes:
        return bklayout.layout_for(self.layout).serialize()

    def format_dirs(self) -> tuple[str, ...]:
        return ("available/readonly",)

    def check_layout(self, stored: bytes | None, where: str, explicit: bool) -> str:
        """The layout recorded in ``stored``; MetadataError if it is not one embedlog keeps,
        or (``explicit``: the URI named one) not the one this store was opened with."""
        if stored is None:
            return self.layout
        found = bklayout.parse_layout(stored).ledger_layout
        if explicit and found != self.layout:
            raise MetadataError(f"{where} holds ledgers in BookKeeper's {found!r} layout; this "
                                f"store was opened as {self.layout!r} and would not see them")
        return found

    # ledgers

    def check_scope(self, scope_id: int | None) -> None:
        if scope_id != 0:
            what = "decentralised 128-bit ids" if scope_id is None else f"scope {scope_id}"
            raise MetadataError(f"{self.root} is in BookKeeper's format, which has no "
                                f"{what}: only scope 0 (63-bit ledger ids)")

    def ledger_path(self, lid: LedgerId) -> str:
        if lid.scope_id != 0:
            raise MetadataError(f"ledger {lid} cannot be kept in BookKeeper's format: its id is in "
                                f"scope {lid.scope_id}; BookKeeper's ledger ids are 63-bit, scope 0 only")
        return self.p(*bklayout.ledger_levels(self.layout, lid.ledger_id))

    def partition_trees(self) -> list:
        """(level widths, leaf width) of each ledger tree, in id order."""
        long = ((3, 4, 4, 4), 4)
        return [((2, 4), 4), long] if self.layout == "hierarchical" else [long]

    def has_scoped_tree(self) -> bool:
        return False

    def encode_ledger(self, md: LedgerMetadata) -> bytes:
        return ledger_metadata.encode(md)

    def decode_ledger(self, lid: LedgerId, data: bytes, znode_ctime_ms: int) -> LedgerMetadata:
        return ledger_metadata.decode(data, lid, znode_ctime_ms)

    def deleted_base(self) -> str:
        return self.p(PRIVATE, "deleted")

    def groups_base(self) -> str:
        return self.p(PRIVATE, "groups")

    def underreplication_base(self) -> str:
        return self.p(PRIVATE, "underreplication", "ledgers")

    # bookies

    def encode_registration(self, bookie_id: str, info: dict | None) -> bytes:
        return service_info.registration_body(bookie_id, info)

    def decode_registration(self, bookie_id: str, read_only: bool, data: bytes) -> BookieRegistration:
        return BookieRegistration(bookie_id, read_only, service_info.registration_info(bookie_id, data))

    def cookie_path(self, name: str) -> str:
        if name in PRIVATE_COOKIES:
            return self.p(PRIVATE, "cookies", name)
        return self.p("cookies", name)

    def cookie_dirs(self) -> tuple[str, ...]:
        return (self.p("cookies"), self.p(PRIVATE, "cookies"))

    def encode_cookie(self, name: str, data: bytes) -> bytes:
        """A bookie's cookie as BookKeeper writes it, so that Java's cookie tools read it."""
        if name in PRIVATE_COOKIES:
            return bytes(data)
        translated = cookie.from_embedlog(data)
        return bytes(data) if translated is None else translated

    def decode_cookie(self, name: str, data: bytes) -> bytes:
        return bytes(data) if name in PRIVATE_COOKIES else cookie.to_embedlog(data)
