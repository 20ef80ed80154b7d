"""The embedded log: one process, one bookie, SQLite metadata, no sockets.

``embedlog.open(path)`` wires a Bookie on ``path``, a metadata store in
``path/meta.db`` and a client with E = Qw = Qa = 1. Ledgers follow
BookKeeper's rules: a single writer appends, an add is acknowledged once its
journal record is durable and every lower entry is, the LAC travels in each
entry, and opening an OPEN ledger with recovery fences it and closes it at its
last durable entry.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from embedlog._native.format import LedgerId, digest_code, mac_key, master_key, parse_entry_header
from embedlog._native.journal_kernels import chunk_end, payload_count
from embedlog.bookie import Bookie
from embedlog.bookie.bookie import MAX_BOUNDED_ENTRY_ID
from embedlog.bookie.snapshot import BookieSnapshot
from embedlog.client.client import password_bytes
from embedlog.client.context import ClientConfig, ClientContext
from embedlog.client.lifecycle import begin_recovery, close_ledger, close_recovered
from embedlog.client.read import ReadHandle as Tailing
from embedlog.client.scan import binary_array
from embedlog.client.stream import delete_stream, find_stream, list_streams, open_stream
from embedlog.client.inflight import AddFuture
from embedlog.client.producer import Producer, limits as producer_limits
from embedlog.config import BookieConfig
from embedlog.errors import (ClientClosedError, EmbedlogError, IllegalOpError, LedgerClosedError,
                             LogDirectoryError, NoSuchEntryError, NoSuchLedgerError,
                             ReadOnlyBookieError, UnauthorizedAccessError)
from embedlog.fileio import file_in_the_way, private_dir
from embedlog import forking
from embedlog.meta import open_metadata_store
from embedlog.meta.api import DigestType, LedgerMetadata, LedgerState, Versioned
from embedlog.net.server import BookieServer
from embedlog.net.transport import InProcessConnection

if TYPE_CHECKING:
    from embedlog._types import LedgerRef, Payload, Stop
    from embedlog.client.read import LedgerEntry as TailEntry
    from embedlog.client.stream import Stream

_CHUNK_BYTES = 8 << 20        # bound on what one append_many frames before a sync
_LOG_NAMES = {"LOCK", "current", "journal", "meta.db"}     # what a log directory holds


def _log_dir(path, read_only: bool) -> str:
    """The absolute log directory ``path`` names; LogDirectoryError if it cannot be one."""
    raw = os.fspath(path)
    if not raw:
        raise LogDirectoryError("embedlog.open needs a directory path, got an empty one")
    where = os.path.abspath(raw)
    if os.path.exists(where) and not os.path.isdir(where):
        raise LogDirectoryError(f"{where} is a file, not a log directory")
    blocker = file_in_the_way(where)
    if blocker is not None:
        raise LogDirectoryError(f"{where} cannot be a log directory: {blocker} is a file, "
                                f"not a directory")
    try:
        names = set(os.listdir(where)) if os.path.isdir(where) else set()
    except OSError as exc:
        raise LogDirectoryError(f"{where}: cannot list it ({exc.strerror})") from None
    if names and not names & _LOG_NAMES:
        raise LogDirectoryError(f"{where} is not empty and holds no log ({len(names)} other "
                                f"entries, such as {min(names)!r}): give a new or empty directory")
    if read_only and "current" not in names:
        raise LogDirectoryError(f"{where} holds no log to read")
    return where


class LedgerEntry:
    """One entry read back: ``entry_id`` and ``data`` (bytes)."""
    __slots__ = ("ledger_id", "entry_id", "data")

    def __init__(self, ledger_id: LedgerId, entry_id: int, data: bytes):
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.data = data

    def __repr__(self):
        return f"LedgerEntry(entry_id={self.entry_id}, {len(self.data)} bytes)"


class EmbeddedLog:
    """An embedded, durable log in one directory; a context manager."""

    def __init__(self, path: str | os.PathLike[str], *, metadata_uri: str | None = None,
                 journal_dir: str | None = None, read_only: bool = False, **config: Any):
        self.path = _log_dir(path, read_only)
        self.read_only = bool(read_only)
        self.config = BookieConfig.from_dict(config)
        uri = metadata_uri or "sqlite://" + os.path.join(self.path, "meta.db")
        self._journal_dir = journal_dir
        try:
            if read_only:
                # no LOCK, nothing written: a view of what the writer has made durable
                self.metadata = open_metadata_store(uri, create=False)
            else:
                private_dir(self.path)
                # the store first: the bookie's cookie names it, and its GC lists ledgers in it
                self.metadata = open_metadata_store(uri)
            try:
                self.bookie = (BookieSnapshot(self.path, self.config, journal_dir) if read_only
                               else Bookie(self.path, self.config, journal_dir=journal_dir,
                                           metadata=self.metadata))
            except BaseException:
                self.metadata.close()
                raise
        except PermissionError as exc:
            raise LogDirectoryError(
                f"{self.path}: {exc.strerror} ({exc.filename or self.path}); a log another user "
                "writes can be read with read_only=True") from None
        except NotADirectoryError as exc:          # a journal or ledger directory below a file
            raise LogDirectoryError(f"{self.path}: {exc.filename} is a file, not a directory "
                                    f"(the log's directories are made there)") from None
        self._closed = False
        self._forked = None              # in a forked child: what the parent owns (forking.Gone)
        self._handles: set = set()
        self._ctx = None                 # client context for streams, made on first use
        forking.track(self)

    def _after_fork(self, gone) -> None:
        # a forked child: the bookie, its journal and threads and the metadata connection
        # are the parent's; every use raises, close() does nothing (embedlog.forking)
        self._closed = True
        self._forked = gone
        self.bookie = self.metadata = gone
        self._ctx = None                 # the context is tracked too and refuses on its own

    # -- ledgers -------------------------------------------------------------------

    def create_ledger(self, digest: str = "crc32c", password: bytes | str = b"",
                      scope_id: int = 0) -> WriteHandle:
        """A new ledger. ``digest``: "crc32c" (default), "crc32", "mac" (HMAC-SHA1 keyed by the
        password) or "dummy": no digest at all, so a damaged entry is served exactly as
        stored (the entry logs' block checksums, checked by the shell's
        localconsistencycheck, are then the only way to find it)."""
        self._check_writable()
        code = digest_code(digest)
        password = password_bytes(password)
        lid = self.metadata.id_generator.generate_ledger_id(scope_id)
        while self.bookie.has_ledger(lid) or self.bookie.was_deleted(lid):
            # the bookie holds an earlier ledger of this id: the metadata went back in time
            lid = self.metadata.id_generator.generate_ledger_id(scope_id)
        md = LedgerMetadata(ledger_id=lid, ensemble_size=1, write_quorum=1, ack_quorum=1,
                            digest_type=DigestType(code), password=password,
                            fragments=((0, (self.bookie.bookie_id,)),))
        versioned = self.metadata.ledger_manager.create_ledger_metadata(md)
        handle = WriteHandle(self, versioned.value, versioned.version)
        self._handles.add(handle)
        forking.track(handle)
        return handle

    def open_ledger(self, ledger_id: LedgerRef, password: bytes | str = b"",
                    recovery: bool = True) -> ReadHandle:
        """Open for reading; with recovery, an OPEN ledger is fenced and closed first.
        Read-only (``read_only=True``): never recovered; the handle reads what the writer
        had made durable when it was opened (an OPEN ledger up to its LAC)."""
        self._check_open()
        lid = LedgerId.coerce(ledger_id)
        versioned = self.metadata.ledger_manager.read_ledger_metadata(lid)
        md = versioned.value
        if master_key(password_bytes(password)) != master_key(md.password):
            raise UnauthorizedAccessError(f"wrong password for ledger {lid}")
        recover = recovery and not self.read_only and md.state != LedgerState.CLOSED
        kind = "fence" if recover else "read"
        # as the server does before a request: data held under this id is served (or fenced)
        # only once facts no older than a watch or FACTS_RECHECK_S say it is this ledger's
        # (its id may have been used again; a restart starts with no facts), and facts of
        # another ctime than md's are stale (a watch event still on ZooKeeper's thread)
        if self.bookie.needs_ledger_facts(lid, kind, md.ctime_ms):
            self.bookie.fetch_ledger_facts(lid, kind)
        if recover and self.bookie.has_ledger(lid):
            self.bookie.is_fenced(lid)      # NoSuchLedgerError for another incarnation's data,
            #                                 before recovery writes the metadata
        if self.read_only:
            # a view taken after the metadata was read holds every entry it covers
            self.refresh()
        elif recover:
            md = self._recover(lid, versioned)
        handle = ReadHandle(self, md)
        forking.track(handle)
        return handle

    def _recover(self, lid: LedgerId, versioned) -> LedgerMetadata:
        """Fence the ledger on its bookie and close it at its last durable entry."""
        lm = self.metadata.ledger_manager
        v = begin_recovery(versioned, self._write_metadata, lm.read_ledger_metadata)
        md = v.value
        if md.state == LedgerState.CLOSED:
            return md
        last, length = -1, 0
        if self.bookie.has_ledger(lid):
            self.bookie.wait_durable(self.bookie.fence(lid, master_key(md.password)))
            self.bookie.wait_all_durable()     # everything framed so far
            last = self.bookie.last_recoverable_entry(lid)
            if last >= 0:
                length = parse_entry_header(self.bookie.read_entry(lid, last))[5]
        return close_recovered(md, md, v.version, last, length, self._write_metadata,
                               lm.read_ledger_metadata)

    def _write_metadata(self, _kind, md, version):
        return self.metadata.ledger_manager.write_ledger_metadata(md, version)

    def delete_ledger(self, ledger_id: LedgerRef) -> None:
        self._check_writable()
        lid = LedgerId.coerce(ledger_id)
        self.metadata.ledger_manager.remove_ledger_metadata(lid)
        if self.bookie.has_ledger(lid):
            try:
                self.bookie.delete_ledger(lid)
            except NoSuchLedgerError:
                pass                # garbage collection found it gone first

    def append_many_ledgers(self, batches: Iterable[tuple[WriteHandle, Iterable[Payload]]]) -> list[int]:
        """Append to several ledgers, all made durable by one group commit.

        ``batches``: (WriteHandle, entries) pairs; each handle's entries are appended in
        order, and one fdatasync covers them all (BookKeeper's journal shares its syncs
        between ledgers; this lets one caller ask for it). Returns the last entry id of
        each batch, in order. If a batch cannot be appended (a closed handle, an entry that
        is not bytes), the batches before it are still made durable and acknowledged, and
        the error is raised."""
        self._check_writable()
        framed, error = [], None
        for handle, items in batches:
            if not isinstance(handle, WriteHandle) or handle._log is not self:
                error = IllegalOpError(f"not a writer of this log: {handle!r}")
                break
            items = items if isinstance(items, list) else list(items)
            if not items:
                error = IllegalOpError("append_many_ledgers needs at least one entry per ledger")
                break
            try:
                framed.append((handle,) + handle._add(items))
            except EmbedlogError as exc:
                error = exc
                break
        out = []
        if framed:
            try:
                self.bookie.wait_durable(max(seq for _h, seq, _last in framed))
            except EmbedlogError as exc:
                for handle, _seq, _last in framed:
                    handle._broken = handle._broken or exc
                raise
            for handle, _seq, last in framed:
                try:
                    out.append(handle._deliver(last))
                except LedgerClosedError as exc:      # closed meanwhile: the others still count
                    error = error or exc
        if error is not None:
            raise error
        return out

    def list_ledgers(self, scope_id: int = 0) -> list[LedgerId]:
        self._check_open()
        return list(self.metadata.ledger_manager.iterate_ledgers(scope_id))

    def ledger_metadata(self, ledger_id: LedgerRef) -> LedgerMetadata:
        return self.metadata.ledger_manager.read_ledger_metadata(LedgerId.coerce(ledger_id)).value

    def statistics(self) -> dict[str, Any]:
        return self.bookie.statistics()

    # -- streams (unbounded ledgers on this one bookie) -------------------------------

    def client_context(self) -> ClientContext:
        """The ClientContext this log's streams run on (made on first use): an event loop
        thread and worker threads, with this bookie reached in process, without a socket.
        embedlog.aio runs this log's coroutines and blocking steps there."""
        self._check_writable("streams and tails")
        return self._stream_ctx()

    def _stream_ctx(self):
        # streams run the same client and bookie code as a cluster, over an in-process
        # transport to this bookie (no socket), with E = Qw = Qa = 1
        if self._ctx is None:
            ctx = ClientContext(self.metadata, ClientConfig())
            server = BookieServer(self.bookie, loop=ctx.loop)
            ctx.add_local_bookie(self.bookie.bookie_id, InProcessConnection(server))
            self._ctx = ctx
        return self._ctx

    def open_stream(self, name: str, *, create: bool = True, digest: str = "crc32c",
                    password: bytes | str = b"", **policy: int | None) -> Stream:
        """The stream called ``name`` (created if absent); see embedlog.client.stream."""
        self._check_writable("streams")
        return open_stream(self._stream_ctx(), name, create=create, ensemble=(1, 1, 1),
                           digest=digest, password=password_bytes(password), **policy)

    def list_streams(self, pattern: str | None = None) -> list[str]:
        return list_streams(self.metadata, pattern)

    def delete_stream(self, name: str) -> None:
        self._check_writable()
        v, _ = find_stream(self.metadata, name)
        delete_stream(self.metadata, name)
        if v is not None and self.bookie.has_ledger(v.value.ledger_id):
            self.bookie.delete_ledger(v.value.ledger_id)

    # -- lifecycle ---------------------------------------------------------------------

    def _check_open(self):
        if self._closed:
            if self._forked is not None:
                raise self._forked.error()
            raise ClientClosedError("the embedded log is closed")

    def _check_writable(self, what: str = "writes") -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyBookieError(f"{self.path} is open read-only (read_only=True): "
                                      f"{what} need the writer's open")

    def refresh(self) -> None:
        """Read-only: take a new view of what the writer has made durable (open_ledger
        does); handles opened before go on reading the view they were opened on."""
        self._check_open()
        if self.read_only:
            self.bookie = BookieSnapshot(self.path, self.config, self._journal_dir)

    def close(self) -> None:
        if self._closed:           # in a forked child too: nothing here is the child's
            return
        self._closed = True
        try:
            for handle in list(self._handles):
                handle._stop_flusher()
            if self._ctx is not None:
                self._ctx.close()
            self.bookie.close()
        finally:
            self.metadata.close()

    def __enter__(self) -> EmbeddedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EmbeddedLog({self.path!r}{', closed' if self._closed else ''})"


class WriteHandle:
    """The single writer of one ledger. Every add is durable when it returns (or its future completes).

    Framing takes the handle lock, so entry ids follow journal order; an add is
    acknowledged (its id returned, its future completed) once its journal record is
    durable, through ``_deliver``, which never acknowledges past the point a close fixed.
    """

    def __init__(self, log: EmbeddedLog, md: LedgerMetadata, version: object):
        self._log = log
        self._bookie = log.bookie
        self._md = md
        self._version = version
        self.ledger_id = md.ledger_id
        self._key = (md.ledger_id.scope_id, md.ledger_id.ledger_id)
        # the bookie's entries a failed journal group took back, read after each sync
        self._lost_adds = log.bookie.descriptors.lost_adds
        self._digest = int(md.digest_type)
        self._mac_key = mac_key(md.password) if md.digest_type == DigestType.MAC else None
        self._master_key = master_key(md.password)
        self._lock = threading.Lock()          # framing, and close against framing
        self._ack_lock = threading.Lock()      # acknowledgements against the close point
        self._next_entry_id = 0
        self._length = 0
        self._lac = -1
        self._closed = False
        self._forked = False                   # in a forked child: close() does nothing
        self._close_point: int | None = None   # the last entry id a close covers
        self._broken: BaseException | None = None   # an add failed: nothing more is acked
        self._prod: Producer | None = None     # produce()'s queue and flusher, made on first use
        self._producer_options = producer_limits()
        # produced messages framed per journal add: an eighth of the journal's memory bound,
        # so produce() is pushed back by it as one-at-a-time adds were (8 MiB at the default)
        self._take_bytes = max(64 << 10, min(_CHUNK_BYTES,
                                             log.bookie.config.journal_max_memory_size_mb << 17))
        self._flusher: threading.Thread | None = None
        self._wake = threading.Lock()          # released by the queue's kick: the flusher looks
        self._stopping = False

    def _after_fork(self, gone) -> None:
        # a forked child (embedlog.forking): adds raise ForkedProcessError from the bookie's
        # stand-in; fresh locks, as a parent thread may have held one at the fork
        self._bookie = gone
        self._forked = True
        self._lock, self._ack_lock = threading.Lock(), threading.Lock()
        # the queue, its messages and the flusher thread are the parent's
        self._prod = None
        self.produce = self.poll = self.flush = self.append_async = gone.refuse()

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._length

    def _add(self, payloads: list):
        """Frame payloads under the handle lock so entry ids follow journal order.

        A long list goes in chunks of at most _CHUNK_BYTES, each made durable before
        the next is framed, so the journal buffer stays bounded whatever the caller passes.
        """
        with self._lock:
            if self._closed:
                raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
            if self._broken is not None:
                # an entry that failed leaves a hole a later one must not be acked across
                raise LedgerClosedError(f"ledger {self.ledger_id}: an earlier add failed "
                                        f"({self._broken}); close it and write to a new ledger")
            start, total = 0, len(payloads)
            if self._prod is not None:
                # messages produced before this call go first: ids follow journal order
                self._reserve_locked(self._prod, total)
            while True:
                end = chunk_end(payloads, start, _CHUNK_BYTES)
                chunk = payloads if (start, end) == (0, total) else payloads[start:end]
                first = self._next_entry_id
                seq, self._length = self._frame(first, chunk)
                self._next_entry_id = first + len(chunk)
                if end >= total:
                    return seq, self._next_entry_id - 1
                self._wait(seq)
                self._deliver(self._next_entry_id - 1)
                start = end

    def _frame(self, first: int, payloads):
        try:
            return self._bookie.add_payloads(self._key, self._master_key, first, self._lac,
                                             self._length, self._digest, self._mac_key, payloads)
        except BaseException as exc:
            if getattr(exc, "entries_framed", 0):
                # part of the batch is in the journal under these ids: none may be reused,
                # so the handle takes no more adds (an earlier add failed)
                self._next_entry_id = first + exc.entries_framed
                self._broken = self._broken or exc
            raise

    def _deliver(self, last: int) -> int:
        """Acknowledge entries up to ``last`` (durable; durability comes in journal order,
        so every lower entry is durable too), unless a close fixed an earlier last entry."""
        with self._ack_lock:
            if self._close_point is not None and last > self._close_point:
                raise LedgerClosedError(f"ledger {self.ledger_id} was closed at entry "
                                        f"{self._close_point} before entry {last} was acknowledged")
            # a group that failed took back an earlier entry: a later group's sync must not
            # acknowledge across that hole (async adds, or threads sharing the handle, have
            # several groups in flight; the failed add's own waiter may not have woken yet)
            lost = self._lost_adds.get(self._key) if self._lost_adds else None
            if lost is not None and last >= lost:
                exc = LedgerClosedError(f"ledger {self.ledger_id}: entry {lost} was not written "
                                        f"(its journal group failed), so entry {last} is not "
                                        f"acknowledged; close the ledger and write to a new one")
                self._broken = self._broken or exc
                raise exc
            if last > self._lac:
                self._lac = last
        return last

    def _wait(self, seq: int) -> None:
        try:
            self._bookie.wait_durable(seq)
        except EmbedlogError as exc:
            self._broken = self._broken or exc
            raise

    def append(self, data: Payload) -> int:
        """Append one entry; returns its entry id once it is durable."""
        seq, last = self._add([data])
        self._wait(seq)
        return self._deliver(last)

    def append_many(self, items: Iterable[Payload]) -> int:
        """Append entries in order; returns the last entry id once all are durable."""
        items = items if isinstance(items, list) else list(items)
        if not items:
            raise IllegalOpError("append_many needs at least one entry")
        seq, last = self._add(items)
        self._wait(seq)
        return self._deliver(last)

    def append_async(self, data: Payload) -> concurrent.futures.Future[int]:
        """Append one entry; the future completes with its entry id once durable. The
        message goes through produce()'s queue (one batch framed for many calls); only
        the future is made per call."""
        fut = AddFuture()
        self._prod.add_future(self.produce(data), fut) if self._prod is not None else \
            self._first_future(data, fut)
        return fut

    def _first_future(self, data, fut) -> None:
        eid = self.produce(data)
        self._prod.add_future(eid, fut)

    # -- the producer (confluent-kafka's produce / poll / flush) -----------------------------

    def configure_producer(self, **options: Any) -> None:
        """Limits of produce()'s queue, before the first produce() or append_async():
        ``queue_buffering_max_messages`` (default 100,000), ``queue_buffering_max_kbytes``
        (default 1 GiB) or ``queue_buffering_max_bytes``, and ``block``: when either is
        reached, produce() raises BufferError (False, the default) or waits for room (True)."""
        opts = producer_limits(**options)
        with self._lock:
            if self._prod is not None:
                raise IllegalOpError("configure_producer comes before the first produce()")
            self._producer_options = opts

    def produce(self, value: Payload, on_delivery: Callable[[Any, int], Any] | None = None) -> int:
        """Queue one entry and return its entry id at once (confluent-kafka's produce).

        The entry is durable, and acknowledged in id order, once its batch's journal group
        is synced; ``on_delivery(error, entry_id)`` then runs in the thread that calls
        poll() or flush() (error None when durable; after a failed group, the same error
        for every entry from the first lost one on). The value is copied: a bytearray may
        change once this returns. BufferError when the queue is full (configure_producer)."""
        p = self._prod
        if p is None:
            p = self._start_producer()
        try:
            eid = p.queue.add(value)
        except BufferError:
            if not p.block:
                raise
            eid = p.full(value, self._check_producing)
        if self._closed or self._broken is not None:
            self._refuse_staged(p)          # a close or a failure came first: not delivered
        if on_delivery is not None:
            p.room_for_callback()
            p.callbacks.append((eid, on_delivery))
        return eid

    def poll(self, timeout: float | None = 0) -> int:
        """Run the delivery callbacks that are due, waiting up to ``timeout`` s for one;
        returns how many ran (confluent-kafka's poll)."""
        return self._prod.poll(timeout) if self._prod is not None else 0

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every produced entry is durable or failed, running callbacks; returns
        how many are still in flight (0 unless ``timeout`` s ran out)."""
        return self._prod.flush(timeout) if self._prod is not None else 0

    def __len__(self) -> int:
        """Entries produced and not yet durable or failed."""
        return len(self._prod) if self._prod is not None else 0

    def _check_producing(self) -> None:
        if self._closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if self._broken is not None:
            raise LedgerClosedError(f"ledger {self.ledger_id}: an earlier add failed "
                                    f"({self._broken}); close it and write to a new ledger")

    def _start_producer(self) -> Producer:
        with self._lock:
            self._check_producing()
            if self._prod is None:
                self._wake.acquire()          # held: the flusher sleeps on it until a kick
                self._prod = Producer(self._next_entry_id, self._log.config.max_entry_size_bytes,
                                      self._wake.release, MAX_BOUNDED_ENTRY_ID,
                                      self._producer_options)
                self._flusher = threading.Thread(target=self._flush_loop, args=(self._prod,),
                                                 name=f"embedlog-produce-{self.ledger_id}",
                                                 daemon=True)
                self._flusher.start()
            return self._prod

    def _refuse_staged(self, p: Producer) -> None:
        with self._lock:
            first, count, nbytes = p.queue.discard()
            if count:
                error = self._broken or LedgerClosedError(f"ledger {self.ledger_id} is closed")
                p.settle(first, first + count - 1, 0, 0, error)     # discard freed them
        self._check_producing()

    def _flush_loop(self, p: Producer) -> None:
        """The flusher: wakes at a kick and frames everything staged, a batch per journal
        add of at most _take_bytes, until nothing is; then sleeps until the next kick."""
        wake = self._wake
        while True:
            wake.acquire()
            while True:
                with self._lock:
                    got = p.queue.take_packed(self._take_bytes, True)
                    if got is None:
                        break
                    self._frame_batch(p, got)
            if self._stopping:
                return

    def _frame_batch(self, p: Producer, got) -> None:
        """Journal one taken batch (handle lock held); its range settles when durable."""
        first, payloads, nbytes = got
        count = payload_count(payloads)
        last = first + count - 1
        if self._closed or self._broken is not None:
            p.settle(first, last, count, nbytes,
                     self._broken or LedgerClosedError(f"ledger {self.ledger_id} is closed"))
            return
        try:
            seq, self._length = self._frame(first, payloads)
        except BaseException as exc:
            self._broken = self._broken or exc
            p.settle(first, last, count, nbytes, exc)
            return
        self._next_entry_id = last + 1
        self._bookie.on_durable(seq, _RangeDelivery(self, p, first, last, count, nbytes))

    def _reserve_locked(self, p: Producer, total: int) -> None:
        while (first := p.queue.reserve(total)) < 0:
            self._frame_batch(p, p.queue.take_packed(self._take_bytes))
        p.skip(first, first + total - 1)
        if self._broken is not None:
            self._check_producing()

    def _stop_flusher(self) -> None:
        self._stopping = True
        if self._prod is not None:
            self._prod.queue.wake()
        t = self._flusher
        if t is not None and t is not threading.current_thread():
            t.join()

    def close(self) -> None:
        """Close the ledger in metadata at its last acknowledged entry.

        Entries already framed are waited for (one group commit) and covered; if the journal
        failed, the close covers what was acknowledged and the rest fail with LedgerClosedError."""
        if self._forked:                       # the parent's ledger: the child closes nothing
            return
        with self._lock:                       # nothing is framed from here on
            if self._closed:
                return
            p = self._prod
            while p is not None and p.queue.staged:     # produced before the close: covered
                self._frame_batch(p, p.queue.take_packed(self._take_bytes))
            self._closed = True
            framed = self._next_entry_id - 1
            try:
                self._bookie.wait_all_durable()
                durable = True
            except EmbedlogError:
                durable = False
            with self._ack_lock:
                # after a failed add, entries framed past it are not durable in the journal
                if durable and framed > self._lac and self._broken is None and \
                        self._lost_adds.get(self._key) is None:
                    self._lac = framed
                last = self._close_point = self._lac
            v = close_ledger(Versioned(self._md, self._version), last, self._length_at(last),
                             self._log._write_metadata,
                             self._log.metadata.ledger_manager.read_ledger_metadata)
            self._md, self._version = v.value, v.version
        self._stop_flusher()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"WriteHandle({self.ledger_id!r}, {state}, last_add_confirmed={self._lac})"

    def _length_at(self, last: int) -> int:
        if last == self._next_entry_id - 1:
            return self._length
        return parse_entry_header(self._bookie.read_entry(self.ledger_id, last))[5] if last >= 0 else 0

    def __enter__(self) -> WriteHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RangeDelivery:
    """Settles one produced batch, entries first..last, once the journal has made it
    durable (called with the error or None): one object per batch, not per entry."""
    __slots__ = ("handle", "producer", "first", "last", "count", "nbytes")

    def __init__(self, handle: WriteHandle, producer: Producer, first: int, last: int,
                 count: int, nbytes: int):
        self.handle, self.producer = handle, producer
        self.first, self.last, self.count, self.nbytes = first, last, count, nbytes

    def __call__(self, error) -> None:
        if error is None:
            try:
                self.handle._deliver(self.last)
            except LedgerClosedError as exc:
                error = exc
        else:
            self.handle._broken = self.handle._broken or error
        self.producer.settle(self.first, self.last, self.count, self.nbytes, error)


class ReadHandle:
    """Reads of one ledger, up to its LAC (or last entry, once closed)."""

    def __init__(self, log: EmbeddedLog, md: LedgerMetadata):
        self._log = log
        self._bookie = log.bookie
        self._md = md
        self.ledger_id = md.ledger_id
        self._digest = int(md.digest_type)
        self._mac_key = mac_key(md.password) if md.digest_type == DigestType.MAC else None
        self._reader = None
        self._lac = -1
        self._lac = md.last_entry_id if md.state == LedgerState.CLOSED else self.read_lac()
        self._bind_reader()

    def _after_fork(self, gone) -> None:
        # a forked child (embedlog.forking): every read raises ForkedProcessError
        self._bookie = gone
        self._reader = None
        self.read_entry = self.read_batch = self.read_arrays = gone.refuse()

    def _bind_reader(self) -> None:
        # read_entry and read_batch go straight to the Cython reader (no Python frame
        # per call: this is the hot path); without entries on the bookie they stay methods
        if self._reader is None and self._bookie.has_ledger(self.ledger_id):
            self._reader = self._bookie.reader(self.ledger_id, self._digest, self._mac_key, self._lac)
            self.read_entry = self._reader.read_entry
            self.read_batch = self._reader.read_batch
        if self._reader is not None:
            self._reader.lac = self._lac

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._md.length

    @property
    def is_closed(self) -> bool:
        return self._md.state == LedgerState.CLOSED

    def read_lac(self) -> int:
        """The LAC as a reader learns it: from the last stored entry and the explicit LAC."""
        if self._md.state == LedgerState.CLOSED:
            return self._md.last_entry_id
        if self._bookie.has_ledger(self.ledger_id):
            last = self._bookie.read_last_entry_id(self.ledger_id)
            lac = self._bookie.get_explicit_lac(self.ledger_id)
            if last >= 0:
                lac = max(lac, self._bookie.carried_lac(self.ledger_id, last))
            self._lac = max(self._lac, lac)
            self._bind_reader()
        return self._lac

    def _check_range(self, first: int, last: int) -> None:
        if not isinstance(first, int) or not isinstance(last, int):
            raise IllegalOpError("entry ids are integers")
        if first < 0 or last < first:
            raise IllegalOpError(f"bad entry range {first}..{last}")
        if last > self._lac:
            raise NoSuchEntryError(
                f"entry {last} of ledger {self.ledger_id} is past the LAC ({self._lac})")

    def read_entry(self, entry_id: int) -> bytes:
        """The payload of one entry (bytes)."""
        self._check_range(entry_id, entry_id)
        raise NoSuchEntryError(f"no entry {entry_id} in ledger {self.ledger_id}")

    def read_batch(self, first: int, last: int) -> list[bytes]:
        """Payloads of first..last inclusive: the fast scan path."""
        self._check_range(first, last)
        raise NoSuchEntryError(f"no entries in ledger {self.ledger_id}")

    def read_arrays(self, first: int, last: int) -> tuple[Any, Any]:
        """(offsets int32[n + 1], values uint8[m]) of the payloads of first..last inclusive,
        numpy arrays: every digest checked, each payload copied once, no Python object per
        entry (the scan path for columnar consumers)."""
        if self._reader is None:
            self._check_range(first, last)
            raise NoSuchEntryError(f"no entries in ledger {self.ledger_id}")
        return self._reader.read_arrays(first, last)

    def read_arrow(self, first: int, last: int) -> Any:
        """The payloads of first..last inclusive as one pyarrow.BinaryArray over
        read_arrays' buffers (no copy). Needs pyarrow (the ``spark`` extra)."""
        return binary_array(*self.read_arrays(first, last))

    def read(self, first: int, last: int, batch_size: int = 4096) -> Iterator[LedgerEntry]:
        """Yield LedgerEntry objects for first..last inclusive."""
        self._check_range(first, last)
        lid = self.ledger_id
        pos = first
        while pos <= last:
            end = min(last, pos + batch_size - 1)
            for i, data in enumerate(self.read_batch(pos, end)):
                yield LedgerEntry(lid, pos + i, data)
            pos = end + 1

    def tail(self, start: int = 0, poll_timeout_ms: int = 200, stop: Stop = None) -> Iterator[TailEntry]:
        """Yield entries from ``start`` on as the writer's LAC passes them (the client's
        tail over the in-process connection to this bookie); ends when the ledger is
        closed and read to its end, or when ``stop()`` is true. The LAC travels in the
        writer's next entry: its last entry shows once it writes another or closes."""
        reader = Tailing(self._log.client_context(), self._log.ledger_metadata(self.ledger_id),
                         self._md.password)
        yield from reader.tail(start, poll_timeout_ms, stop)

    def __repr__(self) -> str:
        state = "CLOSED" if self.is_closed else "OPEN"
        return f"ReadHandle({self.ledger_id!r}, {state}, last_add_confirmed={self._lac})"

    def close(self) -> None:
        pass

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
