"""Seeded chaos for streams: writers take over in turn while bookies are killed,
suspended, stopped and restarted. Checks (seed 001's TLA+ invariants):
- every acknowledged entry is readable with its bytes (AllAckedValuesAreReadable);
- no divergence: one value per position, on every read and at the end (NoLogDivergence);
- no dirty reads: whatever a reader saw up to the LAC is still there at the end (NoDirtyReads).
"""
from __future__ import annotations

import random
import threading
import time

from embedlog.errors import EmbedlogError
from support.replication_chaos import Chaos


class StreamChaos(Chaos):
    def __init__(self, cluster, seed: int, *, duration_s: float, writers: int = 2, name="chaos"):
        super().__init__(cluster, seed, duration_s=duration_s)
        self.name = name
        self.writers = writers
        self.acked_values: dict = {}        # position -> data
        self.seen: dict = {}                # position -> data, from readers

    def _writer(self, wid: int = 0) -> None:
        rnd = random.Random(self.seed * 31 + wid)
        client = self.cluster.client(add_timeout_s=2.0, read_timeout_s=2.0)
        s = client.open_stream(self.name, ensemble_size=3, write_quorum=3, ack_quorum=2)
        n = 0
        while not self._stop.is_set():
            try:
                s.take_over()
                for _ in range(rnd.randint(5, 40)):
                    if self._stop.is_set():
                        break
                    data = b"w%d-%d" % (wid, n)
                    n += 1
                    pos = s.append(data)
                    self.acked_values[pos] = data
            except EmbedlogError:
                # lost the lead (or a bookie is out): let the other writer work a while
                time.sleep(rnd.uniform(0.1, 0.4))

    def _reader(self) -> None:
        client = self.cluster.client(read_timeout_s=2.0)
        s = client.open_stream(self.name, ensemble_size=3, write_quorum=3, ack_quorum=2)
        while not self._stop.is_set():
            try:
                for e in s.read(0):
                    prev = self.seen.setdefault(e.position, e.data)
                    if prev != e.data:
                        self.violations.append(f"position {e.position} read as {prev!r} and {e.data!r}")
            except EmbedlogError:
                pass
            time.sleep(0.05)

    def _workers(self) -> list:
        threads = [threading.Thread(target=self._writer, args=(w,), daemon=True) for w in range(self.writers)]
        return threads + [threading.Thread(target=t, daemon=True) for t in (self._reader, self._faults)]

    def check(self) -> list:
        client = self.cluster.client(read_timeout_s=5.0)
        s = client.open_stream(self.name)
        s.take_over()                      # recovery settles whatever the last writer left
        final = {e.position: e.data for e in s.read(0)}
        for pos, data in self.acked_values.items():
            if final.get(pos) != data:
                self.violations.append(f"acknowledged position {pos} ({data!r}) reads as {final.get(pos)!r}")
        for pos, data in self.seen.items():
            if final.get(pos) != data:
                self.violations.append(f"a reader saw {data!r} at {pos}, now {final.get(pos)!r} (dirty read)")
        self.total_acked = len(self.acked_values)
        return self.violations
