"""The files of a bookie on disk, by kind: what `embedlog shell listfilesondisc` and the
admin API's /api/v1/bookie/list_disk_file show (BookKeeper's listfilesondisc).

Reads directory listings only, so it works on a stopped bookie and beside a running one.
"""
from __future__ import annotations

import os

KINDS = ("journal", "entrylog", "compaction", "index")
_COMPACTION_SUFFIXES = (".log.compacting", ".compaction")


def list_files(ledger_currents: list, journal_dir: str, kinds=KINDS) -> list:
    """[{"kind", "path", "bytes", "allocated_bytes"}] of the journal files (``<hex>.txn``, and
    layout 2's segments ``<hex>.seg``: journals kept as the storage of their entries),
    entry logs (``<hex>.log``), compaction files and index files (``*.idx``), sorted by
    kind and path; files that vanish while listed are left out."""
    out = []

    def add(kind, path):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        out.append({"kind": kind, "path": path, "bytes": st.st_size,
                    "allocated_bytes": st.st_blocks * 512})

    if "journal" in kinds:
        for name in sorted((n for n in _names(journal_dir) if n.endswith((".txn", ".seg"))),
                           key=_hex_order):
            add("journal", os.path.join(journal_dir, name))
    for current in ledger_currents:
        for name in _names(current):
            if name.endswith(".log") and "entrylog" in kinds:
                add("entrylog", os.path.join(current, name))
            elif name.endswith(_COMPACTION_SUFFIXES) and "compaction" in kinds:
                add("compaction", os.path.join(current, name))
        if "index" in kinds:
            for root in ("ledgers", "ledgers-scoped"):
                for dirpath, _dirs, files in sorted(os.walk(os.path.join(current, root))):
                    for name in sorted(files):
                        if name.endswith(".idx"):
                            add("index", os.path.join(dirpath, name))
    return out


def _hex_order(name: str):
    try:
        return (0, int(name.split(".")[0], 16), name)
    except ValueError:
        return (1, 0, name)


def _names(directory: str) -> list:
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
