"""Scrubbing entry logs: find records whose bytes changed since their log was sealed.

A sealed entry log carries a crc32c per 64 KiB block (entrylog.pyx, block_crcs), taken at
the seal. An entry's own digest catches damage too, but a DUMMY-digest ledger has none
(that is what DUMMY means: its entries are served as stored), and a MAC ledger's can only
be checked with its password; the block checksums find damage in every ledger. The
shell's localconsistencycheck reports what this finds (BookKeeper's scrubber does the
same job for its entry logs).
"""
from __future__ import annotations

import hashlib
import mmap
import os

import numpy as np

from embedlog._native import entrylog as nel
from embedlog._native import journal_format as jformat
from embedlog._native import journal_scan as jscan
from embedlog._native import index as nix
from embedlog.bookie import journal_files
from embedlog._native.format import DIGEST_SIZES, LedgerId, crc32, crc32c, parse_entry_header
from embedlog.errors import CorruptedDataError, JournalCorruptedError


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


def unindexed_entries(logs, find_index, keep=lambda key, missing: True, segments=(),
                      cuts=None) -> dict:
    """Entries the entry logs hold that a ledger's index file should hold and cannot: the
    file is missing, or cut: shorter than the length its header records (a file from
    before that record: cut to its header, or inside a page, as it held whole pages). ``logs``: [(log id, path)]; ``find_index(key)``: the ledger's index file, or
    None; ``keep(key, missing)``: whether to look at a suspect (a missing file may be a
    deleted ledger's). Every log names its ledgers (its map; a log without one, such as
    the unsealed last one, is scanned). Returns {key: {"file", "problem", "eids", "locs",
    "ambiguous"}}: the entries past the pages the file holds (ledger_entries: an id whose
    copies differ is left out, in "ambiguous").
    ``segments``: [(log id, path, {key: bytes})] of layout 2's segments and their maps;
    ``cuts``: a function giving journal_cuts of every journal file, called once, and only
    when a ledger's entries are looked for (a walk of every journal record: a start with
    nothing to rebuild must not pay it); None: journal_cuts of ``segments``."""
    named: dict = {}
    for log_id, path, held in segments:
        for key in held:
            named.setdefault(key, []).append((log_id, path))
    for log_id, path in sorted(logs):
        try:
            m = nel.MappedLog.open_existing(path, log_id)
        except (CorruptedDataError, OSError):
            continue                   # damaged_records reports it
        try:
            try:
                held = m.ledgers_map()
            except CorruptedDataError:
                held = None
            for key in (held if held is not None else m.scanned_ledgers()):
                named.setdefault(key, []).append((log_id, path))
        finally:
            m.close()
    out = {}
    found_cuts = None
    for key, where in named.items():
        path = find_index(key)
        if path is None:
            first_page, problem = 0, "its index file is missing"
        else:
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                continue
            if size < nix.HEADER_SIZE:
                continue           # a header cut short is the loader's (rebuilt there)
            first_page, rest = divmod(size - nix.HEADER_SIZE, nix.PAGE_SIZE)
            recorded = nix.recorded_length(path)
            if recorded is not None:
                if size >= recorded:
                    continue       # the pages reach as far as the header says
            elif first_page and not rest:
                continue           # a file from before the length bit holds whole pages
            problem = f"its index file is cut at {size} bytes"
        if not keep(key, path is None):
            continue
        ambiguous: list = []
        if found_cuts is None:
            found_cuts = cuts() if cuts is not None else \
                journal_cuts([(log_id, path) for log_id, path, _held in segments])
        eids, locs = ledger_entries(where, key, first_page * nix.ENTRIES_PER_PAGE, ambiguous,
                                    found_cuts.get(key, []))
        if len(eids) or ambiguous:
            out[key] = {"file": path, "problem": problem, "eids": eids, "locs": locs,
                        "ambiguous": ambiguous}
    return out


SEGMENT_LOG_BIT = 0x80000000        # a log id naming a journal segment (layout 2)


def segment_ledgers(log_id: int, path: str) -> dict | None:
    """{(scope, ledger): bytes} of a journal segment counted from its records, up to the
    first that fails its crc (one whose map is missing or damaged); None if it cannot be
    read (a header that does not parse: its entries are refused on read)."""
    try:
        m = nel.MappedLog.open_segment(path, log_id)
    except (CorruptedDataError, OSError):
        return None
    try:
        return m.scanned_ledgers()
    except CorruptedDataError:
        return None
    finally:
        m.close()


def segments_held(journals) -> list:
    """[(log id, path, {(scope, ledger): bytes} or None, read)] of the ``.seg`` files among
    ``journals`` ([(log id, path)], layout 2): each one's ledgers from its map, or, where the
    map is missing or damaged, counted from its records (``read`` True; None if it cannot be
    read either). A ``.txn`` below the mark is left out: it has no map until a trim renames
    it, and its ledgers' index files were synced before then."""
    out = []
    for log_id, path in journals:
        if path.endswith(".seg"):
            held = journal_files.read_segment_map(path[:-4])
            read = held is None
            if read:
                held = segment_ledgers(log_id, path)
            out.append((log_id, path, held, read))
    return out


def ledger_entries(logs, key, first: int = 0, ambiguous: list | None = None, cuts=None):
    """(entry ids, locations) of ledger ``key``'s entries with ids from ``first`` on in the
    entry logs ``logs`` ([(log id, path)]; a log id with bit 31 set is a journal segment,
    layout 2's storage), one per id, ascending. An id found twice as the same entry (a
    compaction's copy, a replay's, a recovery's add of it with another LAC: _content) takes
    the last log's location; one found as different entries (a stream's dirty entry
    truncated and written again, an id the metadata gave out again) is left out, and added
    to ``ambiguous``: file order does not tell which copy is
    the newer (a compaction target gets a higher id than logs written after it), and a
    wrong guess serves the other bytes under a good digest. Unreadable logs are skipped
    (damaged_records reports them)."""
    eids_all, locs_all, srcs_all = [np.empty(0, np.int64)], [np.empty(0, np.uint64)], [np.empty(0, np.int64)]
    for i, (log_id, path) in enumerate(logs):
        try:
            m = _open_log(log_id, path)
        except (CorruptedDataError, OSError):
            continue
        try:
            locs, _sizes, scopes, lids, eids = m.entry_table()
        finally:
            m.close()
        mask = (scopes == key[0]) & (lids == key[1]) & (eids >= first)
        eids_all.append(eids[mask])
        locs_all.append(locs[mask])
        srcs_all.append(np.full(int(mask.sum()), i, np.int64))
    eids, locs, srcs = np.concatenate(eids_all), np.concatenate(locs_all), np.concatenate(srcs_all)
    order = np.argsort(eids, kind="stable")          # later logs come later
    eids, locs, srcs = eids[order], locs[order], srcs[order]
    if cuts is None:
        cuts = journal_cuts(logs).get(tuple(key), [])
    if cuts and len(eids):
        eids, locs, srcs, unsure = _after_cuts(logs, eids, locs, srcs, cuts)
        if ambiguous is not None:
            ambiguous.extend(unsure)
    last = np.append(eids[1:] != eids[:-1], True) if len(eids) else np.zeros(0, bool)
    keep = last.copy()
    twice = np.unique(eids[~last])
    if len(twice):
        for e, loc in sorted(_settle(logs, eids, locs, srcs, twice).items()):
            lo, hi = np.searchsorted(eids, e, "left"), np.searchsorted(eids, e, "right")
            if loc is None:                      # the copies differ: no location at all
                keep[lo:hi] = False
                if ambiguous is not None:
                    ambiguous.append(e)
            else:
                locs[hi - 1] = loc
    return eids[keep], locs[keep]


def journal_cuts(logs) -> dict:
    """{(scope, ledger): [(log id, offset, type, point)]} of the TRUNCATE (entries above the
    point forgotten: a stream's dirty entries) and TRIM (entries below it forgotten) records
    in the journal files among ``logs``, in journal order (a segment's log id grows with
    its number): what a rebuild from the logs must apply, or it serves entries a stream
    forgot. One walk of every journal file; a start computes it once for all its rebuilds."""
    out: dict = {}
    for log_id, path in sorted(logs):
        if not log_id & SEGMENT_LOG_BIT:
            continue
        try:
            with open(path, "rb") as f:
                size = journal_files.data_end(f.fileno(), os.fstat(f.fileno()).st_size)
                if size <= jformat.HEADER_SIZE:
                    continue
                mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            continue
        try:
            recycled_from, salt = jformat.file_salt(mm[:jformat.HEADER_SIZE])
            records = jscan.scan(mm, jformat.HEADER_SIZE, salt=salt, recycled=recycled_from != 0)[0]
            for i in range(len(records)):
                off, rtype, start, n = records[i]
                if rtype in (jformat.TRUNCATE, jformat.TRIM):
                    try:
                        scope, lid, point = jformat.decode_record(rtype, mm[start:start + n])
                    except JournalCorruptedError:       # a body of another size: not a cut
                        continue
                    out.setdefault((scope, lid), []).append((log_id, off, rtype, point))
        finally:
            mm.close()
    return out


def _after_cuts(logs, eids, locs, srcs, cuts):
    """Drop the copies the cuts forgot: a segment's copy of an id a later cut forgot, and
    any copy of an id a TRIM forgot (ids below a trim never come back). An entry log's copy
    of an id a TRUNCATE forgot has no place in journal order (a compaction made it, before
    or after the cut): dropped, and the id is unsure unless a segment's copy after the cuts
    stands for it. Returns (eids, locs, srcs, unsure ids)."""
    ids = np.array([log_id for log_id, _p in logs], np.int64)[srcs]
    seg = (ids & SEGMENT_LOG_BIT) != 0
    off = (locs & 0xFFFFFFFF).astype(np.int64)
    gone = np.zeros(len(eids), bool)
    undated = np.zeros(len(eids), bool)
    for cut_log, at, rtype, point in cuts:
        hit = eids > point if rtype == jformat.TRUNCATE else eids < point
        before = (ids < cut_log) | ((ids == cut_log) & (off < at))
        gone |= hit & seg & before
        if rtype == jformat.TRIM:
            gone |= hit & ~seg
            continue
        undated |= hit & ~seg
        # the truncating add's own entry comes right before its TRUNCATE: the last copy of
        # the point before the cut is it, earlier ones are what it replaced
        mine = np.flatnonzero((eids == point) & seg & before & ~gone)
        if len(mine) > 1:
            latest = max(mine.tolist(), key=lambda i: (int(ids[i]), int(off[i])))
            gone[mine[mine != latest]] = True
    keep = ~gone & ~undated
    unsure = sorted(set(eids[undated & ~gone].tolist()) - set(eids[keep & seg].tolist()))
    return eids[keep], locs[keep], srcs[keep], unsure


def _open_log(log_id: int, path: str):
    return (nel.MappedLog.open_segment(path, log_id) if log_id & SEGMENT_LOG_BIT else
            nel.MappedLog.open_existing(path, log_id))


def _content(entry: bytes) -> bytes:
    """What two copies must share to be one entry (a hash of it): the ids, the ledger length
    and the payload, not the LAC the entry carries nor the digest over it (a recovery adds
    an entry again with its own LAC: a BookKeeper client's does). A V1 entry does not say
    its digest type: CRC32C and CRC32 are told by checking them; any other is taken as
    DUMMY (a MAC ledger's copies that carry other LACs then differ: left out, kept)."""
    if parse_entry_header(entry)[0] == 2:
        ds = DIGEST_SIZES.get(entry[0] & 0x0F, 0)
        body = (entry[:25], entry[33:41], entry[41 + ds:])
    else:
        head = entry[:32]
        if len(entry) >= 36 and int.from_bytes(entry[32:36], "big") == crc32c(head + entry[36:]):
            ds = 4
        elif len(entry) >= 40 and int.from_bytes(entry[32:40], "big") == crc32(head + entry[40:]):
            ds = 8
        else:
            ds = 0
        body = (entry[:16], entry[24:32], entry[32 + ds:])
    h = hashlib.blake2b(digest_size=16)
    for part in body:
        h.update(part)
    return h.digest()


def _settle(logs, eids, locs, srcs, twice) -> dict:
    """For each id of ``twice``: the location of its last readable copy when every readable
    copy holds the same entry (_content), None when they differ; an id no copy of which
    reads keeps its last location (reads of it fail as the copy does)."""
    want = np.isin(eids, twice)
    copies: dict = {}
    for src in np.unique(srcs[want]).tolist():
        log_id, path = logs[src]
        sel = want & (srcs == src)
        try:
            m = _open_log(log_id, path)
        except (CorruptedDataError, OSError):
            continue
        try:
            for e, loc in zip(eids[sel].tolist(), locs[sel].tolist()):
                try:
                    copies.setdefault(e, []).append((src, loc, _content(m.read_at(loc))))
                except CorruptedDataError:
                    pass
        finally:
            m.close()
    out = {}
    for e, got in copies.items():
        got.sort(key=lambda c: c[0])             # log order: the last readable copy last
        out[e] = got[-1][1] if len({c[2] for c in got}) == 1 else None
    return out
