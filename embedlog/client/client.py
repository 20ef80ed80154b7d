"""`embedlog.Client(metadata_uri)`: ledgers replicated over bookie processes."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import TYPE_CHECKING, Any, Iterable, Optional

from embedlog import forking
from embedlog._native.format import LedgerId, digest_code, master_key
from embedlog.client.context import ClientConfig, ClientContext
from embedlog.client.read import ReadHandle
from embedlog.client.recovery import recover
from embedlog.client.stream import delete_stream, list_streams, open_stream
from embedlog.client.write import WriteHandle
from embedlog.errors import ConfigError, EmbedlogError, IllegalOpError, UnauthorizedAccessError
from embedlog.meta import open_metadata_store
from embedlog.meta.api import DigestType, LedgerMetadata, LedgerState
from embedlog.net.protocol import bookie_info_request

if TYPE_CHECKING:
    from embedlog._types import LedgerRef
    from embedlog.client.stream import Stream


async def bookie_infos(ctx, bookie_ids: Iterable[str] | None,
                       timeout_s: float) -> dict[str, Optional[dict[str, Any]]]:
    """BOOKIE_INFO of each bookie (default: every registered one), asked of all at once on
    ``ctx``'s loop: bookie id -> what it said, or None if it did not answer in time."""
    if bookie_ids is None:
        writable, readonly = await ctx.offload(ctx.refresh_bookies)
        bookie_ids = writable + readonly

    async def one(b):
        try:
            resp = await ctx.call(b, bookie_info_request, timeout_s)
            return json.loads(bytes(resp.body))
        except (EmbedlogError, ValueError, OSError):
            return None

    bookie_ids = list(bookie_ids)
    return dict(zip(bookie_ids, await asyncio.gather(*(one(b) for b in bookie_ids))))


class Client:
    """A BookKeeper client: create, open, recover and delete ledgers on the registered bookies."""

    def __init__(self, metadata_uri: str, *, faults: object = None, create_metadata: bool = False,
                 **config: Any):
        """``config``: ClientConfig's options (timeouts, TLS, ``client_name``...). ``faults``:
        a fault injector that sees every message and metadata write of this client
        (embedlog.harness.faults; LocalCluster.client() passes its own).
        The URI must name an initialised store (one a bookie, LocalCluster or `embedlog
        metadata format` made): a MetadataError naming it otherwise, as the `embedlog`
        commands say, so a mistyped URI never makes a new, empty store.
        ``create_metadata=True`` creates the store if it is missing (an explicit act)."""
        known = {f.name for f in dataclasses.fields(ClientConfig)}
        unknown = sorted(set(config) - known)
        if unknown:           # ClientConfig(**config) would raise a bare TypeError
            raise ConfigError(f"unknown client option {unknown[0]!r}; known: {', '.join(sorted(known))}")
        self.metadata_uri = metadata_uri
        self.metadata = open_metadata_store(metadata_uri, create=create_metadata)
        try:
            self._ctx = ClientContext(self.metadata, ClientConfig(**config), faults)
        except BaseException:
            self.metadata.close()
            raise
        self._closed = False
        forking.track(self)

    def _after_fork(self, gone) -> None:
        # a forked child (embedlog.forking): the metadata connection is the parent's
        self._closed = True                  # close() does nothing
        self.metadata = gone

    @property
    def context(self) -> ClientContext:
        """This client's ClientContext: its event loop thread and worker threads, and the
        bookie connections (embedlog.aio runs its coroutines and blocking steps there)."""
        return self._ctx

    def __repr__(self) -> str:
        return f"Client({self.metadata_uri!r}{', closed' if self._closed else ''})"

    def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                      digest: str = "crc32c", password: bytes | str = b"", scope_id: int = 0,
                      ledger_id: LedgerRef | None = None,
                      custom_metadata: dict[str, bytes | str] | None = None) -> WriteHandle:
        """A new ledger on ensemble_size bookies chosen from the writable ones. ``digest``:
        "crc32c" (default), "crc32", "mac" or "dummy" (no digest: a damaged copy is served as
        stored instead of failing over to another replica)."""
        if not (ensemble_size >= write_quorum >= ack_quorum >= 1):
            raise IllegalOpError(f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                                 f"{ensemble_size}, {write_quorum}, {ack_quorum}")
        code = digest_code(digest)
        password = password_bytes(password)
        custom = {k: (v.encode() if isinstance(v, str) else bytes(v))
                  for k, v in (custom_metadata or {}).items()}
        ensemble = self._ctx.choose_bookies(ensemble_size)
        if ledger_id is None:
            lid = self.metadata.id_generator.generate_ledger_id(scope_id)
        else:
            lid = LedgerId.coerce(ledger_id)
            if scope_id and lid.scope_id != scope_id:
                raise IllegalOpError(f"ledger id {lid} is not in scope {scope_id}")
        md = LedgerMetadata(ledger_id=lid, ensemble_size=ensemble_size, write_quorum=write_quorum,
                            ack_quorum=ack_quorum, digest_type=DigestType(code), password=password,
                            fragments=((0, tuple(ensemble)),), custom_metadata=custom)
        versioned = self.metadata.ledger_manager.create_ledger_metadata(md)
        return WriteHandle(self._ctx, versioned, password)

    def open_ledger(self, ledger_id: LedgerRef, password: bytes | str = b"",
                    recovery: bool = True) -> ReadHandle:
        """Open for reading; with recovery an open ledger is fenced, recovered and closed."""
        lid = LedgerId.coerce(ledger_id)
        versioned = self.metadata.ledger_manager.read_ledger_metadata(lid)
        md = versioned.value
        password = password_bytes(password)
        if master_key(password) != master_key(md.password):
            raise UnauthorizedAccessError(f"wrong password for ledger {lid}")
        if recovery and md.state != LedgerState.CLOSED:
            md = self._ctx.run(recover(self._ctx, versioned, password))
        return ReadHandle(self._ctx, md, password)

    def delete_ledger(self, ledger_id: LedgerRef) -> None:
        """Remove the ledger's metadata; bookies collect its data (garbage collection)."""
        self.metadata.ledger_manager.remove_ledger_metadata(LedgerId.coerce(ledger_id))

    def list_ledgers(self, scope_id: int | None = 0) -> list[LedgerId]:
        return list(self.metadata.ledger_manager.iterate_ledgers(scope_id))

    def ledger_metadata(self, ledger_id: LedgerRef) -> LedgerMetadata:
        return self.metadata.ledger_manager.read_ledger_metadata(LedgerId.coerce(ledger_id)).value

    # -- streams (unbounded ledgers) --------------------------------------------------------

    def open_stream(self, name: str, *, create: bool = True, ensemble_size: int = 2,
                    write_quorum: int = 2, ack_quorum: int = 2, digest: str = "crc32c",
                    password: bytes | str = b"", **policy: int | None) -> Stream:
        """The stream called ``name``, created if absent; see embedlog.client.stream.
        ``policy``: rollover_entries, rollover_bytes, retention_ms, retention_entries.
        E = Qw = Qa = 2 by default (Pulsar's default too): a stream keeps its leader, and a
        new one can take over, while a bookie is lost as long as a spare writable bookie
        outside its ensemble replaces it, so 3 bookies survive one loss (E = Qw = 3 would
        need 4)."""
        return open_stream(self._ctx, name, create=create,
                           ensemble=(ensemble_size, write_quorum, ack_quorum), digest=digest,
                           password=password_bytes(password), **policy)

    def list_streams(self, pattern: str | None = None) -> list[str]:
        return list_streams(self.metadata, pattern)

    def delete_stream(self, name: str) -> None:
        delete_stream(self.metadata, name)

    def bookies(self) -> tuple[list[str], list[str]]:
        """(writable, read-only) bookie ids."""
        return self._ctx.refresh_bookies()

    def bookie_info(self, bookie_ids: Iterable[str] | None = None,
                    timeout_s: float = 2.0) -> dict[str, Optional[dict[str, Any]]]:
        """What each bookie says of itself (BOOKIE_INFO over the wire protocol, asked of all
        at once): bookie id -> {"address", "free_bytes", "total_bytes", "ledgers",
        "add_entries", "read_entries", "read_only", "read_only_reasons", "server", ...}, or
        None for a bookie that did not answer within ``timeout_s``. ``bookie_ids``: default
        every registered bookie."""
        return self._ctx.run(self.bookie_info_async(bookie_ids, timeout_s))

    async def bookie_info_async(self, bookie_ids: Iterable[str] | None = None,
                                timeout_s: float = 2.0) -> dict[str, Optional[dict[str, Any]]]:
        """bookie_info() as a coroutine of the client's event loop (ClientContext.submit)."""
        return await bookie_infos(self._ctx, bookie_ids, timeout_s)

    def close(self) -> None:
        """Stop the client: open writers send their last LAC (best effort, briefly), then an
        add still unacknowledged fails with ClientClosedError, as BookKeeper's does with
        ClientClosedException; the ledgers stay open for a reader's recovery."""
        if self._closed:
            return
        self._closed = True
        try:
            self._ctx.close()
        finally:
            self.metadata.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def password_bytes(password: object) -> bytes:
    """A ledger password as bytes (a str is UTF-8 encoded); IllegalOpError for anything else."""
    if isinstance(password, str):
        return password.encode()
    if not isinstance(password, (bytes, bytearray, memoryview)):
        raise IllegalOpError("a ledger password is bytes")
    return bytes(password)
