"""Write the seed corpora of tools/fuzz/targets.py from real embedlog output.

    python tools/fuzz/make_corpus.py [TARGET ...] [--out tools/fuzz/corpus]

Seeds come from a small embedded-log session (journal files, entry logs, index files,
ledger metadata and cookies as the bookie wrote them) and from embedlog's own encoders
(entries, wire frames, layout and bookie records, offsets, configuration). Each seed is
small; the whole corpus stays well under 1 MB. Rerunning replaces the seeds (ids and
timestamps differ from run to run; the structure does not).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)                     # targets: the structured inputs' Writer

import embedlog  # noqa: E402
from embedlog._native import format as F  # noqa: E402
from embedlog._native import (journal_format as jformat, journal_buffer as jbuffer,
                              journal_scan as jscan)  # noqa: E402
from embedlog.config import BookieConfig  # noqa: E402
from embedlog.meta._common import encode_bookie_info, layout_record  # noqa: E402
from embedlog.net import protocol as P  # noqa: E402

SMALL = dict(skip_list_size_limit=1 << 16, entry_log_size_limit=1 << 16, journal_pre_alloc_size_mb=1,
             flush_interval_ms=100_000, gc_wait_time_ms=0, disk_check_interval_ms=0)
MAC_KEY = F.mac_key(b"fuzz")


def _strip(data: bytes, keep: int = 16) -> bytes:
    """A preallocated or sparse file without its zero tail (a few zeros kept: the end marker)."""
    body = data.rstrip(b"\0")
    return body + b"\0" * min(keep, len(data) - len(body))


class Corpus:
    def __init__(self, root):
        self.root = root

    def put(self, target: str, name: str, data: bytes) -> None:
        d = os.path.join(self.root, target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def session(c: Corpus, tmp: str) -> None:
    """An embedded log with ledgers of every digest, V1 and V2, a fenced ledger, a stream
    (terms, trims), a deleted ledger and an explicit LAC; then its files as seeds."""
    d = os.path.join(tmp, "log")
    with embedlog.open(d, **SMALL) as log:
        ids = []
        for i, (digest, scope) in enumerate([("crc32c", 0), ("crc32", 0), ("mac", 7),
                                             ("dummy", 0xFFFFFFFFFFFFFFFF), ("crc32c", 7)]):
            w = log.create_ledger(digest=digest, password=b"fuzz", scope_id=scope)
            w.append_many([b"entry %d of ledger %d" % (e, i) for e in range(4)])
            w.append(b"")
            ids.append(w.ledger_id)
            if i != 4:
                w.close()
        log.open_ledger(ids[4], password=b"fuzz")                     # fences the open one
        key = F.master_key(b"fuzz")
        log.bookie.wait_durable(log.bookie.set_explicit_lac(ids[0], 2, key))
        s = log.open_stream("orders")
        s.append_many([b"order %d" % i for i in range(6)])
        s.truncate_before(2)
        s.close()
        gone = log.create_ledger(digest="crc32c", password=b"fuzz")
        gone.append(b"doomed")
        gone.close()
        log.delete_ledger(gone.ledger_id)
        for i, lid in enumerate(ids[:4]):
            c.put("metadata", f"ledger-{i}", b"\x00" + log.ledger_metadata(lid).to_bytes())
        from embedlog.client.stream import find_stream
        v, _ = find_stream(log.metadata, "orders")
        c.put("metadata", "ledger-stream", b"\x00" + v.value.to_bytes())
        c.put("metadata", "layout-stored", b"\x01" + (log.metadata.read_layout() or b""))
        c.put("metadata", "cookie-dir", b"\x03" + open(os.path.join(d, "current", "VERSION"), "rb").read())
        c.put("metadata", "cookie-journal", b"\x03" + open(os.path.join(d, "journal", "VERSION"), "rb").read())
    for i, path in enumerate(sorted(glob.glob(os.path.join(d, "journal", "*.txn")))):
        data = _strip(open(path, "rb").read())
        c.put("journal", f"session-{i}", data)
        end = jscan.scan(data)[1]
        c.put("journal", f"session-{i}-torn", data[:end - 5])             # a torn last record
        if end > 700:                                                       # a bad crc mid-file
            c.put("journal", f"session-{i}-corrupt", data[:600] + bytes([data[600] ^ 1]) + data[601:])
    logs = sorted(glob.glob(os.path.join(d, "current", "*.log")))
    for i, path in enumerate(logs):
        c.put("entrylog", f"unsealed-{i}", _strip(open(path, "rb").read()))
    for i, path in enumerate(sorted(glob.glob(os.path.join(d, "current", "ledgers*", "**", "*.idx"),
                                              recursive=True))[:6]):
        c.put("index", f"session-{i}", open(path, "rb").read())
    with embedlog.open(d, **SMALL):              # the restart seals the logs the close left open
        pass
    for i, path in enumerate(sorted(glob.glob(os.path.join(d, "current", "*.log")))):
        c.put("entrylog", f"sealed-{i}", _strip(open(path, "rb").read()))


def journal_records(c: Corpus) -> None:
    """A journal with one record of every type, framed by the journal's own buffer."""
    b = jbuffer.JournalBuffer()
    ids = (7).to_bytes(8, "big") + (3).to_bytes(8, "big")
    b.add_record(jformat.ENTRY, F.encode_entry(7, 3, 0, -1, 5, "crc32c", b"hello"))
    b.add_record(jformat.LEDGER_KEY, ids + F.master_key(b"fuzz"))
    b.add_record(jformat.FENCE, ids)
    b.add_record(jformat.EXPLICIT_LAC, ids + (0).to_bytes(8, "big"))
    b.add_record(jformat.TERM, ids + (2).to_bytes(8, "big"))
    b.add_record(jformat.TRUNCATE, ids + (0).to_bytes(8, "big"))
    b.add_record(jformat.TRIM, ids + (0).to_bytes(8, "big"))
    b.add_record(jformat.DELETE_LEDGER, ids)
    b.add_record(99, b"a record type from the future")
    path = os.path.join(tempfile.mkdtemp(), "j")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    b.write_to(fd, 0)
    os.close(fd)
    c.put("journal", "every-type", jformat.file_header(0x18F00000001) + open(path, "rb").read() + bytes(16))
    c.put("journal", "header-only", jformat.file_header(1))


def entries(c: Corpus) -> None:
    for scope in (0, 7):
        for code, digest in enumerate(("crc32", "mac", "crc32c", "dummy")):
            for n, payload in enumerate((b"", b"payload", bytes(range(64)))):
                e = F.encode_entry(scope, 42, 3, 2, 100, digest, payload, MAC_KEY)
                c.put("entry", f"v{1 if scope == 0 else 2}-{digest}-{n}", bytes([code | 8]) + e)


def wire(c: Corpus) -> None:
    key = F.master_key(b"fuzz")
    es = [F.encode_entry(7, 3, i, i - 1, 5 * (i + 1), "crc32c", b"entry") for i in range(3)]
    reqs = {
        "add": P.add_request(1, 7, 3, key, es, flags=P.FLAG_RECOVERY_ADD),
        "add-v1": P.add_request(2, 0, 3, key, [F.encode_entry(0, 3, 0, -1, 1, "crc32", b"x")]),
        "read": P.read_request(3, 7, 3, 0, 3, flags=P.FLAG_LONG_POLL, previous_lac=1, timeout_ms=100),
        "read-lac": P.read_lac_request(4, 7, 3, flags=P.FLAG_FENCE, master_key=key),
        "write-lac": P.write_lac_request(5, 7, 3, key, 1),
        "trim": P.trim_request(6, 7, 3, key, 2, term=1),
        "bookie-info": P.bookie_info_request(7),
        "auth": P.auth_request(0, b"token"),
    }
    for name, frame in reqs.items():
        c.put("wire_request", name, frame)
    c.put("wire_request", "stream", reqs["auth"] + reqs["add"] + reqs["read"] + reqs["trim"])
    resps = {
        "add": P.response(P.ADD, 0, 1, P.EOK, 7, 3, P.ADD_RESP.pack(0, 3)),
        "read": P.response(P.READ, 0, 3, P.EOK, 7, 3,
                           P.read_response_body(2, [(i, e) for i, e in enumerate(es)])),
        "read-empty": P.response(P.READ, 0, 3, P.EOK, 7, 3, P.read_response_body(-1, [])),
        "read-lac": P.response(P.READ_LAC, 0, 4, P.EOK, 7, 3, P.READ_LAC_RESP.pack(1, 2, len(es[2])) + es[2]),
        "write-lac": P.response(P.WRITE_LAC, 0, 5, P.EOK, 7, 3),
        "bookie-info": P.response(P.BOOKIE_INFO, 0, 7, P.EOK, 0, 0, json.dumps({"bookie_id": "b"}).encode()),
        "error": P.error_response(P.READ, 0, 8, P.ENOENTRY, 7, 3, "no entry 9 in ledger (7, 3)"),
        "error-utf8": P.error_response(P.ADD, 0, 9, P.EUA, 7, 3, "refusé"),
    }
    for name, frame in resps.items():
        c.put("wire_response", name, frame)
    c.put("wire_response", "stream", resps["add"] + resps["read"] + resps["error"])


def bk_serve(c: Corpus) -> None:
    """The bookie's side (bkserve.pyx): v2 request frames (0), v3 responses from fields (1)."""
    key = F.master_key(b"fuzz")
    entry = F.encode_entry(0, 3, 0, -1, 5, "crc32c", b"entry")

    def v2(op, flags, body):
        packet = struct.pack(">I", 2 << 24 | op << 16 | flags) + body
        return struct.pack(">I", len(packet)) + packet
    frames = [v2(1, 2, key + entry), v2(2, 0, struct.pack(">qq", 3, -1)),
              v2(2, 1, struct.pack(">qq", 3, 0) + key),
              v2(7, 0, struct.pack(">qqqiq", 3, 0, 9, 10, 1 << 20)),
              v2(3, 0, b"\x0a\x03abc")]
    c.put("bk_serve", "v2-requests", b"\x00" + b"".join(frames))
    c.put("bk_serve", "v2-add", b"\x00" + frames[0])
    c.put("bk_serve", "v3-responses", b"\x01" + struct.pack(">QIqq", 5, 0, 3, 1) + entry)


def bk_wire(c: Corpus) -> None:
    """BookKeeper's v3 frames (bkwire.pyx): responses (0), requests (1), ADD bodies (2)."""
    from embedlog._native import bkwire as W
    from embedlog._native import bkencode as E
    key = F.master_key(b"fuzz")
    es = [F.encode_entry(0, 3, i, i - 1, 5 * (i + 1), "crc32c", b"entry") for i in range(3)]
    resps = [E.encode_response(1, W.ADD_ENTRY, W.EOK, ledger_id=3, entry_id=0),
             E.encode_response(2, W.READ_ENTRY, W.EOK, ledger_id=3, entry_id=1, body=es[1], max_lac=0),
             E.encode_response(3, W.READ_ENTRY, W.ENOENTRY, ledger_id=3, entry_id=9),
             E.encode_response(4, W.READ_LAC, W.EOK, ledger_id=3, lac_body=E.lac_body(3, 1, 3),
                               last_entry_body=es[2]),
             E.encode_response(5, W.GET_BOOKIE_INFO, W.EOK, total_disk_capacity=1 << 40, free_disk_space=1 << 30),
             E.encode_response(6, W.WRITE_LAC, W.EFENCED, ledger_id=3)]
    c.put("bk_wire", "responses", b"\x00" + b"".join(resps))
    c.put("bk_wire", "read-response", b"\x00" + resps[1])
    reqs = [E.encode_adds(1, 3, key, struct.pack(">I", 3) + b"".join(struct.pack(">I", len(e)) + e
                                                                    for e in es), True)[0],
            E.encode_reads(4, 3, 0, 2, W.FENCE_LEDGER, key),
            E.encode_request(6, W.READ_ENTRY, ledger_id=3, entry_id=-1, flag=W.ENTRY_PIGGYBACK,
                             previous_lac=1, timeout_ms=1000),
            E.encode_request(7, W.WRITE_LAC, ledger_id=3, lac=1, master_key=key, body=E.lac_body(3, 1, 1)),
            E.encode_request(8, W.READ_LAC, ledger_id=3),
            E.encode_request(9, W.GET_BOOKIE_INFO, requested=3)]
    c.put("bk_wire", "requests", b"\x01" + b"".join(reqs))
    body = struct.pack(">I", 3) + b"".join(struct.pack(">I", len(e)) + e for e in es)
    c.put("bk_wire", "add-body", b"\x02" + struct.pack(">q", 3) + body)
    c.put("bk_wire", "add-body-recovery", b"\x06" + struct.pack(">q", 3) + body)


def metadata(c: Corpus) -> None:
    c.put("metadata", "layout", b"\x01" + layout_record("hierarchical"))
    c.put("metadata", "layout-flat", b"\x01" + layout_record("flat"))
    c.put("metadata", "bookie", b"\x02" + encode_bookie_info({"address": "127.0.0.1:3181",
                                                              "disk": {"free": 1, "total": 2}}))
    # under-replication records as the drivers write them: ZooKeeper/etcd, then SQLite's column
    c.put("metadata", "underreplicated", b"\x04" + json.dumps({"missing": ["bookie-1", "bookie-2"],
                                                               "ctime_ms": 1700000000000}).encode())
    c.put("metadata", "underreplicated-sqlite", b"\x04" + json.dumps(["bookie-1"]).encode())


def spark(c: Corpus) -> None:
    for name, text in {"offsets": {"orders": 5, "payments": 0}, "empty": {},
                       "qualified": {"0000000000000007000000000000000a": 12}}.items():
        c.put("spark_offset", name, json.dumps(text).encode())
    for word in ("earliest", "latest"):
        c.put("spark_offset", word, word.encode())


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def config(c: Corpus) -> None:
    defaults = BookieConfig().as_dict()
    c.put("config_toml", "defaults", "".join(f"{k} = {_toml(v)}\n" for k, v in defaults.items()).encode())
    c.put("config_toml", "doc-example", b'journal_max_group_wait_ms = 1.0\n'
          b'metadata_service_uri = "zk+hierarchical://10.0.0.1:2181/ledgers"\n'
          b'http_server_enabled = true\nhttp_server_port = 8080\n')
    c.put("config_toml", "empty", b"")
    c.put("config_toml", "comments", b"# tuned for tests\njournal_sync_data = false  # SAFETY\n"
          b"ledger_directories = '/a,/b'\nentry_log_size_limit = 1_048_576\n")
    c.put("config_env", "defaults", "".join(f"{k}={v}\n" for k, v in defaults.items()).encode())
    c.put("config_env", "typical", b"EMBEDLOG_JOURNAL_MAX_GROUP_WAIT_MS=1\nEMBEDLOG_METADATA=sqlite:///x.db\n"
          b"EMBEDLOG_HTTP_SERVER_ENABLED=yes\nEMBEDLOG_BOOKIE_PORT=0\nEMBEDLOG_FAILPOINTS=\n")


def add_kernels(c: Corpus) -> None:
    """Calls of the add kernels (grammar: targets.fuzz_add_kernels): the reproducer of a crash
    (gapped ids), other id patterns, many ledgers, ids near 2^63, each digest, payload views,
    small memtables, a malformed entry mid-batch."""
    from targets import Writer

    def call(w, op, count, eid_mode=0, eid=0, step=1, lid=0, scope=0, spread=None, size_sel=1,
             size=100, start=0, bad=0):
        w.u(1, op).u(2, count)
        if op & 0x40:
            w.u(1, scope)
        w.u(1, lid)
        if lid >= 0x80:
            w.u(8, 0x1234_5678_9ABC_DEF0)
        w.u(1, eid_mode).u(8, eid).u(2, step)
        if op & 0x80:
            w.u(1, spread or 0)
        w.u(1, size_sel).u(4, size).u(1, start).u(2, bad)
        return w

    def pcall(w, op, count, eid_mode=0, eid=0, lid=0, scope=0, lac=-1, length=0, size_sel=1,
              size=100, start=0, max_entry=None):
        w.u(1, op).u(2, count)
        if op & 0x40:
            w.u(1, scope)
        w.u(1, lid).u(1, eid_mode).u(8, eid).u(8, lac).u(4, length)
        w.u(1, size_sel).u(4, size).u(1, start)
        if op & 0x80:
            w.u(3, max_entry)
        return w

    CRC32C = 0x20                      # op >> 4 & 3 == 2: digest code 3
    for step in (1, 2, 3, 64, 65, -1, 0):
        w = Writer().u(1, 7)           # a 256 MiB memtable
        call(w, CRC32C, 1000, step=step)
        call(w, CRC32C | 4, 1000, eid_mode=1, eid=3000 if step > 0 else 0, step=step)
        c.put("add_kernels", f"encoded-step-{step}", w.bytes())
    w = Writer().u(1, 4)               # 64 KiB: the memtable fills, then is cleared
    for i in range(6):
        call(w, CRC32C | (8 if i % 3 == 2 else 0), 300, eid_mode=4, eid=i, step=2)
    c.put("add_kernels", "encoded-full-then-clear", w.bytes())
    w = Writer().u(1, 6)
    call(w, 0x80 | 0x40 | CRC32C, 1000, scope=0, spread=255, lid=0x80)
    call(w, 0x80 | CRC32C, 500, spread=7, step=5)
    c.put("add_kernels", "encoded-many-ledgers", w.bytes())
    w = Writer().u(1, 5)
    call(w, 0x40 | CRC32C, 70, eid_mode=2, eid=60, scope=1)
    call(w, CRC32C, 10, eid_mode=7, eid=5)
    call(w, CRC32C, 10, eid_mode=5, eid=0x80, step=1)
    call(w, CRC32C, 10, eid_mode=3, eid=(1 << 64) - 7, step=1000)
    c.put("add_kernels", "encoded-odd-ids", w.bytes())
    w = Writer().u(1, 2)
    call(w, CRC32C, 20, size_sel=2, size=5000)       # entries larger than a 4 KiB memtable
    call(w, CRC32C | 8, 20, size_sel=5, size=50)
    call(w, CRC32C, 20, bad=0x8000 | 2 << 8 | 7)     # a malformed entry mid-batch
    c.put("add_kernels", "encoded-limits", w.bytes())
    for digest in range(4):
        for scope_bit in (0, 0x40):
            w = Writer().u(1, 6)
            op = 2 | digest << 4 | scope_bit
            pcall(w, op, 200, scope=1)
            pcall(w, op | 4, 200, eid_mode=1, eid=200, length=20000, start=3, size_sel=5, size=7)
            pcall(w, op | 1, 64, eid_mode=1, eid=400, size_sel=3)              # views
            c.put("add_kernels", f"payloads-d{digest + 1}-{'v2' if scope_bit else 'v1'}", w.bytes())
    w = Writer().u(1, 1 | 1 << 3)      # a 300-byte memtable, a 64-byte journal buffer
    pcall(w, 2 | CRC32C, 5, size_sel=1, size=50)
    pcall(w, 2 | CRC32C | 8, 5, size_sel=1, size=400)
    pcall(w, 2 | 0x80 | CRC32C, 5, size_sel=1, size=100, max_entry=99)
    pcall(w, 3 | 0x10, 8, size_sel=1, size=64, eid_mode=2, eid=7)
    c.put("add_kernels", "payloads-limits", w.bytes())


def bookie_add(c: Corpus) -> None:
    """Connections to a bookie (grammar: targets.fuzz_bookie_add): normal and striped adds,
    many ledgers in a frame, wrong keys, odd ids, oversized entries, each frame mutation, a
    fence before an add, a truncating stream add, raw messages and a garbage tail, long
    polls past their bounds, a WRITE_LAC past the entries, a length prefix alone and a v3
    connection."""
    from targets import Writer

    def add(w, count, eid_mode=0, eid=0, step=1, flags=0, scope=0, lid=0, key=0, term=0,
            spread=0, size_sel=1, size=100, digest=2, mut=0, pos=0, val=0, kind=0,
            lid_value=0x0123_4567_89AB_CDEF):
        w.u(1, kind).u(1, flags).u(1, scope).u(1, lid)
        if lid >= 0x80:
            w.u(8, lid_value)
        w.u(1, key).u(1, term).u(2, count).u(1, eid_mode).u(8, eid).u(2, step).u(1, spread)
        w.u(1, size_sel).u(4, size).u(1, digest).u(1, mut).u(2, pos).u(4, val)
        return w

    put = lambda name, w: c.put("bookie_add", name, w.bytes())       # noqa: E731
    put("add", add(Writer(), 10))
    put("add-v2-each-digest", add(add(add(add(Writer(), 5, scope=2, digest=0), 5, scope=2, digest=1,
                                          eid=5), 5, scope=2, digest=2, eid=10), 5, scope=2, digest=3, eid=15))
    put("striped", add(add(Writer(), 300, step=3, eid=1), 300, eid_mode=1, eid=901, step=3))
    put("gaps-64", add(Writer(), 100, step=64, size_sel=0, size=8))
    put("many-ledgers", add(Writer(), 50, spread=1))
    put("wrong-key", add(add(Writer(), 3, lid=1), 3, lid=1, key=2, eid=3))
    put("odd-ids", add(add(add(Writer(), 2, eid_mode=7, eid=0), 2, eid_mode=6, eid=0x80),
                       2, eid_mode=2, eid=0))
    put("id-2e61", add(Writer(), 1, eid_mode=5, eid=0x80))          # an entry id near 2^61
    put("id-2e40", add(add(Writer(), 2, eid_mode=6, eid=0x7E), 2, eid_mode=6, eid=0x7F))   # the bound
    # scope 0 and a ledger id >= 2^63: raised out of the server's connection loop (fuzzing)
    put("scope0-ledger-2e63", add(Writer(), 1, lid=0xC0, lid_value=1 << 63))
    put("oversized-entry", add(Writer(), 2, size_sel=2, size=20000))
    put("unknown-digest", add(Writer(), 2, scope=2, digest=0x8D))
    for m in range(1, 8):
        put(f"mutation-{m}", add(add(Writer(), 4, mut=m, pos=70, val=0xFFFFFFF0 if m in (3, 4) else 33),
                                 2, eid=100))
    put("fence-then-add", add(add(Writer().u(1, 5).u(1, 0).u(1, 3), 2, lid=3), 2, lid=3, flags=2, eid=2))
    put("stream-truncate", add(add(Writer(), 5, scope=2, term=1), 1, scope=2, term=1, eid=2, flags=8))
    put("raw-and-tail", Writer().u(1, 6).u(2, 60).raw(bytes(range(60))).u(1, 7).raw(b"\0\0\0\x40" + bytes(20)))
    # denials that must stay cheap: long polls past the bounds (two that wait for a LAC the
    # ledger never reaches, one woken by the next add, one past the bounds), a WRITE_LAC
    # far past the entries, a length prefix alone, a BookKeeper v3 connection of them all
    polls = add(Writer(), 3, lid=0)
    for sel in (0x0F, 0x0F, 0x09, 0x0F):
        polls.u(1, 5 | 0x10).u(1, 0).u(1, 0).u(1, sel)
    put("long-polls-past-the-bounds", add(polls, 1, lid=0, eid=3))
    put("write-lac-past-the-entries", add(Writer(), 2, lid=0).u(1, 5 | 0x20).u(1, 0).u(1, 0)
        .u(1, 0).u(8, 1000))
    put("length-prefix-alone", add(Writer(), 1).u(1, 7).raw((60_000).to_bytes(4, "big") + b"\x01"))
    v3 = Writer().u(1, 5 | 0x30).u(1, 5)
    for op, value in ((0, 0x0F), (1, 1000), (2, 3), (0, 0x09), (4, 1 << 40)):
        v3.u(1, op).u(1, 0).u(8, value)
    put("v3-polls-write-lac-partial", v3.u(4, (60_000 << 1) | 1 | (3 << 18)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*",
                    help="write only these targets' seeds, leaving the others' corpora as they are")
    ap.add_argument("--out", default=os.path.join(HERE, "corpus"))
    args = ap.parse_args()
    final = args.out
    if args.targets:
        args.out = tempfile.mkdtemp(prefix="embedlog-seeds-")
    else:
        shutil.rmtree(args.out, ignore_errors=True)
    c = Corpus(args.out)
    tmp = tempfile.mkdtemp(prefix="embedlog-corpus-")
    try:
        session(c, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    journal_records(c)
    entries(c)
    wire(c)
    bk_wire(c)
    bk_serve(c)
    metadata(c)
    spark(c)
    config(c)
    add_kernels(c)
    bookie_add(c)
    if args.targets:
        for target in args.targets:         # seeds replaced; inputs merged by fuzz.py --merge kept
            os.makedirs(os.path.join(final, target), exist_ok=True)
            for path in glob.glob(os.path.join(args.out, target, "*")):
                shutil.copyfile(path, os.path.join(final, target, os.path.basename(path)))
        shutil.rmtree(args.out, ignore_errors=True)
        args.out = final
    total = 0
    for target in sorted(args.targets or os.listdir(args.out)):
        files = glob.glob(os.path.join(args.out, target, "*"))
        size = sum(map(os.path.getsize, files))
        total += size
        print(f"{target:<14} {len(files):>3} files {size:>8} bytes")
    print(f"{'total':<14} {'':>9} {total:>8} bytes")

if __name__ == "__main__":
    main()
