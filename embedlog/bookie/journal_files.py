"""The journal's files: the one being appended to, the next one (new or reused), the zeros
written ahead of the tail, and the trimmed files kept for reuse (journal.py keeps the group
commit that drives them; BookKeeper's JournalChannel and etcd's file_pipeline play this part).

A journal directory holds ``<id>.txn`` journals (id: hex, growing) and ``<id>.free`` ones
trimmed but kept for reuse, which replay never reads. A journal starts with its header in
a block of its own (``jformat.file_header``), so O_DIRECT writes start on block boundaries
after it. A new journal gets zeros written ahead at once (``prealloc_floor``, recorded in
its header); a reused one keeps its old bytes behind a new header whose salt its previous
life's records do not check with.

No lock of its own guards the current file: the journal's leader alone rolls it, appends to
it and cuts it (outside the journal's lock), and the preallocator writes zeros only past a
claim the leader waits for (``claimed``). The spares take a lock of their own: a roll
reusing one, a trim keeping one and the disks giving them back take turns.
"""
from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time

from embedlog._native import entrylog as nel, format as nformat
from embedlog._native import journal_format as jformat, journal_buffer as jbuffer
from embedlog import failpoints, fileio
from embedlog.errors import EmbedlogError
from embedlog.fileio import fsync_dir, no_space, private_dir

log = logging.getLogger("embedlog.bookie")
ALIGN = jbuffer.DIRECT_ALIGN_BYTES      # O_DIRECT's unit: address, length and offset
# file systems whose O_DIRECT write past the end moves the size once, when the whole write
# completed (ext4, XFS: docs/FORMATS.md, "Preallocation"); elsewhere (tmpfs takes O_DIRECT
# through its page cache) a killed write can leave the file ending inside a record
SIZE_AT_COMPLETION = {0xEF53: "ext4", 0x58465342: "xfs"}
FREE = ".free"                    # a trimmed journal kept for reuse (replay never reads it)
GROUPS = jformat.FLAG_GROUPS       # this writer begins each group with a GROUP record
SEG = ".seg"                      # layout 2: a trimmed journal kept as the storage of its entries
MAX_FREE = 8                      # journals kept for reuse, or as many as one trim frees ...
MAX_FREE_BURST = 16               # ... up to this: a lagging checkpoint lets the journal roll
                                  # more files than MAX_FREE, and a pool of eight ran dry then
# Zeros are written ahead of the tail only while the recent groups (a moving mean over about
# eight) are smaller than this, and groups go out with O_DIRECT: a small group's fdatasync
# costs half as much again when it must also commit the file's new size and blocks (4 KiB:
# 49 vs 73 us on this VM), and its zeros cost a disk with bandwidth to spare nothing it was
# doing; a large group extends the file instead, because its zeros would double the bytes
# it writes (1 MiB of zeros: 1.8 ms at the 570 MB/s zeros go at) where committing the new
# size and blocks costs a few metadata blocks and 0.2 ms (docs/FORMATS.md, "Preallocation")
PREALLOC_GROUP_BYTES_MAX = 64 << 10


def journal_ids(directory: str, suffix: str = ".txn") -> list[int]:
    """The ids of the journal files in ``directory`` (``.free``: those kept for reuse)."""
    ids = []
    for name in os.listdir(directory):
        if name.endswith(suffix):
            try:
                ids.append(int(name[:-len(suffix)], 16))
            except ValueError:
                pass
    return sorted(ids)


def read_segment(path: str) -> int:
    """The segment number in a journal file's header (0: none, or no readable header)."""
    try:
        with open(path, "rb") as f:
            header = f.read(jformat.HEADER_SIZE)
        jformat.check_file_header(header)
    except (OSError, ValueError):
        return 0
    return jformat.file_segment(header)


SEG_MAP = ".seg.map"              # the ledgers a segment holds (the entry log's map grammar)
_MAP_HEAD = struct.Struct(">II")
_MAP_ROW = struct.Struct(">QQQ")


def write_segment_map(path: str, segment: int, runs=None) -> None:
    """``<id>.seg.map`` for journal file ``path`` (``<id>.txn``): {(scope, ledger): bytes} of
    its entry records, ``0xFFFFFFFF count (scope ledger bytes)* crc32c``, so a start finds the
    ledgers a segment holds without reading it. ``runs``: the file's records as its leader
    counted them (a jbuffer.LedgerRuns: a file this process wrote); otherwise the file is
    read back and walked."""
    if runs is not None:
        sums = runs.totals()
    else:
        # runs of one ledger counted in C without the GIL (a trim renames gigabytes of
        # journal while the server's loop answers adds), then summed per ledger
        m = nel.MappedLog.open_segment(path, (1 << 31) | segment)
        try:
            scopes, lids, nbytes = m.ledger_runs()
        finally:
            m.close()
        sums = {}
        for key in zip(scopes.tolist(), lids.tolist(), nbytes.tolist()):
            sums[key[:2]] = sums.get(key[:2], 0) + key[2]
    body = _MAP_HEAD.pack(0xFFFFFFFF, len(sums)) + b"".join(
        _MAP_ROW.pack(s, l, n) for (s, l), n in sorted(sums.items()))
    fileio.atomic_write(os.path.splitext(path)[0] + SEG_MAP,
                        body + nformat.crc32c(body).to_bytes(4, "big"))


def data_end(fd: int, size: int) -> int:
    """Where a journal file's written bytes end: its first hole after the header (records
    are written contiguously from there), or its size. A map must stop there: a hole of a
    preallocated file read through a map faults (SIGBUS) on a full tmpfs."""
    try:
        return max(jformat.HEADER_SIZE, min(size, os.lseek(fd, jformat.HEADER_SIZE, os.SEEK_HOLE)))
    except OSError:
        return size


def read_segment_map(stem: str) -> dict | None:
    """The ledgers map of segment ``<stem>.seg``: None if missing or damaged."""
    try:
        with open(stem + SEG_MAP, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < 12 or nformat.crc32c(data[:-4]).to_bytes(4, "big") != data[-4:]:
        return None
    marker, count = _MAP_HEAD.unpack_from(data)
    if marker != 0xFFFFFFFF or len(data) != 12 + 24 * count:
        return None
    rows = (_MAP_ROW.unpack_from(data, 8 + 24 * i) for i in range(count))
    return {(s, l): n for s, l, n in rows}


def delete_segment(stem: str) -> bool:
    """Delete segment ``<stem>.seg`` and its map; returns whether the ``.seg`` was there.
    The map goes first: a crash between leaves a segment whose map is counted again from
    its records, never a map that outlives its segment."""
    fileio.unlink(stem + SEG_MAP)
    return fileio.unlink(stem + SEG)


def prealloc_floor(prealloc_bytes: int) -> int:
    """The size a journal file has from its creation: its header block and the zeros
    written ahead at once (its header records it, see jformat.file_min_size)."""
    return ALIGN + min(prealloc_bytes, 4 << 20)


class JournalFiles:
    """The current journal file of ``directory`` and what comes after it. ``stats`` is the
    journal's dict (zeros_written, files_reused, files_created, spares_given_back are
    counted here)."""

    def __init__(self, directory: str, config, stats: dict):
        self.directory = directory
        self.config = config
        self.stats = stats
        private_dir(directory)
        self.mark = None                  # the LastLogMark: each new file becomes its head
        self.fd = -1
        self.path: str | None = None      # the file fd is open on
        self.dfd = -1                     # the same file opened O_DIRECT (journal_direct_writes)
        self._direct = config.journal_direct_writes
        self._tail = b""                  # the file's bytes in the block the next group starts in
        self.file_id = 0
        self.offset = 0                   # where the next group lands
        self.zero_end = 0                 # the zeros written ahead end here
        self._salt = 0                    # xored into the record crcs of this file's life
        self._counted = jbuffer.LedgerRuns()   # the group being written: its runs, from salt
        self._dropped_to = 0              # pages below this were dropped from the cache
        self.claim = None                 # (file id, start) being zero-filled
        self.group_bytes_mean = None      # moving mean of group sizes (None: no group yet)
        self.max_bytes = config.journal_max_size_mb * 1024 * 1024
        self.prealloc_bytes = config.journal_pre_alloc_size_mb * 1024 * 1024
        self.size_at_completion = jbuffer.fs_type(directory) in SIZE_AT_COMPLETION
        self._spares_lock = threading.Lock()
        # layout 2: each journal gets a segment number (its header's) that index locations
        # name it by; trimmed journals become <id>.seg instead of being deleted or reused,
        # and a segment no location names any more is kept for reuse (retire_segment)
        self.segments = False
        self.segment = 0                  # the current file's
        self._last_segment = None
        self.on_segment = None            # (segment, path without suffix): before any write
        # file id -> jbuffer.LedgerRuns of the journals this process opened: what each
        # segment's map counts, so a trim need not read the file back from the disk
        self._runs: dict = {}

    @property
    def direct_writes(self) -> bool:
        """Whether groups are written with O_DIRECT (journal_direct_writes, if allowed)."""
        return self.dfd >= 0

    # -- opening and rolling ---------------------------------------------------------

    def sync_newest(self) -> None:
        """Sync the last run's newest journal before a later one is begun (with
        journal_sync_data=False its tail may still be only in the page cache): replay takes
        a bad last record in a journal that a later one follows as damage, never as a torn
        write, since every roll syncs the old journal first too."""
        existing = journal_ids(self.directory)
        if not existing:
            return
        path = os.path.join(self.directory, "%x.txn" % existing[-1])
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fileio.sync(fd, path, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def roll(self, sync_old: bool = True) -> None:
        """Sync the current file (unless a failed group left it behind) and go on in the
        next one."""
        if sync_old and self.fd >= 0:
            fileio.sync(self.fd, self.path, self.offset)
        self.open_next()

    def open_next(self) -> None:
        """Open the next journal file (a kept one reused, or a new one) and make it
        current; its first group lands right after the header."""
        existing = journal_ids(self.directory)
        new_id = max([int(time.time() * 1000)] + [i + 1 for i in existing]
                     + [i + 1 for i in journal_ids(self.directory, SEG)])
        path = os.path.join(self.directory, "%x.txn" % new_id)
        prev = max(existing, default=0)
        segment = self._next_segment() if self.segments else 0
        if segment and self.on_segment is not None:
            self.on_segment(segment, path[:-len(".txn")])
        reused = (self._reuse_file(new_id, prev, path, segment)
                  if self.config.journal_reuse_files else None)
        if reused is not None:
            fd, header, zero_end, salt = reused
            dfd = -1
            try:
                dfd = self._open_direct(path)
                if self.mark is not None:
                    self.mark.write_head(new_id)
            except BaseException:
                os.close(fd)
                raise
        else:
            fd, dfd, header, zero_end = self._new_file(new_id, prev, path, segment)
            salt = 0
        self.segment = segment
        if segment:
            self._runs[new_id] = jbuffer.LedgerRuns()
        for old in (self.fd, self.dfd):
            if old >= 0:
                os.close(old)
        self.fd, self.dfd, self.file_id, self.offset = fd, dfd, new_id, jformat.HEADER_SIZE
        self._tail = header
        self._salt = salt
        self._dropped_to = 0
        self.path = path
        self.zero_end = zero_end

    def _next_segment(self) -> int:
        """The next segment number: one past every journal and segment file's (numbers are
        not reused while a file holds them; a freed one's may be, no index names it)."""
        if self._last_segment is None:
            top = 0
            for suffix in (".txn", SEG):
                for i in journal_ids(self.directory, suffix):
                    top = max(top, read_segment(os.path.join(self.directory, "%x%s" % (i, suffix))))
            self._last_segment = top
        self._last_segment += 1
        if self._last_segment >= 1 << 31:
            raise EmbedlogError("journal segment numbers exhausted (31-bit)")
        return self._last_segment

    def _new_file(self, new_id: int, prev: int, path: str, segment: int = 0):
        """A new journal file, its header and zeros written ahead: (fd, O_DIRECT fd or -1,
        header, end of the zeros)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        dfd = -1
        header = jformat.file_header(new_id, prev, segment=segment, flags=GROUPS)
        try:
            # the header's whole block, so O_DIRECT writes start on block boundaries after it
            if os.pwrite(fd, header + bytes(ALIGN - len(header)), 0) != ALIGN:
                raise OSError(errno.ENOSPC, "short write of a journal header")
            dfd = self._open_direct(path)
            mean = self.group_bytes_mean
            if dfd >= 0 and self.size_at_completion and mean is not None \
                    and mean >= PREALLOC_GROUP_BYTES_MAX:
                # large O_DIRECT groups extend the file (zeros_wanted): zeros ahead here
                # would only be written over, 4 MiB a file (0.13 bytes per payload byte with
                # 32 MiB journals); the header's min_size says none were written
                zero_end = ALIGN
            else:
                zero_end = prealloc_floor(self.prealloc_bytes)
            try:
                if zero_end > ALIGN:
                    jbuffer.write_zeros(fd if dfd < 0 else dfd, ALIGN, zero_end - ALIGN)
            except OSError as exc:
                if not no_space(exc):
                    raise               # zeros ahead are a speed-up: without room, none
            else:
                # the header says how long the zeros made the file: replay takes a file found
                # shorter as cut (records after the cut would be lost without a word)
                header = jformat.file_header(new_id, prev, zero_end, segment=segment,
                                             flags=GROUPS)
                os.pwrite(fd, header, 0)
                self.stats["zeros_written"] += zero_end - ALIGN
            fileio.sync(fd, path, jformat.HEADER_SIZE, size=os.fstat(fd).st_size, data_only=False,
                        dirs_up_to=self.directory)
            if self.mark is not None:
                self.mark.write_head(new_id)
        except BaseException:
            os.close(fd)                # no half-made journal file is left for replay
            if dfd >= 0:
                os.close(dfd)
            os.unlink(path)
            raise
        self.stats["files_created"] = self.stats.get("files_created", 0) + 1
        return fd, dfd, header, zero_end

    def _reuse_file(self, new_id: int, prev: int, path: str, segment: int = 0):
        """A trimmed journal made journal ``new_id``, or None if none is kept: its new header
        (a salt its previous life's records do not check with) is synced under its old name,
        then it is renamed, so a crash leaves either a kept file or a whole new journal.
        Returns (fd, header, its size, salt)."""
        with self._spares_lock:
            return self._reuse_spare(new_id, prev, path, segment)

    def _reuse_spare(self, new_id: int, prev: int, path: str, segment: int = 0):
        for old_id in journal_ids(self.directory, FREE):
            free = os.path.join(self.directory, "%x%s" % (old_id, FREE))
            try:
                fd = os.open(free, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                old_header = os.pread(fd, jformat.HEADER_SIZE, 0)
                try:
                    jformat.check_file_header(old_header)
                    old_salt = jformat.file_salt(old_header)[1]
                except ValueError:
                    old_salt = 0
                salt = jformat.new_salt(new_id, old_salt)
                header = jformat.file_header(new_id, prev, size, old_id, salt, segment, GROUPS)
                failpoints.hit("journal.reuse_before_header")
                if os.pwrite(fd, header + bytes(ALIGN - len(header)), 0) != ALIGN:
                    raise OSError(errno.ENOSPC, "short write of a journal header")
                fileio.sync(fd, free, ALIGN, data_only=False)
                failpoints.hit("journal.reuse_before_rename")
                fileio.reuse(free, path)
            except BaseException:
                os.close(fd)
                raise
            self.stats["files_reused"] += 1
            return fd, header, size, salt
        return None

    def _open_direct(self, path: str) -> int:
        """The journal file opened O_DIRECT, or -1 where that is off or refused (tmpfs)."""
        if not self._direct:
            return -1
        try:
            return os.open(path, os.O_RDWR | os.O_DIRECT)
        except OSError as exc:
            log.info("journal %s: O_DIRECT refused (%s); buffered writes", path, exc)
            self._direct = False
            return -1

    def close(self) -> None:
        for fd in (self.fd, self.dfd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.dfd = -1

    # -- the tail (the leader, outside the journal's lock) --------------------------

    def full(self, nbytes: int) -> bool:
        """Whether a group of ``nbytes`` must go to the next file (one that would not fit
        still goes into a file holding nothing but its header)."""
        return self.offset + nbytes > self.max_bytes and self.offset > jformat.HEADER_SIZE

    def append(self, buf) -> None:
        """Write the group ``buf`` at the tail (salted for this file's life) and move the
        tail past it; not synced."""
        self._salt_group(buf)
        self._write(buf, None, False)

    def append_synced(self, buf, busy) -> float:
        """append, then sync: one request (to ``busy``, a busy_io.BusyWriter with
        enable_busy_wait, else one native call) while the file takes O_DIRECT writes;
        then note_written and drop_synced_pages. Returns the fdatasync's seconds."""
        self._salt_group(buf)
        fsync_s = self._write(buf, busy, True)
        if fsync_s is None:                 # written buffered (O_DIRECT refused): sync here
            t0 = time.perf_counter()
            self.sync()
            fsync_s = time.perf_counter() - t0
            self.drop_synced_pages()        # O_DIRECT writes leave no pages to drop
        self.note_written(buf)
        return fsync_s

    def _write(self, buf, busy, synced: bool):
        """Write the salted group at the tail, and with ``synced`` sync it too in the same
        request where the file takes O_DIRECT writes (by ``busy``, if given); the
        fdatasync's seconds then, else None."""
        fsync_s = None
        if self.dfd >= 0:
            try:
                # what the device takes: whole blocks, the partial one before the group
                # written again and the zeros after it (bytes_written counts records only)
                lag = self.offset % ALIGN
                blocks = -(-(lag + buf.nbytes) // ALIGN) * ALIGN
                if busy is None and not synced:
                    self._tail = buf.write_direct(self.dfd, self.offset, self._tail)
                else:
                    self._tail, fsync_s = fileio.write_direct_synced(
                        busy, buf, self.dfd, self.offset, self._tail, self.path)
                self.offset += buf.nbytes
                self.stats["blocks_written"] += blocks
                return fsync_s
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.warning("journal %s: O_DIRECT write refused (%s); buffered writes from now on",
                            self.path, exc)
                self._direct = False
                os.close(self.dfd)
                self.dfd = -1
        buf.write_to(self.fd, self.offset)
        self.offset += buf.nbytes
        self.stats["blocks_written"] += buf.nbytes + 4      # and the zero length after it
        return None

    def _salt_group(self, buf) -> None:
        """Salt the group for this file's life; a segment's also counts its entry runs
        (note_written adds them to the file's once the group is written)."""
        self._counted.clear()
        buf.salt(self._salt, self._counted if self.file_id in self._runs else None)

    def note_written(self, buf) -> None:
        """A group ``buf`` is in the current file for good (written, and synced unless
        journal_sync_data is off): its entries count in the file's segment map."""
        runs = self._runs.get(self.file_id)
        if runs is not None:
            runs.extend(self._counted)

    def sync(self) -> None:
        """fdatasync the file up to the tail."""
        fileio.sync(self.fd, self.path, self.offset)

    def drop_synced_pages(self) -> None:
        """Give the whole synced pages back to the kernel; O_DIRECT writes left none there."""
        end = self.offset & ~4095
        if self.dfd < 0 and self.config.journal_remove_pages_from_page_cache and end > self._dropped_to:
            os.posix_fadvise(self.fd, self._dropped_to, end - self._dropped_to,
                             os.POSIX_FADV_DONTNEED)
            self._dropped_to = end

    def cut_off(self, attempted, exc):
        """A group failed for lack of space after its bytes may have reached the file (a
        failed sync, a partial write): cut them off, or a crash would replay an add that
        was failed. ``attempted`` is (path, offset, bytes) of the group. Returns the error
        the group fails with; if the cut fails too, one that fails the journal (When in
        doubt, fail)."""
        path, offset, nbytes = attempted
        try:
            # zeros over the group, keeping the file's size: a newest journal that ends
            # short of its preallocation reads as cut at the next start. Past the
            # preallocated space the zeros may find no room either: then the file is cut
            try:
                os.pwrite(self.fd, bytes(nbytes), offset)
            except OSError as err:
                if not no_space(err):
                    raise
                os.ftruncate(self.fd, offset)
            fileio.sync(self.fd, path, offset, data_only=False)
        except OSError as err:
            log.error("journal %s: cannot cut off a failed group at %d (%s)", path, offset, err)
            return EmbedlogError(f"journal {path}: a failed group could not be cut off at "
                                 f"{offset} ({err}) after {exc}")
        self.offset = offset
        return exc

    # -- preallocation ----------------------------------------------------------------

    def note_group(self, nbytes: int) -> None:
        """A group of ``nbytes`` was written (journal's lock held): the size the policy
        follows, and whether it grew the file."""
        if self.offset > self.zero_end:
            self.stats["groups_extending"] += 1      # written past the zeros: the file grew
        mean = self.group_bytes_mean
        self.group_bytes_mean = nbytes if mean is None else mean + (nbytes - mean) / 8

    def zeros_required(self) -> bool:
        """Whether every group must land inside zeros: buffered writes, and O_DIRECT on a
        file system not known to move the size only once a whole write completed (a torn
        write past the end of a file can leave it ending inside a record, which replay must
        take as damage; zeros make it read as torn)."""
        return self.dfd < 0 or not self.size_at_completion

    def zeros_wanted(self) -> bool:
        """Whether the preallocator should write zeros ahead now (journal's lock held):
        always where they are required, with O_DIRECT on ext4 and XFS only while the recent
        groups are small (PREALLOC_GROUP_BYTES_MAX) and once a group has shown how large
        they are."""
        if self.zeros_required():
            return True
        mean = self.group_bytes_mean
        return mean is not None and mean < PREALLOC_GROUP_BYTES_MAX

    def cover(self, nbytes: int):
        """(the leader, outside the journal's lock, before it writes a group of ``nbytes``)
        Where zeros are required and the group would pass them (a group larger than the
        zeros ahead, or a writer faster than the preallocator), write and sync zeros up to
        the group's end first. Returns the new end of the zeros, or None if nothing was
        needed. The preallocator claims only from a MiB past the group's end, and never
        while this group was being taken under its claim (Journal._take_group)."""
        end = -(-(self.offset + nbytes + 4) // ALIGN) * ALIGN    # and write_to's zero length
        if not self.zeros_required() or end <= self.zero_end:
            return None
        start = -(-max(self.zero_end, self.offset) // ALIGN) * ALIGN
        if start < end:
            jbuffer.write_zeros(self.dfd if self.dfd >= 0 else self.fd, start, end - start)
            fileio.sync(self.fd, self.path, None, size=end)
            self.stats["zeros_written"] += end - start
        return end

    def zeros_due(self) -> bool:
        """Whether the zeros ahead of the tail ran short of journal_pre_alloc_size_mb and
        are wanted."""
        return self.zero_end - self.offset < self.prealloc_bytes and self.zeros_wanted()

    def claim_zeros(self, head: int):
        """Claim the next stretch of zeros (journal's lock held): contiguous with those
        already written, never below ``head``, whole blocks as O_DIRECT needs. Returns the
        claim for write_zeros and end_claim, or None if the file is as long as it may get."""
        chunk = self.prealloc_bytes
        start = -(-max(self.zero_end, head) // ALIGN) * ALIGN
        if start + chunk > self.max_bytes + chunk:
            return None
        self.claim = (self.file_id, start)
        return (self.dfd if self.dfd >= 0 else self.fd), self.path, self.file_id, start, chunk

    def claimed(self, rolling: bool, end: int) -> bool:
        """Whether the preallocator is writing zeros where a group ending at ``end`` would
        land, or in the file a roll would close."""
        claim = self.claim
        return claim is not None and claim[0] == self.file_id and (rolling or end > claim[1])

    def write_zeros(self, claim) -> bool:
        """Write and sync a claimed stretch of zeros (outside the journal's lock). False if
        that failed: the file was closed under it by a roll, or there was no room."""
        fd, path, _file_id, start, size = claim
        try:
            jbuffer.write_zeros(fd, start, size)
            fileio.sync(fd, path, None, size=start + size)
        except OSError:
            return False
        return True

    def end_claim(self, claim, wrote: bool) -> None:
        """(journal's lock held) The zeros ahead reach the claimed stretch's end if they
        were written into the file still current."""
        _fd, _path, file_id, start, size = claim
        self.claim = None
        if wrote:
            self.stats["zeros_written"] += size
        if wrote and self.file_id == file_id:
            self.zero_end = start + size

    # -- retention ---------------------------------------------------------------------

    def trim(self, mark_file_id: int) -> list[int]:
        """Delete journals older than the mark, keeping journal_max_backups of them; with
        journal_reuse_files, whole ones (of journal_max_size_mb) are kept for reuse instead:
        at most MAX_FREE, or as many as this trim frees up to MAX_FREE_BURST (the journal held
        those files already; the next stretch between checkpoints may need them again)."""
        with self._spares_lock:
            return self._trim(mark_file_id)

    def _trim(self, mark_file_id: int) -> list[int]:
        old = [i for i in journal_ids(self.directory) if i < mark_file_id]
        kept = journal_ids(self.directory, FREE)
        dropped = kept and not self.config.journal_reuse_files
        if dropped:
            for i in kept:                  # kept while reuse was on: nothing reads them now
                fileio.unlink(os.path.join(self.directory, "%x%s" % (i, FREE)))
        if self.segments:
            # the entries below the mark are stored here and nowhere else: keep the files
            # as segments (GC deletes one once no index points into it). A crash before a
            # rename leaves a .txn below the mark, renamed by the next trim; replay never
            # reads below the mark, and readers open either name
            for i in old:
                path = os.path.join(self.directory, "%x.txn" % i)
                try:
                    segment = read_segment(path)
                    if segment:             # its map first: a crash leaves it beside the .txn
                        write_segment_map(path, segment, self._runs.get(i))
                    fileio.reuse(path, os.path.join(self.directory, "%x%s" % (i, SEG)))
                except FileNotFoundError:
                    pass
                self._runs.pop(i, None)
            if old or dropped:
                fsync_dir(self.directory)
            return old
        keep = self.config.journal_max_backups
        victims = old[:-keep] if keep else old
        reuse = self.config.journal_reuse_files and self._room_for_spares()
        free = len(kept) if reuse else 0
        most = max(MAX_FREE, min(len(victims), MAX_FREE_BURST)) if reuse else 0
        for i in victims:
            path = os.path.join(self.directory, "%x.txn" % i)
            try:
                if free < most and self._filled(os.path.getsize(path)):
                    fileio.reuse(path, os.path.join(self.directory, "%x%s" % (i, FREE)))
                    free += 1
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass                # already trimmed: deleting is idempotent
        if victims or dropped:
            fsync_dir(self.directory)
        return victims

    def retire_segment(self, stem: str) -> bool:
        """Layout 2: segment ``<stem>.seg``, which no index location names any more (GC,
        compaction), is kept for reuse as ``<stem>.free`` like a trimmed journal of layout 1
        (whole ones, at most MAX_FREE, with room to spare), or deleted; its map goes either
        way. Its next life is a new segment: a location names a segment by the number in its
        header, and the old number names no file any more. Returns whether the ``.seg`` went
        (the caller syncs the directory)."""
        path = stem + SEG
        with self._spares_lock:
            try:
                keep = (self.config.journal_reuse_files and self._filled(os.path.getsize(path))
                        and len(journal_ids(self.directory, FREE)) < MAX_FREE
                        and self._room_for_spares())
            except FileNotFoundError:
                keep = False
            if not keep:
                return delete_segment(stem)
            fileio.unlink(stem + SEG_MAP)           # first, as delete_segment does
            failpoints.hit("journal.retire_before_rename")
            try:
                fileio.reuse(path, stem + FREE)
            except FileNotFoundError:
                return False
            self.stats["segments_kept"] = self.stats.get("segments_kept", 0) + 1
        return True

    def _filled(self, size: int) -> bool:
        """Whether a journal of ``size`` bytes was rolled because it was full (worth keeping
        for reuse), not cut short by a restart: a preallocated file reaches
        journal_max_size_mb, one that large groups extended stops short of it by less than
        the group that did not fit, taken here as an eighth of it."""
        return size >= self.max_bytes - self.max_bytes // 8

    def _room_for_spares(self) -> bool:
        """Whether trimmed journals may be kept for reuse: they only spare the zeros of a
        new file, so they never take what the journal needs. Its file system must stay
        below disk_usage_warn_threshold with room for a whole journal and its zeros
        besides; a small journal file system filled by eight kept files stayed read-only."""
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return False
        total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        return (total > 0 and 1.0 - usable / total < self.config.disk_usage_warn_threshold
                and usable >= self.max_bytes + self.prealloc_bytes)

    def give_back_spares(self) -> int:
        """Delete the journal files kept for reuse: the first thing given back when the
        journal's file system runs short of room (the disk monitor calls this). Returns the
        bytes freed."""
        freed = n = 0
        with self._spares_lock:
            for i in journal_ids(self.directory, FREE):
                path = os.path.join(self.directory, "%x%s" % (i, FREE))
                try:
                    size = os.stat(path).st_blocks * 512
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                freed += size
                n += 1
            if n:
                fsync_dir(self.directory)
        if n:
            self.stats["spares_given_back"] = self.stats.get("spares_given_back", 0) + n
            log.warning("journal %s: short of room, %d journal files kept for reuse deleted "
                        "(%.1f MiB given back)", self.directory, n, freed / (1 << 20))
        return freed
