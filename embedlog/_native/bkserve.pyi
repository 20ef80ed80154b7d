# Type stubs of the Cython module embedlog._native.bkserve (pyx/embedlog/_native/bkserve.pyx):
# BookKeeper's v2 wire, the bookie's side: requests decoded, responses encoded.
from typing import Any, Sequence

_Buffer = bytes | bytearray | memoryview

ADDENTRY: int
READENTRY: int
AUTH: int
READ_LAC: int
WRITE_LAC: int
GET_BOOKIE_INFO: int
BATCH_READ_ENTRY: int
FLAG_DO_FENCING: int
FLAG_RECOVERY_ADD: int
FLAG_HIGH_PRIORITY: int
MASTER_KEY_BYTES: int
MAX_FRAME_BYTES: int
V2_RESPONSE_HEAD_BYTES: int

def decode_v2(buf: _Buffer, pos: int = ..., end: int = ...,
              max_frame_bytes: int = ...) -> tuple[list[tuple[Any, ...]], int, Exception | None]: ...
def v2_response(version: int, op: int, rc: int, ledger_id: int, entry_id: int,
                body_bytes: int = ...) -> bytes: ...
def v2_batch_response(version: int, rc: int, ledger_id: int, entry_id: int, request_id: int,
                      framed: _Buffer | None = ..., count: int = ...) -> bytes: ...
def v2_auth_response(version: int, plugin_name: bytes, payload: bytes = ...) -> bytes: ...
def auth_plugin_name(message: _Buffer) -> bytes | None: ...
def v2_add_responses(version: int, rc: int, ledger_id: int, entry_ids: Sequence[int]) -> bytes: ...
