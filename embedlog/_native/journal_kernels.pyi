# Type stubs of the Cython module embedlog._native.journal_kernels: the add path that frames
# entries into the journal buffer and the memtable in one pass, and replay's entry runs.
from typing import Any

from embedlog._native.journal_buffer import JournalBuffer
from embedlog._native.journal_scan import Records
from embedlog._native.memtable import MemTable
from embedlog.errors import (CorruptedDataError as CorruptedDataError,
                             EntryTooLargeError as EntryTooLargeError, IllegalOpError as IllegalOpError,
                             JournalCorruptedError as JournalCorruptedError)

MAX_ENTRY_ID: int
DIGEST_SIZES: dict[int, int]

def add_payloads(jb: JournalBuffer, mt: MemTable, scope: int, lid: int, first_eid: int, lac: int,
                 length: int, digest: int, mac_key: bytes | None,
                 payloads: list[Any] | tuple[bytes, bytes], start: int,
                 max_entry_size: int) -> tuple[int, int]:
    """(entries taken, ledger length after them); payloads a list or a packed batch."""
def chunk_end(payloads: list[Any], start: int, limit: int) -> int: ...
def payload_count(payloads: list[Any] | tuple[bytes, bytes]) -> int: ...
def packed_count(packed: tuple[bytes, bytes]) -> int: ...
def unpack_payloads(packed: tuple[bytes, bytes]) -> list[bytes]: ...
def check_payloads(payloads: list[Any], scope: int, digest: int, max_entry_size: int,
                   memtable_limit: int, start: int = 0) -> None:
    """Raise what add_payloads would for the first payload it would refuse."""
def add_encoded_entries(jb: JournalBuffer, mt: MemTable, entries: list[Any], start: int) -> int: ...
def check_encoded_entries(entries: list[Any], start: int, ledger: tuple[int, int] | None,
                          facts: dict[tuple[int, int], Any], checked: Any,
                          runs: dict[tuple[int, int], list[int]],
                          max_entry_size: int) -> tuple[int, tuple[int, int] | None, int]:
    """(index to go on from, a ledger not in checked or None once all are checked, bytes checked)."""

def replay_entries(data: Any, records: Records, i: int, mt: MemTable,
                   seen: dict[tuple[int, int], int],
                   refused: list[tuple[int, int, int, int]] | None = ...,
                   segment_base: int = ...) -> int: ...
