"""Autorecovery: an elected auditor finds lost bookies, replication workers re-replicate.

- The **auditor** (one at a time: it holds a lease, a compare-and-set record in the
  metadata store renewed while it lives) lists the registered bookies; a bookie named
  in some ledger's ensemble but unregistered for longer than ``lost_bookie_grace_s``
  is lost, and every ledger with a fragment on it is marked under-replicated.
- A **replication worker** (one per bookie process) takes under-replicated ledgers,
  and for each fragment on a lost bookie of a CLOSED ledger (or a fragment that is not
  the last of an OPEN one, whose writer handles the last) copies the entries the lost
  bookie should hold from the surviving replicas to a replacement bookie, then
  swaps the replacement into that fragment's ensemble by CAS. A closed ledger thus
  returns to its full write quorum without anyone reading it. Copies carry the ledger's
  term (a stream's bookies refuse an older one); a released stream's last fragment is
  copied up to the released position, and a stream whose leader leaves a lost bookie in
  its last fragment past ``open_stream_grace_s`` is taken over (docs/STREAMS.md).
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

from embedlog._native import arrowread
from embedlog._native.format import decode_entry, mac_key, master_key
from embedlog.errors import BadVersionError, EmbedlogError, NoSuchLedgerError
from embedlog.meta.api import DigestType, LedgerState
from embedlog.client.recovery import cancel
from embedlog.client.scan import read_run
from embedlog.client.schedule import MAX_READ_ENTRIES, slots
from embedlog.client.stream import NAME_KEY, Stream, released_position
from embedlog.net import protocol as P

log = logging.getLogger("embedlog.autorecovery")
LEASE = "auditor-lease"
WINDOW = MAX_READ_ENTRIES          # entries copied per ranged READ (the bookie's most)
WINDOWS_IN_FLIGHT = 4              # windows read and written at once: a few MiB in flight
ENTRY_READS_IN_FLIGHT = 64         # single-entry reads at once (striped fragments)


def current_auditor(metadata) -> str | None:
    """The bookie id of the elected auditor, or None when no lease is held (or it expired);
    on a BookKeeper root, BookKeeper's own auditor when no embedlog bookie holds the lease."""
    v = metadata.cookies.read_cookie(LEASE)
    owner = None
    if v is not None:
        try:
            lease = json.loads(v.value)
            owner = str(lease["owner"]) if float(lease["expires"]) > time.time() else None
        except (ValueError, KeyError, TypeError):
            owner = None
    if owner is None and hasattr(metadata, "bookkeeper_auditor"):
        owner = metadata.bookkeeper_auditor()
    return owner


def underreplicated(metadata) -> dict:
    """Every ledger marked under-replicated -> the bookies it misses: embedlog's marks and,
    on a BookKeeper root, BookKeeper's auditor's (read only: BookKeeper's workers own them)."""
    out = {lid: list(m) for lid, m in metadata.underreplication.list_underreplicated().items()}
    for lid, missing in getattr(metadata, "bookkeeper_underreplicated", dict)().items():
        out[lid] = out.get(lid, []) + [b for b in missing if b not in out.get(lid, [])]
    return out


def ledgers_on(metadata, bookie_id: str) -> list:
    """Every ledger with a fragment whose ensemble names ``bookie_id`` (one metadata read each)."""
    lm = metadata.ledger_manager
    out = []
    for lid in lm.iterate_ledgers(None):
        try:
            md = lm.read_ledger_metadata(lid).value
        except NoSuchLedgerError:
            continue
        if any(bookie_id in ens for _first, ens in md.fragments):
            out.append(md)
    return out


class AutoRecovery:
    """Runs the auditor election loop and a replication worker in background threads."""

    def __init__(self, ctx, self_id: str, *, interval_s: float = 1.0, lost_bookie_grace_s: float = 2.0,
                 lease_s: float = 5.0, open_stream_grace_s: float = 30.0):
        self.ctx = ctx
        self.self_id = self_id
        self.interval_s = interval_s
        self.grace_s = lost_bookie_grace_s
        self.lease_s = lease_s
        self.open_stream_grace_s = open_stream_grace_s
        self._stuck_since: dict = {}       # stream ledger id -> when its leader was first late
        self.is_auditor = False
        self.stats = {"audits": 0, "marked": 0, "fragments_replicated": 0, "entries_copied": 0}
        self._missing_since: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="embedlog-autorecovery", daemon=True)

    def start(self) -> "AutoRecovery":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():         # a stop may come before start() (a signal)
            self._thread.join(timeout=10)
        if self.is_auditor:
            try:
                v = self.ctx.metadata.cookies.read_cookie(LEASE)
                if v is not None and json.loads(v.value)["owner"] == self.self_id:
                    self.ctx.metadata.cookies.remove_cookie(LEASE, v.version)
            except EmbedlogError:
                pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self._hold_lease():
                    self.audit()
                self.replicate_some()
            except EmbedlogError as exc:
                log.warning("autorecovery round failed: %s", exc)

    # -- auditor -----------------------------------------------------------------------

    def _hold_lease(self) -> bool:
        cookies = self.ctx.metadata.cookies
        now = time.time()
        body = json.dumps({"owner": self.self_id, "expires": now + self.lease_s}).encode()
        v = cookies.read_cookie(LEASE)
        try:
            if v is None:
                cookies.write_cookie(LEASE, body, None)
            else:
                cur = json.loads(v.value)
                if cur["owner"] != self.self_id and cur["expires"] > now:
                    self.is_auditor = False
                    return False
                cookies.write_cookie(LEASE, body, v.version)
        except BadVersionError:
            self.is_auditor = False
            return False
        if not self.is_auditor:
            log.info("%s is the auditor now", self.self_id)
        self.is_auditor = True
        return True

    def audit(self) -> list:
        """Mark the ledgers with fragments on lost bookies; returns the ledgers marked."""
        writable, readonly = self.ctx.refresh_bookies()
        alive = set(writable) | set(readonly)
        now = time.monotonic()
        lm = self.ctx.metadata.ledger_manager
        marked = []
        for lid in lm.iterate_ledgers(None):
            try:
                md = lm.read_ledger_metadata(lid).value
            except NoSuchLedgerError:
                continue
            lost = set()
            for _first, ens in md.fragments:
                for b in ens:
                    if b in alive:
                        since = self._missing_since.pop(b, None)
                        if since is not None and self.grace_s > 0:
                            log.info("bookie %s is registered again, %.1f s after it was found "
                                     "missing", b, now - since)
                    elif b not in self._missing_since:
                        self._missing_since[b] = now
                        if self.grace_s > 0:
                            # the grace period begins: say so now, not only once it has passed
                            log.warning("bookie %s (in the ensemble of ledger %s) is not "
                                        "registered: its ledgers are marked under-replicated if "
                                        "it is still gone in %.1f s (lost_bookie_grace_s)",
                                        b, lid, self.grace_s)
                        else:
                            lost.add(b)
                    elif now - self._missing_since[b] >= self.grace_s:
                        lost.add(b)
            if lost:
                self.ctx.metadata.underreplication.mark_ledger_underreplicated(lid, sorted(lost))
                log.info("ledger %r is under-replicated: bookies %s are lost", lid, ", ".join(sorted(lost)))
                marked.append(lid)
        self.stats["audits"] += 1
        self.stats["marked"] += len(marked)
        return marked

    # -- replication worker ----------------------------------------------------------------

    def replicate_some(self, limit: int = 4) -> int:
        ur = self.ctx.metadata.underreplication
        done = 0
        for lid, missing in list(ur.list_underreplicated().items())[:limit]:
            try:
                if self.replicate_ledger(lid, set(missing)):
                    ur.mark_ledger_replicated(lid)
                    done += 1
            except NoSuchLedgerError:
                ur.mark_ledger_replicated(lid)          # deleted meanwhile
            except EmbedlogError as exc:
                log.info("replicating %r: %s", lid, exc)
        return done

    def replicate_ledger(self, lid, missing: set) -> bool:
        """Re-replicate the fragments of ``lid`` on ``missing`` bookies; True when none remain."""
        lm = self.ctx.metadata.ledger_manager
        for _ in range(16):
            v = lm.read_ledger_metadata(lid)
            md = v.value
            frags = list(md.fragments)
            # a released stream has no writer and ends at the released position: its last
            # fragment is copied like a closed one (a take-over meanwhile fails our CAS)
            released = released_position(md) if md.unbounded else None
            todo = [k for k, (_f, ens) in enumerate(frags) if missing & set(ens)
                    and (md.state == LedgerState.CLOSED or k < len(frags) - 1 or released)]
            if not todo:
                if md.unbounded and missing & set(frags[-1][1]) and self._orphaned(v):
                    continue              # taken over: its old last fragment is closed now
                return not any(missing & set(ens) for _f, ens in frags)
            k = todo[0]
            first, ens = frags[k]
            end = (frags[k + 1][0] - 1 if k + 1 < len(frags)
                   else released[0] if released else md.last_entry_id)
            ens = list(ens)
            lost = [b for b in ens if b in missing]
            fresh = self.ctx.choose_bookies(len(lost), exclude=set(ens) | missing)
            for old, new in zip(lost, fresh):
                self._copy_fragment(md, first, end, ens, ens.index(old), new)
                ens[ens.index(old)] = new
            frags[k] = (first, tuple(ens))
            try:
                lm.write_ledger_metadata(md.with_(fragments=tuple(frags)), v.version)
                self.stats["fragments_replicated"] += 1
                log.info("ledger %r: fragment from entry %d re-replicated to %s",
                         lid, first, ", ".join(fresh))
            except BadVersionError:
                continue                  # changed meanwhile (writer, recovery): look again
        return False

    def _orphaned(self, versioned) -> bool:
        """A stream whose current fragment names a lost bookie: its leader replaces it with
        an ensemble change of its own. One that has not done so within the grace period is
        gone (or there is none and the term was not released): take the stream over, which
        replaces the bookie from the truncating no-op on, and release the term at once
        (BookKeeper fences an open ledger after openLedgerRereplicationGracePeriod).
        True once taken over."""
        md = versioned.value
        since = self._stuck_since.setdefault(md.ledger_id, time.monotonic())
        if time.monotonic() - since < self.open_stream_grace_s:
            return False
        s = Stream(self.ctx, md.custom_metadata.get(NAME_KEY, b"").decode(), versioned, md.password)
        s.take_over()
        s.close()
        self._stuck_since.pop(md.ledger_id, None)
        log.info("stream %r: its leader did not replace a lost bookie; taken over at term %d "
                 "and released", s.name, s.term)
        return True

    def _copy_fragment(self, md, first: int, end: int, ens: list, slot: int, target: str) -> None:
        """Copy every entry of [first, end] whose write set includes ensemble position
        ``slot`` from the surviving replicas to ``target``: ranged reads, a few windows in
        flight, each window written in batches with the ledger's term (a stream's bookies
        refuse an add of an older term than theirs)."""
        self.ctx.run(self._copy(md, first, end, ens, slot, target))

    async def _copy(self, md, first, end, ens, slot, target) -> None:
        mk = mac_key(md.password) if md.digest_type == DigestType.MAC else None
        sem = asyncio.Semaphore(WINDOWS_IN_FLIGHT)

        async def window(lo, hi):
            async with sem:
                entries = await self._read_window(md, ens, slot, lo, hi, mk)
                await self._write(target, md, entries)

        tasks = [asyncio.ensure_future(window(lo, min(end, lo + WINDOW - 1)))
                 for lo in range(first, end + 1, WINDOW)]
        try:
            await asyncio.gather(*tasks)
        finally:
            cancel(tasks)

    async def _read_window(self, md, ens, slot, lo, hi, mk) -> list:
        """The encoded entries of lo..hi that ensemble position ``slot`` should hold, checked,
        read from the other replicas (never from the lost bookie)."""
        scope, ledger, digest = md.ledger_id.scope_id, md.ledger_id.ledger_id, int(md.digest_type)
        out = []
        pos = lo
        if md.write_quorum == md.ensemble_size:
            # every replica holds every entry: ranged READs, from a survivor in rotation
            others = [b for i, b in enumerate(ens) if i != slot]
            for k in range(len(others)):
                b = others[(lo // WINDOW + k) % len(others)]
                while pos <= hi:          # a bookie answers at most half a frame: ask again
                    try:
                        body = await read_run(self.ctx, md, b, pos, hi - pos + 1)
                    except EmbedlogError:
                        break
                    n = arrowread.verify_run(body, scope, ledger, pos, hi, digest, mk)
                    if n == 0:
                        break
                    out += [data for _eid, data in P.parse_read_body(body)[1][:n]]
                    pos += n
        # a striped fragment (its entries are not contiguous on a bookie), or what no
        # replica returned in a run: entry by entry, a bounded number at once
        need = [e for e in range(pos, hi + 1) if slot in slots(md.ensemble_size, md.write_quorum, e)]
        sem = asyncio.Semaphore(ENTRY_READS_IN_FLIGHT)

        async def one(eid):
            async with sem:
                sources = [ens[p] for p in slots(md.ensemble_size, md.write_quorum, eid) if p != slot]
                data = await self._read_any(sources, scope, ledger, eid)
                decode_entry(data, scope, ledger, eid, digest, mk)   # copy only intact entries
                return data

        return out + list(await asyncio.gather(*(one(e) for e in need)))

    async def _read_any(self, sources, scope, ledger, eid) -> bytes:
        error: BaseException = EmbedlogError(f"no replica of entry {eid} answered")
        for b in sources:
            try:
                resp = await self.ctx.call(b, lambda rid: P.read_request(rid, scope, ledger, eid),
                                           self.ctx.config.read_timeout_s)
                entries = P.parse_read_body(resp.body)[1]
                if entries:
                    return entries[0][1]
            except EmbedlogError as exc:
                error = exc
        raise error

    async def _write(self, target, md, entries: list) -> None:
        """Recovery adds of ``entries`` to ``target``, in frames under the client's limits,
        with the ledger's term."""
        cfg = self.ctx.config
        batch, size = [], 0
        for data in entries:
            if batch and (size + len(data) + 4 > cfg.max_frame_payload_bytes
                          or len(batch) >= cfg.max_entries_per_frame):
                await self._add(target, md, batch)
                batch, size = [], 0
            batch.append(data)
            size += len(data) + 4
        if batch:
            await self._add(target, md, batch)

    async def _add(self, target, md, batch: list) -> None:
        scope, ledger, key = md.ledger_id.scope_id, md.ledger_id.ledger_id, master_key(md.password)
        await self.ctx.call(target, lambda rid: P.add_request(
            rid, scope, ledger, key, batch, P.FLAG_RECOVERY_ADD, md.term), self.ctx.config.add_timeout_s)
        self.stats["entries_copied"] += len(batch)
