# Type stubs of the Cython module embedlog._native.bkencode: BookKeeper's v3 frames encoded.
from typing import Any, Sequence

from embedlog.errors import (CorruptedDataError as CorruptedDataError,
                             EntryTooLargeError as EntryTooLargeError,
                             IllegalOpError as IllegalOpError)

# the protocol's numbers it uses, bkwire's
READ_ENTRY: int
ADD_ENTRY: int
AUTH: int
WRITE_LAC: int
READ_LAC: int
GET_BOOKIE_INFO: int
START_TLS: int
FORCE_LEDGER: int
GET_LIST_OF_ENTRIES_OF_LEDGER: int
FENCE_LEDGER: int
ENTRY_PIGGYBACK: int
MASTER_KEY_BYTES: int
MAX_FRAME_BYTES: int
V1_HEADER_BYTES: int
LAC_HEADER_BYTES: int
OPERATIONS: dict[int, str]

_Buffer = bytes | bytearray | memoryview

def encode_adds(txn_first: int, ledger_id: int, master_key: _Buffer, add_body: _Buffer,
                recovery: bool = False, max_frame_bytes: int = ...) -> tuple[bytes, int, int]: ...
def encode_reads(txn_first: int, ledger_id: int, first_entry: int, count: int, flag: int = 0,
                 master_key: _Buffer | None = None) -> bytes: ...
def encode_request(txn_id: int, operation: int, max_frame_bytes: int = ..., **fields: object) -> bytes: ...
def encode_response(txn_id: int, operation: int, status: int, max_frame_bytes: int = ...,
                    **fields: object) -> bytes: ...
def lac_body(ledger_id: int, lac: int, digest: int, mac_key: bytes | None = None) -> bytes: ...
def lac_of_body(body: _Buffer, ledger_id: int) -> int: ...
def entry_ids(body: _Buffer, ledger_id: int) -> tuple[int, int]: ...
def v3_add_response(txn_id: int, status: int, ledger_id: int, entry_id: int) -> bytes: ...
def v3_add_responses(txn_ids: Sequence[int], status: int, ledger_id: int,
                     entry_ids: Sequence[int]) -> bytes: ...
def v3_read_head(txn_id: int, status: int, ledger_id: int, entry_id: int, max_lac: int | None = ...,
                 body_bytes: int = ..., lac_update_timestamp: int | None = ...) -> bytes: ...
def v3_status_response(txn_id: int, operation: int, status: int) -> bytes: ...
