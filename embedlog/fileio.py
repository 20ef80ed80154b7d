"""The bookie's file I/O seam: the syncs that make its files durable, fsync of a directory,
write-then-rename, private (0700) directories, and a record of what each file holds durably.

Every file the bookie writes is created 0600. A file written by ``atomic_write`` is either
the old one or the new one after a crash, never a mix: the data goes to ``<path>.tmp``, is
fsynced, renamed over ``path``, and the directory is fsynced so the rename itself survives
a power loss.

Every sync of a bookie file's data is ``sync(fd, path, length)`` (the journal's group
commit, its rolls and preallocation, a torn tail cut at replay, an entry log's flush and
seal, an index flush, compaction's index rewrite, an atomic write): the call that syncs is
the one that records what it made durable, as LevelDB's Env does the I/O itself, so there is
no way to claim durability without the sync. A test can record (``record_durable``) and then
cut every file back to what was durable (``power_loss``): LevelDB's fault-injection test,
for every file of the bookie, not only the journal. Nothing is recorded unless a test asked.
"""
from __future__ import annotations

import errno
import os
import threading

_durable: dict | None = None           # path -> bytes known durable, while a test records
_images: dict = {}                     # path -> a reused file's bytes from its previous life
_lock = threading.Lock()
DATA_SUFFIXES = (".txn", ".log", ".idx", ".log.compacting")


def no_space(exc: BaseException | None) -> bool:
    """True if ``exc`` (or what caused it) is a full disk or quota."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__
    return False


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dirs(path: str, stop: str) -> None:
    """fsync ``path`` and its parents up to ``stop``: directories just made must survive."""
    stop, path = os.path.abspath(stop), os.path.abspath(path)
    while True:
        fsync_dir(path)
        if path == stop or len(path) <= len(stop):
            return
        path = os.path.dirname(path)


def file_in_the_way(path: str) -> str | None:
    """The nearest existing ancestor of ``path`` (or ``path`` itself) if it is not a
    directory (a regular file, say: no directory can be made there), else None."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    while parent != path and not os.path.lexists(path):
        path, parent = parent, os.path.dirname(parent)
    return None if os.path.isdir(path) or not os.path.lexists(path) else path


def private_dir(path: str, tighten: bool = False) -> None:
    """Create ``path`` (and missing parents) readable by this user only: a bookie's files
    hold master keys (index headers) and passwords (meta.db), all the wire needs to write.
    ``tighten`` also narrows an existing directory (the bookie's own subdirectories; a
    directory an operator named, such as a shared journal disk's mount point, is left).
    A file where a directory must be is a NotADirectoryError naming that file."""
    parent = os.path.dirname(path)
    if not os.path.isdir(path) and parent != path and not os.path.isdir(parent):
        private_dir(parent)            # os.makedirs would give parents the default mode
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except FileExistsError:
        # not a directory (makedirs says "File exists", naming neither what nor why)
        raise NotADirectoryError(errno.ENOTDIR, "a file is in the way of a directory", path) from None
    if tighten and os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o700)


def sync(fd: int, path: str, length: int | None, *, size: int | None = None,
         data_only: bool = True, dirs_up_to: str | None = None) -> None:
    """Make the open file ``fd`` durable and record what that made durable: fdatasync, or
    fsync with ``data_only=False`` (a new file's size and times too); with ``dirs_up_to``,
    then fsync its directory and each parent up to that one (a new file's name must
    survive too). ``path`` names the file: its first ``length`` bytes are durable now (None:
    the length an earlier sync recorded stays: a sync of preallocated zeros), and its size
    is at least ``size`` (what lies between reads back as zeros or as it was)."""
    if data_only:
        os.fdatasync(fd)
    else:
        os.fsync(fd)
    if dirs_up_to is not None:
        fsync_dirs(os.path.dirname(path), dirs_up_to)
    if _durable is not None:
        _record(path, length, size)


def write_direct_synced(busy, buf, fd: int, offset: int, tail: bytes, path: str):
    """A journal group written through O_DIRECT ``fd`` at ``offset`` and fdatasynced in one
    request: to ``busy`` (busy_io.BusyWriter: enable_busy_wait), or, with None, by this
    thread in one release of the GIL; records what it made durable, as ``sync`` does.
    Returns (the new tail, the fdatasync's seconds)."""
    if busy is None:
        result = buf.write_direct_synced(fd, offset, tail)
    else:
        result = busy.write_direct_sync(buf, fd, offset, tail)
    if _durable is not None:
        _record(path, offset + buf.nbytes, None)
    return result


def unlink(path: str) -> bool:
    """Delete ``path``; False if it was already gone (deleting is idempotent)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        sync(fd, tmp, len(data), data_only=False)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)              # the old file stays, whole
        raise
    os.close(fd)
    replace(tmp, path)


def replace(src: str, dst: str) -> None:
    """Rename ``src`` over ``dst`` durably (the directory is fsynced); what was recorded
    durable of ``src`` is ``dst``'s now."""
    os.replace(src, dst)
    fsync_dir(os.path.dirname(dst) or ".")
    if _durable is not None:
        with _lock:
            length = _durable.pop(os.path.abspath(src), None)
            if length is not None:
                _durable[os.path.abspath(dst)] = length


def reuse(src: str, dst: str) -> None:
    """Rename a journal file into or out of the files kept for reuse, durably. While a test
    records, its bytes are kept: a power loss leaves those (its previous life), not zeros,
    past what its new life made durable."""
    image = None
    if _durable is not None:
        with open(src, "rb") as f:
            image = f.read()
    replace(src, dst)
    if image is not None:
        with _lock:
            _images.pop(os.path.abspath(src), None)
            _images[os.path.abspath(dst)] = image


# -- what is durable (tests) -----------------------------------------------------------------

def _record(path: str, length: int | None, size: int | None) -> None:
    key = os.path.abspath(path)
    with _lock:
        if _durable is None:           # the test stopped recording meanwhile
            return
        old = _durable.get(key)
        if length is None:
            length = old[0] if old else 0
        _durable[key] = (length, max(old[1] if old else 0, size or 0, length))


def recorded() -> dict:
    """What was recorded durable while recording: {absolute path: (length, size)}."""
    with _lock:
        return dict(_durable or {})


def record_durable(on: bool = True) -> None:
    """Start (or stop) recording what is durable, for ``power_loss``."""
    global _durable
    with _lock:
        _durable = {} if on else None
        _images.clear()


def power_loss(root: str, arrived=None) -> list:
    """Cut every file under ``root`` back to what was recorded durable, as a power loss
    would: longer files are truncated to their durable size, bytes past the durable length
    within it become zeros (preallocated space whose writes never reached the disk), or a
    reused journal's bytes from its previous life (``reuse``), a data file never made durable
    is removed (its directory entry need not have survived either). ``arrived(path, n)``:
    which of the n 512-byte sectors written past a journal's durable length reached the disk
    anyway (a device persists an unsynced write's sectors in any order), a list of n bools;
    None: none did. Returns what changed."""
    changed = []
    known = recorded()
    with _lock:
        images = dict(_images)
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.abspath(os.path.join(dirpath, name))
            entry = known.get(path)
            if entry is None:
                if name.endswith(DATA_SUFFIXES):
                    os.unlink(path)
                    changed.append((path, "removed"))
                continue
            length, size = entry
            cur = os.path.getsize(path)
            if cur > size:
                os.truncate(path, size)
                cur = size
                changed.append((path, size))
            if cur > length:
                old = images.get(path, b"")[length:cur]
                lost = old + bytes(cur - length - len(old))
                with open(path, "r+b") as f:
                    if arrived is not None and name.endswith(".txn"):
                        f.seek(length)
                        now = f.read(cur - length)
                        start = length - length % 512
                        keep = list(arrived(path, (cur - start + 511) // 512))
                        assert len(keep) == (cur - start + 511) // 512, "a bool per sector"
                        lost = b"".join(
                            (now if kept else lost)[max(s, length) - length:s + 512 - length]
                            for s, kept in zip(range(start, cur, 512), keep))
                    f.seek(length)
                    f.write(lost)
                changed.append((path, f"{'previous life' if old else 'zeros'} from {length}"
                                + (" (some sectors arrived)" if arrived else "")))
    return changed
