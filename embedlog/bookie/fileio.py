"""The bookie's small durable files: fsync of a directory, and write-then-rename.

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


def atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")
