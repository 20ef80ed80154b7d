"""An index file lost or cut after a crash: the entry logs still hold the ledger's entries
and name it, so the bookie rebuilds its index from them at start-up, before any recovery
decides where an OPEN ledger ends; it says so, and takes no new adds to the ledger (its
fence state is unknown), while recovery and reads go on. The consistency check reports
such a file before the bookie has started."""
import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from support.cliutil import ROOT, TESTS
import embedlog
from embedlog import LedgerId
from embedlog._native import index as nix
from embedlog._native.format import master_key
from embedlog.cli.shell import shell
from embedlog.errors import CorruptedDataError

# layout 1: an index rebuilt from the entry logs' maps (layout 2's segments and their maps:
# tests/bookie/test_layout2.py)
CFG = dict(journal_pre_alloc_size_mb=1, skip_list_size_limit=64 << 10,
           entry_log_size_limit=1 << 20, flush_interval_ms=3_600_000, storage_layout=1)

CHILD = r"""
import sys, time, embedlog
cfg = dict(journal_pre_alloc_size_mb=1, skip_list_size_limit=64 << 10,
           entry_log_size_limit=1 << 20, flush_interval_ms=3_600_000, storage_layout=1)
log = embedlog.open(sys.argv[1], **cfg)
w = log.create_ledger(digest=sys.argv[2])
w.append_many([b"%06d" % i + bytes(300) for i in range(1500)])
log.bookie.checkpoint()                   # the index holds these; the journal replays none
w.append_many([b"%06d" % i + bytes(300) for i in range(1500, 1520)])
print(w.ledger_id.qualified_name, w.last_add_confirmed, flush=True)
time.sleep(600)
"""


def payload(i):
    return b"%06d" % i + bytes(300)


def killed_writer(path, digest="crc32c"):
    """A child appends 1,520 entries (1,500 of them checkpointed) to an OPEN ledger and is
    killed by SIGKILL; returns (ledger id, last acknowledged entry id)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), digest],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline()            # the acknowledgement: it waits on the child
        assert line, child.stderr.read()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    name, last = line.split()
    return LedgerId.parse(name), int(last)


def shell_json(*args, code=0):
    r = CliRunner().invoke(shell, [str(a) for a in args] + ["--json"], catch_exceptions=False)
    assert r.exit_code == code, r.output
    return json.loads(r.output)


@pytest.mark.parametrize("damage", ["lost", "cut_to_header", "cut_mid_page", "cut_at_a_page_end"])
def test_an_open_ledgers_lost_index_is_rebuilt_before_recovery(tmp_path, damage, caplog):
    lid, last = killed_writer(tmp_path)
    path = nix.index_path(str(tmp_path / "current"), lid.scope_id, lid.ledger_id)
    assert os.path.getsize(path) > nix.HEADER_SIZE + nix.PAGE_SIZE       # pages 0 and 1
    if damage == "lost":
        os.unlink(path)
    else:
        # the last page (1,024..1,499) is short; a cut at a page's end leaves whole pages,
        # which only the length the header records tells from a good file
        os.truncate(path, {"cut_to_header": nix.HEADER_SIZE,
                           "cut_mid_page": nix.HEADER_SIZE + nix.PAGE_SIZE + 100,
                           "cut_at_a_page_end": nix.HEADER_SIZE + nix.PAGE_SIZE}[damage])
    # the offline check names the ledger before any bookie has started
    out = shell_json("localconsistencycheck", "--dir", tmp_path, code=1)
    assert out["ok"] is False
    [row] = out["unindexed_ledgers"]
    assert row["qualified_name"] == lid.qualified_name
    assert row["first_entry_id"] == (1024 if damage.startswith("cut_") and damage != "cut_to_header" else 0)
    assert row["last_entry_id"] >= 1499
    with embedlog.open(tmp_path, **CFG) as log:
        damaged = log.bookie.statistics()["damaged_ledgers"]
        assert lid.qualified_name in damaged
        # recovery fences it and closes it at its last acknowledged entry, not at -1
        r = log.open_ledger(lid)
        assert r.is_closed and r.last_add_confirmed == last
        assert r.read_batch(0, last) == [payload(i) for i in range(last + 1)]
        with pytest.raises(CorruptedDataError, match="no more writes"):
            log.bookie.add_payloads(lid, master_key(b""), last + 1, last, 0, 3, None, [b"x"])
    assert "rebuilt" in caplog.text
    with embedlog.open(tmp_path, **CFG) as log:          # the rebuilt index was written back
        assert log.open_ledger(lid).read_batch(0, last)[last] == payload(last)


def test_a_ledgers_index_costs_what_it_holds(tmp_path):
    """A one-entry ledger's index file is its header and one location (one file-system
    block, not a header and a whole 8 KiB page), and 100 such ledgers come back after a
    reopen. (Cleared locations in a short page: tests/shared/test_native_models_index.py.)"""
    with embedlog.open(tmp_path, **CFG) as log:
        ids = []
        for i in range(100):
            w = log.create_ledger()
            w.append(payload(i))
            w.close()
            ids.append(w.ledger_id)
        log.bookie.checkpoint()
        paths = [nix.index_path(str(tmp_path / "current"), lid.scope_id, lid.ledger_id) for lid in ids]
        assert {os.path.getsize(p) for p in paths} == {nix.HEADER_SIZE + 8}
        assert {nix.recorded_length(p) for p in paths} == {nix.HEADER_SIZE + 8}
        assert sum(os.stat(p).st_blocks for p in paths) * 512 <= 100 * 4096
        w = log.create_ledger()
        w.append_many([payload(i) for i in range(10)])
        log.bookie.checkpoint()
        path = nix.index_path(str(tmp_path / "current"), w.ledger_id.scope_id, w.ledger_id.ledger_id)
        assert os.path.getsize(path) == nix.HEADER_SIZE + 80
    with embedlog.open(tmp_path, **CFG) as log:
        # the start-up learnt each ledger's last entry without loading its page (100,000
        # ledgers used to fill the page cache: 722 MB RSS after a reopen)
        assert log.bookie.statistics()["index_pages_cached"] == 0
        assert [log.open_ledger(lid).read_entry(0) for lid in ids] == [payload(i) for i in range(100)]
        assert log.open_ledger(w.ledger_id).read_batch(0, 9) == [payload(i) for i in range(10)]


def test_a_rebuilt_open_ledger_stays_readable_and_recoverable(tmp_path):
    """A damaged index header, rebuilt: a plain open sees the entries, and recovery's fence
    goes through (only new adds are refused)."""
    lid, last = killed_writer(tmp_path, "dummy")
    path = nix.index_path(str(tmp_path / "current"), lid.scope_id, lid.ledger_id)
    with open(path, "r+b") as f:
        f.write(b"XXXX")
    with embedlog.open(tmp_path, **CFG) as log:
        r = log.open_ledger(lid, recovery=False)
        assert not r.is_closed and r.last_add_confirmed >= 1499     # the LAC the last entry carries
        assert r.read_batch(0, 1499)[-1] == payload(1499)
        r = log.open_ledger(lid)
        assert r.is_closed and r.last_add_confirmed == last
        assert r.read_entry(last) == payload(last)


CHILD_UNCHECKPOINTED = r"""
import sys, embedlog
cfg = dict(journal_pre_alloc_size_mb=1, skip_list_size_limit=64 << 10,
           entry_log_size_limit=1 << 20, flush_interval_ms=3_600_000, storage_layout=1)
log = embedlog.open(sys.argv[1], **cfg)
w = log.create_ledger()
print(w.ledger_id.qualified_name, flush=True)
for i in range(100000):
    w.append(b"%06d" % i + bytes(300))
    print(i, flush=True)
"""


def test_a_crash_before_the_first_checkpoint_is_not_damage(tmp_path):
    """Entries in the entry logs whose index was never written (killed between a memtable
    flush and the checkpoint it asks for) come back by replay: no damage is reported and
    the ledger takes adds again."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]),
           "EMBEDLOG_FAILPOINTS": "checkpoint.before_index_flush=crash:2"}
    proc = subprocess.run([sys.executable, "-c", CHILD_UNCHECKPOINTED, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    name, *acked = proc.stdout.split()
    lid, last = LedgerId.parse(name), int(acked[-1])
    assert last > 150                                      # past the first memtable flush
    path = nix.index_path(str(tmp_path / "current"), lid.scope_id, lid.ledger_id)
    assert not os.path.exists(path)
    with embedlog.open(tmp_path, **CFG) as log:
        assert log.bookie.statistics()["damaged_ledgers"] == {}
        r = log.open_ledger(lid)
        assert r.last_add_confirmed >= last
        assert r.read_batch(0, last) == [payload(i) for i in range(last + 1)]


def test_a_flipped_byte_in_the_unsealed_log_of_a_crash_is_not_sealed_in(tmp_path):
    """The log being written when the writer was killed is sealed at the next start. Its
    block crcs are the ones taken as the blocks were written (kept in the log's tail at
    each flush), not crcs of the damaged bytes: a DUMMY read is refused (issue 26 item 6)."""
    from embedlog._native import entrylog as nel
    lid, last = killed_writer(tmp_path, "dummy")
    current = tmp_path / "current"
    [name] = [n for n in os.listdir(current) if n.endswith(".log")]
    m = nel.MappedLog.open_existing(str(current / name), int(name[:-4], 16))
    try:
        assert not m.sealed
        locs, _sizes, _scopes, _lids, eids = m.entry_table()
        off = int(locs[list(eids).index(100)] & 0xFFFFFFFF) + 20
    finally:
        m.close()
    with open(current / name, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    with embedlog.open(tmp_path, **CFG) as log:
        r = log.open_ledger(lid)
        assert r.read_entry(600) == payload(600)               # another block
        with pytest.raises(CorruptedDataError, match="block checksum"):
            r.read_entry(100)
