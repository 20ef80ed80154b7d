"""Names the public API's annotations share (for type checkers; nothing here runs)."""
from __future__ import annotations

from typing import Callable, Optional, Union

from embedlog._native.format import LedgerId

# what an append takes: a bytes-like object (a str is refused: encode it first)
Payload = Union[bytes, bytearray, memoryview]
# a ledger named by its LedgerId or, in scope 0, by its number
LedgerRef = Union[LedgerId, int]
# a tail's stop condition: the tail ends once it returns True
Stop = Optional[Callable[[], bool]]
