"""Fuzz targets: one ``fuzz_<name>(data: bytes) -> None`` per parser of embedlog.

Each target feeds the bytes to the parser the way embedlog itself does. An
``EmbedlogError`` (CorruptedDataError, MetadataError, ConfigError, ...) is the
expected answer to bad bytes and is swallowed; anything else escaping a target (a
struct.error, IndexError, UnicodeDecodeError, RecursionError, a failed invariant
check...) is a crash. Segfaults, hangs and memory blow-ups are caught by the runner
(tools/fuzz.py: libFuzzer's -timeout and -rss_limit_mb).

Used by tools/fuzz.py (atheris), tools/fuzz/make_corpus.py (seeds) and
tests/shared/test_fuzz.py (corpus replay, hypothesis).
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import struct
import tempfile

from embedlog.errors import EmbedlogError

# file-based parsers get their input through a file; /dev/shm keeps the writes in memory
_SHM = "/dev/shm"
TMP = tempfile.mkdtemp(prefix="embedlog-fuzz-",
                       dir=_SHM if os.access(_SHM, os.W_OK) else None)
atexit.register(shutil.rmtree, TMP, True)

MAX_RECORD = 1 << 20        # journal record bound passed to scan/replay (the bookie's is config)
MAC_PASSWORD = b"fuzz"


class InvariantError(AssertionError):
    """A parser accepted bytes but returned something that breaks its own grammar."""


def _check(cond, what):
    if not cond:
        raise InvariantError(what)


def _expect(fn, *args, **kwargs):
    """fn(*args, **kwargs), or None when it refuses with one of embedlog's errors."""
    try:
        return fn(*args, **kwargs)
    except EmbedlogError:
        return None


def _write(name: str, data: bytes) -> str:
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


# -- entries (pyx/embedlog/_native/format.pyx) --------------------------------------------------

DIGESTS = ("crc32", "mac", "crc32c", "dummy")     # codes 1..4


def fuzz_entry(data: bytes) -> None:
    """data[0] picks the reader's digest (bits 0-1; bit 3: the one a V2 entry's flags name)
    and whether it expects the ids the header names (bit 2 clear: the digest gets checked)
    or ledger (0, 1) entry 0; the rest is an encoded entry, V1 or V2."""
    from embedlog._native import format as F
    if not data:
        return
    sel, buf = data[0], data[1:]
    digest = DIGESTS[sel & 3]
    head = _expect(F.parse_entry_header, buf)
    ids = (0, 1, 0)
    if head is not None:
        version, scope, lid, eid, _lac, _length, code = head
        _check(version in (1, 2), "version")
        _check((version == 1) == (scope == 0) and (code is None) == (version == 1), "V1/V2 split")
        _check(0 <= scope < 1 << 64 and 0 <= lid < 1 << 64, "id range")
        if not sel & 4:
            ids = (scope, lid, eid)
        if version == 2 and sel & 8 and 1 <= code <= 4:
            digest = DIGESTS[code - 1]      # the reader's digest matches the entry's flags
    payload = _expect(F.decode_entry, buf, *ids, digest, F.mac_key(MAC_PASSWORD))
    if payload is not None:
        _check(head is not None and buf.endswith(payload), "payload is the entry's tail")


# -- journal (pyx/embedlog/_native/journal.pyx, embedlog/bookie/journal.py) --------------------

def fuzz_journal(data: bytes) -> None:
    """A whole journal file: its header, the record scan (strict and skipping), each record's
    body, and replay() over it as the file of a journal directory."""
    from embedlog._native import journal as nj
    log_id = _expect(nj.check_file_header, data)
    for skip in (False, True):
        records, end, status, skipped = nj.scan(data, nj.HEADER_SIZE, MAX_RECORD, skip)
        _check(status in ("clean", "torn", "corrupt"), "status")
        _check(end >= nj.HEADER_SIZE and (end <= len(data) or not records), "end")
        pos = nj.HEADER_SIZE
        for off, rtype, start, n in records:
            _check(off >= pos and start == off + 9 and 0 < n <= MAX_RECORD
                   and start + n <= len(data), "record bounds")
            pos = start + n
            _expect(nj.decode_record, rtype, data[start:start + n])
        _check(skip or not skipped, "skipped only when asked")
    _replay(data, log_id)


def _replay(data: bytes, log_id) -> None:
    from embedlog._native import journal as nj
    from embedlog.bookie.replay import replay
    d = os.path.join(TMP, "journal")
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d)
    _write(os.path.join("journal", "%x.txn" % (log_id or 1)), data)
    seen = []

    def apply(rtype, body, path, off):
        seen.append(off)
        _expect(nj.decode_record, rtype, body)

    report = _expect(replay, d, (0, 0), apply, skip_corrupt=bool(len(data) & 1),
                     max_record_size=MAX_RECORD)
    if report is not None:
        _check(report["records"] == len(seen) and seen == sorted(seen), "replay order")


# -- entry logs (pyx/embedlog/_native/entrylog.pyx) ----------------------------------------------

def fuzz_entrylog(data: bytes) -> None:
    """An entry log file as start-up, GC, compaction and the shell read it."""
    from embedlog._native import entrylog as nel
    from embedlog._native import format as F
    path = _write("1.log", data)
    m = _expect(nel.MappedLog.open_existing, path, 1)
    if m is None:
        return
    try:
        _ = m.sealed
        lmap = _expect(m.ledgers_map)
        _check(lmap is None or isinstance(lmap, dict), "ledgers map")
        table = _expect(m.entry_table)
        if table is not None:
            locs, sizes, _scopes, _lids, _eids = table
            for loc, size in zip(locs.tolist()[:64], sizes.tolist()):
                entry = _expect(m.read_at, loc)
                _check(entry is not None and len(entry) == size, "read_at agrees with the table")
                _expect(F.parse_entry_header, entry)
        # an index may point anywhere in a log: read where header bytes 20..27 (unused, so
        # free for the fuzzer) say, as a corrupt index location would
        for off in struct.unpack_from(">II", data, 20) if len(data) >= 28 else ():
            entry = _expect(m.read_at, (1 << 32) | off)
            _check(entry is None or off + len(entry) <= len(data), "read_at bounds")
        _expect(m.scanned_ledgers)
        for loc, entry in m.scan():
            _check(0 < len(entry) and (loc & 0xFFFFFFFF) + len(entry) <= len(data), "scan bounds")
    finally:
        m.close()


# -- index files (pyx/embedlog/_native/index.pyx) -------------------------------------------------

def fuzz_index(data: bytes) -> None:
    """A ledger index file: its header, then the pages behind it."""
    from embedlog._native import index as ni
    path = _write("1.idx", data)
    idx = ni.LedgerIndex(ni.IndexCache(TMP, 16), 0, 1, path)
    try:
        idx.load_header()
    except EmbedlogError:
        return                               # the bookie refuses the file: nothing more to read
    _check(idx.master_key is None or len(idx.master_key) <= ni.MAX_KEY, "key length")
    last = idx.last_entry_id()
    ids = idx.entry_ids()
    _check(last == (ids[-1] if ids else -1), "last entry id")
    for eid in ids[:16]:
        _check(idx.get_location(eid) != 0, "location of a listed entry")


# -- wire frames (embedlog/net/protocol.py) ------------------------------------------------------

def _frames(data: bytes):
    """Split a byte stream into frame messages as a connection reader does (length:u32)."""
    pos = 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        pos += 4
        yield n, data[pos:pos + n]
        pos += n


def fuzz_wire_request(data: bytes) -> None:
    """The frames a bookie reads from one connection, and each request's body."""
    from embedlog._native.format import parse_entry_header
    from embedlog.net import protocol as P
    for n, message in _frames(data):
        _expect(P.check_frame_length, n, P.DEFAULT_MAX_FRAME_BYTES)
        req = _expect(P.parse_request, message)
        if req is None:
            continue
        _check(req.op in P.OPS and len(req.master_key) == 20, "request header")
        if req.op == P.ADD:
            for entry in _expect(P.parse_add_body, req.body) or ():
                _expect(parse_entry_header, entry)
        elif req.op == P.READ:
            _expect(P.parse_read_request, req.body)
        elif req.op in (P.WRITE_LAC, P.TRIM):
            _expect(P.parse_i64_body, req.body)


def fuzz_wire_response(data: bytes) -> None:
    """The frames a client reads from a bookie, and each response's body."""
    from embedlog.net import protocol as P
    for n, message in _frames(data):
        _expect(P.check_frame_length, n, P.DEFAULT_MAX_FRAME_BYTES)
        resp = _expect(P.parse_response, message)
        if resp is None:
            continue
        _check(isinstance(resp.message, str), "message")
        if resp.status != P.EOK:
            continue
        if resp.op == P.READ:
            got = _expect(P.parse_read_body, resp.body)
            if got is not None:
                _check(all(isinstance(e, bytes) for _eid, e in got[1]), "read entries")
        elif resp.op == P.READ_LAC:
            _expect(P.parse_read_lac_body, resp.body)


# -- metadata (embedlog/meta, embedlog/bookie/cookies.py) ---------------------------------------

def _meta_ledger(body: bytes) -> None:
    from embedlog.meta.api import LedgerMetadata
    md = _expect(LedgerMetadata.from_bytes, body)
    if md is None:
        return
    for name in ("ensemble_size", "write_quorum", "ack_quorum", "last_entry_id", "length",
                 "ctime_ms", "term", "first_entry_id"):
        v = getattr(md, name)
        _check(type(v) is int, f"{name} is an int")
    _check(isinstance(md.password, bytes) and type(md.unbounded) is bool, "password, unbounded")
    _check(all(type(f) is int and all(isinstance(b, str) for b in bs) for f, bs in md.fragments),
           "fragments")
    _check(all(type(t) is int for t in md.fragment_ctimes_ms), "fragment ctimes")
    _check(LedgerMetadata.from_bytes(md.to_bytes()) == md, "round trip")


def _meta_layout(body: bytes) -> None:
    from embedlog.meta._common import check_layout
    _expect(check_layout, body, "hierarchical", "fuzz")


def _meta_bookie(body: bytes) -> None:
    from embedlog.meta._common import decode_bookie
    reg = _expect(decode_bookie, "bookie-1", False, body)
    _check(reg is None or isinstance(reg.info, dict), "bookie info")


def _meta_cookie(body: bytes) -> None:
    from embedlog.bookie.cookies import Cookie
    c = _expect(Cookie.from_bytes, body, "fuzz")
    if c is not None:
        _check(all(isinstance(v, str) for v in (c.bookie_id, c.journal_dir) + c.ledger_dirs)
               and all(v is None or isinstance(v, str) for v in (c.instance_id, c.metadata_uri)),
               "cookie fields")
        _check(Cookie.from_bytes(c.to_bytes(), "fuzz") == c, "round trip")


def _meta_underreplicated(body: bytes) -> None:
    from embedlog.meta._common import decode_underreplicated
    for bare in (False, True):
        missing = _expect(decode_underreplicated, body, "fuzz", bare)
        _check(missing is None or all(isinstance(b, str) for b in missing), "missing bookies")


META_KINDS = (_meta_ledger, _meta_layout, _meta_bookie, _meta_cookie, _meta_underreplicated)


def fuzz_metadata(data: bytes) -> None:
    """data[0] picks the record kind (ledger metadata, layout, bookie registration, cookie,
    under-replication record); the rest is the stored value."""
    if data:
        META_KINDS[data[0] % len(META_KINDS)](data[1:])


# -- Spark offsets (embedlog/spark) ---------------------------------------------------------------

def fuzz_spark_offset(data: bytes) -> None:
    """A streaming offset as Spark hands it back (JSON Spark decoded), and the
    startingOffsets/endingOffsets options (JSON embedlog decodes)."""
    from embedlog.spark.options import EARLIEST, LATEST, parse_positions
    from embedlog.spark.source import check_offset
    text = data.decode("utf-8", "surrogateescape")
    for words, allowed in ((("earliest", "latest"), (EARLIEST, LATEST)), (("latest",), (LATEST,))):
        got = _expect(parse_positions, text, "startingOffsets", words, allowed)
        _check(got is None or got in words or isinstance(got, dict) and all(
            v >= 0 or v in allowed for v in got.values()), "positions")
    try:
        value = json.loads(data)        # Spark's own decoding of its checkpoint: not ours
    except (ValueError, RecursionError):
        return
    got = _expect(check_offset, value, "start")
    _check(got is None or all(type(v) is int and v >= 0 for v in got.values()), "offset")


# -- configuration (embedlog/cli/config_file.py, embedlog/config.py) ---------------------------------

def _check_config(eff) -> None:
    from embedlog.config import BookieConfig
    for name, f in BookieConfig.keys().items():
        v = eff.values[name]
        lo, hi = f.metadata["min"], f.metadata["max"]
        _check(type(v) is type(f.default), f"{name} keeps its type")
        _check((lo is None or v >= lo) and (hi is None or v <= hi), f"{name} within its range")


def fuzz_config_toml(data: bytes) -> None:
    """A configuration file (--conf / EMBEDLOG_CONF), resolved as `bookie serve` does."""
    from embedlog.cli import config_file
    path = _write("bookie.toml", data)
    eff = _expect(config_file.resolve, path, {})
    if eff is not None:
        _check_config(eff)


def fuzz_config_env(data: bytes) -> None:
    """EMBEDLOG_* environment variables, one NAME=VALUE a line (NAME without the prefix
    gets it), resolved as `bookie serve` does."""
    from embedlog.cli import config_file
    env = {}
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        name, _, value = line.partition("=")
        name = name.strip().upper()
        if name and "\0" not in line:        # the environment cannot hold NUL bytes
            env[name if name.startswith("EMBEDLOG_") else "EMBEDLOG_" + name] = value
    env.pop("EMBEDLOG_CONF", None)           # a file path: fuzz_config_toml's business
    eff = _expect(config_file.resolve, None, env)
    if eff is not None:
        _check_config(eff)


TARGETS = {
    "entry": fuzz_entry,
    "journal": fuzz_journal,
    "entrylog": fuzz_entrylog,
    "index": fuzz_index,
    "wire_request": fuzz_wire_request,
    "wire_response": fuzz_wire_response,
    "metadata": fuzz_metadata,
    "spark_offset": fuzz_spark_offset,
    "config_toml": fuzz_config_toml,
    "config_env": fuzz_config_env,
}

# -max_len per target: file formats need room for their headers (index pages are 8 KiB)
MAX_LEN = {"journal": 8192, "entrylog": 8192, "index": 20480}
DEFAULT_MAX_LEN = 4096
