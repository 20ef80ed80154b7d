"""Class-data-sharing archives for the Java peers' JVMs: they start about twice as fast.

A JVM started with ``-XX:SharedArchiveFile=A`` maps the classes an earlier run of the same
program loaded from A, already parsed and verified, instead of reading them from the jars.
Measured here (2 cores, Java 17, BookKeeper 4.17.2/4.16.6, interleaved rounds at load
17-21): three bookies ready in 3.1-4.6 s instead of 7.3-8.0 s; a BookieShell or BkDriver
run's user time 1.1 -> 0.7 s.

The first JVM of a role that finds no archive makes it (``-XX:ArchiveClassesAtExit``; that
one run is 2-3 s slower, once per machine); the archive is renamed into place only after its
JVM exited. Its name hashes the java binary and the classpath (paths, sizes, mtimes), so new
jars or a new JDK get a new archive, never a stale one, and the role's old archives are
removed. One process at a time makes a given archive (a lock held until its JVM exits); the
others meanwhile run without one. JVM messages about archives go to stderr (they default to
stdout, where tools print results). ``EMBEDLOG_JAVA_CDS=0`` turns it all off. CDS takes
only jars on the classpath (a non-empty directory makes it refuse).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
from typing import Callable

QUIET = ["-Xlog:disable", "-Xlog:all=warning:stderr"]


def enabled() -> bool:
    return os.environ.get("EMBEDLOG_JAVA_CDS", "1") not in ("0", "false", "no")


def _fingerprint(java: str, classpath: str) -> str:
    h = hashlib.sha256()
    for path in [os.path.realpath(java), *classpath.split(":")]:
        try:
            st = os.stat(path)
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{path}\0missing\n".encode())
    return h.hexdigest()[:16]


class ClassArchive:
    """The archive of one role (``bookie``, ``shell``...) for one java and classpath."""

    def __init__(self, directory: str, role: str, java: str, classpath: str):
        self.path = os.path.join(directory, f"{role}-{_fingerprint(java, classpath)}.jsa")
        self.directory = directory
        self.role = role

    def _prune(self) -> None:
        """Remove this role's archives for other jars or JDKs (30-40 MB each); a JVM still
        mapping one keeps its pages."""
        for old in glob.glob(os.path.join(glob.escape(self.directory),
                                          f"{glob.escape(self.role)}-{'[0-9a-f]' * 16}.jsa")):
            if old != self.path:
                for path in (old, old + ".lock"):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass

    def options(self, dump: bool = True) -> tuple[list[str], Callable[[], None]]:
        """JVM options for one launch, and what to call once that JVM has exited. With an
        archive: use it. Without one and ``dump``: this launch makes it, if no other process
        is making it right now."""
        if not enabled():
            return [], _nothing
        if os.path.exists(self.path):
            return [*QUIET, f"-XX:SharedArchiveFile={self.path}"], _nothing
        if not dump:
            return [], _nothing
        os.makedirs(self.directory, exist_ok=True)
        lock = open(self.path + ".lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return [], _nothing
        if os.path.exists(self.path):            # made while we waited for the lock
            lock.close()
            return [*QUIET, f"-XX:SharedArchiveFile={self.path}"], _nothing
        staging = f"{self.path}.{os.getpid()}.tmp"

        def done() -> None:
            try:
                # a JVM that was SIGKILLed or failed writes nothing, or nothing usable
                if os.path.exists(staging) and os.path.getsize(staging) > 0:
                    os.replace(staging, self.path)
                    self._prune()
                elif os.path.exists(staging):
                    os.unlink(staging)
            finally:
                lock.close()
        return [*QUIET, f"-XX:ArchiveClassesAtExit={staging}"], done


def _nothing() -> None:
    pass
