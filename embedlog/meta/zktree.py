"""embedlog's own format of a ZooKeeper root: where each record lives, and how it is encoded
(ZkMetadataStore, meta/zookeeper.py, makes the calls; BookKeeper's format is
meta/bookkeeper/tree.py's).

Under the root (``/ledgers`` by default; docs/METADATA.md has the full tree)::

    LAYOUT, INSTANCEID
    available/<bookie>            ephemeral, read-write bookies
    available/readonly/<bookie>   ephemeral, read-only bookies
    cookies/<bookie>
    idgen/ID-<seq>                ephemeral-sequential, scope 0 ids below 2^31 - 1
    idgen-long/HOB-%010d/ID-<seq> BookKeeper's high-order-bit extension past 31 bits
    idgen-scoped/%020d/...        the same pair per scope != 0 (and idgen-scoped-long/)
    underreplication/ledgers/urL<qualified name>
    deleted/<last 2 hex digits>/<qualified name>   deletion records: "deleted_at_ms ctime_ms"
    groups/<percent-encoded group id>              consumer groups' records (client/group.py)
    <ledger znodes>               by layout, scope 0:
        flat              L%010d
        hierarchical      %010d split 2-4-4 (00/0000/L0001) below 2^31 - 1, else
                          %019d split 3-4-4-4-4 (000/0000/0000/0000/L0001)
        longhierarchical  %019d split 3-4-4-4-4
    scoped/<scope %020d as 4-4-4-4-4>/<ledger %020d as 4-4-4-4>/L<last 4>
                          scope != 0 ("LongLongHierarchical"), every layout
"""
from __future__ import annotations

import re

from embedlog._native.format import LedgerId
from embedlog.meta._common import (check_layout, check_scope, decode_bookie, encode_bookie_info,
                                   layout_record)
from embedlog.meta.api import BookieRegistration, LedgerMetadata
from embedlog.meta.bookkeeper.layout import split_digits

SHORT_ID_LIMIT = (1 << 31) - 1          # Integer.MAX_VALUE: the hierarchical switch point

# (level widths, leaf width) of each hierarchical tree
LEGACY = ((2, 4), 4)
LONG = ((3, 4, 4, 4), 4)
SCOPED_LEDGER = ((4, 4, 4, 4), 4)
SCOPE_LEVELS = (4, 4, 4, 4, 4)
LEAF = re.compile(r"L(\d+)\Z")


class EmbedlogTree:
    """embedlog's own format of a root (the module docstring's tree); BookKeeperTree
    (meta/bookkeeper/tree.py) is the other, with the same methods."""
    name = "embedlog"

    def __init__(self, root: str, ledger_layout: str):
        self.root, self.layout = root, ledger_layout

    def p(self, *parts: str) -> str:
        return "/".join((self.root,) + parts)

    def layout_record(self) -> bytes:
        return layout_record(self.layout)

    def format_dirs(self) -> tuple[str, ...]:
        return ("available/readonly", "cookies", "idgen", "underreplication/ledgers")

    def check_layout(self, stored: bytes | None, where: str, explicit: bool) -> str:
        check_layout(stored, self.layout, where)
        return self.layout

    def check_scope(self, scope_id: int | None) -> None:
        if scope_id is not None:
            check_scope(scope_id)

    def ledger_path(self, lid: LedgerId) -> str:
        n = lid.ledger_id
        if lid.scope_id:
            scope = split_digits(f"{lid.scope_id:020d}", SCOPE_LEVELS)
            levels = split_digits(f"{n:020d}", SCOPED_LEDGER[0] + (4,))
            return self.p("scoped", *scope, *levels[:-1], "L" + levels[-1])
        if self.layout == "flat":
            return self.p(f"L{n:010d}")
        if self.layout == "hierarchical" and n < SHORT_ID_LIMIT:
            levels = split_digits(f"{n:010d}", (2, 4, 4))
        else:
            levels = split_digits(f"{n:019d}", (3, 4, 4, 4, 4))
        return self.p(*levels[:-1], "L" + levels[-1])

    def partition_trees(self) -> list:
        return [LONG] if self.layout == "longhierarchical" else [LEGACY, LONG]

    def has_scoped_tree(self) -> bool:
        return True

    def encode_ledger(self, md: LedgerMetadata) -> bytes:
        return md.to_bytes()

    def decode_ledger(self, lid: LedgerId, data: bytes, znode_ctime_ms: int) -> LedgerMetadata:
        return LedgerMetadata.from_bytes(data)

    def deleted_base(self) -> str:
        return self.p("deleted")

    def underreplication_base(self) -> str:
        return self.p("underreplication", "ledgers")

    def groups_base(self) -> str:
        return self.p("groups")

    def encode_registration(self, bookie_id: str, info: dict | None) -> bytes:
        return encode_bookie_info(info)

    def decode_registration(self, bookie_id: str, read_only: bool, data: bytes) -> BookieRegistration:
        return decode_bookie(bookie_id, read_only, data)

    def cookie_path(self, name: str) -> str:
        return self.p("cookies", name)

    def cookie_dirs(self) -> tuple[str, ...]:
        return (self.p("cookies"),)

    def encode_cookie(self, name: str, data: bytes) -> bytes:
        return bytes(data)

    def decode_cookie(self, name: str, data: bytes) -> bytes:
        return bytes(data)
