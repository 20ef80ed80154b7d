# Type stubs of the Cython module embedlog._native.arrowread: READ responses checked in place
# and turned into the buffers of Arrow binary arrays (client/scan.py).
from typing import Any

import numpy as np

from embedlog.errors import CorruptedDataError as CorruptedDataError

_Buffer = bytes | bytearray | memoryview
_Run = tuple[_Buffer, int, int]           # (READ body, first entry id, count)

MAX_VALUES_BYTES: int
KIND_DATA_UNTIMED: int
KIND_NOOP: int
KIND_DATA: int
KIND_LINK: int
KIND_PACKED_LINK: int

def verify_run(body: _Buffer, scope: int, ledger: int, first: int, last: int, digest: int,
               mac_key: bytes | None = None) -> int:
    """How many entries at the start of ``body`` are entries first.. of the ledger, intact."""
def payload_arrays(runs: list[_Run], digest: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int32[n + 1], values uint8[m]) of the runs' payloads."""
def stream_arrays(runs: list[_Run], digest: int) -> tuple[Any, ...]:
    """(positions, times_ms, timed, offsets, values, links) of stream entries' rows."""
def packed_arrays(runs: list[_Run], digest: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, values, rows per entry) of the rows packed in the runs' entries."""
def pack_rows(offsets: Any, values: Any, start: int, stop: int, max_bytes: int) -> tuple[bytes, int]:
    """(payload, next row) of rows start.. packed into one entry payload."""
