"""Disks: several ledger directories, a separate journal directory, disk-usage checks and
read-only mode at disk_usage_threshold (writable again below the low-water mark)."""
import errno
import hashlib
import os
import subprocess
import time

import pytest

from support.cliutil import ROOT
import embedlog
from embedlog import LedgerId
from embedlog.bookie.disks import DiskMonitor, resolve_dirs
from embedlog.config import BookieConfig
from embedlog.errors import ConfigError, ReadOnlyBookieError

from support.crash_child import payload
from support.servers import skip_unless_ci


def big_payload(q: str, e: int, n: int = 16 << 10) -> bytes:
    seed = hashlib.sha256(f"{q}/{e}".encode()).digest()
    return (seed * (n // 32 + 1))[:n]


# -- the monitor, with a usage source the test controls -----------------------------------


def test_monitor_thresholds_hysteresis_and_listeners():
    usage = {"/a": 0.5, "/b": 0.5, "/j": 0.1}
    cfg = BookieConfig.from_dict(dict(disk_usage_threshold=0.95, disk_usage_warn_threshold=0.9,
                                      disk_usage_lwm_threshold=0.85))
    mon = DiskMonitor(["/a", "/b"], "/j", cfg, usage_fn=lambda p: (usage[p], int((1 - usage[p]) * 1e9)))
    flips = []
    mon.listeners.append(flips.append)
    assert mon.check() is False and mon.pressure() == "ok"
    usage["/a"] = 0.92
    assert mon.check() is False and mon.pressure() == "warn"
    usage["/a"] = 0.95
    assert mon.check() is True and flips == [True] and mon.pressure() == "full"
    assert mon.choose_dir() == "/b"                   # new files avoid the full disk
    usage["/a"] = 0.90                                # below the threshold, above the low-water mark
    assert mon.check() is True and flips == [True]
    usage["/a"] = 0.84
    assert mon.check() is False and flips == [True, False]
    usage["/j"] = 0.99                                # a full journal disk counts too
    assert mon.check() is True and flips == [True, False, True]
    usage["/j"] = 0.1
    mon.check()
    # only when every ledger directory is full, if so configured
    cfg2 = cfg.replace(read_only_mode_on_any_disk_full_enabled=False)
    mon2 = DiskMonitor(["/a", "/b"], "/j", cfg2, usage_fn=mon.usage_fn)
    usage["/a"] = 0.97
    assert mon2.check() is False
    usage["/b"] = 0.97
    assert mon2.check() is True
    assert mon.stats["read_only_flips"] == 2 and mon.stats["writable_flips"] == 2


def test_disk_full_flips_the_bookie_read_only_and_back(tmp_path):
    """The same with a bookie: adds fail read-only, reads go on, then writable again."""
    usage = {"value": 0.5}
    with embedlog.open(tmp_path, disk_check_interval_ms=0, disk_usage_lwm_threshold=0.8) as log:
        mon = log.bookie.disks
        mon.usage_fn = lambda p: (usage["value"], 1 << 30)
        w = log.create_ledger()
        w.append(b"before")
        w.append(b"before 2")
        usage["value"] = 0.96
        mon.check()
        with pytest.raises(ReadOnlyBookieError):
            w.append(b"refused")
        assert log.open_ledger(w.ledger_id, recovery=False).read_entry(0) == b"before"
        usage["value"] = 0.85                         # hysteresis: still read-only
        mon.check()
        assert log.bookie.read_only
        usage["value"] = 0.79
        mon.check()
        assert not log.bookie.read_only
        assert w.append(b"after") == 2
        assert log.statistics()["disks"]["writable_flips"] == 1


def test_operator_read_only_survives_the_disks(tmp_path):
    usage = {"value": 0.5}
    with embedlog.open(tmp_path, disk_check_interval_ms=0) as log:
        mon = log.bookie.disks
        mon.usage_fn = lambda p: (usage["value"], 1 << 30)
        log.bookie.read_only = True                   # the operator's choice
        usage["value"] = 0.99
        mon.check()
        usage["value"] = 0.1
        mon.check()
        assert log.bookie.read_only


def test_read_only_is_one_state_with_its_reasons(tmp_path):
    """Operator and disk each hold their own reason; the bookie is read-only while either
    holds, each is lifted only by its own source, and listeners hear every change."""
    usage = {"value": 0.5}
    with embedlog.open(tmp_path, disk_check_interval_ms=0) as log:
        b = log.bookie
        b.disks.usage_fn = lambda p: (usage["value"], 1 << 30)
        heard = []
        b.read_only_listeners.append(lambda ro, reasons: heard.append((ro, set(reasons))))
        assert not b.read_only and b.read_only_reasons == frozenset()
        usage["value"] = 0.99
        b.disks.check()
        assert b.read_only_reasons == {"disk"}
        b.set_read_only("operator", True)
        usage["value"] = 0.1
        b.disks.check()                               # the disk lifts only its own reason
        assert b.read_only and b.read_only_reasons == {"operator"}
        b.set_read_only("operator", True)             # no change: nobody is told
        b.set_read_only("operator", False)
        assert not b.read_only
        assert heard == [(True, {"disk"}), (True, {"disk", "operator"}), (True, {"operator"}),
                         (False, set())]
        with pytest.raises(embedlog.errors.IllegalOpError):
            b.set_read_only("lunch", True)


# -- several directories --------------------------------------------------------------------


def test_several_ledger_dirs_and_a_separate_journal_dir(tmp_path):
    d1, d2, j = tmp_path / "disk1", tmp_path / "disk2", tmp_path / "jdisk"
    cfg = dict(ledger_directories=f"{d1},{d2}", journal_directory=str(j),
               skip_list_size_limit=128 << 10, entry_log_size_limit=256 << 10,
               flush_interval_ms=100, gc_wait_time_ms=0, compaction_rate_by_entries=1_000_000,
               storage_layout=1)        # entry logs spread over the ledger directories
    home = tmp_path / "home"
    expected = {}
    with embedlog.open(home, **cfg) as log:
        handles = [log.create_ledger(scope_id=s) for s in (0, 0, 3, 0, 3, 0)]
        for e in range(200):
            for h in handles:
                h.append(payload(h.ledger_id.qualified_name, e))
        for h in handles:
            h.close()
            expected[h.ledger_id.qualified_name] = 200
        log.bookie.checkpoint()
        assert log.bookie.ledger_dirs == [str(d1), str(d2)]
        logs = {d: [n for n in os.listdir(d / "current") if n.endswith(".log")] for d in (d1, d2)}
        assert logs[d1] and logs[d2], logs                 # entry logs spread over both
        idx = {d: list(os.walk(d / "current" / "ledgers")) for d in (d1, d2)}
        assert any(f for _p, _d, f in idx[d1]) and any(f for _p, _d, f in idx[d2])
        assert [n for n in os.listdir(j) if n.endswith(".txn")]
        assert not (home / "journal").exists() or not os.listdir(home / "journal")
        assert os.path.exists(d1 / "current" / "lastMark") and os.path.exists(d2 / "current" / "lastMark")
        # GC and compaction across the directories
        for h in handles[:4]:
            log.delete_ledger(h.ledger_id)
            del expected[h.ledger_id.qualified_name]
        log.bookie.gc.run_once(force_major=True)
    with embedlog.open(home, **cfg) as log:
        for q, n in expected.items():
            assert log.open_ledger(LedgerId.parse(q)).read_batch(0, n - 1) == \
                [payload(q, e) for e in range(n)]


def test_directory_configuration_errors(tmp_path):
    cfg = BookieConfig.from_dict(dict(ledger_directories=f"{tmp_path}/a, {tmp_path}/a"))
    with pytest.raises(ConfigError):
        resolve_dirs(str(tmp_path), cfg)
    lds, jd = resolve_dirs(str(tmp_path), BookieConfig())
    assert lds == [str(tmp_path)] and jd == str(tmp_path / "journal")


# -- a real full filesystem ------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 64 MiB tmpfs mounted by the test (root only), unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        skip_unless_ci(f"cannot mount a tmpfs here ({r.stderr.strip()}); "
                       "test_disk_full_flips_the_bookie_read_only_and_back covers the logic")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_filling_a_small_filesystem_turns_read_only_and_freeing_it_writable(small_fs):
    ballast = small_fs / "ballast"
    with open(ballast, "wb") as f:                    # most of the disk is taken already
        f.write(bytes(36 << 20))
    cfg = dict(skip_list_size_limit=256 << 10, entry_log_size_limit=1 << 20,
               journal_max_size_mb=1, journal_pre_alloc_size_mb=1, journal_max_backups=0,
               flush_interval_ms=50, disk_check_interval_ms=20, disk_usage_lwm_threshold=0.85,
               gc_wait_time_ms=0)
    acked = {}
    path = small_fs / "log"
    with embedlog.open(path, **cfg) as log:
        mon = log.bookie.disks
        # usage when it flipped: later checks may read less (an old journal is trimmed)
        at_flip = []
        mon.listeners.append(lambda full: full and at_flip.append(max(mon.usage.values())))
        w = None
        turned = False
        for i in range(4000):                         # 64 MiB of 16 KiB entries: a bound
            if w is None or i % 100 == 0:
                if w is not None:
                    w.close()
                w = log.create_ledger()
                acked[w.ledger_id.qualified_name] = 0
            q = w.ledger_id.qualified_name
            try:
                w.append(big_payload(q, acked[q]))
            except ReadOnlyBookieError:
                turned = True
                break
            acked[q] += 1
            if i % 16 == 15:                          # let the checker see each 256 KiB
                assert mon.wait_checked(mon.checks, 5)
        assert turned, f"never turned read-only; usage {mon.usage}"
        assert log.bookie.read_only and mon.full
        assert at_flip and at_flip[0] >= 0.95, at_flip
        assert w.append_async is not None
        with pytest.raises(ReadOnlyBookieError):
            w.append(b"still full")
        # reads go on
        first = next(iter(acked))
        assert log.open_ledger(LedgerId.parse(first), recovery=False).read_entry(0) == big_payload(first, 0)
        # free space: delete half the ledgers; GC gives their entry logs back
        names = list(acked)
        for q in names[: len(names) // 2]:
            log.delete_ledger(LedgerId.parse(q))
            del acked[q]
        # GC cycles until the disk is under the low-water mark, as the bookie's own GC
        # thread runs them (one cycle left 85.2% once, at load 10; why not found)
        deadline = time.monotonic() + 30
        while log.bookie.read_only:
            assert time.monotonic() < deadline, f"still read-only at {mon.usage}"
            log.bookie.gc.run_once()
            mon.wait_checked(mon.checks, 1)
        assert max(mon.usage.values()) < 0.85
        w2 = log.create_ledger()
        assert w2.append(b"writable again") == 0
        w2.close()
        for q, n in acked.items():
            if n:
                got = log.open_ledger(LedgerId.parse(q), recovery=True).read_batch(0, n - 1)
                assert got == [big_payload(q, e) for e in range(n)], q
    with embedlog.open(path, **cfg) as log:           # and after a restart
        for q, n in acked.items():
            if n:
                assert log.open_ledger(LedgerId.parse(q)).read_batch(0, n - 1)[-1] == big_payload(q, n - 1)


def test_a_served_bookie_reregisters_read_only_when_its_disk_fills(small_fs, tmp_path):
    """`embedlog bookie serve` on a small filesystem: filling it moves the bookie's
    registration to read-only; freeing it moves it back."""
    import sys
    from embedlog.meta import open_metadata_store
    meta_uri = "sqlite://" + str(tmp_path / "meta.db")
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedlog.cli", "bookie", "serve", "--dir", str(small_fs / "b"),
         "--listen", "127.0.0.1:0", "--metadata", meta_uri, "--ready-file", str(ready),
         "--set", "disk_check_interval_ms=50", "--set", "journal_pre_alloc_size_mb=1",
         "--set", "journal_max_size_mb=1", "--set", "disk_usage_lwm_threshold=0.9"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    store = open_metadata_store(meta_uri)

    def wait_for(pred, what):
        deadline = time.monotonic() + 20
        while not pred():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    try:
        wait_for(ready.exists, "the bookie never became ready")
        bookie_id = ready.read_text().split()[0]
        rc = store.registration_client

        def registered(read_only):
            regs = rc.get_readonly_bookies() if read_only else rc.get_writable_bookies()
            return bookie_id in [r.bookie_id for r in regs]
        wait_for(lambda: registered(False), "not registered writable")
        st = os.statvfs(small_fs)
        ballast = small_fs / "ballast"
        _fill(ballast, leave_bytes=int(0.02 * st.f_blocks * st.f_frsize))   # 98% used
        wait_for(lambda: registered(True) and not registered(False), "never re-registered read-only")
        os.unlink(ballast)
        wait_for(lambda: registered(False) and not registered(True), "never writable again")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        store.close()


def _fill(path, leave_bytes=0) -> None:
    """Write a ballast file until the filesystem has only ``leave_bytes`` free (or none).

    Unbuffered: the bookie may take space between the statvfs and the writes (the journal
    preallocates its next chunk after an add returns), and a buffered file would keep the
    bytes ENOSPC refused and raise again when closed."""
    st = os.statvfs(os.path.dirname(path))
    free = st.f_bavail * st.f_frsize - leave_bytes
    chunk = memoryview(bytes(1 << 20))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while free > 0:
            try:
                free -= os.write(fd, chunk[:min(free, len(chunk))])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break                                     # full
        os.fsync(fd)
    finally:
        os.close(fd)


def test_a_full_journal_disk_recovers_without_a_restart(small_fs):
    """The journal's disk fills up completely: the adds and fences that hit it fail, none is
    acknowledged; once space is freed, adds and fences work again without a restart; a
    restart on an almost full disk replays what it must with no more room than that data."""
    from embedlog.errors import EmbedlogError, LedgerClosedError
    from support.crashutil import abandon
    cfg = dict(skip_list_size_limit=8 << 20, entry_log_size_limit=16 << 20, journal_max_size_mb=4,
               journal_pre_alloc_size_mb=1, flush_interval_ms=0, disk_usage_threshold=1.0,
               disk_usage_warn_threshold=1.0, disk_usage_lwm_threshold=1.0,
               disk_check_interval_ms=0, gc_wait_time_ms=0)
    path, ballast = small_fs / "log", small_fs / "ballast"
    log = embedlog.open(path, **cfg)
    w, other, fresh = log.create_ledger(), log.create_ledger(), log.create_ledger()
    acked = [w.append(payload(0, i)) for i in range(50)]
    _fill(ballast)                                       # the metadata store is full too
    with pytest.raises(EmbedlogError):
        for i in range(50, 5000):                        # until the journal hits ENOSPC
            acked.append(w.append(payload(0, i)))
    with pytest.raises(LedgerClosedError, match="earlier add failed"):
        w.append(b"after the failure")                   # no ack across the failed entry
    with pytest.raises(EmbedlogError):                   # still full: fails, not acked
        other.append(b"x" * 100_000)
    assert log.bookie.statistics()["journal"]["no_space"] >= 1   # the journal hit ENOSPC
    os.unlink(ballast)
    log.bookie.disks.check()                             # what the disk checker does each round
    assert not log.bookie.read_only
    assert fresh.append(b"room again") == 0             # no restart
    # the entry whose add failed was taken back out: recovery of an open ledger ends before it
    assert log.bookie.read_last_entry_id(w.ledger_id) == acked[-1]
    r = log.open_ledger(w.ledger_id)                     # recovery fences: it works again too
    assert r.last_add_confirmed == acked[-1]
    assert r.read_batch(0, acked[-1]) == [payload(0, i) for i in acked]
    # unflushed entries in the journal, then a crash, then a disk left with little room
    w3 = log.create_ledger()
    w3.append_many([bytes(4 << 10)] * 1000)               # 4 MiB, in the journal and memtable
    lid3 = w3.ledger_id
    abandon(log)
    _fill(ballast, leave_bytes=6 << 20)                   # room for the data, not 8 MiB ahead
    with embedlog.open(path, **cfg) as log:               # replay writes 4 MiB of entry logs
        assert log.bookie.read_last_entry_id(lid3) == 999
        assert log.bookie.read_payloads(lid3, 0, 999, 3, None) == [bytes(4 << 10)] * 1000
        assert log.open_ledger(w.ledger_id).read_batch(0, acked[-1])[-1] == payload(0, acked[-1])
        os.unlink(ballast)


# -- a full disk: read-only once, prompt stop, start read-only (issue 26 item 5) --------------


def test_no_space_is_full_until_room_returns():
    """A write refused with ENOSPC makes its disk full whatever the usage says; the disk is
    writable again only below the low-water mark *and* with room_bytes more free than then
    (the bookie's own trimming freeing a little flapped the state)."""
    state = {"usage": 0.5, "free": 1 << 20}
    cfg = BookieConfig.from_dict(dict(disk_usage_threshold=0.95, disk_usage_lwm_threshold=0.9,
                                      journal_pre_alloc_size_mb=1))
    mon = DiskMonitor(["/a"], "/j", cfg, usage_fn=lambda p: (state["usage"], state["free"]))
    flips = []
    mon.listeners.append(flips.append)
    assert mon.check() is False
    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert mon.check(enospc) is True and flips == [True]
    state.update(usage=0.45, free=(1 << 20) + mon.room_bytes - 1)    # a little freed
    assert mon.check() is True and flips == [True]
    state.update(free=(1 << 20) + mon.room_bytes)                    # room again
    assert mon.check() is False and flips == [True, False]
    assert mon.check(OSError(errno.EIO, "I/O error")) is False       # not a full disk


def test_adds_refused_for_lack_of_space_turn_read_only_and_stay(small_fs):
    """Usage thresholds at 1.0 (a disk whose last 5% is plenty): the first add the journal
    cannot write turns the bookie read-only at once (it said writable while adds failed);
    a little space coming back leaves it read-only; room for its writes makes it writable."""
    from embedlog.errors import EmbedlogError
    cfg = dict(journal_pre_alloc_size_mb=1, journal_max_size_mb=4, skip_list_size_limit=1 << 20,
               disk_usage_threshold=1.0, disk_usage_warn_threshold=1.0,
               disk_usage_lwm_threshold=1.0, disk_check_interval_ms=0, gc_wait_time_ms=0)
    with embedlog.open(small_fs / "log", **cfg) as log:
        w = log.create_ledger()
        w.append(b"before")
        _fill(small_fs / "ballast", leave_bytes=3 << 20)
        _fill(small_fs / "ballast2")
        with pytest.raises(EmbedlogError):
            for i in range(2000):
                w.append(bytes(16 << 10))
        assert log.bookie.read_only and log.bookie.read_only_reasons == {"disk"}
        os.unlink(small_fs / "ballast2")                # a few MiB back: not room enough
        log.bookie.disks.check()
        assert log.bookie.read_only
        os.unlink(small_fs / "ballast")
        log.bookie.disks.check()
        assert not log.bookie.read_only
        assert log.create_ledger().append(b"room again") == 0


def test_close_on_a_full_disk_is_prompt(small_fs):
    """The memtable flusher gave up only after close's 30 s join: it retried a flush the
    full disk refused in a loop. Closing now takes no longer than the flush attempt."""
    cfg = dict(journal_pre_alloc_size_mb=1, skip_list_size_limit=4 << 20, flush_interval_ms=0,
               disk_check_interval_ms=0, gc_wait_time_ms=0)
    log = embedlog.open(small_fs / "log", **cfg)
    w = log.create_ledger()
    w.append_many([bytes(4 << 10)] * 512)               # 2 MiB in the journal and the memtable
    _fill(small_fs / "ballast")
    t0 = time.monotonic()
    log.close()
    assert time.monotonic() - t0 < 10


def test_scanning_an_unsealed_log_reads_no_hole_on_a_full_disk(small_fs):
    """The start-up scan of an unsealed entry log stopped only at a zero size: an entry cut
    by a hole sent it into the hole, and on a full tmpfs reading a hole through the map
    faults (SIGBUS). It stops at the hole now, and the seal has room in the page."""
    import sys
    code = f"""
import os, struct, sys
from embedlog._native import entrylog as nel
p = sys.argv[1]
nel.MappedLog.create(p, 1, 16 << 20).close()
with open(p, "r+b") as f:
    f.seek(1024)
    f.write(struct.pack(">I", 8192))          # an entry running into a hole
    f.truncate(4096)
    f.truncate(16 << 20)
b = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(b, bytes(1 << 16))
except OSError:
    pass
m = nel.MappedLog.open_existing(p, 1)
print(len(m.entry_table()[0]), m.sealed)
m.close()
m = nel.MappedLog.open_writable(p, 1)
m.seal({{}})
"""
    r = subprocess.run([sys.executable, "-c", code, str(small_fs / "1.log"), str(small_fs / "ballast")],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0 and r.stdout.split() == ["0", "False"], (r.returncode, r.stderr[-2000:])


def test_a_restart_on_a_full_disk_starts_read_only(small_fs, tmp_path):
    """A crash left an unsealed entry log whose last entry runs into a hole of the file (a
    flush the disk refused part of). On a full tmpfs, reading a hole through the map faults
    (SIGBUS, the process died with an empty log); the start-up scan stops at the hole, the
    seal that finds no room leaves the log unsealed, and the bookie starts read-only with
    every entry readable."""
    import struct
    import sys
    path = small_fs / "log"
    cfg = dict(journal_pre_alloc_size_mb=1, disk_check_interval_ms=0, gc_wait_time_ms=0,
               metadata_uri="sqlite://" + str(tmp_path / "meta.db"),   # not on the full disk
               storage_layout=1)                                     # an entry log's seal
    log = embedlog.open(path, **cfg)
    w = log.create_ledger()
    w.append_many([payload(0, i) for i in range(100)])
    log.close()                                          # the entries are in an entry log
    cur = path / "current"
    (name,) = [n for n in os.listdir(cur) if n.endswith(".log")]
    with open(cur / name, "r+b") as f:
        f.seek(1024)
        end = 1024
        while True:                                      # the end of the entries
            (n,) = struct.unpack(">I", f.read(4))
            if n == 0:
                break
            end += 4 + n
            f.seek(end)
        size = os.fstat(f.fileno()).st_size
        page = (end + 4 + 4095) // 4096 * 4096
        f.seek(end)
        f.write(struct.pack(">I", page - end))          # an entry cut short by the hole
        f.truncate(page)                                  # the rest of the file: a hole
        f.truncate(size)
    _fill(small_fs / "ballast")
    code = f"""
import embedlog, sys
log = embedlog.open(sys.argv[1], **{cfg!r})
lid = embedlog.LedgerId.parse(sys.argv[2])      # OPEN: its entries, as the bookie serves them
print(log.bookie.read_only, log.bookie.read_entry(lid, 99).endswith({payload(0, 99)!r}), flush=True)
log.close()
"""
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, str(path), w.ledger_id.qualified_name],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, (r.returncode, r.stderr[-6000:])
    assert r.stdout.split() == ["True", "True"], r.stdout


# -- the full disk's state ends when the space does (issue 55 item 1) ---------------------------


def _reasons_watch(bookie):
    """(condition, reasons now): every read-only change the bookie announces, kept."""
    import threading
    cv = threading.Condition()
    now = {"reasons": frozenset(bookie.read_only_reasons)}

    def on_change(_read_only, reasons):
        with cv:
            now["reasons"] = reasons
            cv.notify_all()
    bookie.read_only_listeners.append(on_change)
    return cv, now


def test_a_freed_journal_disk_is_writable_within_a_second(small_fs, caplog):
    """ENOSPC on the journal's disk, then the space comes back. Every checkpoint failed on
    the failed group's sequence number (the memtable's last seq, which no add could move
    since the bookie was read-only for that very failure): 'read-only until a checkpoint
    succeeds' never ended. Now the bookie is writable again soon after the space returns
    with the default disk_check_interval_ms (10 s), and a crash after that loses nothing
    acknowledged."""
    import logging
    from embedlog.errors import EmbedlogError
    from support.crashutil import abandon
    cfg = dict(journal_max_size_mb=4, journal_pre_alloc_size_mb=1, flush_interval_ms=100,
               gc_wait_time_ms=0)
    path, ballast = small_fs / "log", small_fs / "ballast"
    log = embedlog.open(path, **cfg)
    try:
        cv, now = _reasons_watch(log.bookie)
        w = log.create_ledger()
        acked = [w.append(payload(0, i)) for i in range(20)]
        _fill(ballast)
        with pytest.raises(EmbedlogError):
            for i in range(20, 5000):
                acked.append(w.append(big_payload("w", i)))
        with cv:                                            # failing checkpoints turn it read-only
            assert cv.wait_for(lambda: "checkpoint" in now["reasons"], 30), now
        os.unlink(ballast)
        t0 = time.monotonic()
        with cv:
            assert cv.wait_for(lambda: not now["reasons"], 10), \
                f"still read-only ({set(now['reasons'])}) 10 s after the space came back"
        took = time.monotonic() - t0
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR
                  and "checkpoint failed" in r.getMessage()]
        assert len(errors) < 10, f"{len(errors)} ERROR lines for one full disk"
        w2 = log.create_ledger()
        assert w2.append(b"writable again") == 0
    except BaseException:
        log.close()            # its threads must not outlive the file system unmounted next
        raise
    abandon(log)                                        # a crash: replay from the mark moved
    with embedlog.open(path, **cfg) as log:
        r = log.open_ledger(w.ledger_id)
        assert r.last_add_confirmed == acked[-1]
        assert r.read_batch(0, acked[-1]) == [payload(0, i) if i < 20 else big_payload("w", i)
                                              for i in acked]
        assert log.open_ledger(w2.ledger_id).read_entry(0) == b"writable again"
    print(f"writable {took:.2f} s after the space came back")
    assert took < 5, took          # 0.1-0.2 s on a quiet machine; headroom for a loaded one


def _served_journal_on(small_fs, tmp_path, **config):
    """A LocalCluster of one bookie whose journal is on ``small_fs`` (its ledgers and the
    metadata store are not)."""
    from embedlog.harness import LocalCluster
    cfg = {**dict(journal_directory=str(small_fs / "journal"), journal_max_size_mb=4,
                  journal_pre_alloc_size_mb=1, gc_wait_time_ms=0), **config}
    return LocalCluster(bookies=1, base_dir=str(tmp_path / "c"), proxies=False,
                        autorecovery=False, bookie_config=cfg)


def _registered(cluster, writable: bool) -> bool:
    from embedlog.meta import open_metadata_store
    with open_metadata_store(cluster.metadata_uri) as store:
        rc = store.registration_client
        regs = rc.get_writable_bookies() if writable else rc.get_readonly_bookies()
        return cluster.bookie_id(0) in [r.bookie_id for r in regs]


def test_a_served_bookie_is_writable_soon_after_its_journal_disk_is_freed(small_fs, tmp_path):
    """Served, the same: the journal's disk fills, adds fail, checkpoints fail (read-only
    until one succeeds); once the space is back the bookie re-registers writable and takes
    adds, without a restart."""
    from support.cliutil import wait_until
    from embedlog.errors import EmbedlogError
    with _served_journal_on(small_fs, tmp_path, flush_interval_ms=100) as cluster:
        client = cluster.client()
        w = client.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
        w.append(b"before")
        _fill(small_fs / "ballast")
        with pytest.raises(EmbedlogError):
            for i in range(5000):
                w.append(big_payload("s", i))
        # every checkpoint failed on the failed group from here on, the bookie read-only
        # for that once three had (100 ms apart), whatever space came back
        wait_until(lambda: _registered(cluster, False), 30, "registered read-only")
        os.unlink(small_fs / "ballast")
        t0 = time.monotonic()
        wait_until(lambda: _registered(cluster, True), 10, "registered writable again",
                   interval_s=0.02)
        took = time.monotonic() - t0
        w2 = client.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
        assert w2.append(b"writable again") == 0
        w2.close()
        print(f"served: registered writable {took:.2f} s after the space came back")
        assert took < 5, took


def test_journal_files_kept_for_reuse_never_take_the_journals_last_space(small_fs, tmp_path):
    """Served, on a 64 MiB journal file system with 4 MiB journals: the journal files kept
    for reuse (up to sixteen) filled it, the journal hit ENOSPC and the bookie went
    read-only, and stayed so across a restart. They are kept now only while the file system
    has room besides them, and given back first when it runs short: a restart on a file
    system something else filled meanwhile is writable at once."""
    from support.cliutil import wait_until
    from embedlog.bookie.journal_files import FREE
    journal = small_fs / "journal"
    # 1 MiB journals: the restart's own trim frees one (at most 2 MiB with its zeros), not
    # the 5% of the file system that would make it writable without the spares
    # layout 1: in layout 2 the journal's file system holds the entries themselves
    with _served_journal_on(small_fs, tmp_path, flush_interval_ms=100, journal_max_size_mb=1,
                            journal_max_backups=0, storage_layout=1) as cluster:
        client = cluster.client()
        w = client.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
        entry = bytes(32 << 10)
        for _ in range(40):                                     # 80 MiB through the journal
            futs = w.append_many_async([entry] * 64)
            futs[-1].result(60)
            st = os.statvfs(journal)
            assert 1 - st.f_bavail / st.f_blocks < 0.95         # never full
        assert w.append(b"last") == 40 * 64
        w.close()
        assert _registered(cluster, True) and not _registered(cluster, False)
        # the checkpoints after the last roll trim what the mark passed; kept for reuse while
        # there is room besides (a loaded machine's lagging mark may have left less)
        wait_until(lambda: len([n for n in os.listdir(journal) if n.endswith(".txn")]) <= 2,
                   30, "journals trimmed")
        spares = [n for n in os.listdir(journal) if n.endswith(FREE)]
        assert len(spares) >= 3, sorted(os.listdir(journal))    # reuse still works
        cluster.stop_bookie(0)
        _fill(small_fs / "ballast")                             # filled while it was down
        cluster.restart_bookie(0)
        wait_until(lambda: _registered(cluster, True), 10, "writable after the restart",
                   interval_s=0.02)
        assert "journal files kept for reuse deleted" in open(os.path.join(cluster.bookie_dir(0), "bookie.log")).read()
        w2 = client.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
        assert w2.append(b"room for the journal") == 0
        w2.close()
