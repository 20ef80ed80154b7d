"""embedlog's metadata on a ZooKeeper root shared with Apache BookKeeper (issue 28 item 2),
against the real 4.17.2 and 4.16.6 jars.

- golden blobs our own runs of BookKeeper made (tools/make_bookkeeper_goldens.py) decode
  to what BookKeeper's getters said and re-encode byte for byte; unknown fields survive;
- a root embedlog formats is BookKeeper's initnewcluster's, a Java bookie starts on it and
  BookieShell reads what embedlog wrote there (ledgers, registrations); a root
  initnewcluster formatted opens in embedlog;
- embedlog and BookKeeper's client create ledgers at once, hierarchical and
  long-hierarchical, and their ids never collide;
- what BookKeeper's format cannot carry is refused, and embedlog's own records stay out
  of BookKeeper's tree.

Per version one ZooKeeper root of each kind and one Java bookie; BookieShell commands run
batched in one JVM. Under CI=true a missing java, jar or ZooKeeper fails.
"""
from __future__ import annotations

import base64
import json
import os
import random
import re
import threading
import uuid
from types import SimpleNamespace

import pytest
from kazoo.client import KazooClient

from embedlog._native.format import LedgerId
from embedlog.errors import LedgerExistsError, MetadataError
from embedlog.harness.peers import bkmeta, jars
from embedlog.meta import open_metadata_store
from embedlog.meta.api import DigestType, LedgerMetadata, LedgerState
from embedlog.meta.bookkeeper import ledger_metadata as bkmd
from embedlog.meta.bookkeeper import protobuf as pb
from embedlog.meta.bookkeeper import textformat as tf
from embedlog.meta.bookkeeper.cookie import Cookie
from embedlog.meta.bookkeeper.layout import ledger_levels
from support.servers import ServerMissing, require_peer, skip_unless_ci

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "bookkeeper")
HIERARCHICAL = b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
LONG_HIERARCHICAL = b"2\norg.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1"
FAKE_BOOKIE = "127.0.0.1:9"          # registered by embedlog; nothing listens there
HOB = 7                              # the high half the long-hierarchical race starts at


def goldens() -> list:
    out = []
    for version in jars.BOOKKEEPER_VERSIONS:
        with open(os.path.join(FIXTURES, version, "manifest.json")) as f:
            out += [pytest.param(version, name, m, id=f"{version}-{name}")
                    for name, m in sorted(json.load(f).items())]
    return out


def golden_blob(version: str, name: str) -> bytes:
    with open(os.path.join(FIXTURES, version, name + ".bin"), "rb") as f:
        return f.read()


# ---- the golden blobs: no server needed ---------------------------------------------------

@pytest.mark.parametrize("version, name, m", goldens())
def test_golden_decodes_to_bookkeepers_fields_and_reencodes_byte_for_byte(version, name, m):
    blob = golden_blob(version, name)
    lid = LedgerId(0, m["ledger_id"])
    # BookKeeper's getters report the znode's ctime when the record holds none: passing
    # that as the znode's time, ctime_ms must match either way
    md = bkmd.decode(blob, lid, m["ctime"])
    assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == \
        (m["ensemble_size"], m["write_quorum"], m["ack_quorum"])
    assert md.state.name == m["state"]
    assert md.digest_type.name == m["digest_type"] and md.password.hex() == m["password"]
    assert md.ctime_ms == m["ctime"]
    assert (bkmd.ctoken_of(md) or 0) == m["ctoken"]
    assert {k: v.hex() for k, v in md.custom_metadata.items()} == m["custom_metadata"]
    assert [[first, list(bookies)] for first, bookies in md.fragments] == m["ensembles"]
    assert md.preserved.format_version == m["format_version"]
    if md.state == LedgerState.CLOSED:          # BookKeeper reports them for closed ledgers only
        assert (md.last_entry_id, md.length) == (m["last_entry_id"], m["length"])
    assert "/".join(ledger_levels("hierarchical", m["ledger_id"])) == m["path"]
    assert bkmd.encode(md) == blob


def _with_unknown_fields(blob: bytes) -> tuple[bytes, bytes, bytes]:
    """``blob`` with two unknown top-level fields and one in its first segment, as a newer
    BookKeeper might write them; also returns those fields' bytes."""
    _, at = bkmd.read_header(blob)
    message, _ = pb.read_delimited(blob, at)
    top = pb.tag(99, pb.VARINT) + pb.encode_varint(123456789) + \
        pb.tag(100, pb.LEN) + pb.encode_varint(6) + b"future"
    in_segment = pb.tag(15, pb.LEN) + pb.encode_varint(4) + b"rack"
    w, done = pb.Writer(), False
    for f in pb.parse(message):
        if f.number == bkmd.SEGMENT and not done:
            w.data(bkmd.SEGMENT, f.data + in_segment)
            done = True
        else:
            w.raw(f.raw)
    return blob[:at] + pb.delimited(w.raw(top).getvalue()), top, in_segment


@pytest.mark.parametrize("version", jars.BOOKKEEPER_VERSIONS)
def test_unknown_fields_and_ctoken_survive_a_rewrite(version):
    blob, top, in_segment = _with_unknown_fields(golden_blob(version, "open_crc32c_custom"))
    md = bkmd.decode(blob, LedgerId(0, 1), 0)
    token = bkmd.ctoken_of(md)
    assert token
    closed = md.with_(state=LedgerState.CLOSED, last_entry_id=0, length=5)
    again = bkmd.encode(closed)
    assert top in again and in_segment in again
    back = bkmd.decode(again, LedgerId(0, 1), 0)
    assert back.state == LedgerState.CLOSED and bkmd.ctoken_of(back) == token
    assert bkmd.encode(back) == again


def test_what_bookkeeper_cannot_carry_is_refused_by_the_codec():
    base = LedgerMetadata(LedgerId(0, 5), 1, 1, 1, fragments=((0, ("127.0.0.1:1",)),))
    for bad, why in [(base.with_(ledger_id=LedgerId(3, 5)), "scope 3"),
                     (base.with_(unbounded=True, term=2), "unbounded"),
                     (base.with_(first_entry_id=10), "retention"),
                     (base.with_(fragments=((4, ("127.0.0.1:1",)),)), "entry 0")]:
        with pytest.raises(MetadataError, match=why):
            bkmd.encode(bad)
    for damaged in [b"BookieMetadataFormatVersion\t1\n2\n", b"BookieMetadataFormatVersion\t3\n\x05\x08",
                    b"embedlog-ledger-metadata\t1\n{}", b"BookieMetadataFormatVersion\t3\n\x02\x08\x01"]:
        with pytest.raises(MetadataError):
            bkmd.decode(damaged, LedgerId(0, 1), 0)


def test_damaged_records_raise_metadata_error_only():
    """Seeded mutations of every golden (binary and text): each read either succeeds or
    raises MetadataError, and what it reads encodes or is refused with MetadataError."""
    rnd = random.Random(28)
    blobs = [golden_blob(v, n) for v in jars.BOOKKEEPER_VERSIONS
             for n in ("open_crc32c_custom", "three_segments_closed_ctime", "v2_text_closed")]
    alphabet = b'\\"{}:#\n 0123456789xabnt-\x80\xff\x08\x12\x1a'
    for _ in range(3000):
        b = bytearray(rnd.choice(blobs))
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(b) + 1)
            if rnd.random() < 0.5 and at < len(b):
                b[at] = rnd.choice(alphabet) if rnd.random() < 0.5 else rnd.randrange(256)
            elif rnd.random() < 0.3:
                del b[at:]
            else:
                b.insert(at, rnd.choice(alphabet))
        try:
            bkmd.encode(bkmd.decode(bytes(b), LedgerId(0, 1), 0))
        except MetadataError:
            pass


def test_text_format_strings_round_trip_any_bytes():
    rnd = random.Random(2)
    for _ in range(2000):
        data = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 24)))
        text = tf.Printer().string("f", data).begin("m").scalar("n", -rnd.randrange(1 << 63)).end()
        assert tf.parse(text.getvalue())[0] == ("f", data)


# ---- live: Java bookies, BookieShell and BookKeeper's client ------------------------------

def _store(zk_hosts: str, root: str, scheme: str = "zk+hierarchical", **options):
    return open_metadata_store(f"{scheme}://{zk_hosts}{root}", timeout_s=10, **options)


@pytest.fixture(scope="module", params=jars.BOOKKEEPER_VERSIONS)
def bk(request, zk):
    """Per version: /emb formatted by embedlog in BookKeeper's format with one Java bookie
    on it, and /long formatted by embedlog as BookKeeper's long-hierarchical layout
    (/java, formatted by BookieShell initnewcluster, comes with the ``shell`` fixture)."""
    from embedlog.harness.peers.bookkeeper import BookKeeperCluster   # after the jar check below
    version = request.param
    require_peer(f"bookkeeper-{version}")
    tag = version.replace(".", "")
    ns = SimpleNamespace(version=version, hosts=zk.hosts, emb=f"/emb{tag}", java=f"/java{tag}",
                         long=f"/long{tag}", cluster=None, stores=[])
    ns.raw = KazooClient(zk.hosts)
    ns.raw.start(timeout=10)
    try:
        ns.store = _store(zk.hosts, ns.emb, metadata_format="bookkeeper")
        ns.stores.append(ns.store)
        ns.long_store = _store(zk.hosts, ns.long, "zk+longhierarchical",
                               metadata_format="bookkeeper")
        ns.stores.append(ns.long_store)
        try:
            ns.cluster = BookKeeperCluster(version, bookies=1, zk_hosts=zk.hosts, root=ns.emb,
                                           format=False)
        except ServerMissing as exc:
            skip_unless_ci(str(exc))
        ns.java_conf = os.path.join(ns.cluster.dir, "java-root.conf")
        with open(ns.java_conf, "w") as f:
            f.write(f"metadataServiceUri=zk+hierarchical://{zk.hosts}{ns.java}\nzkTimeout=10000\n")
        yield ns
    finally:
        for s in ns.stores:
            s.close()
        if ns.cluster is not None:
            ns.cluster.close()
        ns.raw.stop()
        ns.raw.close()


def test_embedlog_formats_a_root_as_initnewcluster_does(bk, shell):
    for root in (bk.emb, bk.java):
        children = set(bk.raw.get_children(root))
        assert {"LAYOUT", "INSTANCEID", "available"} <= children, (root, children)
        assert bk.raw.exists(f"{root}/available/readonly")
        uuid.UUID(bk.raw.get(f"{root}/INSTANCEID")[0].decode())
    assert bk.raw.get(f"{bk.emb}/LAYOUT")[0] == bk.raw.get(f"{bk.java}/LAYOUT")[0] == HIERARCHICAL
    assert bk.raw.get(f"{bk.long}/LAYOUT")[0] == LONG_HIERARCHICAL
    # nothing of embedlog's own tree on a BookKeeper root
    for name in ("underreplication", "deleted", "scoped", "idgen-scoped"):
        assert bk.raw.exists(f"{bk.emb}/{name}") is None, name


def test_a_root_initnewcluster_formatted_opens_in_embedlog(bk, shell):
    for scheme in ("zk", "zk+null", "zk+hierarchical"):
        with _store(bk.hosts, bk.java, scheme, create=False) as s:
            assert (s.metadata_format, s.layout) == ("bookkeeper", "hierarchical")
            assert s.instance_id == bk.raw.get(f"{bk.java}/INSTANCEID")[0].decode()
            assert list(s.iterate_ledgers()) == []
    with _store(bk.hosts, bk.long, "zk", create=False) as s:
        assert (s.metadata_format, s.layout) == ("bookkeeper", "longhierarchical")
    with pytest.raises(MetadataError, match="longhierarchical"):
        _store(bk.hosts, bk.long, "zk+hierarchical", create=False)
    with pytest.raises(MetadataError, match="bookkeeper's format"):
        _store(bk.hosts, bk.java, metadata_format="embedlog")
    emb_own = f"/own{bk.version.replace('.', '')}"
    _store(bk.hosts, emb_own).close()          # embedlog's own format
    with pytest.raises(MetadataError, match="embedlog's format"):
        _store(bk.hosts, emb_own, metadata_format="bookkeeper")


def test_java_bookie_registration_and_cookie_read_by_embedlog(bk):
    java_id = bk.cluster.bookie_ids[0]
    regs = {r.bookie_id: r for r in bk.store.get_all_bookies()}
    assert java_id in regs
    info = regs[java_id].info
    assert info["protocol"] == "bookkeeper" and info["address"] == java_id
    assert [e["protocol"] for e in info["endpoints"]] == ["bookie-rpc"]
    raw = bk.raw.get(f"{bk.emb}/cookies/{java_id}")[0]
    cookie = Cookie.from_bytes(raw)
    assert cookie.bookie_id == java_id and cookie.instance_id == bk.store.instance_id
    assert cookie.to_bytes() == raw
    # the store hands bookie cookies to embedlog as its own record (a Java bookie that is
    # down shows in `embedlog bookie list`), and writes embedlog's in BookKeeper's format
    from embedlog.bookie.cookies import Cookie as EmbedlogCookie
    mine = EmbedlogCookie.from_bytes(bytes(bk.store.read_cookie(java_id).value), "java's")
    assert (mine.bookie_id, mine.instance_id) == (java_id, cookie.instance_id)
    assert mine.ledger_dirs and mine.journal_dir
    ours = EmbedlogCookie("bookie-cookie-format", bk.store.instance_id, "journal", (".", "/d2"))
    v = bk.store.write_cookie(ours.bookie_id, ours.to_bytes())
    written = Cookie.from_bytes(bk.raw.get(f"{bk.emb}/cookies/{ours.bookie_id}")[0])
    assert (written.bookie_id, written.journal_dirs, written.ledger_dirs, written.instance_id) == (
        ours.bookie_id, "journal", "2\t.\t/d2", ours.instance_id)
    assert EmbedlogCookie.from_bytes(bytes(bk.store.read_cookie(ours.bookie_id).value), "") == ours
    bk.store.remove_cookie(ours.bookie_id, v.version)


def _embedlog_ledgers(store, bookie: str) -> dict[str, LedgerMetadata]:
    """Ledgers embedlog writes for BookieShell to read, by kind."""
    ens = (bookie,)
    made = {}
    lid = store.generate_ledger_id()
    made["open"] = store.create_ledger_metadata(LedgerMetadata(
        lid, 1, 1, 1, DigestType.CRC32C, b"pw", fragments=((0, ens),),
        custom_metadata={"app": b"embedlog", "bin": b"\x00\xff"})).value
    lid = store.generate_ledger_id()
    v = store.create_ledger_metadata(LedgerMetadata(lid, 1, 1, 1, DigestType.MAC, b"secret",
                                                    fragments=((0, ens),)))
    made["closed"] = store.write_ledger_metadata(v.value.with_(
        state=LedgerState.CLOSED, last_entry_id=41, length=1234,
        fragments=((0, ens), (20, (FAKE_BOOKIE,)))), v.version).value
    lid = LedgerId(0, (1 << 40) + 3)                      # the long tree of hierarchical
    v = store.create_ledger_metadata(LedgerMetadata(lid, 1, 1, 1, DigestType.CRC32,
                                                    fragments=((0, ens),)))
    made["recovering"] = store.write_ledger_metadata(
        v.value.with_(state=LedgerState.IN_RECOVERY), v.version).value
    return made


@pytest.fixture(scope="module")
def shell(bk):
    """What BookieShell says of a root embedlog formatted and wrote to, one JVM."""
    store = bk.store
    made = _embedlog_ledgers(store, bk.cluster.bookie_ids[0])
    # a golden record with unknown fields, written by "a newer BookKeeper", closed by embedlog
    blob, top, in_segment = _with_unknown_fields(golden_blob(bk.version, "open_crc32c_custom"))
    future = store.generate_ledger_id()
    bk.raw.create(store.ledger_path(future), blob, makepath=True)
    v = store.read_ledger_metadata(future)
    store.write_ledger_metadata(v.value.with_(state=LedgerState.CLOSED, last_entry_id=0,
                                              length=5), v.version)
    made["future"] = store.read_ledger_metadata(future).value
    store.register_bookie(FAKE_BOOKIE, True, {"address": "127.0.0.1:10", "pid": os.getpid()})
    ids = {kind: md.ledger_id.ledger_id for kind, md in made.items()}
    commands = [["@" + bk.java_conf, "initnewcluster"]] + [
        ["ledgermetadata", "-l", ids[k]] for k in made] + [
        ["listbookies", "-rw"], ["listbookies", "-ro"], ["listledgers"],
        ["simpletest", "-e", 1, "-w", 1, "-a", 1, "-n", 5]]
    results = bkmeta.shell_batch(bk.version, bk.cluster.client_conf_path, commands)
    out = dict(zip(["initnewcluster"] + [f"meta:{k}" for k in made] +
                   ["rw", "ro", "ledgers", "simpletest"], results))
    assert out["initnewcluster"][0] == 0, out["initnewcluster"]
    raw_future = bk.raw.get(store.ledger_path(future))[0]
    yield SimpleNamespace(made=made, out=out, raw_future=raw_future, top=top,
                          in_segment=in_segment)
    store.unregister_bookie(FAKE_BOOKIE, True)


def _printed(output: str) -> dict:
    line = next(x for x in output.splitlines() if "LedgerMetadata{" in x)
    body = line[line.index("LedgerMetadata{") + len("LedgerMetadata{"):-1]
    fields = dict(re.findall(r"(\w+)=([^,{]*(?:\{[^}]*\})?)", body))
    return fields


def test_bookieshell_reads_metadata_embedlog_wrote(bk, shell):
    for kind, md in shell.made.items():
        rc, output = shell.out[f"meta:{kind}"]
        assert rc == 0, output
        p = _printed(output)
        assert p["formatVersion"] == "3"
        assert (p["ensembleSize"], p["writeQuorumSize"], p["ackQuorumSize"]) == \
            (str(md.ensemble_size), str(md.write_quorum), str(md.ack_quorum)), p
        assert p["state"] == md.state.name and p["digestType"] == md.digest_type.name
        if md.state == LedgerState.CLOSED:
            assert (p["lastEntryId"], p["length"]) == (str(md.last_entry_id), str(md.length))
        ensembles = "{" + ", ".join(f"{first}=[{', '.join(bookies)}]"
                                    for first, bookies in md.fragments) + "}"
        assert p["ensembles"] == ensembles, p
        assert p["password"] == "base64:" + base64.b64encode(md.password).decode()
    custom = _printed(shell.out["meta:open"][1])["customMetadata"]
    assert "app=base64:ZW1iZWRsb2c=" in custom and "bin=base64:AP8=" in custom


def test_unknown_fields_survive_embedlogs_rewrite_on_zookeeper(shell):
    assert shell.top in shell.raw_future and shell.in_segment in shell.raw_future
    assert shell.made["future"].state == LedgerState.CLOSED
    assert bkmd.ctoken_of(shell.made["future"])


def test_java_bookie_and_bookieshell_accept_the_root_embedlog_formatted(bk, shell):
    rc, rw = shell.out["rw"]
    assert rc == 0 and bk.cluster.bookie_ids[0] in rw, rw
    rc, ro = shell.out["ro"]
    assert rc == 0 and FAKE_BOOKIE in ro, ro          # embedlog's registration body parses
    rc, out = shell.out["simpletest"]
    assert rc == 0 and "5 entries written" in out, out
    rc, listed = shell.out["ledgers"]
    ids = {int(x) for x in re.findall(r"ledgerID: (\d+)", listed)}
    assert {md.ledger_id.ledger_id for md in shell.made.values()} <= ids, listed


def test_embedlog_registration_carries_both_endpoints(bk, shell):
    reg = {r.bookie_id: r for r in bk.store.get_readonly_bookies()}[FAKE_BOOKIE]
    assert reg.info["protocol"] == "embedlog" and reg.info["address"] == "127.0.0.1:10"
    assert reg.info["pid"] == os.getpid()
    assert {(e["protocol"], e["port"]) for e in reg.info["endpoints"]} == \
        {("bookie-rpc", 9), ("embedlog", 10)}


RACE_COUNT = 150


@pytest.fixture(scope="module")
def race(bk):
    """BookKeeper's client creates ledgers on /emb (hierarchical) and /long while embedlog
    creates as many as it can on both until the Java client is done: per root, (Java's
    ids, embedlog's ids). On /long both sides take ids past 2^31 from
    idgen-long/HOB-0000000007; a bookie registered by embedlog makes the ensemble there
    (the Java client creates and closes empty ledgers: it never connects to it)."""
    bk.raw.ensure_path(f"{bk.long}/idgen-long/HOB-{HOB:010d}")
    bk.long_store.register_bookie(FAKE_BOOKIE, False, {"address": "127.0.0.1:10"})
    stores = [bk.store, bk.long_store]
    uris = [bk.cluster.metadata_uri, f"zk+longhierarchical://{bk.hosts}{bk.long}"]
    proc = bkmeta.create_many_popen(bk.version, uris, RACE_COUNT, ensemble=1, in_flight=8)
    ours: list[list[int]] = [[], []]
    stop = threading.Event()
    errors: list[BaseException] = []

    def embedlog_creates(store, out: list[int]) -> None:
        try:
            while not stop.is_set() and len(out) < 4 * RACE_COUNT:
                lid = store.generate_ledger_id()
                store.create_ledger_metadata(LedgerMetadata(lid, 1, 1, 1,
                                                            fragments=((0, (FAKE_BOOKIE,)),)))
                out.append(lid.ledger_id)
        except BaseException as exc:   # noqa: BLE001 - reported by the tests
            errors.append(exc)

    try:
        first = proc.stdout.readline()               # the Java client is up: race from here
        threads = [threading.Thread(target=embedlog_creates, args=(st, out))
                   for st, out in zip(stores, ours)]
        for t in threads:
            t.start()
        rest, err = proc.communicate(timeout=bkmeta.TIMEOUT_S)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for t in threads:
            t.join(timeout=30)
        bk.long_store.unregister_bookie(FAKE_BOOKIE, False)
    assert proc.returncode == 0, first + rest + err
    assert not errors, errors
    theirs: list[list[int]] = [[], []]
    for root, lid in re.findall(r"^ledger (\d) (\d+)$", first + rest, re.M):
        theirs[int(root)].append(int(lid))
    assert [len(t) for t in theirs] == [RACE_COUNT, RACE_COUNT]
    return list(zip(theirs, ours))


def _check_race(store, theirs: list[int], ours: list[int]) -> None:
    assert len(set(theirs) | set(ours)) == len(theirs) + len(ours)       # no id twice
    # the two really interleaved: some of embedlog's ids fall between Java's
    assert any(min(theirs) < i < max(theirs) for i in ours), (theirs, ours)
    listed = {lid.ledger_id for lid in store.iterate_ledgers()}
    assert set(theirs) | set(ours) <= listed
    for lid in theirs[:5]:
        md = store.read_ledger_metadata(lid).value
        assert md.state == LedgerState.CLOSED and bkmd.ctoken_of(md) is not None


def test_ids_never_collide_hierarchical(bk, race):
    theirs, ours = race[0]
    assert max(theirs + ours) < 2**31 - 1
    _check_race(bk.store, theirs, ours)


def test_ids_never_collide_long_hierarchical(bk, race):
    theirs, ours = race[1]
    assert all(i >> 32 == HOB for i in theirs + ours), (theirs, ours)
    _check_race(bk.long_store, theirs, ours)
    digits = f"{ours[0]:019d}"
    assert bk.raw.exists(f"{bk.long}/{digits[:3]}/{digits[3:7]}/{digits[7:11]}/"
                         f"{digits[11:15]}/L{digits[15:]}")


def test_what_bookkeeper_cannot_carry_is_refused_on_its_root(bk):
    store = bk.store
    before = sorted(bk.raw.get_children(bk.emb))
    with pytest.raises(MetadataError, match="scope 2"):
        store.generate_ledger_id(2)
    with pytest.raises(MetadataError, match="128-bit"):
        store.generate_ledger_id(None)
    base = LedgerMetadata(LedgerId(0, 7_000_000), 1, 1, 1, fragments=((0, (FAKE_BOOKIE,)),))
    for bad in (base.with_(ledger_id=LedgerId(5, 1)), base.with_(unbounded=True, term=1),
                base.with_(first_entry_id=3, fragment_ctimes_ms=(1,))):
        with pytest.raises(MetadataError, match="cannot be"):
            store.create_ledger_metadata(bad)
    assert sorted(bk.raw.get_children(bk.emb)) == before
    assert bk.raw.exists(store.ledger_path(7_000_000)) is None
    assert list(store.iterate_ledgers(5)) == []


def test_a_create_that_finds_its_own_znode_succeeds(bk):
    """BookKeeper's cToken: a create retried after a lost answer finds its own record."""
    store = bk.store
    md = LedgerMetadata(store.generate_ledger_id(), 1, 1, 1, fragments=((0, (FAKE_BOOKIE,)),))
    made = store.create_ledger_metadata(md).value
    assert store.create_ledger_metadata(made).version == 0
    with pytest.raises(LedgerExistsError):
        store.create_ledger_metadata(md)              # another creator: another token


def test_embedlogs_own_records_stay_out_of_bookkeepers_tree(bk):
    store = bk.store
    lid = store.generate_ledger_id()
    store.create_ledger_metadata(LedgerMetadata(lid, 1, 1, 1, fragments=((0, (FAKE_BOOKIE,)),)))
    store.mark_ledger_underreplicated(lid, [FAKE_BOOKIE])
    store.remove_ledger_metadata(lid)
    store.write_cookie("auditor-lease", b"{}")
    assert store.ledger_deleted_at(lid) is not None
    assert store.list_underreplicated() == {lid: [FAKE_BOOKIE]}
    assert set(bk.raw.get_children(f"{bk.emb}/embedlog")) == {"deleted", "underreplication", "cookies"}
    assert bk.raw.exists(f"{bk.emb}/underreplication") is None
    assert "auditor-lease" not in bk.raw.get_children(f"{bk.emb}/cookies")
    assert "auditor-lease" in store.list_cookies()
    store.mark_ledger_replicated(lid)
    with pytest.raises(LedgerExistsError, match="deleted"):
        store.create_ledger_metadata(LedgerMetadata(lid, 1, 1, 1, fragments=((0, (FAKE_BOOKIE,)),)))
