"""The one error tree of embedlog.

Every error carries a stable integer ``code`` that can cross the wire. Where
Apache BookKeeper has a client code (``BKException.Code``) we use it; where it
has none, embedlog's own codes live below -1000 so they never collide with a
future BookKeeper code. ``status`` is the status a bookie answers the error with,
a row of STATUSES (the one table of statuses: embedlog's, BookKeeper's v2 and v3
codes), and ``wire_code`` its code on embedlog's protocol; ``from_code`` and
``from_wire_code`` are the places that turn codes back into exceptions.
"""

from __future__ import annotations

import builtins
from typing import NamedTuple

__all__ = [
    "EmbedlogError", "NoSuchLedgerError", "NoSuchEntryError", "LedgerClosedError",
    "LedgerFencedError", "InvalidTermError", "UnauthorizedAccessError",
    "DigestMismatchError", "CorruptedDataError", "JournalCorruptedError",
    "IllegalOpError", "EntryTooLargeError", "BadVersionError", "NotEnoughBookiesError",
    "ReadOnlyBookieError", "TooManyRequestsError", "TimeoutError", "MetadataError",
    "LedgerExistsError", "DirectoryLockedError", "ClientClosedError",
    "LedgerRecoveryError", "ConfigError", "InvalidCookieError", "MetadataUriError",
    "BookieCrashedError", "ForkedProcessError",
    "LogDirectoryError", "CommitFailedError", "GroupNotEmptyError",
    "GroupIdNotFoundError",
    "from_code", "from_wire_code", "Status", "STATUSES", "STATUS", "ERROR_STATUS",
    "V3_TO_EMBEDLOG", "status_of",
]


class EmbedlogError(Exception):
    """Base of every embedlog error."""

    code = -999                       # BookKeeper: UnexpectedConditionException
    status: Status       # ERROR_STATUS, below: the status a bookie answers this error with
    wire_code: int       # status.embedlog

    def __reduce__(self):
        # keep errors picklable across processes (Spark workers, harness)
        return (self.__class__, self.args)


class NoSuchLedgerError(KeyError, EmbedlogError):
    code = -7                         # NoSuchLedgerExists / ENOLEDGER

    def __str__(self):               # KeyError quotes its argument; we want prose
        return Exception.__str__(self)


class NoSuchEntryError(KeyError, EmbedlogError):
    code = -13                        # NoSuchEntry / ENOENTRY

    def __str__(self):
        return Exception.__str__(self)


class IllegalOpError(ValueError, EmbedlogError):
    code = -100                       # IllegalOp / EBADREQ


class EntryTooLargeError(IllegalOpError):
    """An entry (or frame) larger than the configured maximum."""


class UnauthorizedAccessError(PermissionError, EmbedlogError):
    code = -102                       # UnauthorizedAccess / EUA


class BadVersionError(EmbedlogError):
    code = -17                        # MetadataVersion / EBADVERSION


class LedgerFencedError(EmbedlogError):
    code = -101                       # LedgerFenced / EFENCED


class ReadOnlyBookieError(EmbedlogError):
    code = -104                       # WriteOnReadOnlyBookie / EREADONLY


class TooManyRequestsError(EmbedlogError):
    code = -105                       # TooManyRequests / ETOOMANYREQUESTS


class DigestMismatchError(EmbedlogError):
    code = -5                         # DigestMatch


class CorruptedDataError(EmbedlogError):
    """Bytes on disk or on the wire that fail their format (not a digest)."""
    code = -1002


class JournalCorruptedError(CorruptedDataError):
    """A bad journal record in the middle of a journal; names file and offset."""
    code = -1003


class InvalidTermError(EmbedlogError):
    """A request with a term lower than the bookie's (unbounded ledgers)."""
    code = -1001


class LedgerClosedError(EmbedlogError):
    code = -11                        # LedgerClosed


class LedgerExistsError(EmbedlogError):
    # LedgerExist; on embedlog's wire ELEDGEREXISTS (a bookie holding another ledger of the
    # id: a writer never picks it again), BookKeeper's EBADREQ on BookKeeper's
    code = -20


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


class CommitFailedError(EmbedlogError):
    """A consumer group refused a commit: the committing member no longer owns the stream
    under the generation it read it in (the group rebalanced: the member's session
    expired, another member took the stream over, or the group was reset). Kafka's
    CommitFailedException; the member's next poll rejoins and reads from the group's
    committed position."""
    code = -1011


class GroupNotEmptyError(IllegalOpError):
    """A consumer group operation that needs the group inactive (reset, delete) found live
    members; the message names them. Kafka's GroupNotEmptyException."""
    code = -1012


class GroupIdNotFoundError(KeyError, EmbedlogError):
    """No consumer group of that id has a record. Kafka's GroupIdNotFoundException."""
    code = -1013

    def __str__(self):
        return Exception.__str__(self)


class Status(NamedTuple):
    """One status a bookie answers with, as each protocol spells it."""
    name: str
    embedlog: int      # on embedlog's protocol: BookKeeper's v2 code, or embedlog's own past it
    v2: int            # on BookKeeper's v2 protocol (what a v2 client understands)
    v3: int            # on BookKeeper's v3 protocol (StatusCode)


# The one table of statuses: every other table (the codes each protocol module names, the
# maps between them, from_wire_code) is derived from it. embedlog's own statuses past
# BookKeeper's are EBADREQ to a BookKeeper client; EUNKNOWNLEDGERSTATE (a Java bookie's
# ledger in limbo) has no embedlog status: read as EIO, it counts neither as an entry nor
# as an absence.
STATUSES = (
    Status("EOK", 0, 0, 0),
    Status("ENOLEDGER", 1, 1, 402),
    Status("ENOENTRY", 2, 2, 403),
    Status("EBADREQ", 100, 100, 404),
    Status("EIO", 101, 101, 501),
    Status("EUA", 102, 102, 502),
    Status("EBADVERSION", 103, 103, 503),
    Status("EFENCED", 104, 104, 504),
    Status("EREADONLY", 105, 105, 505),
    Status("ETOOMANYREQUESTS", 106, 106, 506),
    Status("EUNKNOWNLEDGERSTATE", 101, 107, 507),
    Status("EINVALIDTERM", 108, 100, 404),
    Status("ELEDGEREXISTS", 109, 100, 404),
)
STATUS = {s.name: s for s in STATUSES}

# each error class's status; a class not named has its nearest base's (EmbedlogError: EIO).
# The first class named with a status is the one that status becomes (from_wire_code).
ERROR_STATUS = (
    (NoSuchLedgerError, "ENOLEDGER"),
    (NoSuchEntryError, "ENOENTRY"),
    (IllegalOpError, "EBADREQ"),
    (LedgerClosedError, "EBADREQ"),
    (EmbedlogError, "EIO"),
    (DigestMismatchError, "EIO"),
    (CorruptedDataError, "EIO"),
    (UnauthorizedAccessError, "EUA"),
    (BadVersionError, "EBADVERSION"),
    (LedgerFencedError, "EFENCED"),
    (ReadOnlyBookieError, "EREADONLY"),
    (TooManyRequestsError, "ETOOMANYREQUESTS"),
    (InvalidTermError, "EINVALIDTERM"),
    (LedgerExistsError, "ELEDGEREXISTS"),
)
for _cls, _name in ERROR_STATUS:
    _cls.status = STATUS[_name]
    _cls.wire_code = STATUS[_name].embedlog

_ALL = [v for v in list(globals().values())
        if isinstance(v, type) and issubclass(v, EmbedlogError)]
_BY_CODE = {}
for _cls in _ALL:
    _BY_CODE.setdefault(_cls.code, _cls)
_BY_CODE[-999] = EmbedlogError
_BY_WIRE = {}
for _cls, _name in ERROR_STATUS:
    _BY_WIRE.setdefault(STATUS[_name].embedlog, _cls)
# a v3 StatusCode as embedlog reads it: the status of its own code (not one spelled so only
# on v3, as EINVALIDTERM's EBADREQ)
V3_TO_EMBEDLOG = {}
for _s in STATUSES:
    V3_TO_EMBEDLOG.setdefault(_s.v3, _s.embedlog)


def status_of(exc: BaseException) -> Status:
    """The status a bookie answers a failed request with (anything not an EmbedlogError: EIO)."""
    return exc.status if isinstance(exc, EmbedlogError) else STATUS["EIO"]


def from_code(code: int, message: str = "") -> EmbedlogError:
    """The exception for an embedlog/BookKeeper client code."""
    return _BY_CODE.get(code, EmbedlogError)(message or f"error code {code}")


def from_wire_code(wire_code: int, message: str = "") -> EmbedlogError:
    """The exception for a bookie status code on embedlog's protocol (BookKeeper's v2
    numbering, embedlog's own past it)."""
    return _BY_WIRE.get(wire_code, EmbedlogError)(message or f"bookie status {wire_code}")
