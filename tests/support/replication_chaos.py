"""A seeded chaos schedule against a LocalCluster, and the checks that must hold after it.

Used by tests/client/test_replication_random.py (short) and tools/replication_soak.py (hours).
Invariants checked (seed 004; Vanlightly's TLA+ properties):
- every acknowledged entry is readable with its bytes (AllAckedEntriesAreReadable);
- every reader sees a prefix of the same sequence: no two values for one entry id;
- a closed ledger's last entry covers every ack (NoDivergenceBetweenClientAndMetaData).
"""
from __future__ import annotations

import random
import threading
import time

from embedlog.errors import EmbedlogError


def payload(ledger_key: str, entry_id: int) -> bytes:
    return f"{ledger_key}/{entry_id}/".encode() * 3


class Chaos:
    def __init__(self, cluster, seed: int, *, duration_s: float, ensemble=(3, 2, 2)):
        self.cluster = cluster
        self.seed = seed       # each thread draws from its own Random: a seed replays its choices
        self.duration_s = duration_s
        self.ensemble = ensemble
        self.acked: dict = {}          # ledger id -> set of acknowledged entry ids
        self.observed: dict = {}       # (ledger id, entry id) -> bytes any reader saw
        self.violations: list = []
        self.actions: list = []
        self._stop = threading.Event()

    # -- workload -------------------------------------------------------------------------

    def _writer(self) -> None:
        rnd = random.Random(self.seed * 3 + 0)
        client = self.cluster.client(add_timeout_s=2.0, read_timeout_s=2.0)
        w = None
        while not self._stop.is_set():
            try:
                if w is None:
                    w = client.create_ledger(*self.ensemble)
                    self.acked[w.ledger_id] = set()
                key = w.ledger_id.qualified_name
                eid = w.last_add_confirmed + 1
                if rnd.random() < 0.5:
                    got = w.append(payload(key, eid))
                    self.acked[w.ledger_id].add(got)
                else:
                    n = rnd.randint(2, 20)
                    last = w.append_many([payload(key, eid + k) for k in range(n)])
                    self.acked[w.ledger_id].update(range(last - n + 1, last + 1))
                if rnd.random() < 0.02:
                    w.close()
                    w = None
            except EmbedlogError:
                w = None        # fenced, not enough bookies, ...: move on to a new ledger
                time.sleep(0.05)

    def _reader(self) -> None:
        rnd = random.Random(self.seed * 3 + 1)
        client = self.cluster.client(read_timeout_s=2.0)
        while not self._stop.is_set():
            ledgers = list(self.acked)
            if not ledgers:
                time.sleep(0.05)
                continue
            lid = rnd.choice(ledgers)
            try:
                r = client.open_ledger(lid, recovery=False)
                lac = r.last_add_confirmed
                if lac >= 0:
                    first = max(0, lac - 20)
                    for i, data in enumerate(r.read_batch(first, lac)):
                        self._observe(lid, first + i, data)
            except EmbedlogError:
                pass
            time.sleep(0.02)

    def _observe(self, lid, eid, data) -> None:
        prev = self.observed.setdefault((lid, eid), data)
        if prev != data:
            self.violations.append(f"two values for entry {eid} of {lid!r}")
        if data != payload(lid.qualified_name, eid):
            self.violations.append(f"entry {eid} of {lid!r} has foreign bytes")

    # -- faults --------------------------------------------------------------------------------

    def _faults(self) -> None:
        rnd = random.Random(self.seed * 3 + 2)
        down: dict = {}          # index -> "killed" | "suspended" | "stopped"
        n = len(self.cluster)
        while not self._stop.wait(rnd.uniform(0.2, 0.6)):
            if down and rnd.random() < 0.6:
                i, how = down.popitem()
                if how == "suspended":
                    self.cluster.resume_bookie(i)
                else:
                    self.cluster.restart_bookie(i)
                self.actions.append(("heal", i, how))
                continue
            if len(down) >= 1:           # at most one bookie out at a time: spares exist
                continue
            i = rnd.randrange(n)
            how = rnd.choice(["killed", "suspended", "stopped"])
            if how == "killed":
                self.cluster.kill_bookie(i)
            elif how == "suspended":
                self.cluster.suspend_bookie(i)
            else:
                self.cluster.stop_bookie(i)
            down[i] = how
            self.actions.append((how, i))
        for i, how in down.items():
            if how == "suspended":
                self.cluster.resume_bookie(i)
            else:
                self.cluster.restart_bookie(i)

    # -- run and check -----------------------------------------------------------------------

    def _workers(self) -> list:
        return [threading.Thread(target=t, daemon=True) for t in (self._writer, self._reader, self._faults)]

    def run(self) -> None:
        threads = self._workers()
        for t in threads:
            t.start()
        time.sleep(self.duration_s)
        self._stop.set()
        for t in threads:
            t.join(60)

    def check(self) -> list:
        client = self.cluster.client(read_timeout_s=5.0)
        total = 0
        for lid, ids in self.acked.items():
            try:
                r = client.open_ledger(lid)          # recovery closes what the writer left open
            except EmbedlogError as exc:
                self.violations.append(f"cannot recover {lid!r}: {exc}")
                continue
            if ids and r.last_add_confirmed < max(ids):
                self.violations.append(f"{lid!r} closed at {r.last_add_confirmed} below ack {max(ids)}")
                continue
            if r.last_add_confirmed >= 0:
                for eid, data in enumerate(r.read_batch(0, r.last_add_confirmed)):
                    self._observe(lid, eid, data)
            for eid in ids:
                if (lid, eid) not in self.observed:
                    self.violations.append(f"acknowledged entry {eid} of {lid!r} is not readable")
            total += len(ids)
        self.total_acked = total
        return self.violations
