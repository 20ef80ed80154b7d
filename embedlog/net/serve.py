"""`embedlog bookie serve`: one bookie process, registered in the metadata store while it lives."""
from __future__ import annotations

import asyncio
import os
import signal
import sys

from embedlog.bookie import Bookie
from embedlog.config import BookieConfig
from embedlog.meta import open_metadata_store


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) < 65536):
        from embedlog.errors import ConfigError
        raise ConfigError(f"--listen wants HOST:PORT, got {listen!r}")
    return host or "127.0.0.1", int(port)


def serve(directory: str, listen: str = "127.0.0.1:3181", advertised_address: str | None = None,
          metadata_uri: str | None = None, read_only: bool = False, config: dict | None = None,
          ready_file: str | None = None, autorecovery: dict | None = None, *,
          tls_cert_file: str | None = None, tls_key_file: str | None = None,
          tls_ca_file: str | None = None, auth_token_file: str | None = None) -> None:
    """Run until SIGTERM or SIGINT; then leave the metadata store and close cleanly.

    TLS with ``tls_cert_file`` (and ``tls_key_file``); with ``tls_ca_file`` too, clients must
    present a certificate signed by that CA. With ``auth_token_file`` every connection must
    begin with AUTH carrying that file's token (docs/SECURITY.md)."""
    from embedlog.net import security
    directory = os.path.abspath(directory)
    host, port = parse_listen(listen)
    security_opts = {}
    if tls_ca_file and not tls_cert_file:
        from embedlog.errors import ConfigError
        raise ConfigError("--tls-ca-file (client certificates) needs --tls-cert-file")
    if tls_cert_file:
        security_opts["ssl_context"] = security.server_context(tls_cert_file, tls_key_file, tls_ca_file)
    if auth_token_file:
        security_opts["auth_token"] = security.read_token(auth_token_file)
    if autorecovery is not None and (tls_cert_file or auth_token_file):
        # the auditor talks to the other bookies as a client: with this bookie's certificate,
        # trusting the same CA, with the same token
        autorecovery = dict(autorecovery, client_config=dict(
            tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
            auth_token_file=auth_token_file))
    # the store first: the bookie's cookie names it, and its GC lists ledgers in it
    meta = open_metadata_store(metadata_uri or "sqlite://" + os.path.join(directory, "meta.db"))
    try:
        bookie = Bookie(directory, BookieConfig.from_dict(config or {}), metadata=meta)
    except BaseException:
        meta.close()
        raise
    try:
        asyncio.run(_run(bookie, meta, host, port, advertised_address, read_only, ready_file,
                         autorecovery, security_opts))
    finally:
        bookie.close()
        meta.close()


async def _run(bookie, meta, host, port, advertised, read_only, ready_file, autorecovery,
               security_opts=None) -> None:
    from embedlog.admin.metrics import MeteredBookieServer
    server = MeteredBookieServer(bookie, host, port, **(security_opts or {}))
    await server.start()
    address = advertised or server.address
    admin = None
    info = {"address": address, "pid": os.getpid()}
    if bookie.config.http_server_enabled:
        from embedlog.admin.http import AdminServer
        admin = AdminServer(bookie, server, meta, host=bookie.config.http_server_host,
                            port=bookie.config.http_server_port, advertised_address=address)
        try:
            admin.start()
        except BaseException:
            await server.stop()
            raise
        server.http_address = info["http"] = admin.address
        print(f"admin http://{admin.address}/status", flush=True)
    meta.registration_manager.register_bookie(bookie.bookie_id, read_only, dict(info))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    state = {"read_only": read_only}

    def set_read_only(flag: bool) -> None:
        # SIGUSR1 / SIGUSR2: the harness's set_read_only; re-register under the other state
        if state["read_only"] == flag:
            return
        bookie.read_only = flag
        meta.registration_manager.unregister_bookie(bookie.bookie_id, state["read_only"])
        meta.registration_manager.register_bookie(bookie.bookie_id, flag, dict(info))
        state["read_only"] = flag

    # an operator's read-only mode (--read-only, SIGUSR1) holds until the operator lifts it;
    # the disks' (bookie/disks.py: full at disk_usage_threshold, writable again below the
    # low-water mark) re-registers the bookie the same way
    operator = {"read_only": read_only}

    def set_operator_read_only(flag: bool) -> None:
        operator["read_only"] = flag
        set_read_only(flag or bookie.disks.full)

    def on_disks(full: bool) -> None:
        loop.call_soon_threadsafe(set_read_only, operator["read_only"] or full)

    loop.add_signal_handler(signal.SIGUSR1, set_operator_read_only, True)
    loop.add_signal_handler(signal.SIGUSR2, set_operator_read_only, False)
    bookie.read_only = read_only
    bookie.disks.listeners[:] = [on_disks]
    if bookie.disks.full:
        set_read_only(True)
    line = f"bookie {bookie.bookie_id} listening on {server.address} (advertised {address})"
    print(line, flush=True)
    if ready_file:
        tmp = ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{bookie.bookie_id} {server.address}\n")
        os.replace(tmp, ready_file)
    recovery = None
    if autorecovery is not None:
        from embedlog.client.autorecovery import AutoRecovery
        from embedlog.client.context import ClientConfig, ClientContext
        autorecovery = dict(autorecovery)
        client_config = ClientConfig(**autorecovery.pop("client_config", {}))
        recovery = AutoRecovery(ClientContext(meta, client_config), bookie.bookie_id,
                                **autorecovery).start()
    if admin is not None:
        admin.autorecovery = server.metrics.autorecovery = recovery
        admin.ready = True
    try:
        await stop.wait()
    finally:
        if admin is not None:
            admin.shutting_down = True
            await loop.run_in_executor(None, admin.stop)
        if recovery is not None:
            await loop.run_in_executor(None, recovery.stop)
            recovery.ctx.close()
        try:
            meta.registration_manager.unregister_bookie(bookie.bookie_id, state["read_only"])
        finally:
            await server.stop()
    print(f"bookie {bookie.bookie_id} stopped", file=sys.stderr, flush=True)
