"""The wire protocol between clients and bookies (docs/PROTOCOL.md).

Grammar (big-endian)::

    frame     := length:u32 message[length]              # length <= max_frame_bytes
    request   := version:u8(=1) op:u8 flags:u16 request_id:u64
                 scope:u64 ledger:u64 master_key[20] term:u64 op_body
    response  := version:u8(=1) op:u8(|0x80) flags:u16 request_id:u64 status:i32
                 scope:u64 ledger:u64 op_body | error_body
    error_body:= message_len:u16 message(utf-8)              # when status != 0

    ADD(1)        request  count:u32 (size:u32 entry[size])*count    # entries of one ledger
                  response first_entry:i64 count:u32
    READ(2)       request  first_entry:i64 count:u32 previous_lac:i64 timeout_ms:u32
                  response lac:i64 count:u32 (entry_id:i64 size:u32 entry[size])*count
    READ_LAC(3)   request  (nothing)
                  response lac:i64 last_entry_id:i64 size:u32 last_entry[size]
    WRITE_LAC(4)  request  lac:i64
                  response (nothing)
    BOOKIE_INFO(5)request  (nothing)                        # scope, ledger, key, term are 0
                  response json[...]
    TRIM(6)       request  first_kept_entry:i64             # stream retention
                  response (nothing)
    AUTH(7)       request  token[...]                       # first frame when the bookie wants a token
                  response (nothing): EOK, or EUA (the connection stays open until AUTH
                  succeeds, MAX_AUTH_FAILURES refusals or the AUTH timeout)
    GOAWAY(8)     response only, request id 0: the bookie will close this idle connection
                  after a grace period; the client sends new requests on a new connection

Limits: a frame over max_frame_size_bytes gets EBADREQ and the connection is closed; over
max_connections a new connection gets ETOOMANYREQUESTS (request id 0) and is closed; at an
in-flight limit the bookie stops reading the connection for up to max_throttle_time_ms, then
answers its requests ETOOMANYREQUESTS until the load falls (docs/SECURITY.md).

Flags: FENCE (0x1) on READ and READ_LAC fences the ledger first (BookKeeper fences with
a read, and its recovery reads fence too); RECOVERY_ADD (0x2) lets an add
through a fenced ledger; LONG_POLL (0x10) on READ waits up to timeout_ms for the
bookie's LAC to pass previous_lac. Unbounded ledgers (streams) fence with terms: every
ADD, and READ / READ_LAC with RECOVERY_READ (0x20), carry the client's term, which the
bookie adopts if higher and refuses with EINVALIDTERM if lower; TRUNCATE (0x8) on ADD
marks a stream's no-op entry after which the bookie forgets every higher entry. Statuses are
the embedlog column of errors.STATUSES: BookKeeper's v2 codes (EOK=0, ENOLEDGER=1,
ENOENTRY=2, EBADREQ=100, EIO=101, EUA=102, EBADVERSION=103, EFENCED=104, EREADONLY=105,
ETOOMANYREQUESTS=106) plus EINVALIDTERM=108 and ELEDGEREXISTS=109.
"""
from __future__ import annotations

import struct

from embedlog._native.frames import add_request, add_request_sized  # noqa: F401  (ADD frames: built in one C pass)
from embedlog._native.frames import split_add_body
from embedlog._native.wire_sizes import (FRAME_HEADERS_BYTES, MASTER_KEY_BYTES, MAX_FRAME_BYTES,
                                         REQ_HEAD_BYTES)
from embedlog.errors import STATUS, CorruptedDataError, EntryTooLargeError, IllegalOpError

VERSION = 1
ADD, READ, READ_LAC, WRITE_LAC, BOOKIE_INFO, TRIM, AUTH = 1, 2, 3, 4, 5, 6, 7
GOAWAY = 8                                        # server to client only
OPS = {ADD: "add", READ: "read", READ_LAC: "read_lac", WRITE_LAC: "write_lac",
       BOOKIE_INFO: "bookie_info", TRIM: "trim", AUTH: "auth"}
FLAG_FENCE, FLAG_RECOVERY_ADD, FLAG_HIGH_PRIORITY, FLAG_TRUNCATE, FLAG_LONG_POLL = 0x1, 0x2, 0x4, 0x8, 0x10
FLAG_RECOVERY_READ = 0x20
RESPONSE_BIT = 0x80
EOK, ENOLEDGER, ENOENTRY, EBADREQ, EIO, EUA, EBADVERSION, EFENCED, EREADONLY, ETOOMANYREQUESTS, \
    EINVALIDTERM, ELEDGEREXISTS = [STATUS[name].embedlog for name in (
        "EOK", "ENOLEDGER", "ENOENTRY", "EBADREQ", "EIO", "EUA", "EBADVERSION", "EFENCED",
        "EREADONLY", "ETOOMANYREQUESTS", "EINVALIDTERM", "ELEDGEREXISTS")]
DEFAULT_MAX_FRAME_BYTES = MAX_FRAME_BYTES + FRAME_HEADERS_BYTES    # BookKeeper's 5 MiB, plus headers
MAX_READ_ENTRIES = 1024                                # entries one READ asks for at most

LENGTH = struct.Struct(">I")
REQ_HEAD = struct.Struct(f">BBHQQQ{MASTER_KEY_BYTES}sQ")
if REQ_HEAD.size != REQ_HEAD_BYTES:              # the size frames.pyx frames ADDs with
    raise ImportError(f"protocol.REQ_HEAD has {REQ_HEAD.size} bytes, wire_sizes.pxd says {REQ_HEAD_BYTES}")
RESP_HEAD = struct.Struct(">BBHQiQQ")            # 32 bytes
U32 = struct.Struct(">I")
I64 = struct.Struct(">q")
ADD_RESP = struct.Struct(">qI")
READ_REQ = struct.Struct(">qIqI")
READ_RESP = struct.Struct(">qI")
ENTRY_HEAD = struct.Struct(">qI")
READ_LAC_RESP = struct.Struct(">qqI")
NO_KEY = bytes(MASTER_KEY_BYTES)


class Request:
    __slots__ = ("op", "flags", "request_id", "scope", "ledger", "master_key", "term", "body")

    def __init__(self, op, flags, request_id, scope, ledger, master_key, term, body):
        self.op, self.flags, self.request_id = op, flags, request_id
        self.scope, self.ledger, self.master_key, self.term, self.body = scope, ledger, master_key, term, body

    def __repr__(self):
        return (f"Request({OPS.get(self.op, self.op)}, id={self.request_id}, "
                f"ledger=({self.scope}, {self.ledger}), flags={self.flags:#x})")


class Response:
    __slots__ = ("op", "flags", "request_id", "status", "scope", "ledger", "body")

    def __init__(self, op, flags, request_id, status, scope, ledger, body):
        self.op, self.flags, self.request_id, self.status = op, flags, request_id, status
        self.scope, self.ledger, self.body = scope, ledger, body

    @property
    def message(self) -> str:
        if self.status == EOK or len(self.body) < 2:
            return ""
        (n,) = struct.unpack_from(">H", self.body)
        return bytes(self.body[2:2 + n]).decode("utf-8", "replace")


# -- requests ------------------------------------------------------------------------------

def _frame(parts: list) -> bytes:
    """One join: the length goes in front of the parts, not onto a joined copy."""
    parts.insert(0, LENGTH.pack(sum(len(p) for p in parts)))
    return b"".join(parts)


def read_request(request_id, scope, ledger, first, count=1, flags=0, master_key=NO_KEY,
                 term=0, previous_lac=-1, timeout_ms=0) -> bytes:
    return _frame([REQ_HEAD.pack(VERSION, READ, flags, request_id, scope, ledger, master_key, term),
                   READ_REQ.pack(first, count, previous_lac, timeout_ms)])


def read_lac_request(request_id, scope, ledger, flags=0, master_key=NO_KEY, term=0) -> bytes:
    return _frame([REQ_HEAD.pack(VERSION, READ_LAC, flags, request_id, scope, ledger, master_key, term)])


def write_lac_request(request_id, scope, ledger, master_key, lac, term=0) -> bytes:
    return _frame([REQ_HEAD.pack(VERSION, WRITE_LAC, 0, request_id, scope, ledger, master_key, term),
                   I64.pack(lac)])


def trim_request(request_id, scope, ledger, master_key, first_kept, term=0) -> bytes:
    return _frame([REQ_HEAD.pack(VERSION, TRIM, 0, request_id, scope, ledger, master_key, term),
                   I64.pack(first_kept)])


def bookie_info_request(request_id) -> bytes:
    return _frame([REQ_HEAD.pack(VERSION, BOOKIE_INFO, 0, request_id, 0, 0, NO_KEY, 0)])


def auth_request(request_id, token: bytes) -> bytes:
    return _frame([REQ_HEAD.pack(VERSION, AUTH, 0, request_id, 0, 0, NO_KEY, 0), bytes(token)])


def parse_request(message) -> Request:
    """A request from one frame's message; IllegalOpError/CorruptedDataError when malformed."""
    if len(message) < REQ_HEAD.size:
        raise CorruptedDataError(f"request of {len(message)} bytes is shorter than its header")
    version, op, flags, rid, scope, ledger, key, term = REQ_HEAD.unpack_from(message)
    if version != VERSION:
        raise IllegalOpError(f"unknown protocol version {version}")
    if op not in OPS:
        raise IllegalOpError(f"unknown operation {op}")
    return Request(op, flags, rid, scope, ledger, key, term, memoryview(message)[REQ_HEAD.size:])


def parse_add_body(body) -> list:
    """The entries of an ADD body, as views of it (``body`` is a memoryview).
    CorruptedDataError for a body cut short, with trailing bytes or without a count;
    IllegalOpError for one without entries. One C pass (frames.split_add_body): this
    loop ran once per entry on the bookie's event loop."""
    return split_add_body(body)


def _exact(st: struct.Struct, body, what: str) -> tuple:
    if len(body) != st.size:          # a malformed request: EBADREQ, as the server answers
        raise IllegalOpError(f"{what} body of {len(body)} bytes, expected {st.size}")
    return st.unpack(body)


def parse_read_request(body) -> tuple:
    """(first_entry, count, previous_lac, timeout_ms) of a READ request."""
    return _exact(READ_REQ, body, "read request")


def parse_i64_body(body) -> int:
    """The one i64 of a WRITE_LAC (lac) or TRIM (first kept entry) request."""
    return _exact(I64, body, "request")[0]


# -- responses -----------------------------------------------------------------------------

def response(req_op, flags, request_id, status, scope, ledger, body=b"") -> bytes:
    head = RESP_HEAD.pack(VERSION, req_op | RESPONSE_BIT, flags, request_id, status, scope, ledger)
    return LENGTH.pack(len(head) + len(body)) + head + body


def goaway() -> bytes:
    return response(GOAWAY, 0, 0, EOK, 0, 0)


def error_response(req_op, flags, request_id, status, scope, ledger, message: str) -> bytes:
    msg = message.encode("utf-8", "replace")[:1000]
    return response(req_op, flags, request_id, status, scope, ledger, struct.pack(">H", len(msg)) + msg)


def read_response_body(lac: int, entries: list) -> bytes:
    parts = [READ_RESP.pack(lac, len(entries))]
    for eid, data in entries:
        parts.append(ENTRY_HEAD.pack(eid, len(data)))
        parts.append(data)
    return b"".join(parts)


def read_response_framed(request_id, flags, scope, ledger, lac: int, count: int, framed) -> list:
    """A READ response whose entries are already framed (LedgerReader.encoded_run), as the
    parts to write: the entries are not copied into one frame again."""
    head = RESP_HEAD.pack(VERSION, READ | RESPONSE_BIT, flags, request_id, EOK, scope, ledger)
    return [LENGTH.pack(len(head) + READ_RESP.size + len(framed)) + head + READ_RESP.pack(lac, count),
            framed]


def parse_response(message) -> Response:
    if len(message) < RESP_HEAD.size:
        raise CorruptedDataError(f"response of {len(message)} bytes is shorter than its header")
    version, op, flags, rid, status, scope, ledger = RESP_HEAD.unpack_from(message)
    if version != VERSION or not op & RESPONSE_BIT:
        raise CorruptedDataError(f"not a version {VERSION} response")
    return Response(op & ~RESPONSE_BIT, flags, rid, status, scope, ledger,
                    memoryview(message)[RESP_HEAD.size:])


def parse_read_body(body) -> tuple[int, list]:
    if len(body) < READ_RESP.size:
        raise CorruptedDataError(f"read response of {len(body)} bytes is shorter than its header")
    lac, count = READ_RESP.unpack_from(body)
    pos, out = READ_RESP.size, []
    for _ in range(count):
        if pos + ENTRY_HEAD.size > len(body):
            raise CorruptedDataError("read response truncated in an entry header")
        eid, n = ENTRY_HEAD.unpack_from(body, pos)
        pos += ENTRY_HEAD.size
        if pos + n > len(body):
            raise CorruptedDataError("read response truncated")
        out.append((eid, bytes(body[pos:pos + n])))
        pos += n
    return lac, out


def parse_read_lac_body(body) -> tuple:
    """(lac, last_entry_id, last entry or an empty view) of a READ_LAC response; the entry
    is a view of the body, not a copy (most callers want only the LAC)."""
    if len(body) < READ_LAC_RESP.size:
        raise CorruptedDataError(f"read-LAC response of {len(body)} bytes is shorter than its header")
    lac, last, n = READ_LAC_RESP.unpack_from(body)
    if READ_LAC_RESP.size + n > len(body):
        raise CorruptedDataError("read-LAC response truncated")
    return lac, last, memoryview(body)[READ_LAC_RESP.size:READ_LAC_RESP.size + n]


def check_frame_length(n: int, max_frame_bytes: int) -> None:
    if n > max_frame_bytes:
        raise EntryTooLargeError(f"frame of {n} bytes exceeds max_frame_bytes={max_frame_bytes}")
    if n < RESP_HEAD.size:
        raise CorruptedDataError(f"frame of {n} bytes is shorter than any message")
