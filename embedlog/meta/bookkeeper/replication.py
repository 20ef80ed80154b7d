"""BookKeeper's own autorecovery records on a BookKeeper root, read so that embedlog's
views (`embedlog autorecovery status`, the admin API, the under-replication metric) show
what BookKeeper's auditor does, where embedlog's own marks live apart (tree.py)::

    ROOT/underreplication/auditorelection/V_<seq>    ephemeral-sequential votes; the lowest
                                                    is the auditor. Text AuditorVoteFormat:
                                                    bookieId: "<bookie id>"
    ROOT/underreplication/ledgers/<h>/<h>/<h>/<h>/urL%010d
                                                    a ledger marked under-replicated, under
                                                    its id's four 16-bit groups in %04x.
                                                    Text UnderreplicatedLedgerFormat:
                                                    replica: "<missing bookie>" ... ctime: N

embedlog only reads them: BookKeeper's auditor and replication workers own them.
"""
from __future__ import annotations

import re

from embedlog.errors import MetadataError
from embedlog.meta.bookkeeper import textformat

ELECTION = ("underreplication", "auditorelection")
LEDGERS = ("underreplication", "ledgers")
_LEAF = re.compile(r"urL(\d{1,19})")
_GROUP = re.compile(r"[0-9a-f]{4}")
_VOTE = re.compile(r"V_(\d+)")


def auditor_of(votes: list[str]) -> str | None:
    """The elected vote's znode name (the lowest sequence), None when nobody stands."""
    seqs = [(int(m.group(1)), name) for name in votes if (m := _VOTE.fullmatch(name))]
    return min(seqs)[1] if seqs else None


def vote_bookie(data: bytes) -> str:
    for name, value in textformat.parse(data):
        if name == "bookieId" and isinstance(value, bytes):
            return value.decode("utf-8", "replace")
    raise MetadataError(f"BookKeeper auditor vote without a bookieId: {data[:60]!r}")


def is_group(name: str) -> bool:
    return bool(_GROUP.fullmatch(name))


def leaf_ledger(name: str) -> int | None:
    m = _LEAF.fullmatch(name)
    return int(m.group(1)) if m else None


def missing_replicas(data: bytes) -> list[str]:
    return [v.decode("utf-8", "replace") for name, v in textformat.parse(data)
            if name == "replica" and isinstance(v, bytes)]
