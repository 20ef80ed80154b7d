"""Damaged files on disk: one bad index file costs its ledger's writes on this bookie,
never the bookie; entries and files that do not validate are refused where they enter or
are opened, with the file and offset named."""
import json
import os

import pytest
from click.testing import CliRunner

import embedlog
from embedlog._native import index as nix
from embedlog.bookie import scrub
from embedlog._native.format import encode_entry, master_key
from embedlog.cli.shell import shell
from embedlog.errors import CorruptedDataError, EmbedlogError

# entry logs and index rebuilds from them: layout 1's storage
CFG = dict(journal_pre_alloc_size_mb=1, skip_list_size_limit=1 << 16, storage_layout=1)


def index_file(log, lid):
    return nix.index_path(log.bookie.ledger_currents[0], lid.scope_id, lid.ledger_id)


@pytest.mark.parametrize("damage", ["truncated", "bad_magic", "version_99"])
def test_one_bad_index_file_costs_one_ledger_not_the_bookie(tmp_path, damage):
    with embedlog.open(tmp_path, **CFG) as log:
        handles = [log.create_ledger(scope_id=s) for s in (0, 0, 7)]
        for h in handles:
            h.append_many([b"%s-%d" % (h.ledger_id.qualified_name.encode(), i) for i in range(300)])
            h.close()
        victim, others = handles[1].ledger_id, [handles[0].ledger_id, handles[2].ledger_id]
        path = index_file(log, victim)
    data = open(path, "rb").read()
    if damage == "truncated":
        data = data[:100]
    elif damage == "bad_magic":
        data = b"XXXX" + data[4:]
    else:
        data = data[:4] + (99).to_bytes(4, "big") + data[8:]
    open(path, "wb").write(data)
    with embedlog.open(tmp_path, **CFG) as log:
        stats = log.bookie.statistics()["damaged_ledgers"]
        assert list(stats) == [victim.qualified_name]
        assert stats[victim.qualified_name]["entries_found"] == 300
        assert os.path.exists(path + ".damaged")
        for lid in others:
            assert log.open_ledger(lid).read_batch(0, 299)[299].endswith(b"-299")
        # the rebuilt index serves every entry the entry logs hold
        got = log.open_ledger(victim).read_batch(0, 299)
        assert got == [b"%s-%d" % (victim.qualified_name.encode(), i) for i in range(300)]
        with pytest.raises(CorruptedDataError, match="damaged"):
            log.bookie.add_payloads(victim, master_key(b""), 300, 299, 0, 3, None, [b"x"])
        w = log.create_ledger()                 # the bookie takes other writes
        assert w.append(b"fine") == 0
    # and the shell's consistency check names the file set aside
    out = shell_json("localconsistencycheck", "--dir", tmp_path)
    assert out["damaged_index_files"] == [path + ".damaged"]
    with embedlog.open(tmp_path, **CFG) as log:  # the rebuilt index is a good file now
        assert log.open_ledger(victim).read_batch(299, 299)[0].endswith(b"-299")


def test_a_bad_bookie_id_file_is_named(tmp_path):
    with embedlog.open(tmp_path, **CFG):
        pass
    (tmp_path / "current" / "BOOKIE_ID").write_bytes(b"\xff\xfe bookie")
    with pytest.raises(CorruptedDataError, match="BOOKIE_ID"):
        embedlog.open(tmp_path, **CFG)


def test_an_entry_log_of_an_unknown_version_is_named_when_opened(tmp_path):
    from embedlog._native import entrylog as nel
    with embedlog.open(tmp_path, **CFG) as log:
        w = log.create_ledger()
        w.append_many([bytes(1000)] * 200)
        w.close()
        logs = [n for n in os.listdir(log.bookie.ledger_currents[0]) if n.endswith(".log")]
    path = os.path.join(tmp_path, "current", logs[0])
    with open(path, "r+b") as f:
        f.seek(4)
        f.write((99).to_bytes(4, "big"))
    with pytest.raises(CorruptedDataError, match=r"offset 4: unknown format version 99"):
        nel.MappedLog.open_existing(path, int(logs[0][:-4], 16))


def test_data_is_private_to_its_user(tmp_path):
    """meta.db holds every ledger's password and index headers hold master keys, which is all
    the wire protocol needs to write: directories 0700, files 0600."""
    import stat
    path = tmp_path / "d"
    with embedlog.open(path, **CFG) as log:
        w = log.create_ledger(password=b"pw")
        w.append_many([bytes(1000)] * 300)
        w.close()
        log.bookie.checkpoint()
    modes = {}
    for root, dirs, files in os.walk(path):
        for d in dirs:
            modes[os.path.join(root, d)] = stat.S_IMODE(os.stat(os.path.join(root, d)).st_mode)
        for f in files:
            modes[os.path.join(root, f)] = stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode)
    modes[str(path)] = stat.S_IMODE(os.stat(path).st_mode)
    loose = {p: oct(m) for p, m in modes.items() if m & 0o077}
    assert not loose, loose
    assert any(p.endswith(".idx") for p in modes) and any(p.endswith("meta.db") for p in modes)


def test_a_flipped_byte_in_a_dummy_ledger_is_found_by_the_block_checksums(tmp_path):
    """DUMMY means no digest. The seal's block checksums still find the damaged record, and
    name the file, the block and the entry; a read checks them too."""
    from embedlog._native import entrylog as nel
    from embedlog.bookie.scrub import damaged_records
    cfg = dict(CFG, entry_log_size_limit=1 << 20)
    with embedlog.open(tmp_path, **cfg) as log:
        w = log.create_ledger(digest="dummy")
        w.append_many([b"%05d" % i + bytes(2000) for i in range(2000)])      # several logs
        w.close()
        log.bookie.checkpoint()
        lid = w.ledger_id
        current = log.bookie.ledger_currents[0]
    logs = sorted((int(n[:-4], 16), os.path.join(current, n)) for n in os.listdir(current)
                  if n.endswith(".log"))
    sealed = [(i, p) for i, p in logs if nel.MappedLog.open_existing(p, i).sealed]
    assert sealed and damaged_records(logs) == []
    log_id, path = sealed[0]
    m = nel.MappedLog.open_existing(path, log_id)
    locs, sizes, scopes, lids, eids = m.entry_table()
    k = len(locs) // 2
    off = int(locs[k] & 0xFFFFFFFF) + 100                  # inside entry eids[k]'s payload
    m.close()
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    found = damaged_records(logs)
    assert len(found) == 1 and found[0]["file"] == path and found[0]["offset"] <= off < found[0]["end"]
    assert (lid.qualified_name, int(eids[k])) in found[0]["entries"]
    # the shell's consistency check reports it (and fails), though the DUMMY digest cannot
    out = shell_json("localconsistencycheck", "--dir", tmp_path, code=1)
    assert out["ok"] is False and not out["errors"]
    [block] = out["damaged_entry_log_blocks"]
    assert block["file"] == path and [lid.qualified_name, int(eids[k])] in block["entries"]
    with embedlog.open(tmp_path, **cfg) as log:     # and a read checks its block's crc: refused
        r = log.open_ledger(lid)
        with pytest.raises(CorruptedDataError, match="block checksum"):
            r.read_entry(int(eids[k]))
        with pytest.raises(CorruptedDataError, match="block checksum"):
            r.read_batch(0, int(eids[k]))
        with pytest.raises(CorruptedDataError, match="block checksum"):
            log.bookie.read_entry(lid, int(eids[k]))          # the wire path, encoded
        assert r.read_entry(0) == b"00000" + bytes(2000)      # other blocks read as before


def shell_json(*args, code=0):
    r = CliRunner().invoke(shell, [str(a) for a in args] + ["--json"], catch_exceptions=False)
    assert r.exit_code == code, r.output
    return json.loads(r.output)


def test_the_unsealed_logs_completed_blocks_are_checked_on_read(tmp_path):
    """The log being written has no checksum table yet: the crc of each block is taken as a
    memtable flush completes it, checked on read, and written at the seal (so the damage is
    not sealed in as good)."""
    from embedlog.bookie.scrub import damaged_records
    cfg = dict(CFG, entry_log_size_limit=4 << 20)
    with embedlog.open(tmp_path, **cfg) as log:
        w = log.create_ledger(digest="dummy")
        w.append_many([b"%05d" % i + bytes(1000) for i in range(600)])   # ~600 KiB: 9 blocks
        log.bookie.checkpoint()
        el = log.bookie.storage.entry_logger
        path, log_id = el.current.path, el.current.log_id
        assert not el.current.sealed
        loc = log.bookie.storage.location((0, w.ledger_id.ledger_id), 100)
        off = (loc & 0xFFFFFFFF) + 50                          # entry 100, in block 1
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\xff", off)                       # the map shares these pages
        finally:
            os.close(fd)
        with pytest.raises(CorruptedDataError, match="block checksum"):
            log.bookie.read_entry(w.ledger_id, 100)
        assert log.bookie.read_entry(w.ledger_id, 500).endswith(b"00500" + bytes(1000))
        w.append_many([b"%05d" % i + bytes(1000) for i in range(600, 5000)])  # rolls: sealed
        log.bookie.checkpoint()
        assert el.current.log_id != log_id
        w.close()
    found = damaged_records([(log_id, path)])
    assert len(found) == 1 and found[0]["offset"] <= off < found[0]["end"]
    with embedlog.open(tmp_path, **cfg) as log:
        with pytest.raises(CorruptedDataError, match="block checksum"):
            log.open_ledger(w.ledger_id).read_entry(100)


def _copies_differing(log, key):
    ambiguous = []
    st = log.bookie.storage
    logs = [(i, st.entry_logger.path_of(i)) for i in st.entry_logger.log_ids()]
    scrub.ledger_entries(logs + st._segment_files(), key, ambiguous=ambiguous)
    return ambiguous


@pytest.mark.parametrize("layout", [1, 2])
def test_a_rebuild_leaves_out_an_entry_whose_copies_differ(tmp_path, layout):
    """An id the logs hold twice as different entries (here a recovery add that wrote other
    bytes; a stream's truncated dirty entry written again is the same): file order does not
    say which copy is newer, so the rebuilt index names neither and reports it (the old
    code took the later file's, which a compaction target can make the older bytes, under
    a good digest). The same entry written again with another LAC (a BookKeeper client's
    recovery) or copied (a compaction's) still comes back."""
    cfg = dict(CFG, storage_layout=layout)
    with embedlog.open(tmp_path, **cfg) as log:
        h = log.create_ledger()
        lid = h.ledger_id
        h.append_many([b"v1-%d" % i for i in range(10)])
        log.bookie.checkpoint()
        b = log.bookie
        mk = master_key(b"")
        other = encode_entry(lid.scope_id, lid.ledger_id, 9, 8, 10 * 4 + 2, "crc32c", b"v2-9xx")
        same = encode_entry(lid.scope_id, lid.ledger_id, 8, 3, 9 * 4, "crc32c", b"v1-8")
        assert same != log.bookie.read_entry(lid, 8)             # another LAC, the same entry
        b.wait_durable(b.add_entries([same, other], mk, recovery=True))
        assert b.read_entry(lid, 9).endswith(b"v2-9xx")          # the bookie's: no LAC
        log.bookie.checkpoint()
        path = index_file(log, lid)
    with open(path, "r+b") as f:
        f.write(b"XXXX")
    with embedlog.open(tmp_path, **cfg) as log:
        report = log.bookie.statistics()["damaged_ledgers"][lid.qualified_name]
        assert report["entries_ambiguous"] == [9]
        assert [log.bookie.read_entry(lid, e)[-4:] for e in range(9)] == \
            [b"v1-%d" % i for i in range(9)]
        with pytest.raises(EmbedlogError):
            log.bookie.read_entry(lid, 9)       # refused, never either copy's bytes


def test_the_copies_a_rebuild_left_out_outlive_gc_and_compaction(tmp_path):
    """Layout 2: each copy of entry 9 shares its segment with a ledger then deleted, so GC
    would free one segment (no index names it) and compaction copy the other's named
    entries only. The rebuilt ledger is pinned (its .damaged file, across restarts): every
    copy of its entries stays live (the old code freed both: no copy was left to read)."""
    cfg = dict(CFG, storage_layout=2, journal_max_size_mb=1, gc_wait_time_ms=0)
    with embedlog.open(tmp_path, **cfg) as log:
        b = log.bookie
        h, dead = log.create_ledger(), [log.create_ledger() for _ in range(2)]
        lid = h.ledger_id
        key = (lid.scope_id, lid.ledger_id)
        h.append_many([b"v1-%d" % i for i in range(10)])
        dead[0].append_many([bytes(1000)] * 2000)                # past the 1 MiB journal
        other = encode_entry(lid.scope_id, lid.ledger_id, 9, 8, 10 * 4 + 2, "crc32c", b"v2-9xx")
        b.wait_durable(b.add_entries([other], master_key(b""), recovery=True))
        dead[1].append_many([bytes(1000)] * 2000)
        b.checkpoint()
        path = index_file(log, lid)
    with open(path, "r+b") as f:
        f.write(b"XXXX")
    with embedlog.open(tmp_path, **cfg) as log:
        assert log.bookie.storage.damaged[key]["entries_ambiguous"] == [9]
        for d in dead:
            log.delete_ledger(d.ledger_id)
        log.bookie.checkpoint()
        log.bookie.gc.run_once(force_major=True)
        assert _copies_differing(log, key) == [9]
    with embedlog.open(tmp_path, **cfg) as log:              # the pin outlives the restart
        assert key in log.bookie.storage.pinned
        log.bookie.gc.run_once(force_major=True)
        assert _copies_differing(log, key) == [9]
        assert [log.bookie.read_entry(lid, e)[-4:] for e in range(9)] == \
            [b"v1-%d" % i for i in range(9)]
