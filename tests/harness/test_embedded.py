"""The embedded API end to end, and bad input that must fail cleanly."""
import array
import ctypes
import gc
import os
import subprocess
import sys
import threading

import pytest

import embedlog
from embedlog import LedgerId
from embedlog.errors import (ClientClosedError, DirectoryLockedError, EmbedlogError, EntryTooLargeError,
                             IllegalOpError, LedgerClosedError, LedgerFencedError,
                             NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError)


def test_round_trip_and_reopen(tmp_path, small_config):
    payloads = [os.urandom(n) for n in (0, 1, 100, 1024, 70_000)] * 50
    with embedlog.open(tmp_path, **small_config) as log:
        w = log.create_ledger(digest="crc32c")
        assert w.append(payloads[0]) == 0
        assert w.append_many(payloads[1:100]) == 99
        futs = [w.append_async(p) for p in payloads[100:]]
        assert [f.result(10) for f in futs] == list(range(100, len(payloads)))
        assert w.last_add_confirmed == len(payloads) - 1
        w.close()
        r = log.open_ledger(w.ledger_id)
        assert r.read_batch(0, r.last_add_confirmed) == payloads
        assert r.length == sum(map(len, payloads))
    with embedlog.open(tmp_path, **small_config) as log:
        r = log.open_ledger(w.ledger_id)
        assert [e.data for e in r.read(0, r.last_add_confirmed)] == payloads
        assert r.read_entry(3) == payloads[3]


def test_an_add_in_flight_leaves_the_collector_few_objects(tmp_path):
    """append_async's add, until durable: its future, its journal callback and the
    callback's queue entry (a closure with its cells was four more). An add lives past young
    collections, and each object it holds is promoted and brings a full collection nearer."""
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger()
        w.append(b"warm")
        gc.collect()
        gc.disable()
        try:
            before = len(gc.get_objects())
            futs = [w.append_async(b"x") for _ in range(1000)]
            grown = len(gc.get_objects()) - before
        finally:
            gc.enable()
        assert [f.result(10) for f in futs] == list(range(1, 1001))
        assert grown <= 3 * 1000 + 100, grown


@pytest.mark.parametrize("digest", ["crc32", "crc32c", "mac", "dummy"])
@pytest.mark.parametrize("scope", [0, 77])
def test_digests_and_scopes(tmp_path, digest, scope):
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger(digest=digest, password=b"pw", scope_id=scope)
        assert w.ledger_id.scope_id == scope
        w.append_many([b"a", b"bb", b"ccc"])
        w.close()
        r = log.open_ledger(w.ledger_id, password=b"pw")
        assert r.read_batch(0, 2) == [b"a", b"bb", b"ccc"]
        assert log.list_ledgers(scope) == [w.ledger_id]
        if scope:
            assert log.list_ledgers(0) == []


def test_recovery_open_fences_the_writer(tmp_path):
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger()
        w.append_many([b"x"] * 10)
        r = log.open_ledger(w.ledger_id)           # recovery: fence and close
        assert r.last_add_confirmed == 9 and r.is_closed
        with pytest.raises(LedgerFencedError):
            w.append(b"late")
        w.close()      # closed by the reader at the writer's own LAC: close succeeds (seed 004)
        assert log.ledger_metadata(w.ledger_id).last_entry_id == 9


def test_non_recovery_open_reads_up_to_lac(tmp_path):
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger()
        for i in range(5):
            w.append(b"%d" % i)
        r = log.open_ledger(w.ledger_id, recovery=False)
        # the LAC a reader learns is the one carried by the last entry: 3
        assert r.last_add_confirmed == 3
        assert r.read_batch(0, 3)[-1] == b"3"
        with pytest.raises(NoSuchEntryError):
            r.read_entry(4)
        w.append(b"5")
        assert r.read_lac() == 4
        w.append(b"6")                              # the writer goes on: not fenced
        w.close()


def test_bad_input(tmp_path):
    with embedlog.open(tmp_path, max_entry_size_bytes=1000) as log:
        w = log.create_ledger(password=b"right")
        w.append(b"ok")
        with pytest.raises(EntryTooLargeError):
            w.append(b"x" * 1001)
        with pytest.raises(IllegalOpError):
            w.append("not bytes")
        with pytest.raises(IllegalOpError):
            w.append_many([])
        assert w.append(b"still fine") == 1
        w.close()
        with pytest.raises(LedgerClosedError):
            w.append(b"after close")
        with pytest.raises(UnauthorizedAccessError):
            log.open_ledger(w.ledger_id, password=b"wrong")
        r = log.open_ledger(w.ledger_id, password=b"right")
        for first, last, err in ((-1, 0, IllegalOpError), (1, 0, IllegalOpError),
                                 (0, 2, NoSuchEntryError), (5, 5, NoSuchEntryError)):
            with pytest.raises(err):
                r.read_batch(first, last)
        with pytest.raises(NoSuchLedgerError):
            log.open_ledger(12345)
        for bad in (-1, "7", 1.5, 1 << 63):
            with pytest.raises(IllegalOpError):
                log.open_ledger(bad)
        with pytest.raises(IllegalOpError):
            log.create_ledger(digest="md5")
        with pytest.raises(embedlog.errors.ConfigError):
            embedlog.open(tmp_path / "other", journal_max_group_wait_ms=-1)
        with pytest.raises(embedlog.errors.ConfigError):
            embedlog.open(tmp_path / "other2", no_such_key=1)
        assert r.read_batch(0, 1) == [b"ok", b"still fine"]   # nothing was corrupted


def test_bookie_rejects_wrong_master_key(tmp_path):
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger(password=b"a")
        w.append(b"1")
        with pytest.raises(UnauthorizedAccessError):
            log.bookie.fence(w.ledger_id, b"\0" * 20)
        assert not log.bookie.is_fenced(w.ledger_id)
        assert w.append(b"2") == 1


def test_delete_and_list(tmp_path, small_config):
    with embedlog.open(tmp_path, **small_config) as log:
        ids = []
        for i in range(5):
            w = log.create_ledger()
            w.append_many([b"e%d" % i] * 100)
            w.close()
            ids.append(w.ledger_id)
        log.delete_ledger(ids[1])
        assert log.list_ledgers() == [ids[0]] + ids[2:]
        with pytest.raises(NoSuchLedgerError):
            log.open_ledger(ids[1])
    with embedlog.open(tmp_path, **small_config) as log:
        assert not log.bookie.has_ledger(ids[1])
        assert log.open_ledger(ids[4]).read_entry(99) == b"e4"


def test_directory_lock(tmp_path):
    with embedlog.open(tmp_path):
        with pytest.raises(DirectoryLockedError):
            embedlog.open(tmp_path)
        code = ("import embedlog,sys\n"
                "try:\n embedlog.open(sys.argv[1])\nexcept embedlog.errors.DirectoryLockedError:\n"
                " sys.exit(7)\n")
        assert subprocess.run([sys.executable, "-c", code, str(tmp_path)]).returncode == 7
    log = embedlog.open(tmp_path)
    log.close()
    with pytest.raises(ClientClosedError):
        log.create_ledger()


def test_concurrent_writers_on_many_ledgers(tmp_path, small_config):
    with embedlog.open(tmp_path, **small_config) as log:
        handles = [log.create_ledger() for _ in range(8)]

        def work(h):
            for i in range(300):
                assert h.append(b"%d" % i) == i

        threads = [threading.Thread(target=work, args=(h,)) for h in handles]
        [t.start() for t in threads]
        [t.join() for t in threads]
        for h in handles:
            h.close()
            assert log.open_ledger(h.ledger_id).read_batch(0, 299)[-1] == b"299"


def test_import_without_extension_fails_clearly(tmp_path):
    # a copy of the package without its compiled modules must not import
    import shutil
    src = os.path.dirname(embedlog.__file__)
    dst = tmp_path / "embedlog"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    out = subprocess.run([sys.executable, "-c", "import embedlog"], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode != 0
    assert "compiled extension" in out.stderr and "pip install" in out.stderr


def test_tiny_index_cache_never_drops_unwritten_pages(tmp_path):
    """Regression: a page loaded for writing must not be evicted before it is marked dirty."""
    n = 1024 * 20
    with embedlog.open(tmp_path, page_limit=16, skip_list_size_limit=1 << 16, flush_interval_ms=0) as log:
        w = log.create_ledger()
        for i in range(0, n, 1000):
            w.append_many([b"%d" % e for e in range(i, min(n, i + 1000))])
        w.close()
        r = log.open_ledger(w.ledger_id)
        assert r.read_batch(0, n - 1) == [b"%d" % e for e in range(n)]
        log.bookie.checkpoint()
        assert log.bookie.storage.index_cache.loaded <= 16 + 4
    with embedlog.open(tmp_path, page_limit=16) as log:
        r = log.open_ledger(w.ledger_id)
        assert [r.read_entry(e) for e in range(0, n, 97)] == [b"%d" % e for e in range(0, n, 97)]


def test_index_pages_loaded_by_readers_keep_the_locations_a_flush_sets(tmp_path):
    """Regression: readers load index pages without the storage lock. When a reader loaded a
    page while a memtable flush was reading the same page from disk, the flush set its
    locations in the reader's copy without marking it dirty, and the cache evicted it:
    acknowledged entries were gone from the index, before and after a reopen."""
    import random

    def pay(q, e):
        return b"%s/%d;" % (q.encode(), e) * (1 + e % 5)
    cfg = dict(page_limit=16, skip_list_size_limit=1 << 18, flush_interval_ms=20)
    errors, stop = [], threading.Event()
    with embedlog.open(tmp_path, **cfg) as log:
        ws = [log.create_ledger() for _ in range(6)]
        for w in ws:                                   # 20 index pages each, on disk
            q = w.ledger_id.qualified_name
            for i in range(0, 20_000, 1000):
                w.append_many([pay(q, e) for e in range(i, i + 1000)])
        log.bookie.checkpoint()

        def reader(seed):
            rnd = random.Random(seed)
            handles = [log.open_ledger(w.ledger_id, recovery=False) for w in ws]
            try:
                while not stop.is_set():
                    h = rnd.choice(handles)
                    lac, q = h.read_lac(), h.ledger_id.qualified_name
                    for e in rnd.sample(range(lac + 1), 50):
                        assert h.read_entry(e) == pay(q, e), (q, e)
            except BaseException as exc:   # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
        [t.start() for t in threads]
        rnd = random.Random(7)
        flushes = log.bookie.statistics()["memtable_flushes"]
        try:                                           # new entries on the pages they load
            while log.bookie.statistics()["memtable_flushes"] < flushes + 60 and not errors:
                w = rnd.choice(ws)
                q, n = w.ledger_id.qualified_name, w.last_add_confirmed + 1
                w.append_many([pay(q, e) for e in range(n, n + rnd.choice((1, 10, 300)))])
        finally:
            stop.set()
            [t.join() for t in threads]
        assert not errors, errors[0]
        acked = {w.ledger_id: w.last_add_confirmed for w in ws}
        for w in ws:                                   # the writer's digest: CRC32C
            got = log.bookie.read_payloads(w.ledger_id, 0, acked[w.ledger_id], 3, None)
            assert got == [pay(w.ledger_id.qualified_name, e) for e in range(len(got))]
    with embedlog.open(tmp_path, **cfg) as log:
        for lid, last in acked.items():
            got = log.open_ledger(lid).read_batch(0, last)
            assert got == [pay(lid.qualified_name, e) for e in range(last + 1)]


@pytest.mark.parametrize("batch", [
    [b"b", b"c", b"x" * 70_000, b"d"],                          # too large for the memtable
    [b"1" * 30_000, b"2" * 30_000, b"3" * 30_000, "not bytes"],  # refused after a full memtable
], ids=["too_large", "not_bytes_after_a_full_memtable"])
def test_a_batch_refused_for_one_entry_frames_none_of_it(tmp_path, batch):
    """Regression: a batch spanning two memtable passes failed on a later entry after the
    first pass was journalled; the next append reused those ids, and after a reopen the
    ledger held entries of the call that had raised."""
    with embedlog.open(tmp_path, skip_list_size_limit=1 << 16) as log:
        w = log.create_ledger()
        w.append(b"a")
        with pytest.raises((EntryTooLargeError, IllegalOpError)):
            w.append_many(batch)
        assert w.append(b"e") == 1               # the refused batch took no id
        lid = w.ledger_id
    with embedlog.open(tmp_path, skip_list_size_limit=1 << 16) as log:
        r = log.open_ledger(lid)
        assert r.read_batch(0, r.last_add_confirmed) == [b"a", b"e"]


@pytest.mark.parametrize("digest", ["crc32c", "crc32", "mac"])
def test_any_buffer_is_an_entry_in_every_pass_of_a_batch(tmp_path, digest):
    """Regression: check_payloads took any buffer while a later pass took only 1-D unsigned
    bytes, so an array or a strided view at the end of a batch spanning two memtable passes
    failed half-framed (BufferError for the strided view) and ended the handle. Every
    buffer is its bytes in C order, as bytes(item) gives them, in every pass."""
    odd = [array.array("i", [1, 2, 3]), memoryview(b"abcdefgh")[::2],
           memoryview(b"0123456789").cast("B", shape=[2, 5]), (ctypes.c_int * 2)(7, 8)]
    with embedlog.open(tmp_path, skip_list_size_limit=1 << 16) as log:
        w = log.create_ledger(digest=digest, password=b"pw")
        last = w.append_many([b"1" * 30_000, b"2" * 30_000, b"3" * 30_000] + odd)
        assert w.append(b"e") == last + 1
        lid = w.ledger_id
    with embedlog.open(tmp_path, skip_list_size_limit=1 << 16) as log:
        r = log.open_ledger(lid, password=b"pw")
        assert r.read_batch(3, 3 + len(odd)) == [bytes(x) for x in odd] + [b"e"]


def test_a_long_batch_goes_in_chunks_each_made_durable(tmp_path, monkeypatch):
    """append_many frames at most _CHUNK_BYTES before a sync (the journal buffer stays
    bounded): a list of any buffers over the bound goes in several groups, ids in order."""
    from embedlog import embedded
    from embedlog._native.journal_kernels import chunk_end
    monkeypatch.setattr(embedded, "_CHUNK_BYTES", 10_000)
    items = [os.urandom(3_000), bytearray(os.urandom(3_000)), memoryview(os.urandom(4_000))] * 20
    assert chunk_end(items, 0, 10_000) == 3            # 10,000 bytes are not below the bound
    assert chunk_end(items, 59, 10_000) == 60 and chunk_end([b"x" * 20_000], 0, 10) == 1
    with pytest.raises(IllegalOpError, match="bytes-like"):
        chunk_end([b"a", 7], 0, 10_000)
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger()
        before = log.statistics()["journal"]["fsyncs"]
        assert w.append_many(items) == len(items) - 1
        assert log.statistics()["journal"]["fsyncs"] - before >= 20       # 20 chunks of 3
        lid = w.ledger_id
    with embedlog.open(tmp_path) as log:
        r = log.open_ledger(lid)
        assert r.read_batch(0, r.last_add_confirmed) == [bytes(x) for x in items]


def test_a_batch_that_fails_after_part_of_it_was_framed_ends_the_handle(tmp_path, monkeypatch):
    """An error after part of a batch is journalled (here: the memtable cannot make room)
    leaves those ids taken: the handle refuses more adds instead of reusing them."""
    with embedlog.open(tmp_path, skip_list_size_limit=1 << 16) as log:
        w = log.create_ledger()
        w.append(b"a")

        def no_room(seq):
            raise EmbedlogError("injected: no room in the memtable")
        monkeypatch.setattr(log.bookie.storage, "make_room", no_room)
        with pytest.raises(EmbedlogError, match="injected"):
            w.append_many([b"1" * 30_000, b"2" * 30_000, b"3" * 30_000])
        monkeypatch.undo()
        with pytest.raises(LedgerClosedError):
            w.append(b"e")
        w.close()
        assert log.open_ledger(w.ledger_id).last_add_confirmed == 0


@pytest.mark.parametrize("writer", ["ledger", "stream"])
def test_an_add_future_cannot_be_cancelled_and_adds_go_on(tmp_path, writer):
    """Regression: cancel() on a pending append_async future succeeded, and completing it
    raised InvalidStateError in the journal's writer thread (which died: every later
    append_async waited for ever) or in the client's acknowledgement loop."""
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger() if writer == "ledger" else log.open_stream("s")
        first = w.append(b"first")
        futures = [w.append_async(b"%d" % i) for i in range(300)]
        assert not any(f.cancel() for f in futures)
        assert [f.result(10) for f in futures] == list(range(first + 1, first + 301))
        assert w.append_async(b"after").result(10) == first + 301
        assert w.append(b"last") == first + 302


# -- issue 27 item 6: paths that are not logs, and a read-only open beside the writer ---------------

def test_open_refuses_a_path_that_cannot_be_a_log(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    for bad, words in (("", "empty"), (a_file, "is a file"), (other, "holds no log")):
        with pytest.raises(embedlog.errors.LogDirectoryError, match=words):
            embedlog.open(bad)
    assert sorted(os.listdir(other)) == ["cat.jpg"]          # nothing was written there
    for made in (tmp_path / "new", other / "empty"):
        with embedlog.open(made):                            # a new or empty directory is fine
            pass
        with embedlog.open(made) as log:                     # and so is a log
            assert log.list_ledgers() == []
    with pytest.raises(embedlog.errors.LogDirectoryError, match="no log to read"):
        embedlog.open(tmp_path / "nothing", read_only=True)


def test_a_path_below_a_file_is_a_log_directory_error(tmp_path):
    """Issue 52, item 2: a path below a regular file raised a bare FileExistsError (or
    NotADirectoryError); it is a LogDirectoryError naming the path and the file in the way,
    for the log's directory and for a journal or ledger directory given with it."""
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    for below in (a_file / "sub", a_file / "sub" / "deeper"):
        for read_only in (False, True):
            with pytest.raises(embedlog.errors.LogDirectoryError) as info:
                embedlog.open(below, read_only=read_only)
            assert str(below) in str(info.value) and f"{a_file} is a file" in str(info.value)
    for where in (dict(journal_dir=str(a_file / "journal")),
                  dict(ledger_directories=str(a_file / "ledgers"))):
        with pytest.raises(embedlog.errors.LogDirectoryError, match=f"{a_file} is a file"):
            embedlog.open(tmp_path / "log", **where)
        with embedlog.open(tmp_path / "log") as log:       # nothing held: it opens after
            assert log.list_ledgers() == []
    assert a_file.read_text() == "mine"


def test_a_directory_this_user_cannot_write_is_an_embedlog_error(tmp_path, monkeypatch):
    def denied(uri, **kw):
        raise PermissionError(13, "Permission denied", str(tmp_path / "log" / "meta.db"))
    monkeypatch.setattr(embedlog.embedded, "open_metadata_store", denied)
    with pytest.raises(embedlog.errors.LogDirectoryError, match="Permission denied .*read_only=True"):
        embedlog.open(tmp_path / "log")
    monkeypatch.undo()
    if os.geteuid() == 0:
        return                                     # root writes anywhere: no real refusal
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(embedlog.errors.LogDirectoryError, match="Permission denied"):
        embedlog.open(locked)


READER = """
import json, sys
import embedlog
with embedlog.open(sys.argv[1], read_only=True) as log:
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "read":
            r = log.open_ledger(int(args[0]))
            out = {"lac": r.last_add_confirmed, "closed": r.is_closed,
                   "entries": [e.decode() for e in r.read_batch(0, r.last_add_confirmed)]
                              if r.last_add_confirmed >= 0 else []}
        else:
            try:
                {"create": log.create_ledger, "delete": lambda: log.delete_ledger(0),
                 "stream": lambda: log.open_stream("s")}[cmd]()
                out = {"error": None}
            except embedlog.errors.EmbedlogError as exc:
                out = {"error": type(exc).__name__}
        print(json.dumps(out), flush=True)
"""


def test_a_read_only_open_in_another_process_sees_what_the_writer_made_durable(tmp_path):
    """The reader takes no lock and writes nothing; each open_ledger sees the entries the
    writer had made durable by then: a closed ledger whole, an open one up to its LAC, through
    the writer's checkpoints (entry logs and index) and its journal alike."""
    import json
    from support.cliutil import cli_env
    path = tmp_path / "log"
    log = embedlog.open(path, flush_interval_ms=3_600_000)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=cli_env())

    def ask(line):
        reader.stdin.write(line + "\n")
        reader.stdin.flush()
        answer = reader.stdout.readline()
        assert answer, f"the reader died on {line!r}"
        return json.loads(answer)

    try:
        closed = log.create_ledger()
        closed.append_many([b"c%d" % i for i in range(5)])
        closed.close()
        w = log.create_ledger()
        for i in range(3):
            w.append(b"w%d" % i)
        assert ask(f"read {closed.ledger_id.ledger_id}") == {
            "lac": 4, "closed": True, "entries": ["c0", "c1", "c2", "c3", "c4"]}
        # the LAC travels in the next entry: entry 2 is durable, confirmed up to 1
        assert ask(f"read {w.ledger_id.ledger_id}") == {"lac": 1, "closed": False, "entries": ["w0", "w1"]}
        log.bookie.checkpoint()                       # into entry logs and index, journal trimmed
        w.append_many([b"w%d" % i for i in range(3, 2000)])
        w.append(b"w2000")                            # carries the batch's LAC (1999)
        got = ask(f"read {w.ledger_id.ledger_id}")
        assert got["lac"] == 1999 and got["entries"] == ["w%d" % i for i in range(2000)]
        for cmd in ("create", "delete", "stream"):
            assert ask(cmd) == {"error": "ReadOnlyBookieError"}
        w.close()
        log.close()                                   # the reader holds no lock: the writer reopens
        log = embedlog.open(path)
        w2 = log.create_ledger()
        w2.append(b"later")
        w2.close()
        assert ask(f"read {w.ledger_id.ledger_id}")["lac"] == 2000
        assert ask(f"read {w2.ledger_id.ledger_id}")["entries"] == ["later"]
    finally:
        reader.stdin.close()
        assert reader.wait(60) == 0
        log.close()
