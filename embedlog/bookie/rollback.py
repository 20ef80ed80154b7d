"""Deletion halted while the metadata store looks older than what this bookie has seen.

A store restored from an older backup (or a ZooKeeper snapshot put back) has lost the
ledgers created after the backup, and its id generator hands their ids out again. Garbage
collection's rules (gc.py: a deletion record, or on a BookKeeper root the confirmed absence
of a znode) then speak of the *new* ledgers of those ids: once one is deleted, the bookie
would free the data of the old ledger it holds under the same id, whose metadata the
restore lost. So before deleting anything, each GC cycle looks for signs that the store
went back:

| sign                                                    | what it shows                     |
| ------------------------------------------------------- | --------------------------------- |
| the id generator's high-water mark below the highest    | the generator went back           |
| one this bookie read before (kept across restarts)      |                                   |
| a held ledger missing from the store (no row, no        | the store lost a ledger its       |
| deletion record) whose id is at or above that mark      | generator has not handed out yet  |
| a held ledger whose id the store gives another ledger   | the id came back                  |
| (another incarnation: bookie/descriptors.py)            |                                   |
| a held ledger whose deletion record names another       | the id came back (seen even when  |
| ledger (the record keeps the deleted one's ctime)       | the generator passed its old mark |
|                                                         | before this bookie looked)        |

Any sign halts every deletion of ledgers on this bookie (compaction and entry-log GC of
ledgers already deleted go on) until an operator confirms the store is right (`embedlog
bookie deletion-halt BOOKIE_ID --resume`, the admin API's DELETE
/api/v1/bookie/deletion_halt, ``GarbageCollector.resume_deletion``). The halt and its
reasons are logged at ERROR, counted (``deletion_halted`` in the GC statistics and
metrics) and kept in ``current/deletion-halt`` (JSON), so a restart does not lift it.
A ledger created with an explicit id above the generator's mark and then deleted without a
record (a Java client's createLedgerAdv on a BookKeeper root) looks like the second sign:
the operator resumes, knowing why. A resume takes the ledgers that showed the last two
signs as rightly gone: their ids' deletion records then delete them. What no sign shows:
on a BookKeeper root, a Java client's deletion of a re-issued id leaves no record, and the
znode's absence (bookie/absence.py) cannot say which ledger of the id was deleted.
"""
from __future__ import annotations

import json
import logging
import os
import time

from embedlog._native.format import LedgerId
from embedlog.fileio import atomic_write

log = logging.getLogger("embedlog.bookie.gc")
FILE = "deletion-halt"
MAX_REASONS = 20               # kept in the file: the first ones name the problem


class DeletionHalt:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, FILE)
        self.highest_mark = -1               # the generator's high-water mark read before
        self.reasons: dict = {}              # kind -> {"reason", "since_ms"}
        self._unsaved = False                # a write of the state failed: write it again
        try:
            with open(self.path, "rb") as f:
                state = json.loads(f.read())
            self.highest_mark = int(state.get("highest_mark", -1))
            self.reasons = {str(k): dict(v) for k, v in state.get("reasons", {}).items()}
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, AttributeError) as exc:
            # a damaged file must not lift a halt: keep deleting nothing until resumed
            self.reasons = {"damaged": {"reason": f"{self.path} is damaged ({exc})",
                                        "since_ms": int(time.time() * 1000)}}
            log.error("%s is damaged (%s): ledger deletion stays halted until resumed",
                      self.path, exc)

    @property
    def halted(self) -> bool:
        return bool(self.reasons)

    def check(self, mark: int | None, missing: list, foreign: dict, reissued: dict) -> bool:
        """One GC cycle's look (``mark``: the store's id high-water mark, None where it
        has none; ``missing``: held keys the store lacks; ``foreign``: descriptors.foreign();
        ``reissued``: held keys whose deletion record names another ledger, key -> (held
        ctime, deleted ctime)). Returns whether deletion is halted now."""
        found = {}
        if mark is not None:
            if mark < self.highest_mark:
                found["id-generator"] = (f"the metadata store's ledger id generator went back "
                                         f"from {self.highest_mark} to {mark} (a store restored "
                                         "from an older backup?)")
            lost = sorted(k for k in missing if k[0] == 0 and k[1] >= mark)
            if lost:
                found["missing-above-mark"] = (
                    f"{len(lost)} ledger(s) held here are missing from the metadata store with "
                    f"ids at or above its generator's mark {mark}, which it has not handed out "
                    f"yet (first: {LedgerId(*lost[0])!r}): the store lost ledgers created "
                    "after its backup")
        if foreign:
            key, (held, listed) = sorted(foreign.items())[0]
            found["incarnation"] = (
                f"{len(foreign)} ledger id(s) held here name another ledger in the metadata "
                f"store (first: {LedgerId(*key)!r}, held created at {held} ms, listed created "
                f"at {listed} ms): ids came back")
        if reissued:
            key, (held, deleted) = sorted(reissued.items())[0]
            found["deleted-other-ledger"] = (
                f"{len(reissued)} ledger id(s) held here were deleted in the metadata store as "
                f"another ledger (first: {LedgerId(*key)!r}, held created at {held} ms, the "
                f"deleted one created at {deleted} ms): ids came back, and the ledgers held "
                "here are kept")
        changed = False
        now_ms = int(time.time() * 1000)
        for kind, reason in found.items():
            if kind not in self.reasons and len(self.reasons) < MAX_REASONS:
                self.reasons[kind] = {"reason": reason, "since_ms": now_ms}
                changed = True
                log.error("ledger deletion halted on this bookie: %s. Nothing is deleted until "
                          "an operator confirms the metadata store is right (`embedlog bookie "
                          "deletion-halt BOOKIE_ID --resume`)", reason)
        if mark is not None and mark > self.highest_mark and not found.get("id-generator"):
            self.highest_mark = mark
            changed = True
        if changed or self._unsaved:
            self._persist()
        return self.halted

    def resume(self, mark: int | None) -> dict:
        """An operator's confirmation: lift the halt, and take ``mark`` as the new base."""
        lifted = self.reasons
        self.reasons = {}
        if mark is not None:
            self.highest_mark = mark
        self._persist()
        if lifted:
            log.warning("ledger deletion resumed on an operator's confirmation (it was halted: "
                        "%s)", "; ".join(r["reason"] for r in lifted.values()))
        return lifted

    def _persist(self) -> None:
        """Best effort: a full disk must not stop a bookie from starting or collecting (the
        state holds in memory and is written again at the next look)."""
        try:
            atomic_write(self.path, json.dumps({"highest_mark": self.highest_mark,
                                                "reasons": self.reasons}).encode())
            self._unsaved = False
        except OSError as exc:
            self._unsaved = True
            log.warning("%s could not be written (%s); kept in memory, written at the next "
                        "look", self.path, exc)
