"""The operations a request asks of the bookie, whatever protocol carried it (BookKeeper's
BookieRequestProcessor: the protocol matters when a request is decoded and when it is
answered, not in between). embedlog's protocol (net/elserver.py) and BookKeeper's v3 and v2
(net/bkserver.py) decode a request, call one of these with callbacks that encode its
answer, and nothing else; these run on the server's event loop.

- Facts before a create: a request that may create a ledger here (or carries a term, or
  finds the ledger's metadata changed) waits for one metadata read, off the loop, first
  (``with_facts``).
- Every durable answer goes one way (``when_durable``): the waits of one loop step's adds,
  fences, LACs and trims, of any protocol, gathered, synced on the loop when the journal is
  idle and its fdatasync quick (Journal.sync_if_idle) so a lone add crosses no thread,
  else handed to the journal's thread and completed back on the loop (net/completions.py).
- Adds (``add``: one entry or a run of one ledger's, the recovery and priority flags),
  fence-then (``fence_then``: fenced or the term adopted, durable, before the read),
  reads, long polls (net/longpolls.py), LACs read and written (a BookKeeper writer's
  WRITE_LAC body kept in the index header, synced before the answer), force, trim, the
  disk's figures.
- One step from an error to its status (``failed``): errors.status_of, counted.
"""
from __future__ import annotations

import asyncio
import logging
import shutil

from embedlog._native.format import LedgerId
from embedlog.errors import EmbedlogError, NoSuchEntryError, Status, status_of

log = logging.getLogger("embedlog.server")
LAST_ENTRY = -1              # the entry id of a read of the last entry the bookie holds


class RequestProcessor:
    """The bookie's operations on the server's loop. ``complete`` runs a callback on the loop
    from the journal's thread (Completions.complete); ``polls`` are the server's LongPolls;
    ``stats`` the server's counters; ``loop`` is set when the server starts (or given)."""

    def __init__(self, bookie, complete, polls, stats: dict, loop=None):
        self.bookie = bookie
        self.complete = complete
        self.polls = polls
        self.stats = stats
        self.loop = loop
        self.due: list = []              # (seq, reply) of this loop step's waits (_sync_due)
        self.due_handle = None           # the call_soon that syncs them

    # -- durable answers ---------------------------------------------------------------------

    def when_durable(self, seq: int, reply) -> None:
        """``reply(error_or_None)`` on the loop once ``seq`` is durable. Gathered until the end
        of this loop step, so the requests read together (any protocol) share a sync."""
        self.due.append((seq, reply))
        if len(self.due) == 1:
            self.due_handle = asyncio.get_running_loop().call_soon(self._sync_due)

    def sync_before_read(self, reader) -> None:
        """A connection is about to wait for its socket (``reader`` holds nothing more): when
        no other callback of this loop step is left to run (no other connection's frames
        still to come in it), its waits are synced now rather than by the call_soon of
        when_durable, one loop step (an epoll_wait and a handle) later. Those read together
        still share the sync: it waits for the last of them."""
        if self.due and not reader.has_data():
            ready = getattr(self.loop, "_ready", None)      # asyncio's loop: what is left to run
            if ready is not None and len(ready) == 1 and ready[0] is self.due_handle:
                self.due_handle.cancel()
                try:
                    self._sync_due()
                except Exception:
                    # as the loop would have had it: logged, and this connection (the adds
                    # may be another's) goes on
                    log.exception("answering a loop step's adds failed")

    def _sync_due(self) -> None:
        """The durable waits of one loop step: synced here, on the loop, when the journal is
        idle and its fdatasync quick (Journal.sync_if_idle); otherwise the journal's thread
        syncs them and completes them here."""
        due, self.due = self.due, []
        try:
            synced = self.bookie.sync_if_idle(max(seq for seq, _ in due))
        except Exception:
            synced = False          # on_durable tells each wait what became of its group
        if synced:
            for _seq, reply in due:
                reply(None)
            return
        complete = self.complete
        for seq, reply in due:
            self.bookie.on_durable(seq, lambda error, reply=reply: complete(reply, error))

    # -- facts before a create -----------------------------------------------------------------

    def with_facts(self, scope: int, ledger: int, kind: str, then, fail, *args) -> None:
        """``then(*args)`` once the ledger's facts from the metadata store are here (``kind``:
        what the request does, Bookie.needs_ledger_facts): now, or after one read of them
        off the loop. ``fail(*args, exc)`` when the id names no ledger or the read failed;
        an exception of a deferred ``then`` goes to ``fail`` too."""
        try:
            lid = LedgerId(scope, ledger)
            needs = self.bookie.needs_ledger_facts(lid, kind)
        except EmbedlogError as exc:   # an id no ledger has (scope 0, >= 2^63): a status
            fail(*args, exc)
            return
        if not needs:
            then(*args)
            return
        fut = self.loop.run_in_executor(None, self.bookie.fetch_ledger_facts, lid, kind)

        def fetched(f):
            exc = f.exception()
            if exc is not None:
                fail(*args, exc)
                return
            try:
                then(*args)
            except Exception as exc:
                fail(*args, exc)
        fut.add_done_callback(fetched)

    def has_facts(self, lid: LedgerId, kind: str = "create") -> bool:
        """The ledger's facts are here: a request of ``kind`` needs no metadata read (False
        also for an id no ledger has: with_facts answers it)."""
        try:
            return not self.bookie.needs_ledger_facts(lid, kind)
        except EmbedlogError:
            return False

    # -- writes ----------------------------------------------------------------------------

    def add(self, key, entries: list, master_key: bytes, done, *, recovery: bool = False,
            high_priority: bool = False, term: int = 0, truncate: bool = False) -> None:
        """Journal encoded ``entries`` of ledger ``key`` (scope, id): one add or a run of
        them; ``done(error_or_None)`` once durable, then the ledger's long polls are woken.
        Raises what the bookie refuses at once. ``high_priority`` (a Java recovery's adds):
        taken by a bookie the operator made read-only (Bookie._ensure_writable)."""
        seq = self.bookie.add_entries(entries, master_key, recovery=recovery, term=term,
                                      truncate=truncate, ledger=key, high_priority=high_priority)
        wake = self.polls.wake

        def durable(error):
            done(error)
            wake(key)
        self.when_durable(seq, durable)

    def fence_then(self, lid: LedgerId, master_key: bytes, then, fail,
                   term: int | None = None) -> None:
        """Fence the ledger (journalled, durable) before ``then()``, as BookKeeper's fencing
        read does; with a ``term`` (a stream's recovery read), check and adopt the term
        instead. Raises what the bookie refuses at once; ``fail(exc)`` for the rest."""
        if term is None:
            seq = self.bookie.fence(lid, master_key)
        else:
            seq = self.bookie.check_term(lid, master_key, term)

        def durable(error):
            if error is not None:
                fail(error)
                return
            try:
                then()
            except Exception as exc:
                fail(exc)
        self.when_durable(seq, durable)

    def write_lac(self, lid: LedgerId, lac: int, master_key: bytes, done, *,
                  body: bytes | None = None, term: int = 0) -> None:
        """Raise the explicit LAC; ``done(error_or_None)`` once durable, then the ledger's
        long polls are woken. A BookKeeper writer's ``body`` (its digest of the LAC) is kept
        for READ_LAC across restarts: in the index header, synced off the loop first."""
        seq = self.bookie.set_explicit_lac(lid, lac, master_key, body, term=term)
        key, wake = (lid.scope_id, lid.ledger_id), self.polls.wake

        def durable(error):
            done(error)
            wake(key)

        if body is None:
            self.when_durable(seq, durable)
            return

        def synced(f):
            exc = f.exception()
            if exc is not None:
                done(exc)
            else:
                self.when_durable(seq, durable)
        self.loop.run_in_executor(None, self.bookie.sync_ledger_header, lid).add_done_callback(synced)

    def trim(self, lid: LedgerId, master_key: bytes, term: int, first_kept: int, done) -> None:
        """A stream's retention: entries below ``first_kept`` forgotten; ``done`` when durable."""
        self.when_durable(self.bookie.trim(lid, master_key, term, first_kept), done)

    def force(self, done) -> None:
        """``done`` once everything journalled so far is durable (what FORCE_LEDGER promises a
        DEFERRED_SYNC writer)."""
        self.when_durable(self.bookie.journal.appended_seq, done)

    # -- reads -----------------------------------------------------------------------------

    def lac(self, lid: LedgerId) -> tuple[int, int]:
        """(LAC, last entry id held) of the ledger."""
        return self.bookie.last_add_confirmed(lid)

    def read_entry(self, lid: LedgerId, entry_id: int) -> bytes:
        """The stored entry (LAST_ENTRY: the last one the bookie holds)."""
        if entry_id == LAST_ENTRY:
            _lac, last = self.bookie.last_add_confirmed(lid)
            if last < 0:
                raise NoSuchEntryError(f"ledger {lid.ledger_id} has no entry on this bookie")
            entry_id = last
        return self.bookie.read_entry(lid, entry_id)

    def read_entries(self, lid: LedgerId, first: int, count: int, max_bytes: int):
        """(k, framed): up to ``count`` entries from ``first`` within ``max_bytes`` (the first
        whatever its size), framed as reader.pyx frames them."""
        return self.bookie.read_entries(lid, first, count, max_bytes)

    def read_lac(self, lid: LedgerId, with_body: bool = False):
        """(LAC, last entry id, the last entry or None, the kept WRITE_LAC body or None)."""
        lac_body = self.bookie.explicit_lac_body(lid) if with_body else None
        lac, last = self.bookie.last_add_confirmed(lid)
        last_body = self.bookie.read_entry(lid, last) if last >= 0 else None
        return lac, last, last_body, lac_body

    def long_poll(self, conn, reply, key, previous_lac: int, timeout_ms: int, answer) -> bool:
        """Wait for ledger ``key``'s LAC to pass ``previous_lac`` (LongPolls.park)."""
        return self.polls.park(conn, reply, key, previous_lac, timeout_ms, answer)

    def disk_usage(self):
        return shutil.disk_usage(self.bookie.directory)

    # -- errors ----------------------------------------------------------------------------

    def count(self, name: str) -> None:
        """One more of the server's counter ``name``."""
        self.stats[name] = self.stats.get(name, 0) + 1

    def failed(self, exc: BaseException) -> Status:
        """A request failed: counted, and its status on each protocol (errors.STATUSES)."""
        self.stats["errors"] += 1
        return status_of(exc)
