"""Metadata drivers, chosen by a metadata service URI (see open_metadata_store)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from embedlog.errors import MetadataUriError
from embedlog.meta.api import MetadataStore

__all__ = ["open_metadata_store", "parse_metadata_uri", "SCHEMES"]

# scheme -> ZooKeeper ledger layout (None for the non-ZooKeeper drivers)
SCHEMES = {
    "sqlite": None,
    "zk+flat": "flat",
    "zk+hierarchical": "hierarchical",
    "zk+longhierarchical": "longhierarchical",
    "zk": "hierarchical",            # BookKeeper's plain zk:// means its default factory
    "zk+null": "hierarchical",
    "etcd": None,
}
# BookKeeper's zk:// and zk+null:// name no layout: a root is read in the layout its LAYOUT
# records, and a new one is made hierarchical (BookKeeper's default)
LAYOUT_FROM_ROOT = ("zk", "zk+null")


def _option_value(text: str):
    # query-string options are strings; the drivers' options are numbers or words
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_metadata_uri(uri: str) -> tuple[str, str, str, dict]:
    """(scheme, servers, path, options from the query string) of a metadata URI.

    ``servers`` is BookKeeper's host list (``h1:2181;h2:2181``, commas also accepted,
    returned comma-separated); ``path`` the sqlite file, ZooKeeper root or etcd prefix.
    """
    if not isinstance(uri, str) or "://" not in uri:
        raise MetadataUriError(f"not a metadata service URI: {uri!r} "
                               f"(expected e.g. sqlite:///abs/path/meta.db)")
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise MetadataUriError(f"malformed metadata service URI {uri!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise MetadataUriError(f"unknown metadata URI scheme {scheme!r} in {uri!r}; known: "
                               + ", ".join(sorted(SCHEMES)))
    servers = parts.netloc.replace(";", ",")
    for server in filter(None, servers.split(",")):
        host, sep, port = server.rpartition(":")
        if sep and (not host or not port.isdigit() or not 0 < int(port) < 65536):
            raise MetadataUriError(f"malformed server {server!r} in metadata service URI {uri!r} "
                                   f"(want HOST:PORT)")
    options = {k: _option_value(v) for k, v in parse_qsl(parts.query)}
    return scheme, servers, parts.path, options


def open_metadata_store(uri: str, *, create: bool = True, **options) -> MetadataStore:
    """Open the metadata store a URI names; ``options`` override the URI's query string.

    ``create=False`` opens only a store that exists and was initialised (its layout and
    instance id written: by a bookie, LocalCluster or `embedlog metadata format`), and
    writes nothing while opening (but BookKeeper's LAYOUT on a BookKeeper root that has none,
    as BookKeeper's own clients write it): a MetadataError naming the URI otherwise. Tools
    that only read or change ledgers, and bookies on ZooKeeper or etcd, use it, so a typo in
    a URI never makes a new store.

    - ``sqlite:///abs/path/meta.db``: :class:`embedlog.meta.sqlite.SqliteMetadataStore`
    - ``zk+flat|zk+hierarchical|zk+longhierarchical://h1:2181[;h2:2181]/root``:
      :class:`embedlog.meta.zookeeper.ZkMetadataStore` (root defaults to /ledgers);
      ``metadata_format=auto|embedlog|bookkeeper`` picks embedlog's own tree or
      BookKeeper's (auto: what the root records, a root with an INSTANCEID and no LAYOUT
      being BookKeeper's, else embedlog's). ``zk://`` and
      ``zk+null://`` take the layout the root records (a new root: hierarchical), as
      BookKeeper does.
    - ``etcd://host:2379/prefix``: :class:`embedlog.meta.etcd.EtcdMetadataStore`

    Every driver takes ``timeout_s`` (default 5): an unreachable server raises
    MetadataError within about that time. An unknown scheme raises MetadataError.
    """
    # drivers import on use: kazoo and etcd3 are heavy, and only the chosen one is needed
    scheme, servers, path, query_options = parse_metadata_uri(uri)
    opts = {**query_options, **options}
    if not scheme.startswith("zk") and opts.pop("metadata_format", "embedlog") not in ("auto", "embedlog"):
        raise MetadataUriError(f"{scheme} keeps metadata in embedlog's format only; BookKeeper's "
                               f"format is a ZooKeeper one (zk+hierarchical://...): {uri!r}")
    if scheme == "sqlite":
        if servers not in ("", "localhost"):
            raise MetadataUriError(f"sqlite URI names a host ({servers!r}); use sqlite:///abs/path")
        if not path or path == "/":
            raise MetadataUriError(f"sqlite URI without a file path: {uri!r}")
        from embedlog.meta.sqlite import SqliteMetadataStore
        return SqliteMetadataStore(path, uri=uri, create=create, **opts)
    if not servers:
        raise MetadataUriError(f"metadata URI without a server: {uri!r}")
    if scheme == "etcd":
        from embedlog.meta.etcd import EtcdMetadataStore
        return EtcdMetadataStore(servers, path or "/ledgers", uri=uri, create=create, **opts)
    from embedlog.meta.zookeeper import ZkMetadataStore
    layout = None if scheme in LAYOUT_FROM_ROOT else SCHEMES[scheme]
    return ZkMetadataStore(servers, path or "/ledgers", layout=layout, uri=uri,
                           create=create, **opts)
