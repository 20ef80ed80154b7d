"""Work done in other processes by the contract suite, and small shared helpers.

Pool workers are started with spawn and import this module by name (pytest puts this
directory on sys.path, and spawn passes sys.path on). Run as a script it is the
bookie stand-in that registers and then waits to be SIGKILLed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from embedlog._native.format import LedgerId  # noqa: E402
from embedlog.errors import BadVersionError, LedgerExistsError  # noqa: E402
from embedlog.meta import open_metadata_store  # noqa: E402
from embedlog.meta.api import LedgerMetadata  # noqa: E402


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` passed; bounded by construction."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def _start_together(start_at: float) -> None:
    # every worker begins at the same wall-clock instant, so the race is real
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(min(delay, 10.0))


def create_race(uri: str, options: dict, ids: list[tuple[int, int]], marker: str,
                start_at: float) -> list[tuple[int, int]]:
    """Try to create every id; return the ones this process won."""
    won = []
    with open_metadata_store(uri, **options) as store:
        _start_together(start_at)
        for scope, ledger in ids:
            md = LedgerMetadata(LedgerId(scope, ledger), 1, 1, 1,
                                custom_metadata={"owner": marker.encode()})
            try:
                store.create_ledger_metadata(md)
                won.append((scope, ledger))
            except LedgerExistsError:
                pass
    return won


def generate_ids(uri: str, options: dict, count: int, scope: int | None,
                 start_at: float) -> list[tuple[int, int]]:
    with open_metadata_store(uri, **options) as store:
        _start_together(start_at)
        out = []
        for _ in range(count):
            lid = store.generate_ledger_id(scope)
            out.append((lid.scope_id, lid.ledger_id))
        return out


def cas_increments(uri: str, options: dict, scope: int, ledger: int, count: int,
                   start_at: float) -> int:
    """Add 1 to the ledger's length ``count`` times with read-CAS-retry; return the
    number of conflicts seen (stale versions that lost)."""
    lid = LedgerId(scope, ledger)
    conflicts = 0
    with open_metadata_store(uri, **options) as store:
        _start_together(start_at)
        for _ in range(count):
            for _attempt in range(10_000):
                current = store.read_ledger_metadata(lid)
                try:
                    store.write_ledger_metadata(
                        current.value.with_(length=current.value.length + 1), current.version)
                    break
                except BadVersionError:
                    conflicts += 1
            else:
                raise RuntimeError("CAS never won")
    return conflicts


def _hold_registration(uri: str, options_json: str, bookie_id: str) -> None:
    store = open_metadata_store(uri, **json.loads(options_json))
    store.register_bookie(bookie_id, False, {"pid": os.getpid()})
    print("registered", flush=True)
    time.sleep(120)          # the test SIGKILLs us long before this


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        _hold_registration(*sys.argv[2:5])
