"""The high-water mark of BookKeeper's ledger id generator: every id it has handed out is
below it.

HierarchicalLedgerManagerFactory and LongHierarchicalLedgerManagerFactory both take ids
from LongZkLedgerIdGenerator (embedlog's ZkMetadataStore.generate_ledger_id does the same)::

    idgen/ID-<seq>                  an ephemeral-sequential znode, made and deleted at once:
                                    the id is <seq>, while it is below 2^31 - 1
    idgen-long/HOB-%010d/ID-<seq>   once that counter overflows: (HOB << 32) | <seq>, the
                                    highest HOB directory in use (older ones are deleted)

A sequential znode's <seq> is its parent's count of child creations, which ZooKeeper
keeps in 32 bits and shows through the parent's Stat as ``cversion = 2 * creations -
numChildren`` (DataNode.copyStat: creations and deletions both count). So the next
<seq> under a parent is ``(cversion + numChildren) / 2`` (mod 2^31), read without
writing anything, and it only grows: a lower one means a ZooKeeper restored from an older
backup, or a root formatted again.
"""

from __future__ import annotations

SHORT_ID_LIMIT = (1 << 31) - 1      # ZkLedgerIdGenerator refuses <seq> from here on


def next_sequence(cversion: int, num_children: int) -> int:
    """The <seq> the next sequential child of a parent with this Stat gets (creations so
    far; ZooKeeper's 32-bit arithmetic undone)."""
    return ((cversion + num_children) % (1 << 32)) // 2


def high_water_mark(short: tuple[int, int] | None, long_mode: bool,
                    top_hob: tuple[int, int, int] | None) -> int:
    """The lowest id the generator has not handed out yet (a bound: ids are skipped too).

    ``short``: (cversion, numChildren) of ``idgen`` (None: never used); ``long_mode``:
    ``idgen-long`` exists; ``top_hob``: (HOB, cversion, numChildren) of its highest
    ``HOB-`` directory (None: none yet)."""
    mark = 0
    if short is not None:
        mark = min(next_sequence(*short), SHORT_ID_LIMIT)
    if long_mode:
        mark = SHORT_ID_LIMIT                 # the 31-bit ids are used up
        if top_hob is not None:
            hob, cversion, children = top_hob
            mark = max(mark, (hob << 32) + min(next_sequence(cversion, children), SHORT_ID_LIMIT))
    return mark
