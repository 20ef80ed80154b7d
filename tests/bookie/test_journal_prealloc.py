"""Journal preallocation (issue 47): zeros go ahead of the tail only while groups are small
(or written buffered); large O_DIRECT groups extend the file instead, so a fresh log writes
each journal byte once. Every acknowledged entry survives a power loss and a reopen either
way, and a journal that large groups extended is still kept for reuse when trimmed."""
import os
import random
import shutil
import tempfile

import pytest

import embedlog
from embedlog import fileio
from embedlog._native import journal_buffer as jbuffer
from embedlog.bookie.journal_files import PREALLOC_GROUP_BYTES_MAX
from support.crash_child import payload
from support.crashutil import abandon
from support.cliutil import wait_until
from support.servers import skip_unless_ci

TMPFS_MAGIC = 0x01021994
CFG = dict(journal_max_size_mb=64, journal_pre_alloc_size_mb=1, flush_interval_ms=0,
           skip_list_size_limit=64 << 20)


def _stats(log):
    return log.bookie.statistics()["journal"]


def _direct_or_skip(log):
    if not log.bookie.journal.direct_writes:
        log.close()
        # the policy under test is O_DIRECT's; a CI whose disk refuses it must say so
        skip_unless_ci("O_DIRECT refused here: buffered groups always write zeros ahead")


def test_large_groups_extend_the_journal_without_zeros(tmp_path):
    data = os.urandom(1000)
    log = embedlog.open(tmp_path / "d", **CFG)
    _direct_or_skip(log)
    floor = _stats(log)["zeros_written"]            # the new file's header block and floor
    assert floor <= (1 << 20)
    w = log.create_ledger()
    for _ in range(40):                             # 40 groups of ~100 KB: past the floor
        last = w.append_many([data] * 100)
    assert _stats(log)["zeros_written"] == floor
    assert _stats(log)["groups_extending"] >= 30
    log.close()
    with embedlog.open(tmp_path / "d", **CFG) as log:
        assert log.open_ledger(w.ledger_id).read_batch(0, last) == [data] * (last + 1)


def test_small_groups_keep_zeros_ahead(tmp_path):
    with embedlog.open(tmp_path / "d", **CFG) as log:
        _direct_or_skip(log)
        floor = _stats(log)["zeros_written"]
        w = log.create_ledger()
        for i in range(300):                        # 1.2 MB: past the floor's 1 MiB
            w.append(b"%04d" % i + bytes(4000))     # one lone group each
        wait_until(lambda: _stats(log)["zeros_written"] > floor, timeout_s=30,
                   what="zeros ahead of small groups")
        assert (log.bookie.journal.files.group_bytes_mean or 0) < PREALLOC_GROUP_BYTES_MAX


def _large_groups_stay_in_zeros(path, **cfg):
    data = os.urandom(1024)
    with embedlog.open(path, **dict(CFG, **cfg)) as log:
        files = log.bookie.journal.files
        assert files.zeros_required()
        w = log.create_ledger()
        for _ in range(6):                          # 4 MiB groups, 1 MiB of zeros ahead
            last = w.append_many([data] * 4000)
            assert files.zero_end >= files.offset
        assert _stats(log)["groups_extending"] == 0
    with embedlog.open(path, **dict(CFG, **cfg)) as log:
        assert log.open_ledger(w.ledger_id).read_batch(0, last) == [data] * (last + 1)


def test_buffered_groups_larger_than_the_zeros_never_pass_them(tmp_path):
    """A torn buffered write past the end of the file can leave it ending inside a record,
    which replay must refuse: the leader writes zeros under a group the preallocator has
    not covered (the old code extended the file: a SIGKILL in the middle of a 4 MiB pwrite
    refused the next start, 2 in 40)."""
    _large_groups_stay_in_zeros(tmp_path / "d", journal_direct_writes=False)


def test_power_loss_after_buffered_groups_larger_than_the_zeros(tmp_path):
    """The zeros the leader writes under a large buffered group are synced before the
    group: a power loss keeps every acknowledged entry and the file's size past them."""
    data = os.urandom(1024)
    path = tmp_path / "d"
    cfg = dict(CFG, journal_direct_writes=False)
    fileio.record_durable(True)
    try:
        log = embedlog.open(path, **cfg)
        w = log.create_ledger()
        for _ in range(3):
            last = w.append_many([data] * 3000)          # 3 MiB groups, 1 MiB of zeros ahead
        assert _stats(log)["groups_extending"] == 0
        abandon(log)
        fileio.power_loss(str(path))
    finally:
        fileio.record_durable(False)
    with embedlog.open(path, **cfg) as log:
        assert log.open_ledger(w.ledger_id).read_batch(0, last) == [data] * (last + 1)


def test_direct_groups_on_tmpfs_keep_zeros_under_them():
    """tmpfs takes O_DIRECT through its page cache, so a killed write can move the size
    part way: only on ext4 and XFS do large O_DIRECT groups extend the file (the old code
    extended it everywhere: 8 starts refused in 40 SIGKILLs on /dev/shm)."""
    if not os.path.isdir("/dev/shm") or jbuffer.fs_type("/dev/shm") != TMPFS_MAGIC:
        pytest.skip("no tmpfs at /dev/shm")
    path = tempfile.mkdtemp(prefix="embedlog-test-", dir="/dev/shm")
    try:
        _large_groups_stay_in_zeros(os.path.join(path, "d"))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_blocks_written_counts_what_the_device_takes(tmp_path):
    """bytes_written counts records; blocks_written what the writes put on the device:
    with O_DIRECT each lone group writes its whole block again."""
    with embedlog.open(tmp_path / "d", **CFG) as log:
        _direct_or_skip(log)
        w = log.create_ledger()
        before = dict(_stats(log))
        for i in range(20):
            w.append(b"%04d" % i + bytes(96))       # 20 lone groups: a 145-byte record each
        after = _stats(log)
        groups = after["groups"] - before["groups"]
        records = after["bytes_written"] - before["bytes_written"]
        assert groups == 20 and 20 * 145 <= records < 20 * 200   # the first add's own records too
        # every group sits inside the first blocks: one or two blocks each
        assert 20 * 4096 <= after["blocks_written"] - before["blocks_written"] <= 40 * 4096


@pytest.mark.parametrize("seed", range(3))
def test_power_loss_over_extended_and_preallocated_stretches(tmp_path, seed):
    """Groups alternate between large (the file is extended) and small (zeros go ahead
    again, past a hole when the tail ran beyond the zeros); the power goes, what was not
    synced is gone; every acknowledged entry reads back."""
    rnd = random.Random(seed)
    path = tmp_path / "d"
    fileio.record_durable(True)
    try:
        log = embedlog.open(path, **dict(CFG, journal_max_size_mb=4, journal_max_backups=0,
                                         flush_interval_ms=20, skip_list_size_limit=256 << 10))
        w = log.create_ledger()
        q = w.ledger_id.qualified_name
        acked = []
        for _ in range(rnd.randint(20, 40)):
            e = len(acked)
            if rnd.random() < 0.5:
                last = w.append_many([payload(q, e + k) for k in range(rnd.randint(80, 300))])
                acked.extend(range(e, last + 1))
            else:
                for k in range(rnd.randint(5, 40)):
                    acked.append(w.append(payload(q, e + k)))
        abandon(log)
        cut = fileio.power_loss(str(path))
    finally:
        fileio.record_durable(False)
    assert cut
    with embedlog.open(path, **CFG) as log:
        got = log.open_ledger(w.ledger_id).read_batch(0, acked[-1])
        assert got == [payload(q, e) for e in acked]


def test_extended_journals_are_kept_for_reuse(tmp_path):
    """A roll happens when the next group does not fit, so a journal that large groups
    extended ends short of journal_max_size_mb; it is still kept for reuse, and once the
    pool has files no zeros are written at all."""
    data = os.urandom(1000)
    cfg = dict(CFG, journal_max_size_mb=4, journal_max_backups=0, flush_interval_ms=20, storage_layout=1,
               skip_list_size_limit=1 << 20)
    with embedlog.open(tmp_path / "d", **cfg) as log:
        _direct_or_skip(log)
        w = log.create_ledger()
        wait_until(lambda: (w.append_many([data] * 150) is not None and
                            _stats(log)["files_reused"] >= 2), timeout_s=120, what="reuse")
        zeros = _stats(log)["zeros_written"]
        reused = _stats(log)["files_reused"]
        wait_until(lambda: (w.append_many([data] * 150) is not None and
                            _stats(log)["files_reused"] >= reused + 3), timeout_s=120,
                   what="more reuse")
        assert _stats(log)["zeros_written"] == zeros
        last = w.append(b"last")
    with embedlog.open(tmp_path / "d", **cfg) as log:
        assert log.open_ledger(w.ledger_id).read_entry(last) == b"last"


def test_a_journal_rolled_under_large_groups_gets_no_zeros(tmp_path):
    """A new journal made while the groups are large gets its header block and no zeros
    ahead (they would only be written over: 4 MiB a file), and says so in its header; the
    entries on both sides of the roll read back after a reopen."""
    cfg = dict(CFG, journal_max_size_mb=4)
    data = os.urandom(1000)
    log = embedlog.open(tmp_path / "d", **cfg)
    _direct_or_skip(log)
    w = log.create_ledger()
    stats = _stats(log)
    floor = stats["zeros_written"]                  # the first file's, before any group
    files = stats.get("files_created", 0)
    last = -1
    while _stats(log).get("files_created", 0) < files + 3:   # rolls under ~100 KB groups
        last = w.append_many([data] * 100)
    assert _stats(log)["zeros_written"] == floor
    log.close()
    with embedlog.open(tmp_path / "d", **cfg) as log:
        assert log.open_ledger(w.ledger_id).read_batch(0, last) == [data] * (last + 1)
