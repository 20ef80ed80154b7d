"""embedlog: Apache BookKeeper's bookie, embedded in a Python process.

    import embedlog
    with embedlog.open("./data") as log:
        w = log.create_ledger()
        w.append(b"event")
"""
from embedlog import _native  # noqa: F401  (fails with a clear message if not built)
from embedlog._native.format import LedgerId
from embedlog import errors
from embedlog.errors import EmbedlogError

__version__ = "0.1.0"
__all__ = ["open", "LedgerId", "Client", "EmbeddedLog", "errors", "EmbedlogError"]


def open(path, **config):
    """Open (creating if needed) an embedded log in directory ``path``; see EmbeddedLog."""
    # the facade loads the layers above it on first use, so `import embedlog` stays cheap
    from embedlog.embedded import EmbeddedLog
    return EmbeddedLog(path, **config)


def __getattr__(name):
    # heavier layers load on first use, so `import embedlog` stays cheap
    if name == "EmbeddedLog":
        from embedlog.embedded import EmbeddedLog
        return EmbeddedLog
    if name == "Client":
        from embedlog.client import Client
        return Client
    raise AttributeError(f"module 'embedlog' has no attribute {name!r}")
