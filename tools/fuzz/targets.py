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
import time

from embedlog.errors import STATUSES, EmbedlogError

# file-based parsers get their input through a file; /dev/shm keeps the writes in memory
_SHM = "/dev/shm"
# (tools/fuzz.py gives its children a root it removes afterwards: libFuzzer exits without atexit)
TMP = tempfile.mkdtemp(prefix="embedlog-fuzz-", dir=os.environ.get("EMBEDLOG_FUZZ_TMP_ROOT")
                       or (_SHM if os.access(_SHM, os.W_OK) else None))
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


# -- journal (pyx/embedlog/_native/journal_format.pyx, journal_scan.pyx, embedlog/bookie/journal.py) -

def fuzz_journal(data: bytes) -> None:
    """A whole journal file: its header, the record scan (strict and skipping), each record's
    body, and replay() over it as the file of a journal directory."""
    from embedlog._native import journal_format as jformat, journal_scan as jscan
    log_id = _expect(jformat.check_file_header, data)
    for skip in (False, True):
        records, end, status, skipped = jscan.scan_file(data, MAX_RECORD, skip)
        _check(status in ("clean", "torn", "corrupt"), "status")
        _check(end >= jformat.HEADER_SIZE and (end <= len(data) or not records), "end")
        pos = jformat.HEADER_SIZE
        for off, rtype, start, n in records:
            _check(off >= pos and start == off + 9 and 0 < n <= MAX_RECORD
                   and start + n <= len(data), "record bounds")
            pos = start + n
            _expect(jformat.decode_record, rtype, data[start:start + n])
        _check(skip or not skipped, "skipped only when asked")
    _replay(data, log_id)


def _replay(data: bytes, log_id) -> None:
    from embedlog._native import journal_format as jformat
    from embedlog.bookie.replay import replay
    d = os.path.join(TMP, "journal")
    shutil.rmtree(d, ignore_errors=True)
    os.mkdir(d)
    _write(os.path.join("journal", "%x.txn" % (log_id or 1)), data)
    seen = []

    def apply(rtype, body, path, off):
        seen.append(off)
        _expect(jformat.decode_record, rtype, body)

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


# -- BookKeeper's v3 frames (pyx/embedlog/_native/bkwire.pyx) ---------------------------------------

def fuzz_bk_wire(data: bytes) -> None:
    """The first byte picks the parser: 0 the v3 responses a client reads from a Java bookie,
    1 the requests a bookie reads, 2 an embedlog ADD body turned into v3 AddRequests (and
    read back as requests: one per entry, each carrying its entry whole)."""
    from embedlog._native import bkwire as W
    from embedlog._native import bkencode as E
    if not data:
        return
    kind, rest = data[0] % 3, data[1:]
    if kind in (0, 1):
        decode = W.decode_responses if kind == 0 else W.decode_requests
        got, pos, err = decode(rest)
        _check(0 <= pos <= len(rest) and (err is None or isinstance(err, EmbedlogError)), "decode")
        for m in got:
            _check(m.body is None or isinstance(m.body, bytes), "body")
            _check(m.ledger_id is None or -(1 << 63) <= m.ledger_id < (1 << 63), "ledger id")
        if err is None and got:
            again, pos2, _ = decode(rest, 0, pos)
            _check(len(again) == len(got) and pos2 == pos, "the same frames decode the same")
        return
    if len(rest) < 8:
        return
    ledger = struct.unpack_from(">q", rest)[0]
    body = rest[8:]
    out = _expect(E.encode_adds, 1, ledger, b"k" * 20, body, bool(data[0] & 4))
    if out is None:
        return
    frames, count, first = out
    reqs, pos, err = W.decode_requests(frames)
    _check(err is None and pos == len(frames) and len(reqs) == count, "frames of the adds")
    off = 4
    for i, r in enumerate(reqs):
        (n,) = struct.unpack_from(">I", body, off)
        _check(r.body == body[off + 4:off + 4 + n] and r.ledger_id == ledger and r.txn_id == 1 + i,
               "an AddRequest carries its entry")
        _check(r.entry_id == struct.unpack_from(">q", body, off + 12)[0], "entry id")
        off += 4 + n
    _check(reqs[0].entry_id == first, "first entry id")


# -- the bookie's side of BookKeeper's wire (pyx/embedlog/_native/bkserve.pyx) ----------------------

def fuzz_bk_serve(data: bytes) -> None:
    """The first byte picks: 0 v2 request frames as a bookie reads them (and again from where
    the first pass stopped: the same requests); 1 v3 add and read responses built from the
    bytes, read back by bkwire's decoder with the same fields."""
    from embedlog._native import bkencode as E
    from embedlog._native import bkserve as S
    from embedlog._native import bkwire as W
    if not data:
        return
    kind, rest = data[0] % 2, data[1:]
    if kind == 0:
        got, pos, err = S.decode_v2(rest)
        _check(0 <= pos <= len(rest) and (err is None or isinstance(err, EmbedlogError)), "decode_v2")
        for op, version, flags, lid, eid, key, more in got:
            _check(op in (S.ADDENTRY, S.READENTRY, S.AUTH, S.BATCH_READ_ENTRY), "opcode")
            _check(key is None or len(key) == 20, "master key")
            _check(op != S.ADDENTRY or (isinstance(more, bytes) and len(more) >= 16), "entry")
        again, pos2, _ = S.decode_v2(rest, 0, pos)
        _check(again == got and pos2 == pos, "the same frames decode the same")
        return
    if len(rest) < 28:
        return
    txn, status, lid, eid = struct.unpack_from(">QIqq", rest)
    status %= 1000
    body = rest[28:]
    lac = max(eid - 1, -(1 << 63))          # an i64, as the bookie's LACs are
    (r,), _pos, err = W.decode_responses(E.v3_read_head(txn, status, lid, eid, lac, len(body)) + body)
    _check(err is None and (r.txn_id, r.ledger_id, r.entry_id, r.body, r.max_lac) ==
           (txn, lid, eid, body, lac), "a read response reads back")
    (r,), _pos, err = W.decode_responses(E.v3_add_response(txn, status, lid, eid))
    _check(err is None and (r.txn_id, r.ledger_id, r.entry_id) == (txn, lid, eid), "an add response reads back")


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


# -- the add kernels (pyx/embedlog/_native/journal_kernels.pyx, memtable.pyx) ---------------------



class Reader:
    """The structured inputs' decoding: big-endian unsigned fields read from the front;
    past the end, fields read as zero (so any prefix of a seed is an input too)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def u(self, nbytes: int) -> int:
        b = self.data[self.pos:self.pos + nbytes]
        self.pos += nbytes
        return int.from_bytes(b, "big") << 8 * (nbytes - len(b))

    def i(self, nbytes: int) -> int:
        v = self.u(nbytes)
        return v - (1 << 8 * nbytes) if v >> (8 * nbytes - 1) else v

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b


class Writer:
    """Reader's counterpart, for seeds (tools/fuzz/make_corpus.py) and tests."""

    def __init__(self):
        self.parts = []

    def u(self, nbytes: int, value: int) -> "Writer":
        self.parts.append((value % (1 << 8 * nbytes)).to_bytes(nbytes, "big"))
        return self

    def raw(self, data: bytes) -> "Writer":
        self.parts.append(bytes(data))
        return self

    def bytes(self) -> bytes:
        return b"".join(self.parts)


I64_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1
MT_LIMITS = (64, 300, 4096, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 256 << 20)
JB_CAPACITIES = (1, 64, 4096, 1 << 20)
SCOPES = (7, U64_MAX, 1 << 63)
LEDGERS = (1, 2, 3, I64_MAX)
SIZE_MASKS = (0x3F, 0xFFF, 0x3FFFF, 0)
KERNEL_BYTES = 4 << 20            # bytes one call frames at most (keeps an input quick)
_PATTERN = bytes(range(251)) * 1100


def _payload(i: int, n: int) -> bytes:
    k = (i * 13) % 251
    return _PATTERN[k:k + n]


def _eid(mode: int, v: int) -> int:
    """A first entry id: small, mid, at 2^63, anywhere (negative too), a block boundary,
    near 2^61 (once past the C kernels' bounds), near 2^40 (the bookie's MAX_ENTRY_ID + 1), just below 0."""
    return (v & 0xFF, v & 0xFFFFF, I64_MAX - (v & 0xFFF), v - (1 << 64) if v >> 63 else v,
            (v & 0xFFFF) << 6, (1 << 61) + (v & 0xFF) - 0x80, (1 << 40) + (v & 0xFF) - 0x80,
            -1 - (v & 0xFF))[mode & 7]


def _wrap(v: int) -> int:
    v &= U64_MAX
    return v - (1 << 64) if v >> 63 else v


def _patch_ids(e: bytes, scope: int, lid: int, eid: int) -> bytes:
    """An encoded entry with other ids in its header (any u64: what a client may send; its
    digest no longer matches, which the add kernels do not check)."""
    b = bytearray(e)
    if scope:
        b[1:25] = struct.pack(">QQQ", scope, lid, eid & U64_MAX)
    else:
        b[0:16] = struct.pack(">QQ", lid, eid & U64_MAX)
    return bytes(b)


BAD_ENTRIES = (b"", b"\x00" * 31, b"\xa3" + b"\x00" * 40 + b"\x00" * 4, b"\xb3" + b"\x01" * 44,
               b"\xa3" + b"\x01" * 20)


def _ids_of(e: bytes):
    from embedlog._native import format as F
    _v, s, l, eid, _lac, _n, _d = F.parse_entry_header(e)
    return s, l, eid


class _KernelState:
    def __init__(self, limit: int, capacity: int):
        from embedlog._native import journal_buffer as jbuffer
        from embedlog._native import memtable as nm
        self.mt = nm.MemTable(limit)
        self.jb = jbuffer.JournalBuffer(capacity)
        self.model = {}           # (scope, lid, eid) -> encoded entry the memtable must hold
        self.journal = []         # encoded entries framed in the journal buffer, in order

    def take(self, entries) -> None:
        for e in entries:
            self.model[_ids_of(e)] = e
            self.journal.append(e)

    def check(self) -> None:
        """What the memtable holds is the model, byte for byte; the journal buffer's records
        are the entries taken since it was cleared, in order, byte for byte; limits hold."""
        from embedlog._native import journal_format as jformat, journal_scan as jscan
        mt, jb = self.mt, self.jb
        _check(jb.nrecords == len(self.journal), "journal buffer record count")
        _check(mt.count == len(self.model), "memtable entry count")
        for key, e in self.model.items():
            _check(mt.get_encoded(*key) == e, f"memtable entry {key} reads back")
        recs = mt.sorted_records()
        _check(len(recs) == len(self.model), "sorted_records count")
        keys = [(int(r["scope"]), int(r["lid"]), int(r["eid"])) for r in recs]
        _check(keys == sorted(self.model), "flush order")
        _check(mt.size_bytes <= mt.limit_bytes, f"arena {mt.size_bytes} bytes over {mt.limit_bytes}")
        # an empty memtable takes one entry of up to limit_bytes: its block may pass the limit
        _check(mt.used_bytes <= mt.limit_bytes or (mt.count == 1 and mt.nblocks_used == 1),
               f"memtable {mt.used_bytes} bytes over its limit {mt.limit_bytes}")
        _check(jb.entry_ids() == [_ids_of(e) for e in self.journal], "journal buffer entry ids")
        if self.journal:
            fd = os.memfd_create("jb")
            try:
                n = jb.write_to(fd, jformat.HEADER_SIZE)
                _check(n == jb.nbytes, "journal bytes written")
                data = jformat.file_header(1) + os.pread(fd, n, jformat.HEADER_SIZE) + bytes(16)
            finally:
                os.close(fd)
            records, _end, status, _skipped = jscan.scan(data, jformat.HEADER_SIZE, 1 << 30, False)
            _check(status == "clean" and len(records) == len(self.journal), "journal scan")
            for (_off, rtype, start, size), e in zip(records, self.journal):
                _check(rtype in jformat.ENTRY_TYPES and data[start:start + size] == e,
                       "journal record is the entry taken")


def _sizes(size_sel: int, size: int, count: int) -> list:
    """Payload sizes of a kernel call: one size or growing ones, masked to a size class,
    halved in count until the call's bytes fit KERNEL_BYTES."""
    mask = SIZE_MASKS[size_sel & 3]
    lens = [((size * (i + 1)) if size_sel & 4 else size) & mask for i in range(count)]
    while lens and sum(lens) > KERNEL_BYTES:
        lens = lens[:len(lens) // 2]
    return lens


def _kernel_encoded(st: _KernelState, r: Reader, op: int) -> None:
    from embedlog._native import format as F
    from embedlog._native import journal_kernels as jkernels
    from embedlog._native import memtable as nm
    count = r.u(2) & 0x3FF
    scope = SCOPES[r.u(1) % 3] if op & 0x40 else 0
    lid_sel = r.u(1)
    lid = LEDGERS[lid_sel & 3] if lid_sel < 0x80 else r.u(8)
    if scope == 0:
        lid &= I64_MAX                     # a V1 header's ledger id is below 2^63 (format.pyx)
    mode, v = r.u(1), r.u(8)
    first = _eid(mode, v)
    step = r.i(2)
    spread = r.u(1) if op & 0x80 else 0        # many ledgers per call: lid + i % spread
    size_sel, size = r.u(1), r.u(4)
    start = r.u(1)
    bad = r.u(2)
    digest = (op >> 4 & 3) + 1
    lens = _sizes(size_sel, size, count)
    count = len(lens)
    mac_key = F.mac_key(MAC_PASSWORD)
    entries = []
    for i in range(count):
        l = (lid + (i % spread if spread else 0)) & (U64_MAX if scope else I64_MAX)
        e = F.encode_entry(scope, 1, 0, -1, 0, digest, _payload(i, lens[i]), mac_key)
        entries.append(_patch_ids(e, scope, l, first + i * step))
    if bad and count and bad >> 15:
        entries[bad % count] = BAD_ENTRIES[(bad >> 8) % len(BAD_ENTRIES)]
    start = min(start, count)
    before = st.jb.nrecords
    try:
        got = jkernels.add_encoded_entries(st.jb, st.mt, entries, start)
    except EmbedlogError:
        got = None
    taken = st.jb.nrecords - before
    _check(0 <= taken <= count - start, "records taken")
    if got is not None:
        _check(got == taken, "add_encoded_entries' count is what it journalled")
        if got < count - start:
            _check(not st.mt.is_empty(), "no progress on an empty memtable")
            n = len(entries[start + got])
            _check(st.mt.used_bytes + n + nm.MT_BLOCK_BYTES > st.mt.limit_bytes,
                   "stopped with room left")
    else:
        _check(taken == 0, "a refusal leaves nothing half written")
    st.take(entries[start:start + taken])


def _kernel_payloads(st: _KernelState, r: Reader, op: int) -> None:
    from array import array
    from embedlog._native import format as F
    from embedlog._native import journal_kernels as jkernels
    count = r.u(2) & 0x3FF
    scope = SCOPES[r.u(1) % 3] if op & 0x40 else 0
    lid_sel = r.u(1)
    lid = LEDGERS[lid_sel & 3] if lid_sel < 0x80 else r.u(8)
    mode, v = r.u(1), r.u(8)
    first = _eid(mode, v)
    lac, length = r.i(8), r.u(4)
    size_sel, size = r.u(1), r.u(4)
    start = r.u(1)
    max_entry = r.u(3) if op & 0x80 else 1 << 20
    digest = (op >> 4 & 3) + 1
    lens = _sizes(size_sel, size, count)
    count = len(lens)
    start = min(start, count)
    payloads = []
    for i in range(count):
        p = _payload(i, lens[i])
        kind = (size_sel >> 3) + i & 3 if op & 3 == 3 else 0
        if kind == 1:
            p = bytearray(p)
        elif kind == 2:
            p = memoryview(p)[0:]
        elif kind == 3 and len(p) % 4 == 0:
            p = array("I", p)                      # a non-byte format: cast by the kernel
        payloads.append(p)
    mac_key = F.mac_key(MAC_PASSWORD)
    before = st.jb.nrecords
    try:
        got, new_length = jkernels.add_payloads(st.jb, st.mt, scope, lid, first, lac, length, digest,
                                          mac_key, payloads, start, max_entry)
    except EmbedlogError:
        got = None
    taken = st.jb.nrecords - before
    _check(0 <= taken <= count - start, "records taken")
    expect, running = [], length
    for i in range(start, start + taken):
        running += lens[i]
        eid = first + (i - start)
        expect.append(F.encode_entry(scope, lid, eid, lac, running, digest, bytes(payloads[i]), mac_key)
                      if eid <= I64_MAX and running <= I64_MAX and (scope or lid <= I64_MAX) else None)
    if got is not None:
        _check(got == taken, "add_payloads' count is what it journalled")
        _check(new_length == running, "ledger length after the batch")
        if got < count - start:
            _check(not st.mt.is_empty(), "no progress on an empty memtable")
    else:
        _check(taken == 0, "a refusal leaves nothing half written")
    if any(e is None for e in expect):
        raise InvariantError("ids or length past int64 taken")
    for k, e in enumerate(expect):
        eid = first + k
        _check(st.mt.read_payload(scope, lid, eid, digest, mac_key) == bytes(payloads[start + k]),
               "payload reads back")
    st.take(expect)


def fuzz_add_kernels(data: bytes) -> None:
    """The add kernels (journal_kernels.pyx: add_encoded_entries, add_payloads) on a memtable and
    a journal buffer, call after call, against a model of what each took.

    Input (Reader: big-endian, zeros past the end)::

        input := limit:u8 call{0..8}       # limit & 7: MT_LIMITS; limit >> 3 & 3: JB_CAPACITIES
        call  := op:u8 body                # op & 3: 0/1 encoded, 2 payloads, 3 payloads as views
                                           # op & 4: clear the journal buffer first; & 8: the memtable
                                           # op >> 4 & 3: digest code - 1; & 0x40: scope != 0
                                           # & 0x80: many ledgers (encoded) / max_entry_size (payloads)
        encoded  := count:u16 [scope:u8] lid:u8 [u64] eid_mode:u8 eid:u64 step:i16 [spread:u8]
                    size_sel:u8 size:u32 start:u8 bad:u16
        payloads := count:u16 [scope:u8] lid:u8 [u64] eid_mode:u8 eid:u64 lac:i64 length:u32
                    size_sel:u8 size:u32 start:u8 [max_entry_size:u24]

    The bracketed fields are read only when op says so: scope when op & 0x40 (SCOPES[scope % 3]),
    spread and max_entry_size when op & 0x80. count & 0x3FF entries; lid >= 0x80 reads a u64
    ledger id (else LEDGERS[lid & 3]); eid_mode & 7 picks _eid's range; ids first + i * step (payloads:
    first + i); sizes size & SIZE_MASKS[size_sel & 3], times i + 1 when size_sel & 4; bad
    (top bit set) puts a malformed entry in the batch. Invariants: _KernelState.check, a
    refusal is an EmbedlogError, a count short of the batch means the memtable is full."""
    r = Reader(data)
    sel = r.u(1)
    st = _KernelState(MT_LIMITS[sel & 7], JB_CAPACITIES[sel >> 3 & 3])
    for _ in range(8):
        if r.left() <= 0:
            break
        op = r.u(1)
        if op & 4:
            st.jb.clear()
            st.journal.clear()
        if op & 8:
            st.mt.clear()
            st.model.clear()
        if op & 3 < 2:
            _kernel_encoded(st, r, op)
        else:
            _kernel_payloads(st, r, op)
        st.check()


# -- the bookie's ADD handling from wire bytes (embedlog/net/server.py, embedlog/bookie) -----------

BOOKIE_CONFIG = dict(journal_sync_data=False, journal_pre_alloc_size_mb=1, journal_max_size_mb=4,
                     journal_max_group_wait_ms=0, skip_list_size_limit=1 << 20,
                     entry_log_size_limit=1 << 20, flush_interval_ms=86_400_000, gc_wait_time_ms=0,
                     disk_check_interval_ms=0, max_entry_size_bytes=16 << 10,
                     max_frame_size_bytes=1 << 16, max_long_polls=3, max_long_polls_per_connection=2)
BOOKIE_RECYCLE = 2000             # inputs a bookie serves before a fresh one replaces it
BOOKIE_STATUSES = {0, 1, 2, 100, 101, 102, 103, 104, 105, 106, 108}
ANSWER_TIMEOUT_S = 5.0
CANARY_SCOPE = 0x5AFE


class _FakeWriter:
    """The server's side of a connection without a socket: what it writes is kept."""

    class _Transport:
        def get_write_buffer_size(self):
            return 0

    def __init__(self):
        self.out = bytearray()
        self.closed = False
        self.transport = self._Transport()

    def get_extra_info(self, name, default=None):
        return ("198.51.100.7", 40000) if name == "peername" else default

    def write(self, data):
        self.out += data

    def writelines(self, parts):      # a READ's reply: its head, then the entries' frames
        for part in parts:
            self.out += part

    async def drain(self):
        pass

    def is_closing(self):
        return False          # replies after the close still land here: the test counts them

    def close(self):
        self.closed = True


class _ServerErrors:
    """Collects the server's log.exception records: an exception that is not one of
    embedlog's errors escaped a handler (the client got EIO)."""

    def __init__(self):
        import logging
        self.records = []
        handler = logging.Handler(logging.ERROR)
        handler.emit = self.records.append
        logging.getLogger("embedlog.server").addHandler(handler)
        logging.getLogger("embedlog.server").propagate = False


class _BookieUnderTest:
    def __init__(self, serial: int):
        import asyncio
        from embedlog.bookie.bookie import Bookie
        from embedlog.config import BookieConfig
        from embedlog.net.server import BookieServer
        self.directory = os.path.join(TMP, f"bookie-{serial}")
        self.bookie = Bookie(self.directory, BookieConfig(**BOOKIE_CONFIG))
        self.loop = asyncio.new_event_loop()
        self.server = BookieServer(self.bookie, max_frame_bytes=BOOKIE_CONFIG["max_frame_size_bytes"],
                                   loop=self.loop)
        self.server._room_freed = asyncio.Event()
        self.exchanges = []
        dispatch = self.server.dispatch

        def recording_dispatch(req, exchange):       # every request the server admits
            self.exchanges.append(exchange)
            try:
                dispatch(req, exchange)
            except BaseException:
                self.exchanges.remove(exchange)      # escapes _serve: see exchange()
                raise

        self.server.dispatch = recording_dispatch
        self.inputs = 0
        self.canary_next = {}                      # canary ledger id -> next entry id

    def close(self) -> None:
        try:
            self.bookie.close()
        except Exception:
            pass                  # a bookie replaced after the known checkpoint failure
        self.loop.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def exchange(self, stream: bytes) -> bytes:
        """``stream`` read by the server as one connection's bytes, then the end of the
        connection; returns what the server wrote once every admitted request is answered."""
        import asyncio
        from embedlog.net.framereader import FrameReader
        from embedlog.net.server import READ_BUFFER_BYTES
        # the server's own reader and limit: _serve calls read_frame
        reader = FrameReader(limit=READ_BUFFER_BYTES, loop=self.loop)
        reader.feed_data(stream)
        reader.feed_eof()
        writer = _FakeWriter()
        del self.exchanges[:]
        try:
            self.loop.run_until_complete(asyncio.wait_for(self.server._serve(reader, writer),
                                                          ANSWER_TIMEOUT_S))
        except Exception as exc:
            # e.g. scope 0 and a ledger id >= 2^63 did, before 78bfe99: no answer, and the
            # connection dropped (regression scope0-ledger-2e63-escapes-dispatch)
            raise InvariantError(f"{exc!r} escaped the server's connection loop") from exc
        except asyncio.TimeoutError:
            raise InvariantError("the server did not finish reading the connection") from None
        _check(writer.closed, "the server closes the connection at its end")

        async def answered():
            while not all(x.answered for x in self.exchanges):
                await asyncio.sleep(0.0005)
        try:
            self.loop.run_until_complete(asyncio.wait_for(answered(), ANSWER_TIMEOUT_S))
        except asyncio.TimeoutError:
            raise InvariantError(f"{sum(not x.answered for x in self.exchanges)} requests "
                                 "never answered") from None
        srv = self.server

        async def over():
            # a connection's long polls end with it (in batches), and a BookKeeper session's
            # requests (not recorded above) are answered
            while srv.long_polls or srv.in_flight_requests:
                await asyncio.sleep(0.0005)
        try:
            self.loop.run_until_complete(asyncio.wait_for(over(), ANSWER_TIMEOUT_S))
        except asyncio.TimeoutError:
            raise InvariantError(f"{srv.long_polls} long polls outlive their connection, "
                                 f"{srv.in_flight_requests} requests never answered") from None
        self.loop.run_until_complete(asyncio.sleep(0))      # replies scheduled by callbacks
        _check(srv.in_flight_requests == 0 and srv.in_flight_bytes == 0,
               f"in-flight counts leak: {srv.in_flight_requests} requests, "
               f"{srv.in_flight_bytes} bytes")
        _check(srv.reading_bytes == 0 and not srv._arriving and not srv._arriving_by_address
               and srv._lead is None, f"bytes of frames still arriving leak: {srv.reading_bytes}")
        _check(not srv.polls.by_ledger, "long polls leak")
        self.last_writer = writer
        return bytes(writer.out)

    def v3_replies(self, whole: int) -> list:
        """The v3 responses of the last exchange once ``whole`` came (a dropped connection's
        requests still finish: a WRITE_LAC's header sync, its journal record), or those that
        came in ANSWER_TIMEOUT_S."""
        import asyncio
        from embedlog._native import bkwire as W
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while True:
            out = bytes(self.last_writer.out)
            got, pos, err = W.decode_responses(out)
            _check(err is None and pos == len(out), f"v3 replies: {err}")
            if len(got) >= whole or time.monotonic() > deadline:
                return got
            self.loop.run_until_complete(asyncio.sleep(0.001))


_BUT = None
_SERIAL = [0]
_ERRORS = None


def _bookie() -> _BookieUnderTest:
    global _BUT, _ERRORS
    if _ERRORS is None:
        _ERRORS = _ServerErrors()
    if _BUT is not None and _BUT.inputs >= BOOKIE_RECYCLE:
        _BUT.close()
        _BUT = None
    if _BUT is None:
        _SERIAL[0] += 1
        _BUT = _BookieUnderTest(_SERIAL[0])
    _BUT.inputs += 1
    return _BUT


def _replace_bookie() -> None:
    global _BUT
    if _BUT is not None:
        _BUT.close()
        _BUT = None


atexit.register(_replace_bookie)          # before TMP goes (atexit runs last-registered first)


def _responses(out: bytes) -> list:
    from embedlog.net import protocol as P
    resps, pos = [], 0
    while pos < len(out):
        _check(pos + 4 <= len(out), "reply frame length")
        (n,) = P.LENGTH.unpack_from(out, pos)
        _check(pos + 4 + n <= len(out), "reply frame complete")
        P.check_frame_length(n, P.DEFAULT_MAX_FRAME_BYTES)
        resps.append(P.parse_response(out[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return resps


BOOKIE_KEY_PASSWORDS = (b"fuzz", b"", b"other")


def _add_frame(r: Reader, rid: int) -> tuple:
    """One ADD frame from the input; returns (frame bytes, mutated?)."""
    from embedlog._native import format as F
    from embedlog.net import protocol as P
    flags = r.u(1)
    scope = (0, 0, 7, U64_MAX)[r.u(1) & 3]
    lid_sel = r.u(1)
    lid = LEDGERS[lid_sel & 3] if lid_sel < 0x80 else r.u(8)
    if scope == 0 and lid_sel < 0xC0:
        lid &= I64_MAX
    key = F.master_key(BOOKIE_KEY_PASSWORDS[r.u(1) % 3])
    term = r.u(1) & 3
    count = r.u(2) & 0x1FF
    mode, v, step = r.u(1), r.u(8), r.i(2)
    first = _eid(mode, v)
    spread = r.u(1)
    size_sel, size = r.u(1), r.u(4)
    digest = r.u(1)
    mut, pos, val = r.u(1), r.u(2), r.u(4)
    mask = (0x3F, 0xFFF, 0x7FFF, 0)[size_sel & 3]
    lens = [((size * (i + 1)) if size_sel & 4 else size) & mask for i in range(count)]
    while count and sum(lens) + 8 * count > BOOKIE_CONFIG["max_frame_size_bytes"] and not mut & 0x80:
        count //= 2
        lens = lens[:count]
    code = (digest & 3) + 1
    mac_key = F.mac_key(MAC_PASSWORD)
    entries = []
    for i in range(count):
        l = lid if not spread or i % (spread + 1) == 0 else (lid + i) & (U64_MAX if scope else I64_MAX)
        e = F.encode_entry(scope, 1, 0, i - 1, i, code, _payload(i, lens[i]), mac_key)
        e = _patch_ids(e, scope, l, first + i * step)
        if scope and digest & 0x80:
            e = bytes([e[0] & 0xF0 | digest & 0x0F]) + e[1:]    # an unknown digest code
        entries.append(e)
    frame = bytearray(P.add_request(rid, scope, lid, key, entries, flags=flags, term=term))
    m = mut & 7
    if m == 1:
        del frame[pos % (len(frame) + 1):]                  # truncated
    elif m == 2:
        frame[0:4] = struct.pack(">I", len(frame) - 4 + val % 97)       # says more than it has
    elif m == 3:
        frame[60:64] = struct.pack(">I", val)               # entry count
    elif m == 4 and count:
        frame[64:68] = struct.pack(">I", val)               # first entry's size
    elif m == 5 and len(frame) >= 8:
        p = 4 + pos % (len(frame) - 7)
        frame[p:p + 4] = struct.pack(">I", val)
    elif m == 6:
        frame[0:4] = struct.pack(">I", BOOKIE_CONFIG["max_frame_size_bytes"] + val % 4096 + 1)
    elif m == 7:
        frame[0:4] = struct.pack(">I", val % 64)            # shorter than a request head
    return bytes(frame), m != 0


def fuzz_bookie_add(data: bytes) -> None:
    """A real bookie (embedlog.bookie.Bookie behind embedlog.net.server.BookieServer) reads
    one connection's bytes: ADD frames with arbitrary entry ids, ledgers per frame, counts,
    sizes, keys, flags and terms, mutated (truncated, oversized, wrong counts and sizes), a
    fencing READ_LAC, long polls (past the long-poll bounds too: BOOKIE_CONFIG's are 2 a
    connection, 3 the bookie), a WRITE_LAC of any LAC (past every entry), raw bytes (a frame
    that never comes whole: its length alone), and BookKeeper v3 connections of their own
    (long polls, WRITE_LACs, GET_BOOKIE_INFO, a partial frame) among them. The server's own
    frame loop (_serve) reads them from its FrameReader: no socket. The bookie lives on
    across inputs (replaced every BOOKIE_RECYCLE inputs, or after the known checkpoint
    failure).

    Input (Reader)::

        input := frame{0..8}
        frame := kind:u8 body      # kind & 7: 0..4 ADD, 5 by kind >> 4 & 3: fence, poll,
                                   # write_lac, v3; 6 raw message, 7 the rest of the input as
                                   # raw bytes on the connection; kind & 8: a checkpoint
                                   # first, then a new connection (a v3 one is always new)
        ADD   := flags:u8 scope:u8 lid:u8 [u64] key:u8 term:u8 count:u16 eid_mode:u8 eid:u64
                 step:i16 spread:u8 size_sel:u8 size:u32 digest:u8 mutation:u8 pos:u16 val:u32
        fence := scope:u8 lid:u8 [u64]
        poll  := scope:u8 lid:u8 [u64] sel:u8   # previous LAC, timeout, count from sel
        write_lac := scope:u8 lid:u8 [u64] key:u8 lac:u64
        v3    := count:u8 (op:u8 lid:u8 value:u64){count} partial:u32
        raw   := len:u16 message[len]

    Invariants: every reply is a well-formed response with a known status (never EIO: an
    exception that is not an EmbedlogError escaped); every request the server admits is
    answered once (a waiting long poll when its connection ends); in-flight counts, bytes
    of frames still arriving and long polls return to zero; what an ADD answered EOK holds
    reads back byte for byte, from the memtable and after a checkpoint; then the same bookie
    takes a normal ADD and answers a READ of it (a canary ledger)."""
    from embedlog._native import format as F
    from embedlog._native.format import LedgerId
    from embedlog.net import protocol as P
    r = Reader(data)
    but = _bookie()
    stream, adds, any_mutated = [], {}, False     # adds: request id -> [(ledger, entries)]
    segments = []                 # the frames before each checkpoint (kind & 8) and the rest
    v3 = []                       # (v3 connection's bytes, its whole requests)
    for i in range(8):
        if r.left() <= 0:
            break
        kind = r.u(1)
        if kind & 8 and stream:
            segments.append(b"".join(stream))
            stream = []
        shape = kind >> 4 & 3
        kind &= 7
        rid = i + 1
        if kind <= 4:
            frame, mutated = _add_frame(r, rid)
            stream.append(frame)
            any_mutated = any_mutated or mutated
            try:                      # what the frame says, mutated or not, as the server reads it
                req = P.parse_request(frame[4:])
                adds.setdefault(req.request_id, []).append(
                    ((req.scope, req.ledger), P.parse_add_body(req.body)))
            except EmbedlogError:
                pass
        elif kind == 5 and shape == 3:
            v3.append(_v3_connection(r))
        elif kind == 5:
            scope = (0, 7)[r.u(1) & 1]
            lid_sel = r.u(1)
            lid = LEDGERS[lid_sel & 3] if lid_sel < 0x80 else r.u(8) & I64_MAX
            if shape == 0:
                stream.append(P.read_lac_request(rid, scope, lid, flags=P.FLAG_FENCE,
                                                 master_key=F.master_key(b"fuzz")))
            elif shape == 1:          # a long poll: answered at once, when the LAC passes, at
                sel = r.u(1)          # its timeout, past the bounds, or as its connection ends
                previous = (-1, 0, 5, 10 ** 12)[sel & 3]
                stream.append(P.read_request(rid, scope, lid, previous + 1, 1 + (sel >> 4 & 3),
                                             flags=P.FLAG_LONG_POLL, previous_lac=previous,
                                             timeout_ms=(0, 1, 30, 60_000)[sel >> 2 & 3]))
            else:                     # a WRITE_LAC, far past every entry as well
                key = F.master_key(BOOKIE_KEY_PASSWORDS[r.u(1) % 3])
                stream.append(P.write_lac_request(rid, scope, lid, key, r.u(8) & I64_MAX))
        elif kind == 6:
            msg = r.take(r.u(2) & 0x3FF)
            stream.append(struct.pack(">I", len(msg)) + msg)
        else:
            stream.append(r.take(r.left()))
    segments.append(b"".join(stream))
    stream = b"".join(segments + [b for b, _ in v3])
    n_errors = len(_ERRORS.records)
    out = b""
    for k, segment in enumerate(segments):    # a connection each, a checkpoint between them
        if k:
            but.bookie.checkpoint()
        out += but.exchange(segment)
    for segment, whole in v3:                 # and the v3 connections, after them
        but.exchange(segment)
        got = but.v3_replies(whole)
        _check(len(got) == whole, f"{len(got)} v3 replies to {whole} whole requests")
        _check(all(g.status in V3_STATUSES for g in got), f"v3 statuses {[g.status for g in got]}")
    if len(_ERRORS.records) > n_errors:
        rec = _ERRORS.records[n_errors]
        raise InvariantError(f"the server logged an error: {rec.getMessage()} "
                             f"{rec.exc_info[1]!r}" if rec.exc_info else rec.getMessage())
    expect = {}           # (scope, lid, eid) -> entry, what EOK adds must have left
    for resp in _responses(out):
        _check(resp.status in BOOKIE_STATUSES, f"status {resp.status}: {resp.message}")
        if resp.op != P.ADD or resp.status != P.EOK:
            continue
        sent = adds.get(resp.request_id, [])
        if len(sent) != 1:
            # mutated frames may carry any request id: then the add answered is not known
            _check(any_mutated, "EOK for an ADD that was not sent")
            continue
        ledger, entries = sent[0]
        _check((resp.scope, resp.ledger) == ledger, "ADD response's ledger")
        first, count = P.ADD_RESP.unpack(resp.body)
        _check(count == len(entries) and first == _ids_of(entries[0])[2], "ADD response")
        for e in entries:
            key = _ids_of(e)
            _check(key[:2] == ledger and key[2] >= 0, "an EOK add of entries it must refuse")
            expect[key] = e
        # a truncating add forgets the ledger's entries above its last one
        if resp.flags & P.FLAG_TRUNCATE:
            last = _ids_of(entries[-1])
            for k in [k for k in expect if k[:2] == last[:2] and k[2] > last[2]]:
                del expect[k]
    bookie = but.bookie
    for (s, l, e), entry in expect.items():
        _check(bookie.read_entry(LedgerId(s, l), e) == entry, f"entry {e} of ({s}, {l}) reads back")
    try:
        bookie.checkpoint()       # entry logs and index files take what was added
    except Exception as exc:
        _replace_bookie()
        raise InvariantError(f"checkpoint after the adds: {exc!r}") from exc
    _check(not bookie.read_only, f"bookie read-only: {sorted(bookie.read_only_reasons)}")
    for (s, l, e), entry in expect.items():
        _check(bookie.read_entry(LedgerId(s, l), e) == entry,
               f"entry {e} of ({s}, {l}) reads back after a checkpoint")
    _canary(but, stream)


V3_STATUSES = {s.v3 for s in STATUSES}          # BookKeeper's StatusCode (errors.STATUSES)


def _v3_connection(r: Reader) -> tuple:
    """A BookKeeper v3 connection's bytes (grammar: fuzz_bookie_add's v3) and how many whole
    requests it sends: long polls (piggybacked, of entry -1), WRITE_LACs of any LAC (with the
    right or a wrong key), GET_BOOKIE_INFO, then maybe the first bytes of a frame that never
    comes whole (a declared length up to past the frame limit)."""
    from embedlog._native import bkencode as E
    from embedlog._native import bkwire as W
    from embedlog._native import format as F
    parts = []
    n = r.u(1) & 7
    for txn in range(1, n + 1):
        op, lid_sel, value = r.u(1), r.u(1), r.u(8)
        lid = LEDGERS[lid_sel & 3] & (U64_MAX >> 1)
        if op % 3 == 0:
            parts.append(E.encode_request(txn, W.READ_ENTRY, ledger_id=lid, entry_id=-1,
                                          previous_lac=(-1, 0, 5, 10 ** 12)[value & 3],
                                          timeout_ms=(0, 1, 30, 60_000)[value >> 2 & 3],
                                          flag=W.ENTRY_PIGGYBACK))
        elif op % 3 == 1:
            lac = value & I64_MAX
            key = F.master_key(BOOKIE_KEY_PASSWORDS[op // 3 % 3])
            parts.append(E.encode_request(txn, W.WRITE_LAC, ledger_id=lid, lac=lac, master_key=key,
                                          body=E.lac_body(lid, lac, 3, None)))   # CRC32C
        else:
            parts.append(E.encode_request(txn, W.GET_BOOKIE_INFO, requested=value & 3))
    partial = r.u(4)
    if partial & 1:
        parts.append(((partial >> 1) & 0x1FFFF).to_bytes(4, "big") + bytes(partial >> 18 & 7))
    if not parts or parts[0][4:5] != b"\x0a":
        parts.insert(0, E.encode_request(n + 1, W.GET_BOOKIE_INFO, requested=1))
        n += 1
    return b"".join(parts), n


def _canary(but: _BookieUnderTest, stream: bytes) -> None:
    """A normal ADD of two entries to a ledger the input did not name, then a READ of them."""
    from embedlog._native import format as F
    from embedlog.net import protocol as P
    lid = 1_000_001
    while struct.pack(">Q", lid) in stream:
        lid += 1
    eid = but.canary_next.get(lid, 0)
    key = F.master_key(b"fuzz")
    es = [F.encode_entry(CANARY_SCOPE, lid, eid + i, eid + i - 1, 10 * (eid + i + 1), "crc32c",
                         b"canary %d" % (eid + i)) for i in range(2)]
    out = {o.request_id: o for o in _responses(but.exchange(
        P.add_request(1, CANARY_SCOPE, lid, key, es) + P.read_request(2, CANARY_SCOPE, lid, eid, 2)))}
    _check(sorted(out) == [1, 2], f"canary: answers {sorted(out)}")
    _check(out[1].status == P.EOK, f"canary add: {out[1].status} {out[1].message}")
    _check(out[2].status == P.EOK, f"canary read: {out[2].status} {out[2].message}")
    _lac, got = P.parse_read_body(out[2].body)
    _check(got == [(eid, es[0]), (eid + 1, es[1])], "canary entries read back")
    but.canary_next[lid] = eid + 2

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
    "add_kernels": fuzz_add_kernels,
    "bookie_add": fuzz_bookie_add,
    "bk_wire": fuzz_bk_wire,
    "bk_serve": fuzz_bk_serve,
}

# -max_len per target: file formats need room for their headers (index pages are 8 KiB)
MAX_LEN = {"journal": 8192, "entrylog": 8192, "index": 20480, "add_kernels": 512, "bookie_add": 2048}
DEFAULT_MAX_LEN = 4096
