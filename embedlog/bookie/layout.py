"""Which storage layout a bookie's directories hold: ``current/LAYOUT`` in every ledger
directory, one line, ``2`` (docs/FORMATS.md, "Layout 2").

Layout 1 (no LAYOUT file: every directory made before layout 2) copies each entry from
the journal into entry logs at a memtable flush. Layout 2 keeps the journal's files as the
storage of the entries they hold. A directory keeps the layout it was made with; only a
new one (no journal file, no mark, no entry log, no index) takes ``storage_layout``.
"""
from __future__ import annotations

import logging
import os

from embedlog.bookie.journal_files import SEG, journal_ids, read_segment
from embedlog.errors import CorruptedDataError
from embedlog.fileio import atomic_write

NAME = "LAYOUT"
log = logging.getLogger("embedlog.bookie")


def _read(current: str) -> int | None:
    try:
        with open(os.path.join(current, NAME), "rb") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    if text not in (b"1", b"2"):
        raise CorruptedDataError(f"{os.path.join(current, NAME)}: unknown layout {text!r}")
    return int(text)


def _fresh(currents: list[str], journal_dir: str) -> bool:
    if os.path.isdir(journal_dir) and any(journal_ids(journal_dir, s) for s in (".txn", SEG, ".free")):
        return False
    for current in currents:
        if not os.path.isdir(current):
            continue
        for name in os.listdir(current):
            if name.startswith("lastMark") or name.endswith(".log") or name.startswith("ledgers"):
                return False
    return True


def _journal_says_2(journal_dir: str) -> bool:
    """Whether the journal's files are layout 2's: a ``.seg`` file, or a journal whose
    header carries a segment number (layout 1 never writes one)."""
    if not os.path.isdir(journal_dir):
        return False
    if journal_ids(journal_dir, SEG):
        return True
    return any(read_segment(os.path.join(journal_dir, "%x.txn" % i))
               for i in journal_ids(journal_dir))


def open_layout(currents: list[str], journal_dir: str, wanted: int) -> int:
    """The layout of these directories: the one their LAYOUT files name (written into a
    ledger directory added since), or for new directories ``wanted`` (recorded before
    anything else is written, so a crash leaves a new directory or a marked one). A
    directory that lost its LAYOUT files but whose journal is layout 2's opens as layout 2
    (and LAYOUT is written again): opened as layout 1, its journal would be trimmed and
    reused, and the entries stored only there lost."""
    found = {c: _read(c) for c in currents}
    named = {v for v in found.values() if v is not None}
    if len(named) > 1:
        raise CorruptedDataError(f"ledger directories name different layouts: {found}")
    if named:
        layout = named.pop()
    elif _fresh(currents, journal_dir):
        layout = wanted
    elif _journal_says_2(journal_dir):
        log.error("%s is missing, but the journal %s holds layout 2's segments: opened as "
                  "layout 2, and %s written again", os.path.join(currents[0], NAME),
                  journal_dir, NAME)
        layout = 2
    else:
        layout = 1
    if layout == 2:
        for c, v in found.items():
            if v is None:
                atomic_write(os.path.join(c, NAME), b"2\n")
    return layout


def read_layout(currents: list[str]) -> int:
    """The layout the directories' LAYOUT files name (1 without one), writing nothing."""
    named = {v for v in map(_read, currents) if v is not None}
    return named.pop() if len(named) == 1 else 1


def use_segments(storage, journal_dir: str) -> None:
    """Layout 2: the storage reads the journal's files (``.txn`` and ``.seg``) as segments,
    every one registered from its header's number."""
    storage.segments = True
    for suffix in (".txn", SEG):
        for i in journal_ids(journal_dir, suffix):
            stem = os.path.join(journal_dir, "%x" % i)
            segment = read_segment(stem + suffix)
            if segment:
                storage.entry_logger.add_segment(segment, stem)
