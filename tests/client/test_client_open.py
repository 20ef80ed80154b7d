"""Issue 27 item 5: a client never makes a metadata store by accident. A mistyped URI is
refused with the message the CLI gives (exit 5 there); creating a store is explicit."""
from __future__ import annotations

import asyncio

import pytest

import embedlog
import embedlog.aio
from embedlog.errors import MetadataError


def test_a_mistyped_sqlite_uri_is_refused_and_nothing_is_created(tmp_path):
    typo = f"sqlite://{tmp_path}/typo.db"
    with pytest.raises(MetadataError, match=f"no metadata store at {typo}: .* does not exist"):
        embedlog.Client(typo)
    assert not (tmp_path / "typo.db").exists()

    async def aio_client():
        async with embedlog.aio.Client(typo):
            pass
    with pytest.raises(MetadataError, match="no metadata store at"):
        asyncio.run(aio_client())
    assert not (tmp_path / "typo.db").exists()


def test_an_uninitialised_file_is_not_taken_for_a_store(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(MetadataError, match="no metadata store at"):
        embedlog.Client(f"sqlite://{empty}")
    assert empty.read_bytes() == b""


def test_creating_a_store_is_explicit(tmp_path):
    uri = f"sqlite://{tmp_path}/meta.db"
    with embedlog.Client(uri, create_metadata=True) as c:
        assert c.list_ledgers() == []
    with embedlog.Client(uri) as c:              # now it exists: opened as it is
        assert c.list_streams() == []


def test_an_unknown_client_option_is_a_config_error_naming_it(tmp_path):
    """Issue 52, beyond its list: Client(uri, bogus=1) raised a bare TypeError from
    ClientConfig (embedlog.open names an unknown key with a ConfigError); it names the
    option and the known ones, before any store is opened, from Client and aio.Client."""
    uri = f"sqlite://{tmp_path}/meta.db"
    with embedlog.Client(uri, create_metadata=True, add_timeout_s=5.0) as c:   # a known one
        assert c.context.config.add_timeout_s == 5.0
    with pytest.raises(embedlog.errors.ConfigError, match="unknown client option 'add_timeout'.*add_timeout_s"):
        embedlog.Client(uri, add_timeout=5.0)
    with pytest.raises(embedlog.errors.ConfigError, match="unknown client option 'bogus'"):
        embedlog.Client(f"sqlite://{tmp_path}/typo.db", bogus=1)       # before the store
    assert not (tmp_path / "typo.db").exists()

    async def aio_client():
        async with embedlog.aio.Client(uri, bogus=1):
            pass
    with pytest.raises(embedlog.errors.ConfigError, match="unknown client option 'bogus'"):
        asyncio.run(aio_client())
