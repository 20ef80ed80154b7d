"""TLS contexts and the shared token (docs/SECURITY.md). Everything here is off unless asked for."""
from __future__ import annotations

import ssl

from embedlog.errors import ConfigError


def read_token(path: str) -> bytes:
    """The shared token from a file (surrounding whitespace stripped); it must not be empty."""
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the auth token file {path!r}: {exc}") from None
    if not token:
        raise ConfigError(f"the auth token file {path!r} is empty")
    return token


def server_context(cert_file: str, key_file: str | None = None,
                   client_ca_file: str | None = None) -> ssl.SSLContext:
    """The bookie's TLS context; with ``client_ca_file`` every client must present a
    certificate signed by that CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
        if client_ca_file:
            ctx.load_verify_locations(client_ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the bookie's TLS files: {exc}") from None
    return ctx


def client_context(ca_file: str | None, cert_file: str | None = None, key_file: str | None = None,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A client's TLS context: verifies the bookie's certificate against ``ca_file`` (the
    system's CAs when None); presents ``cert_file`` when the bookie wants client certificates."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    try:
        if cert_file:
            ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the client's TLS files: {exc}") from None
    return ctx
