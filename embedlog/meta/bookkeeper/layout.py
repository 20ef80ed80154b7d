"""BookKeeper's LAYOUT record (LedgerLayout) and where its ledger managers keep ledgers.

``ROOT/LAYOUT`` names the ledger manager factory every client and bookie of the cluster
must use; BookKeeper's ``initnewcluster`` (and the first bookie or client on an empty
root) writes it once::

    layout = format_version "\\n" manager "\\n"?    format_version: 2 (1 is also read)
    manager (v2) = factory class ":" factory version    e.g.
        org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1
    manager (v1) = type name ":" version                 e.g. hierarchical:1

Ledger znodes and ids, as HierarchicalLedgerManager and LongHierarchicalLedgerManager
keep them (both take ids from LongZkLedgerIdGenerator: ``idgen/ID-<seq>`` below
2^31 - 1, then ``idgen-long/HOB-%010d/ID-<seq>`` for the high and low 32 bits)::

    hierarchical      id < 2^31 - 1: %010d split 2-4-4        ROOT/00/0000/L0042
                      else:         %019d split 3-4-4-4-4    ROOT/000/0000/0021/4748/L3648
    longhierarchical  %019d split 3-4-4-4-4

A factory class is matched by its simple name, so a shaded copy (Pulsar's
``org.apache.pulsar.shade.org.apache.bookkeeper...``) names the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedlog.errors import MetadataError

LAYOUT_FORMAT_VERSION = 2
MANAGER_VERSION = 1          # CUR_VERSION of every ZooKeeper ledger manager factory
SHORT_ID_LIMIT = (1 << 31) - 1
_PACKAGE = "org.apache.bookkeeper.meta."
# embedlog's layout name -> BookKeeper's factory class (simple name)
FACTORIES = {
    "hierarchical": "HierarchicalLedgerManagerFactory",
    "longhierarchical": "LongHierarchicalLedgerManagerFactory",
}
# layouts BookKeeper has and embedlog does not keep ledgers in: named in the refusal
UNSUPPORTED = {
    "FlatLedgerManagerFactory": "flat",
    "LegacyHierarchicalLedgerManagerFactory": "legacyhierarchical",
    "MSLedgerManagerFactory": "ms",
}
_V1_TYPES = {"hierarchical": "hierarchical", "flat": "flat"}


@dataclass(frozen=True)
class LedgerLayout:
    manager_factory_class: str
    manager_version: int = MANAGER_VERSION
    layout_format_version: int = LAYOUT_FORMAT_VERSION

    def serialize(self) -> bytes:
        return (f"{self.layout_format_version}\n{self.manager_factory_class}:"
                f"{self.manager_version}").encode("utf-8")

    @property
    def ledger_layout(self) -> str:
        """embedlog's name of this layout; MetadataError for one embedlog does not keep."""
        name = self.manager_factory_class.rsplit(".", 1)[-1]
        if self.layout_format_version == 1:
            name = {"hierarchical": "HierarchicalLedgerManagerFactory",
                    "flat": "FlatLedgerManagerFactory"}.get(name, name)
        for layout, factory in FACTORIES.items():
            if name == factory:
                if self.manager_version != MANAGER_VERSION:
                    raise MetadataError(f"BookKeeper layout {self.manager_factory_class} version "
                                        f"{self.manager_version} is not known (only {MANAGER_VERSION})")
                return layout
        if name in UNSUPPORTED:
            raise MetadataError(f"BookKeeper's {UNSUPPORTED[name]} ledger layout "
                                f"({self.manager_factory_class}) is not supported; embedlog keeps "
                                f"ledgers in BookKeeper's hierarchical and longhierarchical layouts")
        raise MetadataError(f"unknown BookKeeper ledger manager factory {self.manager_factory_class!r}")


def layout_for(ledger_layout: str) -> LedgerLayout:
    """The LAYOUT BookKeeper's initnewcluster writes for one of embedlog's layout names."""
    if ledger_layout not in FACTORIES:
        raise MetadataError(f"BookKeeper format needs the hierarchical or longhierarchical "
                            f"ledger layout, not {ledger_layout!r}")
    return LedgerLayout(_PACKAGE + FACTORIES[ledger_layout])


def parse_layout(data: bytes) -> LedgerLayout:
    """BookKeeper's LedgerLayout.parseLayout; MetadataError if ``data`` is not one."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise MetadataError("not a BookKeeper layout: not UTF-8") from None
    lines = text.split("\n")
    if not lines[0].isdigit():
        raise MetadataError(f"not a BookKeeper layout: {text[:60]!r}")
    version = int(lines[0])
    if not 1 <= version <= LAYOUT_FORMAT_VERSION:
        raise MetadataError(f"BookKeeper layout format version {version} is not known "
                            f"(1 to {LAYOUT_FORMAT_VERSION})")
    parts = lines[1].split(":") if len(lines) > 1 else []
    if len(parts) != 2 or not parts[1].isdigit() or not parts[0]:
        raise MetadataError(f"invalid ledger manager in BookKeeper layout: {text[:120]!r}")
    return LedgerLayout(parts[0], int(parts[1]), version)


def is_bookkeeper_layout(data: bytes | None) -> bool:
    if data is None:
        return False
    try:
        parse_layout(data)
    except MetadataError:
        return False
    return True


def split_digits(digits: str, widths) -> list[str]:
    """``digits`` cut into runs of ``widths`` (a hierarchical layout's znode levels)."""
    out, i = [], 0
    for w in widths:
        out.append(digits[i:i + w])
        i += w
    return out


def ledger_levels(ledger_layout: str, ledger_id: int) -> list[str]:
    """The znode names from the root to a ledger's node (the last is ``L....``)."""
    if not 0 <= ledger_id < 1 << 63:
        raise MetadataError(f"BookKeeper ledger ids are below 2^63, not {ledger_id}")
    if ledger_layout == "hierarchical" and ledger_id < SHORT_ID_LIMIT:
        levels = split_digits(f"{ledger_id:010d}", (2, 4, 4))
    elif ledger_layout in FACTORIES:
        levels = split_digits(f"{ledger_id:019d}", (3, 4, 4, 4, 4))
    else:
        raise MetadataError(f"no BookKeeper ledger path in layout {ledger_layout!r}")
    return levels[:-1] + ["L" + levels[-1]]
