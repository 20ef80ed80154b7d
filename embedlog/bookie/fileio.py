"""The bookie's small durable files: fsync of a directory, write-then-rename, and
private (0700) directories; every file the bookie writes is created 0600.

A file written by ``atomic_write`` is either the old one or the new one after a crash,
never a mix: the data goes to ``<path>.tmp``, is fsynced, renamed over ``path``, and the
directory is fsynced so the rename itself survives a power loss.
"""
from __future__ import annotations

import os


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(path: str, tighten: bool = False) -> None:
    """Create ``path`` (and missing parents) readable by this user only: a bookie's files
    hold master keys (index headers) and passwords (meta.db), all the wire needs to write.
    ``tighten`` also narrows an existing directory (the bookie's own subdirectories; a
    directory an operator named, such as a shared journal disk's mount point, is left)."""
    parent = os.path.dirname(path)
    if not os.path.isdir(path) and parent != path and not os.path.isdir(parent):
        private_dir(parent)            # os.makedirs would give parents the default mode
    os.makedirs(path, mode=0o700, exist_ok=True)
    if tighten and os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o700)


def atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)              # the old file stays, whole
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")
