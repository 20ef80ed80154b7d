# Type stubs of the Cython module embedlog._native.journal: journal records and file headers,
# and the add-path kernels that frame entries into the journal buffer and the memtable.
from typing import Any

from embedlog._native.memtable import MemTable
from embedlog.errors import (CorruptedDataError as CorruptedDataError,
                             EntryTooLargeError as EntryTooLargeError, IllegalOpError as IllegalOpError,
                             JournalCorruptedError as JournalCorruptedError)

_Buffer = bytes | bytearray | memoryview

HEADER_SIZE: int
DIRECT_ALIGN_BYTES: int
MAX_MASTER_KEY: int
MAGIC: bytes
FORMAT_VERSION: int
READABLE_VERSIONS: tuple[int, ...]
RECORD_TYPES: dict[int, str]
ENTRY: int
ENTRY_CRC32C: int
ENTRY_TYPES: tuple[int, ...]
LEDGER_KEY: int
FENCE: int
EXPLICIT_LAC: int
TERM: int
TRUNCATE: int
DELETE_LEDGER: int
TRIM: int

class JournalHeaderError(JournalCorruptedError, ValueError): ...

class JournalBuffer:
    """Records framed in memory, written to the journal file in one pwrite."""
    def __init__(self, capacity: int = ...) -> None: ...
    def add_record(self, rtype: int, body: _Buffer) -> None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def nrecords(self) -> int: ...
    def clear(self) -> None: ...
    def swap(self, other: JournalBuffer) -> None: ...
    def write_to(self, fd: int, offset: int) -> int: ...
    def set_lead(self, file_offset: int) -> None: ...
    def write_direct(self, fd: int, offset: int, tail: bytes) -> bytes: ...
    def entry_ids(self) -> list[tuple[int, int, int]]:
        """(scope, ledger, entry id) of every ENTRY record framed in the buffer."""

def file_header(log_id: int, prev_log_id: int = 0) -> bytes: ...
def file_chain(data: _Buffer) -> int | None:
    """The id of the journal written before this one (0: none), None for an unchained header."""
def check_file_header(data: _Buffer) -> int: ...
def decode_record(rtype: int, body: _Buffer) -> tuple[Any, ...] | None: ...
def sync_fd(fd: int, data_only: bool = True) -> None: ...
def write_zeros(fd: int, offset: int, length: int, sync: bool = True) -> None: ...
class Records:
    """scan()'s records: ``records[i]`` is (offset, type, body start, body length)."""
    def __len__(self) -> int: ...
    def __getitem__(self, key: int, /) -> tuple[int, int, int, int]: ...

class DurableSeq:
    """How far the journal is durable, for waiters outside the bookie's lock."""
    def __init__(self) -> None: ...
    @property
    def synced(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def nwaiting(self) -> int: ...
    def publish(self, synced: int) -> None: ...
    def wake(self) -> None: ...
    def wait(self, seq: int, epoch: int, timeout_s: float) -> bool: ...

def scan(data: Any, start: int = 512, max_record_size: int = ...,
         skip_corrupt: bool = False) -> tuple[Records, int, str, list[tuple[int, int]]]:
    """(records as (offset, type, body start, body length), end, "clean" | "torn" |
    "corrupt", skipped regions as (offset, length))."""
def parse_entry_header(data: _Buffer) -> tuple[int, int, int, int, int, int, int | None]: ...

def add_payloads(jb: JournalBuffer, mt: MemTable, scope: int, lid: int, first_eid: int, lac: int,
                 length: int, digest: int, mac_key: bytes | None, payloads: list[Any], start: int,
                 max_entry_size: int) -> tuple[int, int]:
    """(entries taken, ledger length after them)."""
def check_payloads(payloads: list[Any], scope: int, digest: int, max_entry_size: int,
                   memtable_limit: int, start: int = 0) -> None:
    """Raise what add_payloads would for the first payload it would refuse."""
def add_encoded_entries(jb: JournalBuffer, mt: MemTable, entries: list[Any], start: int) -> int: ...

def replay_entries(data: Any, records: Records, i: int, mt: MemTable,
                   seen: dict[tuple[int, int], int],
                   refused: list[tuple[int, int, int, int]] | None = ...) -> int: ...
