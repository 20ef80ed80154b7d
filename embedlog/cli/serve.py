"""`embedlog bookie serve`: one bookie process, registered in the metadata store while it lives.

The process wires the layers together, which is why it lives with the command and not in
the wire layer: a Bookie (bookie/), its metadata store (meta/), the BookieServer (net/),
the admin HTTP server and its metrics (admin/), and autorecovery (client/).

Read-only mode is the bookie's own state, with its reasons (Bookie.set_read_only):
"operator" (--read-only, SIGUSR1 / SIGUSR2, the admin API's state/readonly) and "disk"
(the disk monitor). This process only follows it: whenever the state changes, the bookie
is registered again under its new state.
"""
from __future__ import annotations

import asyncio
import ctypes
import errno
import gc
import logging
import os
import signal
import threading
import sys

from embedlog.admin.http import AdminServer
from embedlog.admin.metrics import BookieMetrics
from embedlog.bookie import Bookie
from embedlog.client.autorecovery import AutoRecovery
from embedlog.client.context import ClientConfig, ClientContext
from embedlog.config import BookieConfig
from embedlog.errors import ConfigError
from embedlog.meta import open_metadata_store
from embedlog.net import loop as event_loop
from embedlog.net import security
from embedlog.net.server import BookieServer

log = logging.getLogger("embedlog.serve")

M_TRIM_THRESHOLD = -1            # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
LARGE_BLOCK = 1 << 20
KEPT_HEAP_TOP = 8 << 20


def keep_large_blocks_mapped() -> None:
    """glibc raises its mmap threshold to the size of every mapped block freed, so once a
    client's large frame is gone, later large frames come from the heap and stay there when
    freed (200 partial 2 MiB frames left 152 MB behind). A fixed threshold keeps blocks of
    LARGE_BLOCK or more in mappings of their own, given back when freed. Fixing it also
    fixes the heap's trim threshold at 128 KiB, which gave the top of the heap back after
    nearly every frame read, so the next frame faulted its pages in afresh (a tenth of the
    bookie loop's CPU with 1 KiB adds): KEPT_HEAP_TOP of free heap top is kept instead.
    Process-wide settings, so the serving process makes them, not the library."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)
        libc.mallopt(M_TRIM_THRESHOLD, KEPT_HEAP_TOP)
    except (OSError, AttributeError):     # not glibc: its allocator decides
        pass


async def give_back_dropped_frames(server, period_s: float = 1.0) -> None:
    """Hand the heap that partial frames held back to the system once they are gone. Their
    bytes arrive in reads of up to 256 KiB, below LARGE_BLOCK, so they come from the heap,
    and freed among live blocks they stay resident: glibc trims only the heap's top (40
    partial 4 MiB frames left the bookie 13 MiB larger for good). So when at least
    LARGE_BLOCK of partial frames went with their connections (BookieServer.
    dropped_frame_bytes) and frames still arriving hold less than that, malloc_trim(0)
    gives back the free pages throughout the heap, the kept top too: at most once a
    period; a bookie serving whole frames never calls it."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):     # not glibc: its allocator decides
        return
    seen = server.dropped_frame_bytes
    while True:
        await asyncio.sleep(period_s)
        dropped = server.dropped_frame_bytes
        if dropped - seen >= LARGE_BLOCK and server.reading_bytes < LARGE_BLOCK:
            seen = dropped
            trim(0)


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) < 65536):
        raise ConfigError(f"--listen wants HOST:PORT, got {listen!r}")
    return host or "127.0.0.1", int(port)


def make_directory(directory: str) -> str:
    """The bookie's directory, absolute, created (0700) if missing; ConfigError if it cannot
    be (a file there, no permission, a read-only file system)."""
    directory = os.path.abspath(directory)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--dir {directory}: cannot create it: {exc.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"--dir {directory}: not writable by this user")
    return directory


WILDCARDS = ("0.0.0.0", "::", "[::]", "*")


def serve(directory: str, listen: str = "127.0.0.1:3181", advertised_address: str | None = None,
          metadata_uri: str | None = None, read_only: bool = False, config: dict | None = None,
          ready_file: str | None = None, autorecovery: dict | None = None, *,
          tls_cert_file: str | None = None, tls_key_file: str | None = None,
          tls_ca_file: str | None = None, auth_token_file: str | None = None,
          parent_pid: int | None = None) -> None:
    """Run until SIGTERM or SIGINT; then leave the metadata store and close cleanly.
    With ``parent_pid``, also once that process is no longer this one's parent (it died:
    LocalCluster's bookies do not outlive their owner, however it ends).

    TLS with ``tls_cert_file`` (and ``tls_key_file``); with ``tls_ca_file`` too, clients must
    present a certificate signed by that CA. With ``auth_token_file`` every connection must
    begin with AUTH carrying that file's token (docs/SECURITY.md). Whatever stops it from
    starting (a port in use, a directory it cannot use) is a ConfigError naming it."""
    host, port = parse_listen(listen)
    if host in WILDCARDS and not advertised_address:
        # a wildcard would be registered as the address clients dial: say where they reach us
        raise ConfigError(f"--listen {listen} listens on every interface: give "
                          "--advertised-address HOST:PORT, the address clients connect to")
    bookie_config = BookieConfig.from_dict(config or {})
    security_opts = {}
    if tls_ca_file and not tls_cert_file:
        raise ConfigError("--tls-ca-file (client certificates) needs --tls-cert-file")
    if tls_cert_file:
        security_opts["ssl_context"] = security.server_context(tls_cert_file, tls_key_file, tls_ca_file)
    if auth_token_file:
        security_opts["auth_token"] = security.read_token(auth_token_file)
    # the auditor and the admin server talk to the other bookies as a client: with this
    # bookie's certificate, trusting the same CA, with the same token
    client_config = (dict(tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
                          tls_key_file=tls_key_file, auth_token_file=auth_token_file)
                     if tls_cert_file or auth_token_file else {})
    if autorecovery is not None and client_config:
        autorecovery = dict(autorecovery, client_config=client_config)
    directory = make_directory(directory)
    keep_large_blocks_mapped()
    if threading.current_thread() is threading.main_thread():
        # until the loop takes SIGTERM over, a start (a long replay, a wait for an old
        # registration) stops as on Ctrl-C, closing what it opened, instead of dying at once
        signal.signal(signal.SIGTERM, _stop_while_starting)
    # the store first: the bookie's cookie names it, and its GC lists ledgers in it. A bookie
    # makes its own SQLite store, but joins a ZooKeeper or etcd cluster that someone made
    # (as BookKeeper's bookie, which exits on a root without one): a mistyped root must not
    # start a new cluster of one bookie
    uri = metadata_uri or "sqlite://" + os.path.join(directory, "meta.db")
    meta = open_metadata_store(uri, create=uri.startswith("sqlite:"))
    try:
        try:
            bookie = Bookie(directory, bookie_config, metadata=meta)
        except OSError as exc:
            raise ConfigError(f"--dir {directory}: {exc.strerror or exc}"
                              + (f" ({exc.filename})" if exc.filename else "")) from None
    except BaseException:
        meta.close()
        raise
    try:
        if read_only:
            bookie.set_read_only("operator", True)
        event_loop.run(_run(bookie, meta, host, port, advertised_address, ready_file,
                         autorecovery, security_opts, client_config, parent_pid))
    finally:
        bookie.close()
        meta.close()


def _stop_while_starting(_signum, _frame) -> None:
    raise KeyboardInterrupt


def _quiet_cancelled(loop, context) -> None:
    """The loop's exception handler. At shutdown asyncio cancels the connections' tasks, and
    Python 3.11's streams then ask each cancelled task for its exception from a callback:
    CancelledError, logged with a traceback for every open connection. Only that is
    dropped."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


async def _stop_when_orphaned(parent_pid: int, stop: asyncio.Event) -> None:
    # the parent's death reparents this process: then stop as on SIGTERM
    while os.getppid() == parent_pid:
        await asyncio.sleep(0.2)
    log.warning("parent process %d is gone: stopping", parent_pid)
    stop.set()


async def _run(bookie, meta, host, port, advertised, ready_file, autorecovery,
               security_opts=None, client_config=None, parent_pid=None) -> None:
    metrics = BookieMetrics(bookie).count_written_entries(meta)
    server = BookieServer(bookie, host, port, **(security_opts or {}))
    metrics.watch(server)
    try:
        await server.start()
    except OSError as exc:
        what = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise ConfigError(f"--listen {host}:{port}: cannot listen: {what}") from None
    address = advertised or server.address
    # what replay and start-up built lives as long as the process: the collector's full
    # passes need not walk it again and again while adds are served
    gc.freeze()
    admin = None
    info = {"address": address, "pid": os.getpid()}
    if getattr(meta, "metadata_format", None) == "bookkeeper":
        # BookKeeper's clients connect to the bookie-rpc endpoint: the same port, which
        # tells their connections from embedlog's by their first bytes (net/bkserver.py)
        info["bookie_rpc"] = address
    if bookie.config.http_server_enabled:
        admin = AdminServer(bookie, server, meta, metrics=metrics,
                            host=bookie.config.http_server_host,
                            port=bookie.config.http_server_port, advertised_address=address,
                            client_config=client_config)
        try:
            admin.start()
        except BaseException:
            await server.stop()
            raise
        server.info["http"] = info["http"] = admin.address
        print(f"admin http://{admin.address}/status", flush=True)
        if admin.token_file is not None:
            # where the token is, not the token: an operator on this host, as this user, can
            # read it (`embedlog bookie readonly` does); anyone else needs it handed over
            info["admin_token_file"] = admin.token_file
            print(f"admin token (for changing requests) in {admin.token_file}", flush=True)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_quiet_cancelled)
    registered = {"read_only": bookie.read_only}
    meta.registration_manager.register_bookie(bookie.bookie_id, registered["read_only"], dict(info))

    def follow_state() -> None:
        # the registration follows the bookie's read-only state (whatever the reason);
        # runs on the loop, so changes are applied one at a time, the last one last
        flag = bookie.read_only
        if flag == registered["read_only"]:
            return
        # one call moves the registration in one transaction: never in neither list, and
        # watchers see one change, not a removal and an addition
        meta.registration_manager.register_bookie(bookie.bookie_id, flag, dict(info))
        registered["read_only"] = flag
        log.warning("bookie %s is %s (%s)", bookie.bookie_id, "read-only" if flag else "writable",
                    ", ".join(sorted(bookie.read_only_reasons)) or "no reason left")

    def on_state(read_only: bool, reasons) -> None:       # any thread (the disk checker)
        loop.call_soon_threadsafe(follow_state)

    bookie.read_only_listeners.append(on_state)
    stop = asyncio.Event()
    stopped_by = []

    def on_signal(sig) -> None:
        if not stopped_by:
            stopped_by.append(sig)
            log.info("bookie %s: %s, stopping", bookie.bookie_id, sig.name)
        stop.set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    # SIGUSR1 / SIGUSR2: the operator's read-only mode (the harness's set_read_only)
    loop.add_signal_handler(signal.SIGUSR1, bookie.set_read_only, "operator", True)
    loop.add_signal_handler(signal.SIGUSR2, bookie.set_read_only, "operator", False)
    if parent_pid:
        loop.create_task(_stop_when_orphaned(parent_pid, stop))
    loop.create_task(give_back_dropped_frames(server))
    follow_state()          # a change between registering and listening
    line = f"bookie {bookie.bookie_id} listening on {server.address} (advertised {address})"
    print(line, flush=True)
    log.info("%s, directory %s, metadata %s", line, bookie.directory, getattr(meta, "uri", "?"))
    if ready_file:
        tmp = ready_file + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with open(fd, "w") as f:
            os.fchmod(fd, 0o644)       # whatever the umask (000 made it 0666) or an old tmp
            f.write(f"{bookie.bookie_id} {server.address}\n")
        os.replace(tmp, ready_file)
    recovery = None
    if autorecovery is not None:
        autorecovery = dict(autorecovery)
        client_config = ClientConfig(**autorecovery.pop("client_config", {}))
        recovery = AutoRecovery(ClientContext(meta, client_config), bookie.bookie_id,
                                **autorecovery).start()
    metrics.autorecovery = recovery
    if admin is not None:
        admin.autorecovery = recovery
        admin.ready = True
    try:
        await stop.wait()
    finally:
        bookie.read_only_listeners.remove(on_state)
        if admin is not None:
            admin.shutting_down = True
            await loop.run_in_executor(None, admin.stop)
        if recovery is not None:
            await loop.run_in_executor(None, recovery.stop)
            recovery.ctx.close()
        try:
            meta.registration_manager.unregister_bookie(bookie.bookie_id, registered["read_only"])
        finally:
            await server.stop()
            metrics.written.close()
    print(f"bookie {bookie.bookie_id} stopped" + (f" ({stopped_by[0].name})" if stopped_by else ""),
          file=sys.stderr, flush=True)
