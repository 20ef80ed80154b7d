"""Which bookies hold which entry: BookKeeper's DistributionSchedule, written once.

A ledger's metadata lists fragments: (first entry, ensemble of E bookies), in entry
order. Entry e belongs to the last fragment whose first entry is <= e; its **write set**
is the Qw bookies of that ensemble from index e % E (seed 004's striping), so an ensemble
has E distinct write quorums. Recovery's fencing is done when (Qw - Qa) + 1 members of
every write quorum answered (quorum coverage). A ranged READ returns at most
MAX_READ_ENTRIES entries (the bookie's limit, embedlog.net.protocol).
"""
from __future__ import annotations

import bisect

from embedlog.net.protocol import MAX_READ_ENTRIES  # noqa: F401  (the read window, re-exported)


def stripe(ensemble, write_quorum: int, entry_id: int) -> list:
    """The write set of ``entry_id`` in ``ensemble``: Qw bookies from index e % E."""
    e = len(ensemble)
    return [ensemble[(entry_id + k) % e] for k in range(write_quorum)]


def slots(ensemble_size: int, write_quorum: int, entry_id: int) -> list:
    """The ensemble positions of ``entry_id``'s write set (autorecovery copies by position)."""
    return [(entry_id + k) % ensemble_size for k in range(write_quorum)]


def fragment_index(md, entry_id: int) -> int:
    """Index in ``md.fragments`` of the fragment that holds ``entry_id``."""
    firsts = [f for f, _ in md.fragments]
    return max(0, bisect.bisect_right(firsts, entry_id) - 1)


def fragment_last(md, k: int) -> int | None:
    """The last entry of fragment ``k`` (None for the last fragment: it has no end yet)."""
    return md.fragments[k + 1][0] - 1 if k + 1 < len(md.fragments) else None


def write_set(md, entry_id: int) -> list:
    """The bookies that should hold ``entry_id``, by the fragments of ``md``."""
    return stripe(md.fragments[fragment_index(md, entry_id)][1], md.write_quorum, entry_id)


def write_quorums(md, ensemble) -> list:
    """The E distinct write quorums of an ensemble."""
    return [stripe(ensemble, md.write_quorum, start) for start in range(md.ensemble_size)]


def quorum_covered(md, ensemble, answered) -> bool:
    """Every write quorum of ``ensemble`` has (Qw - Qa) + 1 members in ``answered``."""
    need = md.write_quorum - md.ack_quorum + 1
    return all(sum(1 for b in wq if b in answered) >= need for wq in write_quorums(md, ensemble))
