"""Scrubbing entry logs: find records whose bytes changed since their log was sealed.

A sealed entry log carries a crc32c per 64 KiB block (entrylog.pyx, block_crcs), taken at
the seal. An entry's own digest catches damage too, but a DUMMY-digest ledger has none
(that is what DUMMY means: its entries are served as stored), and a MAC ledger's can only
be checked with its password; the block checksums find damage in every ledger. The
shell's localconsistencycheck reports what this finds (BookKeeper's scrubber does the
same job for its entry logs).
"""
from __future__ import annotations

import numpy as np

from embedlog._native import entrylog as nel
from embedlog._native.format import LedgerId
from embedlog.errors import CorruptedDataError


def damaged_records(logs) -> list:
    """For ``logs`` [(log id, path)], every damaged block of a sealed log with the entries it
    holds: [{"file", "offset", "end", "entries": [(qualified name, entry id), ...]}]. A log
    without checksums (not sealed yet, or older) is skipped; a log whose checksum table
    itself is damaged is reported with no entries."""
    out = []
    for log_id, path in sorted(logs):
        try:
            m = nel.MappedLog.open_existing(path, log_id)
        except CorruptedDataError as exc:
            out.append({"file": path, "offset": 0, "end": 0, "entries": [], "error": str(exc)})
            continue
        try:
            try:
                bad = m.damaged_blocks()
            except CorruptedDataError as exc:
                out.append({"file": path, "offset": 0, "end": 0, "entries": [], "error": str(exc)})
                continue
            if not bad:
                continue
            locs, sizes, scopes, lids, eids = m.entry_table()
            starts = (locs & 0xFFFFFFFF).astype(np.int64) - 4      # the record's size word
            ends = starts + 4 + sizes.astype(np.int64)
            for lo, hi in bad:
                hit = np.nonzero((starts < hi) & (ends > lo))[0]
                out.append({"file": path, "offset": lo, "end": hi, "entries": [
                    (LedgerId(int(scopes[i]), int(lids[i])).qualified_name, int(eids[i])) for i in hit]})
        finally:
            m.close()
    return out
