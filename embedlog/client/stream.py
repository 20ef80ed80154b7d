"""Streams: unbounded ledgers whose writers take over in turn, fenced by terms.

Seed 001 ("Tweaking the BookKeeper Protocol - Unbounded Ledgers"), as verified in TLA+:

- A stream is one ledger that never closes. Its metadata holds a term; every bookie of
  the current fragment stores the term too. Adds, recovery adds, recovery LAC reads and
  recovery reads carry the writer's term: a bookie adopts a higher term and refuses a
  lower one with InvalidTerm. Normal reads ignore terms.
- ``take_over()``: increment the term by CAS in metadata, then recover the last fragment
  under the new term: read the LAC from enough bookies ((Qw - Qa) + 1 of each write
  quorum), read forward with recovery reads, write every entry found back to its whole
  write quorum (guaranteed write quorum: all Qw must acknowledge), then write a no-op
  entry with the truncate flag to every bookie of the last fragment's ensemble (changing
  the ensemble first if one is down). A bookie that stores it forgets every entry above
  it, so no dirty entry of the old term survives: this prevents the seed's
  log-divergence counterexample. Ensemble changes made during that recovery stay in
  memory until it is done, then are written in one CAS with the term unchanged (the
  term's commit); a take-over that fails leaves the fragments as they were. Only then
  does the new leader write.
- A leader that stops cleanly (``close()``: every add acknowledged, nothing in flight)
  releases its term: it writes ``stream.released = term:last:length`` into the metadata
  by CAS. The next ``take_over()`` that finds its own term released raises the term and
  clears the mark in one CAS, and starts writing after ``last`` with no recovery and no
  no-op: the released leader wrote nothing past ``last`` (an add that failed leaves no
  release), so there is no dirty entry to truncate and no gap in the positions. A race of
  two take-overs is settled by the CAS: the loser finds no mark and recovers as usual.
- Stream positions are entry ids. Each entry's payload starts with a kind byte:
  2 = data, after the writer's append time (ms since the epoch, never going backwards
  within one writer); 1 = no-op; 3 = a link, which makes entries of a closed ledger rows
  of the stream at that one position without copying them (``append_links``); 4 = a link
  to entries that each pack many rows (embedlog.spark's ledgers); 0 = data written before
  entries had times. Readers skip no-ops, so positions have gaps where
  they stand, and read a link's rows from its ledger. ``position_at`` finds the first
  position appended at or after a time, by binary search over positions.
- Fragments roll over when they reach ``rollover_entries`` or ``rollover_bytes``, so a
  stream spreads over the cluster. Retention (``truncate_before``, or the policy given
  at creation: ``retention_ms``, ``retention_entries``) removes whole old fragments from
  the metadata and trims their entries on the bookies, so the fragment list stays
  bounded by retention / fragment size (docs/STREAMS.md).
- Streams live in their own ledger scope (STREAM_SCOPE_ID); the ledger id is a hash of
  the name (probing the next id on a collision), and the name is kept in the ledger's
  custom metadata, so streams are listed by name or pattern from the metadata store.

The entries' payloads and the rows readers get are stream_format.py's; reading, tailing
and finding positions by time, stream_read.py's.
"""
from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from embedlog._native.format import (LedgerId, digest_code, encode_entry, mac_key,
                                     master_key, parse_entry_header)
from embedlog.client.lifecycle import merge_local_fragments
from embedlog.client.recovery import backed_start, fence, read_forward, read_raw, start_length
from embedlog.client.stream_format import (KIND_DATA, KIND_LINK, KIND_NOOP, KIND_PACKED_LINK, LINK,
                                           MAX_LINK_ENTRIES, PACKED_LINK, TIME)
from embedlog.client.stream_read import StreamReading
from embedlog.client.write import WriteHandle
from embedlog.errors import (BadVersionError, EmbedlogError, IllegalOpError, InvalidTermError,
                             LedgerExistsError, LedgerRecoveryError, NoSuchLedgerError,
                             UnauthorizedAccessError)
from embedlog.meta.api import DigestType, LedgerMetadata, LedgerState, Versioned
from embedlog.net import protocol as P

if TYPE_CHECKING:
    import concurrent.futures

    from embedlog._types import Payload

STREAM_SCOPE_ID = 0x53545245414D0001       # b"STREAM" + 1: the scope every stream lives in
NAME_KEY = "stream.name"
RELEASED_KEY = "stream.released"           # term:last position:length of a clean release
LINKS_KEY = "stream.links"                 # b"1" once the stream holds a link
_POLICY = ("rollover_entries", "rollover_bytes", "retention_ms", "retention_entries")
_PROBES = 64


def _base_id(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def _check_name(name) -> str:
    if not isinstance(name, str) or not name or len(name) > 1024:
        raise IllegalOpError(f"a stream name is a non-empty string (at most 1024 characters), got {name!r}")
    return name


def find_stream(metadata, name: str):
    """The Versioned metadata of stream ``name``, or (None, first free id). An id whose
    deletion record the store keeps is not free: bookies refuse a deleted ledger id."""
    lm = metadata.ledger_manager
    base = _base_id(name)
    for k in range(_PROBES):
        lid = LedgerId(STREAM_SCOPE_ID, (base + k) % (1 << 64))
        try:
            v = lm.read_ledger_metadata(lid)
        except NoSuchLedgerError:
            if lm.ledger_deleted_at(lid) is not None:
                continue
            return None, lid
        if v.value.custom_metadata.get(NAME_KEY) == name.encode():
            return v, lid
    raise EmbedlogError(f"no free stream id for {name!r} after {_PROBES} probes")


def open_stream(ctx, name: str, *, create: bool = True, ensemble=(2, 2, 2), digest="crc32c",
                password: bytes = b"", **policy) -> "Stream":
    name = _check_name(name)
    for key in policy:
        if key not in _POLICY:
            raise IllegalOpError(f"unknown stream option {key!r}; known: {', '.join(_POLICY)}")
    lm = ctx.metadata.ledger_manager
    for _ in range(8):
        v, lid = find_stream(ctx.metadata, name)
        if v is not None:
            return Stream(ctx, name, v, password)
        if not create:
            raise NoSuchLedgerError(f"no stream named {name!r}")
        e, qw, qa = ensemble
        custom = {NAME_KEY: name.encode()}
        custom.update({f"stream.{k}": str(int(v_)).encode() for k, v_ in policy.items() if v_ is not None})
        md = LedgerMetadata(ledger_id=lid, ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                            digest_type=DigestType(digest_code(digest)), password=bytes(password),
                            fragments=((0, tuple(ctx.choose_bookies(e))),), custom_metadata=custom,
                            unbounded=True)
        md = md.with_(fragment_ctimes_ms=(md.ctime_ms,))
        try:
            return Stream(ctx, name, lm.create_ledger_metadata(md), password)
        except LedgerExistsError:
            continue                      # created by someone else meanwhile: open theirs
    raise EmbedlogError(f"could not open stream {name!r}: its id kept changing hands")


def list_streams(metadata, pattern: str | None = None) -> list:
    """Stream names (sorted), optionally those matching a glob pattern."""
    lm = metadata.ledger_manager
    names = []
    for lid in lm.iterate_ledgers(STREAM_SCOPE_ID):
        try:
            md = lm.read_ledger_metadata(lid).value
        except NoSuchLedgerError:
            continue
        name = md.custom_metadata.get(NAME_KEY, b"").decode()
        if name and (pattern is None or fnmatch.fnmatchcase(name, pattern)):
            names.append(name)
    return sorted(names)


def delete_stream(metadata, name: str) -> None:
    v, _ = find_stream(metadata, _check_name(name))
    if v is None:
        raise NoSuchLedgerError(f"no stream named {name!r}")
    metadata.ledger_manager.remove_ledger_metadata(v.value.ledger_id)


class Stream(StreamReading):
    """One stream: append as its leader, read and tail as anyone (stream_read.py)."""

    def __init__(self, ctx, name: str, versioned, password: bytes):
        self._ctx = ctx
        self.name = name
        self._md, self._version = versioned.value, versioned.version
        self.ledger_id = self._md.ledger_id
        self._password = bytes(password)
        if master_key(self._password) != master_key(self._md.password):
            raise UnauthorizedAccessError(f"wrong password for stream {name!r}")
        self._writer = None                  # a WriteHandle while this client leads
        self._lost: BaseException | None = None
        self._lock = threading.Lock()
        self._leading = threading.Lock()    # the first append's take-over, once per handle
        self._frag_entries = 0
        self._frag_bytes = 0
        self._lac = -1
        self._last_time_ms = 0               # appends never go back in time
        self._head = b""                     # produce()'s entry header, for time _head_ms
        self._head_ms = -1
        policy = self._md.custom_metadata
        self.rollover_entries = int(policy.get("stream.rollover_entries", b"0")) or None
        self.rollover_bytes = int(policy.get("stream.rollover_bytes", b"0")) or None
        self.retention_ms = int(policy.get("stream.retention_ms", b"0")) or None
        self.retention_entries = int(policy.get("stream.retention_entries", b"0")) or None

    # -- metadata -------------------------------------------------------------------------

    def refresh(self) -> LedgerMetadata:
        v = self._ctx.metadata.ledger_manager.read_ledger_metadata(self.ledger_id)
        self._md, self._version = v.value, v.version
        return self._md

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def term(self) -> int:
        return self._md.term

    @property
    def is_leader(self) -> bool:
        return self._writer is not None and self._lost is None

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        role = "leader" if self.is_leader else "reader"
        return f"Stream({self.name!r}, term {self._md.term}, {role})"

    # -- taking over ------------------------------------------------------------------------

    def take_over(self) -> int:
        """Become the writer: a new term by CAS, recovery under it, then the truncating
        no-op. Returns the position the next append gets."""
        with self._lock:
            old, self._writer = self._writer, None
            if old is not None:
                self._ctx.run(old.drain())
            for _ in range(64):
                md = self.refresh()
                released = released_position(md)
                custom = {k: v for k, v in md.custom_metadata.items() if k != RELEASED_KEY}
                try:
                    v = self._ctx.write_metadata_sync(
                        "term", md.with_(term=md.term + 1, custom_metadata=custom), self._version)
                    break
                except BadVersionError:
                    continue
            else:
                raise BadVersionError(f"could not raise the term of stream {self.name!r}")
            if old is not None:
                old.abandon(InvalidTermError(f"stream {self.name!r} moved to term {v.value.term}"))
            self._md, self._version = v.value, v.version
            if released is not None:
                # the last leader released its term cleanly: nothing to recover or truncate
                writer = WriteHandle(self._ctx, v, self._password, term=v.value.term)
                writer.promote(v, *released)
            else:
                try:
                    writer = self._ctx.run(_recover_stream(self._ctx, v, self._password))
                except InvalidTermError as exc:
                    self._lost = exc          # a later term won: stay out until asked again
                    raise
            self._md, self._version = writer.metadata, writer.version
            self._writer = writer
            self._lost = None
            if self._ctx.config.ensemble_check_interval_s > 0 and not self._ctx._local:
                self._ctx.submit(self._keep_ensemble(writer))
            self._lac = writer.last_add_confirmed
            # rollover counts the entries the last fragment holds, whoever wrote them: a
            # stream taken over often (a commit log) still rolls over and meets retention
            self._frag_entries = max(0, writer.next_entry_id - writer.metadata.fragments[-1][0])
            self._frag_bytes = 0
            return self._lac + 1

    async def _keep_ensemble(self, w) -> None:
        """While ``w`` leads, replace a bookie of its fragment that is no longer registered
        (missing at two checks in a row) by an ensemble change of its own, as a failed add
        would: an idle stream heals too, once autorecovery copies the fragment so closed."""
        interval = self._ctx.config.ensemble_check_interval_s
        missing: set = set()
        while self._writer is w and not w.is_closed:
            await asyncio.sleep(interval)
            try:
                writable, readonly = await self._ctx.offload(self._ctx.refresh_bookies)
            except EmbedlogError:
                continue                  # the store is unreachable: look again later
            alive = set(writable) | set(readonly)
            gone = {b for b in w.metadata.fragments[-1][1] if b not in alive}
            lost, missing = gone & missing, gone
            if lost and self._writer is w:
                try:
                    await w.replace_bookies(sorted(lost))
                except EmbedlogError:
                    return                # the writer failed: its appends say why

    # -- appending ------------------------------------------------------------------------

    def _leader(self):
        if self._lost is None and self._writer is None:
            with self._leading:           # threads sharing the handle take the lead once
                if self._lost is None and self._writer is None:
                    self.take_over()
        if self._lost is not None:
            raise InvalidTermError(f"stream {self.name!r}: this client lost the lead "
                                   f"({self._lost}); call take_over() to lead again")
        w = self._writer
        if w is None:                     # another thread's take_over() is under way
            raise InvalidTermError(f"stream {self.name!r}: a take-over is under way")
        return w

    def append_async(self, data: Payload) -> concurrent.futures.Future[int]:
        # one add without append_many_async's lists (the add path of a Python producer)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise IllegalOpError(f"stream entries are bytes-like, got {type(data).__name__}")
        w = self._leader()
        fut = w.append_async(KIND_DATA + TIME.pack(self._append_time_ms()) + data, self._watch)
        self._frag_entries += 1
        self._frag_bytes += len(data)
        return fut

    def produce(self, value: Payload, on_delivery: Callable[[Any, int], Any] | None = None) -> int:
        """Queue one entry and return its position at once (confluent-kafka's produce): the
        leader's WriteHandle.produce, so batches of calls travel as one ADD frame per bookie;
        ``on_delivery(error, position)`` runs in poll() or flush() once the entry is durable
        on Qa bookies. flush() before close() or a take-over: entries still queued then fail."""
        w = self._writer
        if w is None or self._lost is not None:
            w = self._leader()
        now_ms = time.time_ns() // 1_000_000
        if now_ms > self._last_time_ms:
            self._last_time_ms = now_ms        # appends never go back in time
        if self._head_ms != self._last_time_ms:
            # the entry header changes at most once a millisecond
            self._head_ms = self._last_time_ms
            self._head = KIND_DATA + TIME.pack(self._head_ms)
        pos = w.produce_after(self._head, value, on_delivery)
        self._frag_entries += 1
        self._frag_bytes += len(value)
        return pos

    def poll(self, timeout: float | None = 0) -> int:
        """Run the delivery callbacks that are due (waiting up to ``timeout`` s for one)."""
        w = self._writer
        if w is None:
            return 0
        n = w.poll(timeout)
        self._lac = max(self._lac, w.last_add_confirmed)
        return n

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every produced entry is durable or failed, running callbacks; returns
        how many are still in flight. A rollover that is due happens here."""
        w = self._writer
        if w is None:
            return 0
        left = w.flush(timeout)
        self._lac = max(self._lac, w.last_add_confirmed)
        if not left and self._lost is None:
            self._maybe_roll()
        return left

    def __len__(self) -> int:
        w = self._writer
        return len(w) if w is not None else 0

    def append_many_async(self, items: Iterable[Payload]) -> list[concurrent.futures.Future[int]]:
        items = list(items)
        for item in items:
            if not isinstance(item, (bytes, bytearray, memoryview)):
                raise IllegalOpError(f"stream entries are bytes-like, got {type(item).__name__}")
        w = self._leader()
        head = KIND_DATA + TIME.pack(self._append_time_ms())
        return self._send(w, [head + bytes(d) for d in items], sum(len(d) for d in items))

    def _append_time_ms(self) -> int:
        self._last_time_ms = max(self._last_time_ms, time.time_ns() // 1_000_000)
        return self._last_time_ms

    def _send(self, w, payloads: list, size_bytes: int) -> list:
        # adds complete in order, and all after a failed one fail: the last one tells
        futs = w.append_many_async(payloads, self._watch)
        self._frag_entries += len(payloads)
        self._frag_bytes += size_bytes
        return futs

    def _watch(self, fut) -> None:
        exc = fut.exception()
        if isinstance(exc, InvalidTermError):
            self._lost = exc
        elif fut.exception() is None:
            self._lac = max(self._lac, fut.result())

    def append(self, data: Payload) -> int:
        """Append one entry; returns its position once durable on Qa bookies."""
        pos = self._result(self.append_async(data))
        self._maybe_roll()
        return pos

    def append_many(self, items: Iterable[Payload]) -> int:
        """Append entries in order; returns the last position."""
        items = list(items)
        if not items:
            raise IllegalOpError("append_many needs at least one entry")
        last = None
        while items:
            # a rollover falls between entries: a call bigger than a fragment is split
            n = self._room(items)
            futures = self.append_many_async(items[:n])   # one call: consecutive positions
            for f in futures:
                last = self._result(f)
            self._maybe_roll()
            items = items[n:]
        return last

    def _room(self, items: list) -> int:
        """How many of ``items`` the current fragment takes before it rolls over (at least 1)."""
        n = len(items)
        if self.rollover_entries:
            n = min(n, max(1, self.rollover_entries - self._frag_entries))
        if self.rollover_bytes:
            room, k = self.rollover_bytes - self._frag_bytes, 0
            while k < n and room > 0:
                room -= len(items[k])
                k += 1
            n = max(1, k)
        return n

    def append_links(self, links, packed: bool = False) -> int:
        """Make entries of closed ledgers part of the stream without copying them: each
        ``(ledger_id, first, count)`` becomes one position whose rows are entries
        first..first + count - 1 of that ledger (readers read them from it). With
        ``packed``, each link is ``(ledger_id, first, count, rows)`` and the entries pack
        ``rows`` rows in all (embedlog.client.scan.pack_rows' format). Returns the last
        position. Each ledger must be closed, hold those entries and have the stream's
        password.

        The stream does not own a linked ledger: whoever links it deletes it once no
        reader needs it (retention has removed its position, or the stream was deleted).
        embedlog.spark does so for the ledgers its writes link."""
        links = list(links)
        if not links:
            raise IllegalOpError("append_links needs at least one link")
        key = master_key(self._password)
        checked: dict = {}
        payloads = []
        stamp = TIME.pack(self._append_time_ms())
        for link in links:
            if len(link) != (4 if packed else 3):
                raise IllegalOpError(f"a link is (ledger id, first, count{', rows' if packed else ''}), "
                                     f"got {link!r}")
            ledger_id, first, count = link[:3]
            lid = LedgerId.coerce(ledger_id)
            md = checked.get(lid)
            if md is None:
                md = checked[lid] = self._ctx.metadata.ledger_manager.read_ledger_metadata(lid).value
                if md.unbounded or md.state != LedgerState.CLOSED:
                    raise IllegalOpError(f"only a closed ledger can be linked; {lid} is not")
                if master_key(md.password) != key:
                    raise UnauthorizedAccessError(f"ledger {lid} has another password than "
                                                  f"stream {self.name!r}")
            if not (isinstance(first, int) and isinstance(count, int) and first >= 0
                    and 1 <= count <= MAX_LINK_ENTRIES and first + count - 1 <= md.last_entry_id):
                raise IllegalOpError(f"ledger {lid} has entries 0..{md.last_entry_id}; cannot link "
                                     f"{count!r} from {first!r}")
            if packed:
                if not isinstance(link[3], int) or link[3] < 0:
                    raise IllegalOpError(f"a packed link's row count is an int >= 0, got {link[3]!r}")
                payloads.append(KIND_PACKED_LINK + stamp + PACKED_LINK.pack(
                    lid.scope_id, lid.ledger_id, first, count, link[3]))
            else:
                payloads.append(KIND_LINK + stamp + LINK.pack(lid.scope_id, lid.ledger_id, first, count))
        w = self._leader()
        self._mark_links(w)
        futures = self._send(w, payloads, 0)
        last = None
        for f in futures:
            last = self._result(f)
        self._maybe_roll()
        return last

    @property
    def has_links(self) -> bool:
        """True once a link was appended (as of the metadata this handle last read)."""
        return self._md.custom_metadata.get(LINKS_KEY) == b"1"

    def _mark_links(self, w) -> None:
        """Record in the metadata, before the first link, that the stream holds links (readers
        that plan by rows read the entries of such a stream first)."""
        if w.metadata.custom_metadata.get(LINKS_KEY) == b"1":
            return
        with self._lock:
            md = w.metadata
            new = md.with_(custom_metadata={**md.custom_metadata, LINKS_KEY: b"1"})
            v = self._ctx.run(self._write_own("links", new, w.version))
            self._md, self._version = v.value, v.version

    async def _write_own(self, kind: str, md, version):
        """A metadata write of this leader's (a BadVersionError means another took over)."""
        v = await self._ctx.write_metadata(kind, md, version)
        if self._writer is not None:
            self._writer.adopt_metadata(v)
        return v

    def _result(self, fut):
        try:
            return fut.result()
        except InvalidTermError as exc:
            self._lost = exc
            raise

    def _maybe_roll(self) -> None:
        w = self._writer
        if w is None or not (self.rollover_entries and self._frag_entries >= self.rollover_entries
                             or self.rollover_bytes and self._frag_bytes >= self.rollover_bytes):
            return
        with self._lock:
            self._ctx.run(w.roll())
            self._md, self._version = w.metadata, w.version
            self._frag_entries = self._frag_bytes = 0
            self._apply_retention()

    # -- retention ------------------------------------------------------------------------------

    def _apply_retention(self) -> None:
        md = self._md
        cut = None
        now_ms = int(time.time() * 1000)
        times = md.fragment_ctimes_ms
        for k in range(1, len(md.fragments)):
            # fragment k-1 ends where k begins; it may go when it is old or far enough back
            end = md.fragments[k][0]
            old = self.retention_ms and k < len(times) and now_ms - times[k] >= self.retention_ms
            far = self.retention_entries and self._writer.next_entry_id - end >= self.retention_entries
            if old or far:
                cut = end
        if cut is not None:
            self._truncate(cut)

    def truncate_before(self, position: int) -> int:
        """Retention: forget whole fragments that end before ``position``; returns the
        first position still kept (fragments are never cut in the middle)."""
        if not isinstance(position, int) or position < 0:
            raise IllegalOpError(f"a stream position is a non-negative int, got {position!r}")
        with self._lock:
            return self._truncate(position)

    def _truncate(self, position: int) -> int:
        for _ in range(64):
            md = self.refresh() if self._writer is None else self._writer.metadata
            version = self._version if self._writer is None else self._writer.version
            frags = list(md.fragments)
            times = list(md.fragment_ctimes_ms) or [md.ctime_ms] * len(frags)
            k = 0
            while k + 1 < len(frags) and frags[k + 1][0] <= position:
                k += 1
            if k == 0:
                return md.first_entry_id
            gone = frags[:k]
            keep_from = frags[k][0]
            new = md.with_(fragments=tuple(frags[k:]), fragment_ctimes_ms=tuple(times[k:]),
                           first_entry_id=keep_from)
            try:
                v = self._ctx.run(self._write_truncation(new, version))
            except BadVersionError:
                self.refresh()
                continue
            self._md, self._version = v.value, v.version
            bookies = {b for _f, ens in gone for b in ens}
            self._ctx.run(self._trim(bookies, keep_from))
            return keep_from
        raise BadVersionError(f"could not truncate stream {self.name!r}")

    async def _write_truncation(self, md, version):
        return await self._write_own("truncate", md, version)

    async def _trim(self, bookies, first_kept: int) -> None:
        key = master_key(self._password)

        async def one(b):
            try:
                await self._ctx.call(b, lambda rid: P.trim_request(
                    rid, self.ledger_id.scope_id, self.ledger_id.ledger_id, key, first_kept,
                    self._md.term), self._ctx.config.add_timeout_s)
            except EmbedlogError:
                pass          # a bookie that is down keeps the bytes until its GC or compaction

        await asyncio.gather(*(one(b) for b in bookies))

    def close(self) -> None:
        """Stop writing (pending appends finish); the stream itself never closes. A leader
        whose every append was acknowledged releases its term, so the next writer goes on
        after its last position without a take-over's recovery and no-op."""
        w, self._writer = self._writer, None
        if w is not None and self._lost is None:
            w.flush()                     # produced entries still queued go out first
            self._ctx.run(w.drain())
            self._ctx.run(w.flush_lac())
            self._release(w)
        if w is not None:
            w.abandon(IllegalOpError(f"stream {self.name!r} was closed by this client"))

    def _release(self, w) -> None:
        if w.is_closed or w.last_add_confirmed != w.next_entry_id - 1:
            return                        # an add failed or is unanswered: the next leader recovers
        md = w.metadata
        mark = f"{md.term}:{w.last_add_confirmed}:{w.length}".encode()
        try:
            v = self._ctx.write_metadata_sync(
                "release", md.with_(custom_metadata={**md.custom_metadata, RELEASED_KEY: mark}),
                w.version)
        except EmbedlogError:
            return                        # the metadata moved (a take-over): nothing to release
        self._md, self._version = v.value, v.version


def released_position(md):
    """(last position, length) when the leader of ``md``'s term released it, else None. A
    stream still at term 0 was never led: nothing to recover, so it starts at position 0."""
    if md.term == 0:
        return -1, 0
    try:
        term, last, length = (int(x) for x in md.custom_metadata[RELEASED_KEY].split(b":"))
    except (KeyError, ValueError):
        return None
    return (last, length) if term == md.term else None


async def _recover_stream(ctx, versioned, password: bytes) -> WriteHandle:
    """Recovery at the start of a term; returns the WriteHandle the new leader writes with."""
    md, version = versioned.value, versioned.version
    term = md.term
    lid = md.ledger_id
    scope, ledger = lid.scope_id, lid.ledger_id
    key = master_key(password)
    mac = mac_key(password) if md.digest_type == DigestType.MAC else None

    # 1. the recovery LAC read carries the new term: bookies adopt it, older writers bounce
    lacs = await fence(ctx, md, lambda rid: P.read_lac_request(
        rid, scope, ledger, P.FLAG_RECOVERY_READ, key, term))
    read = lambda rid, e: P.read_request(rid, scope, ledger, e,  # noqa: E731
                                         flags=P.FLAG_RECOVERY_READ, master_key=key, term=term)
    start, start_data = await backed_start(ctx, md, lacs, read, mac)   # a LAC entries back

    # 2. read forward with recovery reads (term), 3. write back to the whole write quorum
    writer = WriteHandle(ctx, versioned, password, recovery=True, term=term)
    writer.require_write_quorum()
    writer.start_recovered_range(start, 0)
    try:
        last, length = await read_forward(ctx, md, writer, start, read, mac)
        if length is None:
            length = start_length(start, start_data)
        if length is None:
            length = 0 if last < 0 else parse_entry_header(await read_raw(ctx, md, last))[5]

        # 4. the truncating no-op, on every bookie of the last fragment's ensemble
        writer.start_recovered_range(last, length)
        noop_id = last + 1
        noop = encode_entry(scope, ledger, noop_id, last, length + 1, int(md.digest_type), KIND_NOOP, mac)
        for _ in range(ctx.config.ensemble_change_retries):
            ens = list(writer.metadata.fragments[-1][1])
            results = await asyncio.gather(*(ctx.call(b, lambda rid: P.add_request(
                rid, scope, ledger, key, [noop], P.FLAG_RECOVERY_ADD | P.FLAG_TRUNCATE, term),
                ctx.config.add_timeout_s) for b in ens), return_exceptions=True)
            for r in results:
                if isinstance(r, (InvalidTermError, UnauthorizedAccessError)):
                    raise r
            failed = [b for b, r in zip(ens, results) if isinstance(r, BaseException)]
            if not failed:
                break
            await writer.replace_bookies(failed)       # in memory, from the no-op on
        else:
            raise LedgerRecoveryError(f"could not write the truncating no-op of stream ledger {lid}")
        await ctx.offload(ctx.failpoint, "client.take_over.before_commit")

        # 5. the term's commit: the recovery's ensemble changes, with the term unchanged
        committed = Versioned(md, version)
        local = writer.local_metadata
        for _ in range(64):
            if local.fragments == md.fragments:
                break                              # nothing changed: nothing to commit
            target = merge_local_fragments(md, local, committed.value)
            if target is None:
                raise LedgerRecoveryError(f"stream ledger {lid} changed during its take-over; "
                                          "take over again")
            try:
                committed = await ctx.write_metadata("term_commit", target, committed.version)
                break
            except BadVersionError:
                committed = await ctx.read_metadata(lid)
                if committed.value.term != term:
                    raise InvalidTermError(f"stream ledger {lid} moved to term "
                                           f"{committed.value.term} during this take-over (term {term})")
        else:
            raise BadVersionError(f"could not commit the take-over of stream ledger {lid}")
    except BaseException as exc:
        writer.abandon(exc if isinstance(exc, EmbedlogError) else LedgerRecoveryError(str(exc)))
        raise
    writer.promote(committed, noop_id, length + 1)
    return writer
