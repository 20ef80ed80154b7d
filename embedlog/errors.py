"""The one error tree of embedlog.

Every error carries a stable integer ``code`` that can cross the wire. Where
Apache BookKeeper has a client code (``BKException.Code``) we use it; where it
has none, embedlog's own codes live below -1000 so they never collide with a
future BookKeeper code. ``wire_code`` is BookKeeper's v2 bookie status code
where one exists (EOK=0, ENOLEDGER=1, ...); ``from_code`` is the one place that
turns a code back into an exception.
"""

from __future__ import annotations

import builtins

__all__ = [
    "EmbedlogError", "NoSuchLedgerError", "NoSuchEntryError", "LedgerClosedError",
    "LedgerFencedError", "InvalidTermError", "UnauthorizedAccessError",
    "DigestMismatchError", "CorruptedDataError", "JournalCorruptedError",
    "IllegalOpError", "EntryTooLargeError", "BadVersionError", "NotEnoughBookiesError",
    "ReadOnlyBookieError", "TooManyRequestsError", "TimeoutError", "MetadataError",
    "LedgerExistsError", "DirectoryLockedError", "ClientClosedError",
    "LedgerRecoveryError", "ConfigError", "InvalidCookieError", "MetadataUriError",
    "BookieCrashedError", "ForkedProcessError",
    "LogDirectoryError",
    "from_code", "from_wire_code",
]


class EmbedlogError(Exception):
    """Base of every embedlog error."""

    code = -999          # BookKeeper: UnexpectedConditionException
    wire_code = 101      # EIO

    def __reduce__(self):
        # keep errors picklable across processes (Spark workers, harness)
        return (self.__class__, self.args)


class NoSuchLedgerError(KeyError, EmbedlogError):
    code, wire_code = -7, 1           # NoSuchLedgerExists / ENOLEDGER

    def __str__(self):               # KeyError quotes its argument; we want prose
        return Exception.__str__(self)


class NoSuchEntryError(KeyError, EmbedlogError):
    code, wire_code = -13, 2          # NoSuchEntry / ENOENTRY

    def __str__(self):
        return Exception.__str__(self)


class IllegalOpError(ValueError, EmbedlogError):
    code, wire_code = -100, 100       # IllegalOp / EBADREQ


class EntryTooLargeError(IllegalOpError):
    """An entry (or frame) larger than the configured maximum."""


class UnauthorizedAccessError(PermissionError, EmbedlogError):
    code, wire_code = -102, 102       # UnauthorizedAccess / EUA


class BadVersionError(EmbedlogError):
    code, wire_code = -17, 103        # MetadataVersion / EBADVERSION


class LedgerFencedError(EmbedlogError):
    code, wire_code = -101, 104       # LedgerFenced / EFENCED


class ReadOnlyBookieError(EmbedlogError):
    code, wire_code = -104, 105       # WriteOnReadOnlyBookie / EREADONLY


class TooManyRequestsError(EmbedlogError):
    code, wire_code = -105, 106       # TooManyRequests / ETOOMANYREQUESTS


class DigestMismatchError(EmbedlogError):
    code, wire_code = -5, 101         # DigestMatch


class CorruptedDataError(EmbedlogError):
    """Bytes on disk or on the wire that fail their format (not a digest)."""
    code, wire_code = -1002, 101


class JournalCorruptedError(CorruptedDataError):
    """A bad journal record in the middle of a journal; names file and offset."""
    code = -1003


class InvalidTermError(EmbedlogError):
    """A request with a term lower than the bookie's (unbounded ledgers)."""
    code, wire_code = -1001, 108


class LedgerClosedError(EmbedlogError):
    code, wire_code = -11, 100        # LedgerClosed


class LedgerExistsError(EmbedlogError):
    # LedgerExist; on embedlog's wire ELEDGEREXISTS (a bookie holding another ledger of the
    # id: a writer never picks it again), BookKeeper's EBADREQ on BookKeeper's
    code, wire_code = -20, 109


class LedgerRecoveryError(EmbedlogError):
    code = -10                        # LedgerRecovery


class NotEnoughBookiesError(EmbedlogError):
    code = -6                         # NotEnoughBookies


class TimeoutError(builtins.TimeoutError, EmbedlogError):
    code = -23                        # Timeout


class MetadataError(EmbedlogError):
    code = -18                        # MetaStoreException


class ClientClosedError(EmbedlogError):
    code = -19                        # ClientClosed


class DirectoryLockedError(EmbedlogError):
    """Another process has the bookie directory open."""
    code = -1004


class ConfigError(ValueError, EmbedlogError):
    """A configuration key with a bad value; the message names the key."""
    code = -1005


class MetadataUriError(ConfigError, MetadataError):
    """A metadata service URI that is malformed or names an unknown scheme: bad input (a
    ConfigError), and still a MetadataError for code that catches those."""
    code = -1007


class InvalidCookieError(EmbedlogError):
    """A bookie's directories do not match its cookie (missing, extra or foreign directory,
    or another metadata store); the message says which and how to fix it. BookKeeper's
    InvalidCookieException."""
    code = -1006


class BookieCrashedError(EmbedlogError):
    """A bookie process of a LocalCluster exited without being asked to (a crash, a signal,
    a fatal error); the message names it, its exit code or signal and its log's last lines."""
    code = -1008


class ForkedProcessError(IllegalOpError):
    """A log or client used in a process forked from the one that opened it (os.fork,
    multiprocessing's fork start method): its bookie, journal, metadata connection and
    threads belong to the parent, so the child may not use them; close() there is a no-op.
    The message names the parent's pid and how to give the child its own."""
    code = -1009


class LogDirectoryError(ConfigError):
    """A path embedlog.open cannot use: empty, a file, below a file, a non-empty directory
    that is not a log, one this user cannot write, or (read_only=True) one that holds no log;
    the message says which."""
    code = -1010


_ALL = [v for v in list(globals().values())
        if isinstance(v, type) and issubclass(v, EmbedlogError)]
_BY_CODE = {}
for _cls in _ALL:
    _BY_CODE.setdefault(_cls.code, _cls)
_BY_CODE[-999] = EmbedlogError
_BY_WIRE = {1: NoSuchLedgerError, 2: NoSuchEntryError, 100: IllegalOpError,
            101: EmbedlogError, 102: UnauthorizedAccessError, 103: BadVersionError,
            104: LedgerFencedError, 105: ReadOnlyBookieError,
            106: TooManyRequestsError, 108: InvalidTermError, 109: LedgerExistsError}


def from_code(code: int, message: str = "") -> EmbedlogError:
    """The exception for an embedlog/BookKeeper client code."""
    return _BY_CODE.get(code, EmbedlogError)(message or f"error code {code}")


def from_wire_code(wire_code: int, message: str = "") -> EmbedlogError:
    """The exception for a bookie status code (BookKeeper's v2 numbering)."""
    return _BY_WIRE.get(wire_code, EmbedlogError)(message or f"bookie status {wire_code}")
