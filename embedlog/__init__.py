"""embedlog: Apache BookKeeper's bookie, embedded in a Python process.

    import embedlog
    with embedlog.open("./data") as log:
        w = log.create_ledger()
        w.append(b"event")
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from embedlog import _native  # noqa: F401  (fails with a clear message if not built)
from embedlog._native.format import LedgerId
from embedlog import errors
from embedlog.errors import EmbedlogError

if TYPE_CHECKING:                     # loaded on first use at run time (__getattr__)
    from embedlog.client import Client
    from embedlog.client.consumer import Consumer, TopicPartition
    from embedlog.embedded import EmbeddedLog

__version__ = "0.1.0"
__all__ = ["open", "LedgerId", "Client", "EmbeddedLog", "Consumer", "TopicPartition", "errors",
           "EmbedlogError"]


def open(path: str | os.PathLike[str], **config: Any) -> EmbeddedLog:
    """Open (creating if needed) an embedded log in directory ``path``; see EmbeddedLog."""
    # the facade loads the layers above it on first use, so `import embedlog` stays cheap
    from embedlog.embedded import EmbeddedLog
    return EmbeddedLog(path, **config)


def __getattr__(name: str) -> object:
    # heavier layers load on first use, so `import embedlog` stays cheap
    if name == "EmbeddedLog":
        from embedlog.embedded import EmbeddedLog
        return EmbeddedLog
    if name == "Client":
        from embedlog.client import Client
        return Client
    if name in ("Consumer", "TopicPartition"):
        from embedlog.client import consumer
        return getattr(consumer, name)
    raise AttributeError(f"module 'embedlog' has no attribute {name!r}")
