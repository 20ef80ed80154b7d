"""Replay: the journal from the LastLogMark, re-applied to a starting bookie.

First every file replay needs is checked to be there (``check_chain``); then each record
is applied by the handler its type names (``HANDLERS``: the table of what each record did
before the crash); a record of an unknown type with a good checksum is skipped, so newer
record types can be added. A torn tail is cut (a copy is kept under ``journal/torn/``);
corruption in the middle stops start-up with the file and offset, unless
journal_skip_corrupt_records steps over it (docs/FORMATS.md, "Journal").
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import time

from embedlog._native import (journal_format as jformat, journal_scan as jscan,
                              journal_kernels as jkernels)
from embedlog._native.format import MAX_ENTRY_ID, LedgerId
from embedlog import fileio
from embedlog.bookie import journal_files
from embedlog.bookie.journal_files import journal_ids
from embedlog.errors import EmbedlogError, JournalCorruptedError
from embedlog.fileio import atomic_write, private_dir

log = logging.getLogger("embedlog.bookie")


# -- what each record type did, done again (called with the replaying bookie) ---------------

def _entry(bookie, fields, body) -> None:
    storage = bookie.storage
    if not storage.active.add_encoded(body):
        with bookie.cv:
            storage.make_room(bookie.journal.appended_seq)
        storage.active.add_encoded(body)
    _v, scope, lid, eid = fields[:4]
    bookie.descriptors.known((scope, lid))
    bookie.descriptors.seen((scope, lid), eid)


def _ledger_key(bookie, fields, _body) -> None:
    bookie.descriptors.set_master_key((fields[0], fields[1]), fields[2])


def _fence(bookie, fields, _body) -> None:
    bookie.descriptors.fence((fields[0], fields[1]))


def _explicit_lac(bookie, fields, _body) -> None:
    bookie.descriptors.raise_explicit_lac((fields[0], fields[1]), fields[2])


def _term(bookie, fields, _body) -> None:
    bookie.descriptors.raise_term((fields[0], fields[1]), fields[2])


def _truncate(bookie, fields, _body) -> None:
    bookie.descriptors.truncate((fields[0], fields[1]), fields[2])


def _delete(bookie, fields, _body) -> None:
    bookie.descriptors.delete((fields[0], fields[1]))


def _trim(bookie, fields, _body) -> None:
    bookie.storage.erase((fields[0], fields[1]), 0, fields[2] - 1)


def _incarnation(bookie, fields, _body) -> None:
    bookie.descriptors.set_incarnation((fields[0], fields[1]), fields[2])


HANDLERS = {jformat.ENTRY: _entry, jformat.ENTRY_CRC32C: _entry, jformat.LEDGER_KEY: _ledger_key, jformat.FENCE: _fence,
            jformat.EXPLICIT_LAC: _explicit_lac, jformat.TERM: _term, jformat.TRUNCATE: _truncate,
            jformat.DELETE_LEDGER: _delete, jformat.TRIM: _trim, jformat.INCARNATION: _incarnation}


def apply_record(bookie, rtype: int, body: bytes) -> None:
    """Re-apply one record: what the add, fence, ... did before the crash. A body that does
    not fit its type is JournalCorruptedError, even with a good checksum."""
    fields = jformat.decode_record(rtype, body)
    handler = HANDLERS.get(rtype)
    if fields is not None and handler is not None:
        handler(bookie, fields, body)


def replay_bookie(bookie, live: bool = False) -> dict:
    """Replay ``bookie``'s journal from its LastLogMark (read by the caller, see
    ``LastLogMark.read``); the report of what was done. ``live``: another process is
    writing the journal (a read-only view): see ``replay``."""
    mark = bookie.mark.persisted

    def apply(rtype, body, path, off):
        try:
            apply_record(bookie, rtype, body)
        except EmbedlogError as exc:
            raise JournalCorruptedError(f"journal {path} offset {off}: {exc}") from exc

    def apply_entries(mm, records, i, path):
        """A run of entry records, put into the memtable in one native loop (the common
        case: most of a journal is entries)."""
        storage, seen, refused = bookie.storage, {}, []
        # layout 2: each entry's location is its record in this file, set again as often
        # as the file is replayed (the same segment and offset each time)
        segment = jformat.file_segment(mm[:jformat.HEADER_SIZE]) if storage.segments else 0
        base = (1 << 63) | (segment << 32) if segment else 0
        while True:
            try:
                j = jkernels.replay_entries(mm, records, i, storage.active, seen, refused, base)
            except JournalCorruptedError as exc:
                raise JournalCorruptedError(f"journal {path} {exc}") from exc
            for off, scope, lid, eid in refused:
                # journalled before bookies bounded entry ids; no index can hold it
                log.error("journal %s offset %d: entry %d of ledger %r is outside 0..%d and "
                          "was not replayed", path, off, eid, LedgerId(scope, lid), MAX_ENTRY_ID)
            refused.clear()
            for key, eid in seen.items():     # known before any flush sets their locations
                bookie.descriptors.known(key)
                bookie.descriptors.seen(key, eid)
            seen.clear()
            if j >= len(records) or records[j][1] not in jformat.ENTRY_TYPES:
                return j
            if j == i and storage.active.is_empty():
                raise MemoryError(f"no memory for the memtable replaying {path}")
            with bookie.cv:
                storage.make_room(bookie.journal.appended_seq)
            i = j

    cfg = bookie.config
    report = replay(bookie.journal_dir, mark, apply, apply_entries=apply_entries,
                    skip_corrupt=cfg.journal_skip_corrupt_records,
                    max_record_size=cfg.max_entry_size_bytes + 4096, head=bookie.mark.read_head(),
                    allow_missing=cfg.journal_allow_missing_files, live=live)
    report["mark"] = mark
    report["damaged_marks"] = list(bookie.mark.damaged)
    return report


# -- the files ---------------------------------------------------------------------------------

def prefetch(directory: str, mark: tuple[int, int]) -> threading.Event:
    """Read the journal from ``mark`` on into the page cache in a thread while the bookie
    loads its indexes and entry logs; set the returned event to stop it. The journal's
    pages were dropped from the cache after each sync, and the kernel's readahead of a
    mapping (even with MADV_WILLNEED) fetches a few MiB at a time, so the scan would
    wait for the disk."""
    stop = threading.Event()

    def run():
        buf = bytearray(1 << 20)
        try:
            for file_id in journal_ids(directory):
                if file_id < mark[0]:
                    continue
                with open(os.path.join(directory, "%x.txn" % file_id), "rb", buffering=0) as f:
                    off = mark[1] & ~(mmap.PAGESIZE - 1) if file_id == mark[0] else 0
                    while not stop.is_set():
                        n = os.preadv(f.fileno(), [buf], off)
                        if n <= 0:
                            break
                        off += n
        except OSError:
            pass                # a speed-up only: replay reads (and reports) what it needs

    threading.Thread(target=run, name="embedlog-journal-prefetch", daemon=True).start()
    return stop


def check_chain(directory: str, mark_id: int, head: int | None) -> list:
    """Journal files replay needs that are missing, before anything is applied: the file
    the mark points into, a file between two that the later one's header names as its
    predecessor, and the newest file ``journalHead`` recorded. Returns descriptions."""
    ids = [i for i in journal_ids(directory) if i >= mark_id]
    missing = []
    if mark_id and mark_id not in ids:
        missing.append(f"{mark_id:x}.txn (the LastLogMark points into it)")
    prev_ids = {}
    for i in ids:
        path = os.path.join(directory, "%x.txn" % i)
        with open(path, "rb") as f:
            header = f.read(jformat.HEADER_SIZE)
        if len(header) == jformat.HEADER_SIZE:
            try:
                jformat.check_file_header(header)
            except ValueError:
                continue                   # replay reports a bad header with its offset
            prev_ids[i] = jformat.file_chain(header)
    for before, after in zip(ids, ids[1:]):
        prev = prev_ids.get(after)
        if prev is not None and prev != before:
            missing.append(f"{prev:x}.txn (written between {before:x}.txn and {after:x}.txn)"
                           if prev > before else
                           f"the chain: {after:x}.txn follows {prev:x}.txn, not {before:x}.txn")
    if head is not None and head >= mark_id and head not in ids and (not ids or head > ids[-1]):
        missing.append(f"{head:x}.txn (the newest journal, recorded in journalHead)")
    return missing


RECORD_HEAD = 9                  # len:u32 crc:u32 type:u8
SECTOR = 512                     # the unit a torn write loses
RECYCLED_TORN_COPY = 4096        # of a torn tail in a reused journal, what is kept under torn/


def tail_damage(mm, end: int, size: int, max_record_size: int,
                hole_after: bool = False, recycled: bool = False) -> str | None:
    """What the bad record at ``end`` (the last thing in its file) is: None for a torn write
    (part of it never reached the disk: it ends in zeros, or a sector of it is all zeros, as
    preallocated space reads), else why it is damage: a record cut by the end of the file,
    or a complete record (every sector written) failing its checksum, such as a flipped bit.
    ``hole_after``: ``size`` is where the file's data stops, a hole (never written) follows.
    ``recycled``: in a reused journal, sectors a torn write missed hold its previous life's
    bytes, not zeros, so only the file's end tells damage (RocksDB's rule for recycled logs)."""
    if recycled:
        return (f"the file ends inside a record header at offset {end}"
                if end + 4 > size and not hole_after else None)
    if end + 4 > size:
        return None if hole_after else f"the file ends inside a record header at offset {end}"
    (length,) = struct.unpack_from(">I", mm, end)
    if length > max_record_size:
        return (f"the record at offset {end} claims {length} bytes, more than any record "
                f"({max_record_size}), and it is not unwritten space")
    stop = end + RECORD_HEAD + length
    if stop > size:
        if hole_after:
            return None              # its end was never written: a hole reads as zeros
        return f"the file ends at {size}, inside the record at offset {end} ({length} bytes)"
    if mm[stop - 1] == 0:
        return None                  # its last bytes never arrived (or were zeros)
    # the sector holding the record's start was written (its length is not zero); a torn
    # write loses a later one, which then reads as zeros
    sector = end - end % SECTOR + SECTOR
    while sector < stop:
        if not any(mm[max(sector, end):min(sector + SECTOR, stop)]):
            return None
        sector += SECTOR
    return (f"the record at offset {end} ({length} bytes) was written whole but fails its "
            "checksum")


def _zero_sector(mm, start: int, stop: int) -> bool:
    """Whether the bad stretch [start, stop) shows a sector that never arrived: a length of
    0 at its start (a written record's never is), or an aligned sector of zeros inside it
    (the next good record may begin in the sector's last bytes: its length's high bytes
    are zeros too)."""
    if not any(mm[start:start + 4]):
        return True
    sector = start - start % SECTOR
    while sector < stop:
        lo, hi = max(sector, start), min(sector + SECTOR, stop)
        if hi - lo >= SECTOR - RECORD_HEAD and not any(mm[lo:hi]):
            return True
        sector += SECTOR
    return False


def _last_group(records, end: int):
    """The last GROUP record among ``records`` (scan()'s) before offset ``end``, or None."""
    for i in range(len(records) - 1, -1, -1):
        if records[i][1] == jformat.GROUP and records[i][0] < end:
            return records[i]
    return None


def torn_group(mm, records, end: int, data_end: int, max_record_size: int,
               salt: int, hole_after: bool) -> str | None:
    """Whether the bad record at ``end``, which good records follow, is a power loss inside
    the newest journal's last group rather than damage: sectors of a group written into
    zeros reach the disk in any order until its fdatasync returns, and no group is written
    before the one ahead of it was synced, so only the last group can be torn. It is when
    (1) no good GROUP record (a later group) follows it, (2) every good record after it lies
    inside the group the last GROUP record before it began (or it is the next group's own
    GROUP record, in a sector that kept its bytes from before that group's write), and (3)
    each bad stretch shows a sector of zeros that never arrived; a flipped bit, a later
    group, a record past the group's end: damage (None)."""
    group = _last_group(records, end)
    if group is None:
        # replay began at the mark, inside the file: find the group from its start
        group = _last_group(jscan.scan(mm, jformat.HEADER_SIZE, max_record_size, False, salt,
                                       False)[0], end)
    if group is None:
        # the file's first group lost its GROUP record: it begins on a sector boundary
        # (HEADER_SIZE), where a torn write cannot be told from a lost sector (below)
        return None
    group_off, _t, body, n = group
    group_end = group_off + jformat.decode_record(jformat.GROUP, mm[body:body + n])[0]
    if end > group_end:
        return None
    if end == group_end:
        # the next group's own GROUP record is bad: its length is unknown, so what
        # follows must show that group was the one torn, not damage over groups
        # acknowledged before the last: the sector holding its start kept the bytes
        # it had before that write (the previous group's tail, then zeros), as a
        # sector a torn write never reached does; a sector lost whole does not
        if end % SECTOR == 0 or any(mm[end:end - end % SECTOR + SECTOR]):
            return None
        group_end = None
    after, last, status, skipped = jscan.scan(mm, end, max_record_size, True, salt, False)
    for off, rtype, body, n in after:
        if rtype == jformat.GROUP or (group_end is not None and body + n > group_end):
            return None
    for off, n in skipped:
        if not _zero_sector(mm, off, off + n):
            return None
    if status == "torn" and tail_damage(mm, last, data_end, max_record_size, hole_after) is not None:
        return None
    torn_from = end if group_end is None else group_off
    return (f"a power loss tore the last group (from offset {torn_from}): sectors of it "
            "never reached the disk while later ones did")


def _damaged_tail(path: str, end: int, why: str, skip_corrupt: bool, report: dict) -> None:
    if not skip_corrupt:
        raise JournalCorruptedError(
            f"journal {path} is damaged at offset {end}: {why}. Acknowledged entries may have "
            "been there: restore the file, or set journal_skip_corrupt_records=True to accept "
            "the loss (it is reported in replay_report['damaged_tails']).")
    log.error("journal %s: damaged at offset %d (%s); accepting the loss "
              "(journal_skip_corrupt_records)", path, end, why)
    report["damaged_tails"].append((path, end, why))


def replay(directory: str, mark: tuple[int, int], apply, *, skip_corrupt: bool,
           max_record_size: int, head: int | None = None, allow_missing: bool = False,
           apply_entries=None, live: bool = False) -> dict:
    """Apply every journal record from ``mark`` on, in numeric file order.

    A journal file replay needs that is missing (check_chain) stops start-up with the file
    named, unless ``allow_missing`` (an operator accepts the loss: it is reported). A torn
    tail is cut off after a copy is kept under ``torn/``; corruption in the middle raises
    JournalCorruptedError naming file and offset, unless ``skip_corrupt``, which steps
    over it and reports what it skipped. ``apply_entries(mm, records, i, path)``, if
    given, applies the run of entry records from records[i] and returns the index after it.

    A bad last record is a torn tail only in the newest journal, and only if part of it
    never reached the disk (``tail_damage``); one cut by the end of the file or complete but
    failing its checksum is damage, and so is any in a journal a later one follows (that
    one was begun after this file's last sync). So is a newest file shorter than the size its header says its preallocated
    zeros gave it (jformat.file_min_size): it was cut.
    Damage raises JournalCorruptedError naming file and offset unless ``skip_corrupt``
    (the operator accepts the loss: it is logged and reported in ``damaged_tails``).
    ``live``: a writer is appending to the journal (a read-only view replays it): its tail
    is where the writer is, so a bad last record is neither damage nor cut, and nothing is
    written.
    """
    t0 = time.perf_counter()
    report = {"files": 0, "records": 0, "bytes": 0, "torn": [], "skipped": [],
              "missing_files": [], "damaged_tails": []}
    mark_id, mark_off = mark
    missing = check_chain(directory, mark_id, head)
    if missing and not allow_missing:
        raise JournalCorruptedError(
            f"journal {directory}: missing {'; '.join(missing)}. Acknowledged entries may be in "
            "it: restore the file, or set journal_allow_missing_files=True to start without it "
            "(the loss is reported in replay_report['missing_files']).")
    if missing:
        log.error("journal %s: starting without %s (journal_allow_missing_files)",
                  directory, "; ".join(missing))
        report["missing_files"] = missing
    ids = journal_ids(directory)
    for file_id in ids:
        if file_id < mark_id:
            continue
        path = os.path.join(directory, "%x.txn" % file_id)
        size = os.path.getsize(path)
        if file_id == mark_id and mark_off > size:
            # the LastLogMark was written when this file held records up to mark_off: it was
            # cut since, and the records past the mark (entries not yet in the entry logs) with it
            why = (f"journal {path} ends at offset {size}, before the LastLogMark's offset "
                   f"{mark_off} in it: the file was cut after the mark was written, and what "
                   "followed the mark is gone")
            if not skip_corrupt:
                raise JournalCorruptedError(
                    f"{why}. Restore the file, or set journal_skip_corrupt_records=True to "
                    "accept the loss (it is reported in replay_report['skipped']).")
            log.error("%s; accepting the loss (journal_skip_corrupt_records)", why)
            report["skipped"].append((path, size, mark_off - size))
            continue
        if size < jformat.HEADER_SIZE:
            # a file created but never written before a crash: nothing was acknowledged in it
            report["torn"].append((path, 0, size))
            continue
        with open(path, "rb" if live else "r+b") as f:
            # only the part the journal wrote: a hole of a preallocated file read through the
            # map faults (SIGBUS) on a full tmpfs, and holds no record anyway
            data_end = journal_files.data_end(f.fileno(), size)
            mm = mmap.mmap(f.fileno(), data_end, access=mmap.ACCESS_READ)
            try:
                try:
                    got_id = jformat.check_file_header(mm[:jformat.HEADER_SIZE])
                except ValueError as exc:
                    raise JournalCorruptedError(f"journal {path} offset 0: {exc}") from None
                if got_id != file_id:
                    raise JournalCorruptedError(
                        f"journal {path} offset 0: header names journal {got_id:x}")
                floor = jformat.file_min_size(mm[:jformat.HEADER_SIZE])
                recycled_from, salt = jformat.file_salt(mm[:jformat.HEADER_SIZE])
                start = max(jformat.HEADER_SIZE, mark_off) if file_id == mark_id else jformat.HEADER_SIZE
                # the journal's pages were dropped after each sync: read ahead of the scan
                mm.madvise(mmap.MADV_SEQUENTIAL)
                if start < len(mm):             # a mark at the very end: nothing to read
                    mm.madvise(mmap.MADV_WILLNEED, start & ~(mmap.PAGESIZE - 1))
                newest = file_id == ids[-1] and not live
                # groups bounded by GROUP records (a new file of this format): a power loss
                # inside the last one is told from damage (torn_group), with or without
                # journal_skip_corrupt_records, so the first scan stops at a bad record
                grouped = newest and not recycled_from and \
                    jformat.file_flags(mm[:jformat.HEADER_SIZE]) & jformat.FLAG_GROUPS
                records, end, status, skipped = jscan.scan(
                    mm, start, max_record_size, skip_corrupt and not grouped, salt,
                    recycled_from != 0)
                torn_why = None
                if status == "corrupt" and grouped:
                    torn_why = torn_group(mm, records, end, data_end, max_record_size, salt,
                                          data_end < size)
                    if torn_why is not None:
                        status = "torn"
                    elif skip_corrupt:
                        records, end, status, skipped = jscan.scan(
                            mm, start, max_record_size, True, salt, False)
                if status == "corrupt":
                    raise JournalCorruptedError(
                        f"journal {path} is corrupt at offset {end}: a bad record is followed by "
                        "good ones, so this is not a torn tail. Set journal_skip_corrupt_records=True "
                        "to step over it (what is skipped is reported), or restore the file.")
                i = 0
                while i < len(records):
                    off, rtype, body_start, body_len = records[i]
                    if apply_entries is not None and rtype in jformat.ENTRY_TYPES:
                        i = apply_entries(mm, records, i, path)
                        continue
                    apply(rtype, mm[body_start:body_start + body_len], path, off)
                    i += 1
                report["records"] += len(records)
                report["bytes"] += end - start
                report["skipped"].extend((path, o, n) for o, n in skipped)
                damage = None
                if live:
                    status = "live"            # the writer's tail: not read, not cut
                elif status == "torn":
                    later = next((i for i in ids if i > file_id), None)
                    if later is not None:
                        # a roll syncs a journal before it makes the next one, and so does
                        # a start (Journal._sync_newest): this record was durable and
                        # acknowledged, and is damage, recycled file or not
                        damage = (f"the last record, at offset {end}, fails its checksum, and "
                                  f"journal {later:x}.txn was begun after this file was synced, "
                                  "so it is not a torn write: an acknowledged record was damaged")
                    elif torn_why is None:
                        damage = tail_damage(mm, end, data_end, max_record_size,
                                             hole_after=data_end < size,
                                             recycled=recycled_from != 0)
                elif status == "clean" and file_id == ids[-1] and size < floor:
                    damage = (f"the file is {size} bytes, short of the {floor} its "
                              f"preallocation gave it: it was cut, and records after offset "
                              f"{end} are gone")
                if damage is not None:
                    _damaged_tail(path, end, damage, skip_corrupt, report)
                tail = None
                if status == "torn":
                    # a reused file's previous life follows: keep (and cut) the record's head
                    tail = mm[end:end + RECYCLED_TORN_COPY] if recycled_from else mm[end:].rstrip(b"\0")
            finally:
                mm.close()
            if status == "torn":
                torn_dir = os.path.join(directory, "torn")
                private_dir(torn_dir)
                atomic_write(os.path.join(torn_dir, "%x.txn.%d" % (file_id, end)), tail)
                # zeros over the tail, not a shorter file: a journal that ends exactly at a
                # record short of its preallocation is one that was cut (see above); in a
                # reused one a zero length is enough to end the log there
                os.pwrite(f.fileno(), bytes(4 if recycled_from else len(tail)), end)
                fileio.sync(f.fileno(), path, os.fstat(f.fileno()).st_size, data_only=False)
                log.warning("journal %s: cut a torn tail of %d bytes at offset %d (%s; a "
                            "copy is in %s)", path, len(tail), end,
                            torn_why or "a write that never reached the disk whole", torn_dir)
                report["torn"].append((path, end, len(tail)))
        report["files"] += 1
    report["seconds"] = time.perf_counter() - t0
    return report
