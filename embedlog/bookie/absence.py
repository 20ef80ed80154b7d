"""Deletion without a deletion record, on a ZooKeeper root in BookKeeper's format.

A Java BookKeeper client deletes a ledger by removing its znode, leaving no deletion record,
so garbage collection's positive rule (gc.py) alone would keep its data forever. On a root
in BookKeeper's format (``metadata_format`` bookkeeper), and only there, a ledger this
bookie holds also counts as deleted when all of these hold (docs/BOOKKEEPER.md, "Deletion"):

1. its znode was absent on a direct read (not a listing) in two GC cycles at least
   ``gc_missing_ledger_wait_time_ms`` apart, and no read found it in between;
2. each of those reads came after a ZooKeeper sync, on one session that stayed connected
   until the cycle's last read (a ZooKeeper error, a timeout or a lost session aborts
   the cycle: nothing it read counts);
3. the root's INSTANCEID, read in both cycles, is the one in this bookie's cookie (a root
   formatted again is another cluster);
4. its id is below the id generator's high-water mark read in both cycles
   (meta/bookkeeper/idgen.py), and that mark never went down while this bookie watched: a
   ZooKeeper restored from an older backup has not handed out the ids of the ledgers
   created after the backup, so it cannot confirm their deletion.

A ledger being created is safe: a bookie takes a ledger's first entry only once it has read
its znode (descriptors.py, fetch_facts), so it never holds a ledger whose znode it has not
seen, and the sync makes every znode created before the read visible to it. What is
confirmed is deleted as any other deleted ledger (journalled DELETE_LEDGER, remembered in
the deleted-ledgers file). First absences live in memory only: after a restart a ledger
needs two cycles again.
"""
from __future__ import annotations

import logging
import time

from embedlog._native.format import LedgerId

log = logging.getLogger("embedlog.bookie.gc")


class AbsentLedgers:
    """The rule above, and what it has seen: per ledger, when its znode was first absent."""

    def __init__(self, wait_ms: int, instance_id: str | None):
        self.wait_s = wait_ms / 1000.0
        self.instance_id = instance_id
        self.first_absent: dict = {}        # (scope, lid) -> time.monotonic() of the first read
        self.highest_mark = 0
        self._refused: str | None = None     # why the last cycle confirmed nothing, logged once

    def start(self, store) -> int:
        """Before a cycle's direct reads: ZooKeeper's sync; the session they must stay on."""
        return store.sync_reads()

    def forget(self, key) -> None:
        """A read found the ledger's znode: its absence starts over."""
        self.first_absent.pop(key, None)

    def judge(self, store, session: int, missing: list) -> list:
        """The keys of ``missing`` (absent on this cycle's direct reads, made after
        ``start``, with no deletion record) now confirmed deleted. Raises the store's
        error when a read fails or the session changed: then nothing counts."""
        if not missing:
            self.first_absent = {}
            return []
        instance = store.read_instance_id()
        mark = store.ledger_id_high_water_mark()
        store.check_session(session)            # every read of this cycle on one session
        why = None
        if self.instance_id is None:
            why = "this bookie's cookie records no INSTANCEID"
        elif instance != self.instance_id:
            why = (f"the root's INSTANCEID is {instance}, not {self.instance_id} as in this "
                   f"bookie's cookie (the root was formatted again)")
        elif mark < self.highest_mark:
            why = (f"the root's ledger id generator went back from {self.highest_mark} to "
                   f"{mark} (a ZooKeeper restored from an older backup?)")
        if why is not None:
            if why != self._refused:
                log.error("no ledger is confirmed deleted by the absence of its znode: %s; "
                          "%d missing ledger(s) kept", why, len(missing))
            self._refused = why
            self.first_absent = {}
            return []
        self._refused = None
        self.highest_mark = mark
        now = time.monotonic()
        seen = {k: self.first_absent.get(k, now) for k in missing if k[0] == 0 and k[1] < mark}
        confirmed = [k for k, t in seen.items() if k in self.first_absent and now - t >= self.wait_s]
        self.first_absent = {k: t for k, t in seen.items() if k not in confirmed}
        if confirmed:
            log.warning("%d ledger(s) confirmed deleted without a deletion record (znode absent "
                        "on direct reads at least %.0f s apart, INSTANCEID %s, ids below %d); "
                        "their data goes: %s", len(confirmed), self.wait_s, instance, mark,
                        ", ".join(repr(LedgerId(*k)) for k in confirmed[:20]))
        return confirmed
