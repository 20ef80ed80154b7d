"""Write the seed corpora of tools/fuzz/targets.py from real embedlog output.

    python tools/fuzz/make_corpus.py [--out tools/fuzz/corpus]

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
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import embedlog  # noqa: E402
from embedlog._native import format as F  # noqa: E402
from embedlog._native import journal as nj  # noqa: E402
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
        end = nj.scan(data)[1]
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
    b = nj.JournalBuffer()
    ids = (7).to_bytes(8, "big") + (3).to_bytes(8, "big")
    b.add_record(nj.ENTRY, F.encode_entry(7, 3, 0, -1, 5, "crc32c", b"hello"))
    b.add_record(nj.LEDGER_KEY, ids + F.master_key(b"fuzz"))
    b.add_record(nj.FENCE, ids)
    b.add_record(nj.EXPLICIT_LAC, ids + (0).to_bytes(8, "big"))
    b.add_record(nj.TERM, ids + (2).to_bytes(8, "big"))
    b.add_record(nj.TRUNCATE, ids + (0).to_bytes(8, "big"))
    b.add_record(nj.TRIM, ids + (0).to_bytes(8, "big"))
    b.add_record(nj.DELETE_LEDGER, ids)
    b.add_record(99, b"a record type from the future")
    path = os.path.join(tempfile.mkdtemp(), "j")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    b.write_to(fd, 0)
    os.close(fd)
    c.put("journal", "every-type", nj.file_header(0x18F00000001) + open(path, "rb").read() + bytes(16))
    c.put("journal", "header-only", nj.file_header(1))


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "corpus"))
    args = ap.parse_args()
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
    metadata(c)
    spark(c)
    config(c)
    total = 0
    for target in sorted(os.listdir(args.out)):
        files = glob.glob(os.path.join(args.out, target, "*"))
        size = sum(map(os.path.getsize, files))
        total += size
        print(f"{target:<14} {len(files):>3} files {size:>8} bytes")
    print(f"{'total':<14} {'':>9} {total:>8} bytes")


if __name__ == "__main__":
    main()
