"""Helpers for crash tests: abandon a log as a crash would (no checkpoint, no flush)."""
import os
import shutil

from embedlog._native import journal_format as jformat, journal_scan as jscan
from embedlog.bookie.journal_files import journal_ids


def abandon(log):
    """Drop an open EmbeddedLog without closing it cleanly, like a SIGKILL would:
    the journal writer stops, nothing more is written, the directory lock is released."""
    b = log.bookie
    b.gc.stop()          # a SIGKILL stops these too; left running they poll a deleted directory
    b.disks.stop()
    with b.cv:
        b._closed = True
        b.journal._closed = True
        b.cv.notify_all()
        b.journal._writer_cv.notify_all()
        b.journal._prealloc_cv.notify_all()
    b.checkpointer.stop()
    for t in b.journal._threads:
        t.join(timeout=5)
    b.journal.files.close()
    b.storage.close()
    os.close(b._lock_fd)
    log.metadata.close()
    log._closed = True


def newest_journal(path):
    jdir = os.path.join(path, "journal")
    return os.path.join(jdir, "%x.txn" % journal_ids(jdir)[-1])


def journal_records(path):
    """The file's records but its GROUP records (each group's first: its bounds), which
    the tests that pick a record by its place do not count."""
    data = open(path, "rb").read()
    records, end, status, _ = jscan.scan_file(data)
    return [r for r in records if r[1] != jformat.GROUP], end, status


def copy_dir(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("LOCK"))
