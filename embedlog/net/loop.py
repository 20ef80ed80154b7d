"""The event loop the client and the served bookie run on: asyncio's own, or uvloop with
EMBEDLOG_EVENT_LOOP=uvloop (``pip install embedlog[fast]``). Opt-in because it measured
only 0-10% more adds/s here (benchmarks/replication.py, docs/PERFORMANCE.md): the
per-add cost is Python's, not the loop's."""
from __future__ import annotations

import asyncio
import os

from embedlog.errors import ConfigError


def loop_name() -> str:
    """"uvloop" or "asyncio": what new_event_loop() makes in this process."""
    want = os.environ.get("EMBEDLOG_EVENT_LOOP", "").strip().lower() or "asyncio"
    if want not in ("uvloop", "asyncio"):
        raise ConfigError(f"EMBEDLOG_EVENT_LOOP={want!r}: use uvloop or asyncio")
    if want == "uvloop":
        try:
            import uvloop  # noqa: F401  (optional: the "fast" extra)
        except ImportError:
            raise ConfigError("EMBEDLOG_EVENT_LOOP=uvloop but uvloop is not installed "
                              "(pip install embedlog[fast])") from None
    return want


def new_event_loop() -> asyncio.AbstractEventLoop:
    if loop_name() == "uvloop":
        import uvloop          # optional dependency (the fast extra)
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(coro):
    """asyncio.run on new_event_loop()'s kind of loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
