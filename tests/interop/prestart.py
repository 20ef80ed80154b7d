"""Per-version module setups that overlap: while one version's tests run, the next version's
setup starts in a background thread. A setup is mostly waiting (JVMs and bookie processes
starting, ZooKeeper round trips), so it costs the tests running meanwhile little and the
module one setup's wait less."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


class Prestart:
    """``make(param, *args)`` builds a module's setup for one param, ``close(setup)`` ends
    it; ``take`` hands them out in ``params`` order, starting the next one meanwhile."""

    def __init__(self, params, make: Callable[..., Any], close: Callable[[Any], None]):
        self.params, self.make, self.close = list(params), make, close
        self._futures: dict = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prestart")

    def take(self, param, *args, ready: Callable[[Any], bool] = lambda p: True):
        """``param``'s setup (started earlier, or made now); the next param's starts now
        when ``ready(next)`` (its jars are there)."""
        future = self._futures.pop(param, None)
        setup = future.result() if future is not None else self.make(param, *args)
        at = self.params.index(param)
        if at + 1 < len(self.params) and ready(self.params[at + 1]):
            nxt = self.params[at + 1]
            self._futures[nxt] = self._pool.submit(self.make, nxt, *args)
        return setup

    def close_unused(self) -> None:
        """End setups started for params no test took (a run stopped early, -k)."""
        for future in self._futures.values():
            try:
                self.close(future.result())
            except BaseException:  # noqa: BLE001 - a setup no test used fails no test
                pass
        self._futures.clear()
