# Type stubs of the Cython module embedlog._native.addpath (pyx/embedlog/_native/addpath.pyx):
# the client's add path, one C pass per batch, with the future of an add and the in-flight bound.
import collections
import concurrent.futures
from typing import Any, Callable

_Buffer = bytes | bytearray | memoryview

class AddFuture(concurrent.futures.Future[Any]):
    def __init__(self, on_done: Callable[[concurrent.futures.Future[Any]], object] | None = ...) -> None: ...

class InFlight:
    @property
    def limit(self) -> int: ...
    def __init__(self, limit: int) -> None: ...
    def take(self, most: int = ..., block: bool = ...) -> int: ...
    def give(self, n: int = ...) -> None: ...

class PendingAdd:
    entry_id: int
    data: bytes
    length: int
    acked: set[str] | None      # None until the first acknowledgement
    future: concurrent.futures.Future[Any]
    def __init__(self, entry_id: int, data: bytes, length: int,
                 future: concurrent.futures.Future[Any]) -> None: ...

def encode_adds(batch: list[tuple[_Buffer, concurrent.futures.Future[Any]]], scope: int, lid: int,
                eid: int, lac: int, length: int, digest: int, mac_key: bytes | None,
                pending: collections.OrderedDict[int, PendingAdd],
                ops: list[PendingAdd]) -> tuple[int, int, int]: ...
def add_request(request_id: int, scope: int, ledger: int, master_key: _Buffer,
                entries: list[bytes] | list[_Buffer], flags: int = ..., term: int = ...) -> bytes: ...
def ack(ops: list[PendingAdd], bookie: str, pending: collections.OrderedDict[int, PendingAdd],
        quorums: list[list[str]]) -> None: ...
def acknowledged_run(pending: collections.OrderedDict[int, PendingAdd], qa: int,
                     quorums: list[list[str]]) -> list[PendingAdd]: ...
def set_results(done: list[PendingAdd]) -> None: ...
def split_add_body(body: _Buffer) -> list[memoryview]: ...
def frame_buffer(n: int) -> bytearray:
    """A bytearray of n bytes, not zero-filled: every byte is written before it is read."""
