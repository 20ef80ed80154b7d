"""The exact znode paths and etcd keys of docs/METADATA.md, read back with the raw clients."""

from __future__ import annotations

import uuid

import etcd3
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from embedlog._native.format import LedgerId
from embedlog.errors import MetadataError
from embedlog.meta import open_metadata_store
from embedlog.meta.api import LedgerMetadata
from embedlog.meta.bookkeeper import layout as bklayout


@pytest.fixture
def zk(zk_server):
    """A raw kazoo client chrooted at a fresh namespace, and "host:port/namespace": in a
    metadata URI the namespace becomes the first part of the root path."""
    chroot = "/c" + uuid.uuid4().hex[:10]
    admin = KazooClient(zk_server.hosts)
    admin.start(timeout=5)
    admin.ensure_path(chroot)
    admin.stop()
    admin.close()
    client = KazooClient(zk_server.hosts + chroot)
    client.start(timeout=5)
    yield client, zk_server.hosts + chroot
    client.stop()
    client.close()


@pytest.fixture
def etcd(etcd_server):
    host, port = etcd_server.endpoint.split(":")
    client = etcd3.client(host, int(port), timeout=5)
    yield client, etcd_server.endpoint, "/p" + uuid.uuid4().hex[:10]
    client.close()


def md(lid) -> LedgerMetadata:
    return LedgerMetadata(LedgerId.coerce(lid) if isinstance(lid, int) else lid, 1, 1, 1)


@pytest.mark.parametrize("layout, ledger, path", [
    ("hierarchical", 1, "/ledgers/00/0000/L0001"),
    ("hierarchical", 1234567890, "/ledgers/12/3456/L7890"),
    ("hierarchical", 2**31 - 2, "/ledgers/21/4748/L3646"),
    # at Integer.MAX_VALUE and above: the long 3-4-4-4-4 split, as BookKeeper switches
    ("hierarchical", 2**31 - 1, "/ledgers/000/0000/0021/4748/L3647"),
    ("hierarchical", 2**63 - 1, "/ledgers/922/3372/0368/5477/L5807"),
    ("flat", 1, "/ledgers/L0000000001"),
    ("flat", 2**40, "/ledgers/L1099511627776"),
    ("longhierarchical", 1, "/ledgers/000/0000/0000/0000/L0001"),
    ("longhierarchical", 1234567890123456789, "/ledgers/123/4567/8901/2345/L6789"),
])
def test_zk_ledger_paths(zk, layout, ledger, path):
    raw, hosts = zk
    with open_metadata_store(f"zk+{layout}://{hosts}/ledgers", timeout_s=5) as store:
        created = store.create_ledger_metadata(md(ledger))
        data, stat = raw.get(path)
        assert LedgerMetadata.from_bytes(data) == created.value
        assert stat.version == created.version == 0
        assert store.ledger_path(ledger) == store.root[:-len("/ledgers")] + path
        assert list(store.iterate_ledgers(0)) == [LedgerId(0, ledger)]


def test_zk_scoped_ledgers_live_in_their_own_tree(zk):
    raw, hosts = zk
    for layout in ("flat", "hierarchical", "longhierarchical"):
        with open_metadata_store(f"zk+{layout}://{hosts}/{layout}", timeout_s=5) as store:
            store.create_ledger_metadata(md(LedgerId(5, 1)))
            store.create_ledger_metadata(md(LedgerId(2**64 - 1, 2**64 - 1)))
            store.create_ledger_metadata(md(1))
            assert raw.exists(f"/{layout}/scoped/0000/0000/0000/0000/0005/0000/0000/0000/0000/L0001")
            assert raw.exists(f"/{layout}/scoped/1844/6744/0737/0955/1615/1844/6744/0737/0955/L1615")
            assert list(store.iterate_ledgers(0)) == [LedgerId(0, 1)]


def test_zk_tree_and_registration_znodes(zk):
    raw, hosts = zk
    with open_metadata_store(f"zk+hierarchical://{hosts}/ledgers", timeout_s=5) as store:
        for child in ("LAYOUT", "INSTANCEID", "available", "available/readonly", "cookies", "idgen"):
            assert raw.exists(f"/ledgers/{child}"), child
        assert raw.get("/ledgers/INSTANCEID")[0].decode() == store.instance_id
        store.register_bookie("127.0.0.1:3181", False, {"a": 1})
        data, stat = raw.get("/ledgers/available/127.0.0.1:3181")
        assert stat.ephemeralOwner != 0 and b'"a":1' in data
        store.register_bookie("127.0.0.1:3181", True)
        assert raw.exists("/ledgers/available/127.0.0.1:3181") is None
        assert raw.exists("/ledgers/available/readonly/127.0.0.1:3181").ephemeralOwner != 0
        store.write_cookie("127.0.0.1:3181", b"c")
        assert raw.get("/ledgers/cookies/127.0.0.1:3181")[0] == b"c"
    # the session ended with the store: the ephemeral znode is gone at once
    assert raw.exists("/ledgers/available/readonly/127.0.0.1:3181") is None


def test_zk_sequential_ids_and_high_order_bits(zk):
    raw, hosts = zk
    with open_metadata_store(f"zk+hierarchical://{hosts}/ledgers", timeout_s=5) as store:
        first = [store.generate_ledger_id().ledger_id for _ in range(3)]
        assert first == [first[0], first[0] + 1, first[0] + 2] and first[0] < 2**31
        # once idgen-long/ exists, ids are HOB-<high 32 bits> + a sequential low half
        raw.ensure_path("/ledgers/idgen-long/HOB-0000000005")
        lid = store.generate_ledger_id()
        assert lid.ledger_id >> 32 == 5 and lid.ledger_id & 0xFFFFFFFF == 0
        store.create_ledger_metadata(md(lid))
        digits = f"{lid.ledger_id:019d}"
        assert raw.exists(f"/ledgers/{digits[:3]}/{digits[3:7]}/{digits[7:11]}/"
                          f"{digits[11:15]}/L{digits[15:]}")
        assert store.generate_ledger_id().ledger_id == (5 << 32) | 1
        # the ids' sequence znodes are removed after use
        assert all(not c.startswith("ID-") for c in raw.get_children("/ledgers/idgen"))


def test_zk_layout_mismatch_refused(zk):
    _, hosts = zk
    with open_metadata_store(f"zk+hierarchical://{hosts}/ledgers", timeout_s=5):
        pass
    with pytest.raises(MetadataError, match="hierarchical"):
        open_metadata_store(f"zk+flat://{hosts}/ledgers", timeout_s=5)


def test_zk_uri_without_layout_takes_the_recorded_one(zk):
    """zk:// and zk+null:// name no layout: the root's LAYOUT decides (BookKeeper's meaning),
    a new root is hierarchical; a root is opened in its own format only."""
    raw, hosts = zk
    with open_metadata_store(f"zk+longhierarchical://{hosts}/ledgers", timeout_s=5):
        pass
    for scheme in ("zk", "zk+null"):
        with open_metadata_store(f"{scheme}://{hosts}/ledgers", timeout_s=5, create=False) as s:
            assert (s.layout, s.metadata_format) == ("longhierarchical", "embedlog")
    with open_metadata_store(f"zk+null://{hosts}/fresh", timeout_s=5) as s:
        assert s.layout == "hierarchical"
    with pytest.raises(MetadataError, match="embedlog's format"):
        open_metadata_store(f"zk://{hosts}/ledgers", timeout_s=5, metadata_format="bookkeeper")
    with pytest.raises(MetadataError, match="unknown metadata format"):
        open_metadata_store(f"zk://{hosts}/ledgers", timeout_s=5, metadata_format="json")
    with pytest.raises(MetadataError, match="flat"):
        open_metadata_store(f"zk+flat://{hosts}/bk", timeout_s=5, metadata_format="bookkeeper")
    assert raw.exists("/bk/LAYOUT") is None


def test_zk_a_root_bookkeeper_or_pulsar_initialised_without_a_layout_is_bookkeepers(zk):
    """Pulsar's `initialize-cluster-metadata` leaves a root with INSTANCEID and `available`
    and no LAYOUT (BookKeeper writes it lazily): it is a BookKeeper root, and opening it
    writes BookKeeper's LAYOUT, as BookKeeper's clients do, never embedlog's format."""
    raw, hosts = zk
    raw.create("/ledgers/INSTANCEID", b"c0ffee00-0000-4000-8000-000000000000", makepath=True)
    raw.ensure_path("/ledgers/available/readonly")
    with open_metadata_store(f"zk+hierarchical://{hosts}/ledgers", timeout_s=5,
                             create=False) as s:
        assert s.metadata_format == "bookkeeper"
        assert s.instance_id == "c0ffee00-0000-4000-8000-000000000000"
    assert bklayout.is_bookkeeper_layout(raw.get("/ledgers/LAYOUT")[0])
    raw.delete("/ledgers/LAYOUT")
    with pytest.raises(MetadataError, match="bookkeeper's format"):
        open_metadata_store(f"zk+hierarchical://{hosts}/ledgers", timeout_s=5,
                            metadata_format="embedlog")
    # embedlog's own format writes INSTANCEID and LAYOUT in one transaction
    with open_metadata_store(f"zk+hierarchical://{hosts}/mine", timeout_s=5) as s:
        assert s.metadata_format == "embedlog"
    assert raw.exists("/mine/INSTANCEID") and raw.exists("/mine/LAYOUT")


def test_zk_a_root_formatted_by_another_process_while_opening_stays_embedlogs(zk, monkeypatch):
    """Three processes opening one new root at once: one formats it (INSTANCEID and LAYOUT
    in one transaction) between another's reads of the two. That one must see embedlog's
    root, not a BookKeeper root without a LAYOUT (CI saw it: "BookKeeper format needs the
    hierarchical ... layout, not 'flat'"). Here the other process formats the root right
    after this one's first read of either node."""
    from embedlog.meta.zookeeper import ZkMetadataStore
    raw, hosts = zk
    uri = f"zk+flat://{hosts}/ledgers"
    formatted = []

    def after_first_read(real):
        def read(self, *args, **kwargs):
            out = real(self, *args, **kwargs)
            if not formatted:
                formatted.append(True)
                # the other process (the hook is armed only for the first store)
                with open_metadata_store(uri, timeout_s=5):
                    pass
            return out
        return read

    monkeypatch.setattr(ZkMetadataStore, "read_layout",
                        after_first_read(ZkMetadataStore.read_layout))
    monkeypatch.setattr(ZkMetadataStore, "_exists", after_first_read(ZkMetadataStore._exists))
    with open_metadata_store(uri, timeout_s=5) as store:
        assert formatted
        assert store.metadata_format == "embedlog" and store.layout == "flat"
        store.create_ledger_metadata(LedgerMetadata(LedgerId(0, 1), 1, 1, 1))
    assert raw.get("/ledgers/LAYOUT")[0].startswith(b"embedlog")


def test_zk_failed_transaction_is_reported(zk):
    """kazoo returns a failed transaction's errors instead of raising: the driver raises,
    and nothing of the transaction was applied."""
    raw, hosts = zk
    with open_metadata_store(f"zk+hierarchical://{hosts}/ledgers", timeout_s=5) as store:
        txn = store._zk.transaction()
        txn.create(store.root + "/probe", b"x")                 # would succeed alone
        txn.create(store.root + "/LAYOUT", b"x")                # exists: fails
        with pytest.raises(NodeExistsError):
            store._commit(txn, "test")
        assert raw.exists("/ledgers/probe") is None


def test_etcd_keys(etcd):
    raw, endpoint, prefix = etcd
    with open_metadata_store(f"etcd://{endpoint}{prefix}", timeout_s=5) as store:
        assert raw.get(f"{prefix}/LAYOUT")[0].startswith(b"embedlog-layout\t1\n")
        assert raw.get(f"{prefix}/INSTANCEID")[0].decode() == store.instance_id
        created = store.create_ledger_metadata(md(1))
        value, meta = raw.get(f"{prefix}/ledgers/0000000000000000001")
        assert LedgerMetadata.from_bytes(value) == created.value
        assert meta.mod_revision == created.version
        store.create_ledger_metadata(md(LedgerId(7, 2**64 - 1)))
        assert raw.get(f"{prefix}/ledgers-scoped/00000000000000000007/18446744073709551615")[0]
        # zero-padded keys sort by id
        for n in (10, 2, 2**63 - 1):
            store.create_ledger_metadata(md(n))
        keys = [m.key.decode() for _, m in raw.get_prefix(f"{prefix}/ledgers/", sort_order="ascend")]
        assert keys == [f"{prefix}/ledgers/{n:019d}" for n in (1, 2, 10, 2**63 - 1)]

        store.register_bookie("127.0.0.1:3181", False)
        _, meta = raw.get(f"{prefix}/available/readwrite/127.0.0.1:3181")
        assert meta.lease_id != 0
        store.register_bookie("127.0.0.1:3181", True)
        assert raw.get(f"{prefix}/available/readwrite/127.0.0.1:3181")[1] is None
        assert raw.get(f"{prefix}/available/readonly/127.0.0.1:3181")[1].lease_id != 0
        store.write_cookie("127.0.0.1:3181", b"c")
        assert raw.get(f"{prefix}/cookies/127.0.0.1:3181")[0] == b"c"

        lid = store.generate_ledger_id()
        bucket = lid.ledger_id >> 56
        counter, _ = raw.get(f"{prefix}/IDGEN/{bucket:03d}")
        assert int(counter) == lid.ledger_id & ((1 << 56) - 1)
    # close revokes the lease
    assert raw.get(f"{prefix}/available/readonly/127.0.0.1:3181")[1] is None
