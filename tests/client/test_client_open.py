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
