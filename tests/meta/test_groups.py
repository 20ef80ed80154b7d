"""Consumer groups' records (meta/api.py's ConsumerGroupStore) on every driver: create,
compare-and-set, remove, list; ids that are not path-safe; CAS under racing writers from
two connections (client/group.py's update_group); BookKeeper's format on ZooKeeper keeps
them under embedlog's private folder."""
import concurrent.futures

import pytest

from embedlog.client import group as G
from embedlog.errors import BadVersionError, IllegalOpError


def test_group_records(backend):
    store = backend.open()
    groups = store.consumer_groups
    assert groups.read_group("billing") is None and groups.list_groups() == []
    v0 = groups.write_group("billing", b"one")
    with pytest.raises(BadVersionError):
        groups.write_group("billing", b"again")                  # exists: needs its version
    v1 = groups.write_group("billing", b"two", v0.version)
    with pytest.raises(BadVersionError):
        groups.write_group("billing", b"stale", v0.version)
    assert groups.read_group("billing") == v1
    with pytest.raises(BadVersionError):
        groups.remove_group("billing", v0.version)
    assert groups.remove_group("billing", v1.version) is True
    assert groups.read_group("billing") is None
    assert groups.remove_group("billing") is False
    with pytest.raises(BadVersionError):
        groups.write_group("billing", b"gone", v1.version)      # absent: no version matches


def test_group_ids_that_are_not_path_safe(backend):
    groups = backend.open().consumer_groups
    ids = ["a/b", "50%", "spark-kafka-source-1f2e/3", "ünïcode group", ".", ".."]
    for gid in ids:
        groups.write_group(gid, gid.encode())
    assert groups.list_groups() == sorted(ids)
    other = backend.open().consumer_groups                        # another connection sees them
    assert [other.read_group(g).value for g in ids] == [g.encode() for g in ids]
    for bad in ("", "x" * 256, "tab\there", None):
        with pytest.raises(IllegalOpError):
            groups.write_group(bad, b"")


def test_racing_updates_lose_nothing(backend):
    """Eight writers on two connections add to one record 25 times each by update_group's
    compare-and-set loop: every add lands."""
    stores = [backend.open(), backend.open()]

    def add(k):
        for _ in range(25):
            def change(rec):
                rec["committed"]["s"] = {"position": rec["committed"].get("s", {"position": 0})["position"] + 1}
                return rec
            G.update_group(stores[k % 2], "race", change)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(add, range(8)))
    rec, _ = G.read_group(stores[0], "race")
    assert rec["committed"]["s"]["position"] == 200
