# Type stubs of the Cython module embedlog._native.journal_scan: the scanner replay reads
# a journal file with.
from typing import Any

HEADER_SIZE: int

class Records:
    """scan()'s records: ``records[i]`` is (offset, type, body start, body length)."""
    def __len__(self) -> int: ...
    def __getitem__(self, key: int, /) -> tuple[int, int, int, int]: ...

def scan(data: Any, start: int = 512, max_record_size: int = ...,
         skip_corrupt: bool = False, salt: int = 0,
         recycled: bool = False) -> tuple[Records, int, str, list[tuple[int, int]]]:
    """(records as (offset, type, body start, body length), end, "clean" | "torn" |
    "corrupt", skipped regions as (offset, length))."""

def scan_file(data: Any, max_record_size: int = ...,
              skip_corrupt: bool = False) -> tuple[Records, int, str, list[tuple[int, int]]]:
    """scan() of a whole journal file from its first record, with its header's salt."""
