"""Batch reads for Arrow: READ responses checked, then turned into BinaryArray buffers;
rows packed into entries and back (the ledgers embedlog.spark writes)."""
import numpy as np

MAX_VALUES_BYTES: int
KIND_DATA_UNTIMED: int
KIND_NOOP: int
KIND_DATA: int
KIND_LINK: int
KIND_PACKED_LINK: int

Run = tuple[bytes | memoryview, int, int]     # (READ body, first entry id, entry count)
# (position, append time ms, scope, ledger, first entry, entry count, rows, packed)
Link = tuple[int, int, int, int, int, int, int, bool]

def verify_run(body: bytes | memoryview, scope: int, ledger: int, first: int, last: int,
               digest: int, mac_key: bytes | None = None) -> int: ...
def payload_arrays(runs: list[Run], digest: int) -> tuple[np.ndarray, np.ndarray]: ...
def stream_arrays(runs: list[Run], digest: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                          np.ndarray, np.ndarray, list[Link]]: ...
def packed_arrays(runs: list[Run], digest: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
def pack_rows(offsets: np.ndarray, values: np.ndarray, start: int, stop: int,
              max_bytes: int) -> tuple[bytes, int]: ...
