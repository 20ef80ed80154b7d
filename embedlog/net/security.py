"""TLS contexts and the shared token (docs/SECURITY.md). Everything here is off unless asked for."""
from __future__ import annotations

import os
import ssl
import stat

from embedlog.errors import ConfigError


MIN_TOKEN_BYTES = 16        # a shorter shared secret is guessable
MAX_TOKEN_BYTES = 1024      # it travels in every connection's first frame


def read_token(path: str) -> bytes:
    """The shared token from a file (surrounding whitespace stripped). The file must be
    readable by its owner only, and the token 16 to 1024 bytes long."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            token = f.read(MAX_TOKEN_BYTES + 2).strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the auth token file {path!r}: {exc}") from None
    if mode & 0o077:
        raise ConfigError(f"the auth token file {path!r} is readable by others "
                          f"(mode {stat.S_IMODE(mode):o}); chmod 600 it")
    if not MIN_TOKEN_BYTES <= len(token) <= MAX_TOKEN_BYTES:
        raise ConfigError(f"the auth token in {path!r} is {len(token)} bytes; use "
                          f"{MIN_TOKEN_BYTES} to {MAX_TOKEN_BYTES} (for example: "
                          "python -c 'import secrets; print(secrets.token_hex(32))')")
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
