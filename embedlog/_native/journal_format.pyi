# Type stubs of the Cython module embedlog._native.journal_format: the journal's record
# grammar (record types) and its file header.
from typing import Any

from embedlog.errors import JournalCorruptedError as JournalCorruptedError

_Buffer = bytes | bytearray | memoryview

HEADER_SIZE: int
MAX_MASTER_KEY: int
MAGIC: bytes
FORMAT_VERSION: int
SEGMENT_VERSION: int
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
INCARNATION: int
GROUP: int
FLAG_GROUPS: int

class JournalHeaderError(JournalCorruptedError, ValueError): ...

def file_header(log_id: int, prev_log_id: int = 0, min_size: int = 0, recycled_from: int = 0,
                salt: int = 0, segment: int = 0, flags: int = 0) -> bytes: ...
def file_flags(data: Any) -> int:
    """The header's flags (FLAG_GROUPS), 0 for a header from before the field."""
def file_segment(data: Any) -> int:
    """The segment number of a journal header (0: none, layout 1)."""
def file_salt(data: Any) -> tuple[int, int]:
    """(recycled_from, salt): (0, 0) for a new file or a header from before recycling."""
def new_salt(log_id: int, old_salt: int) -> int: ...
def file_min_size(data: Any) -> int: ...
def file_chain(data: _Buffer) -> int | None:
    """The id of the journal written before this one (0: none), None for an unchained header."""
def check_file_header(data: _Buffer) -> int: ...
def decode_record(rtype: int, body: _Buffer) -> tuple[Any, ...] | None: ...
def parse_entry_header(data: _Buffer) -> tuple[int, int, int, int, int, int, int | None]: ...
