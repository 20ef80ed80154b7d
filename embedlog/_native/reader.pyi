# Type stubs of the Cython module embedlog._native.reader: checked reads of one ledger.
from embedlog._native.entrylog import EntryLogger
from embedlog._native.index import LedgerIndex
from embedlog._native.memtable import MemTable
from embedlog.errors import (CorruptedDataError as CorruptedDataError, IllegalOpError as IllegalOpError,
                             NoSuchEntryError as NoSuchEntryError)

class LedgerReader:
    """Checked reads of one ledger, up to ``lac``."""
    @property
    def scope(self) -> int: ...
    @property
    def lid(self) -> int: ...
    lac: int
    @property
    def reads(self) -> int: ...
    def __init__(self, mt: MemTable, mt2: MemTable, el: EntryLogger, idx: LedgerIndex, scope: int,
                 lid: int, digest: int, mac_key: bytes | None, lac: int) -> None: ...
    def read_entry(self, entry_id: int) -> bytes: ...
    def read_batch(self, first: int, last: int) -> list[bytes]: ...
