"""Adds in flight: the future each add is handed, and the bound on how many there are.

Both are on the path of every add, so both avoid what the standard library builds per
call: a ``concurrent.futures.Future`` makes a ``threading.Condition`` (an RLock and
half a dozen bound methods) when created and enters it when completed, and a
``threading.BoundedSemaphore`` enters a Condition on every acquire and release. They are
compiled with the rest of the client's add path (pyx/embedlog/_native/addpath.pyx), which
completes a run of acknowledged futures under one hold of their lock.
"""
from __future__ import annotations

from embedlog._native.addpath import AddFuture, InFlight

__all__ = ["AddFuture", "InFlight"]
