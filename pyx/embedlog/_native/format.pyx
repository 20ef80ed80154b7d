# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Entry formats, checksums and the 128-bit ledger id.

Grammar (all integers big-endian; see docs/FORMATS.md)::

    entry_v1 := ledger_id:i64 entry_id:i64 lac:i64 length:i64 digest payload
                # scope 0 only; ledger_id < 2^63; byte-identical to BookKeeper
    entry_v2 := flags:u8 scope_id:u64 ledger_id:u64 entry_id:i64 lac:i64 length:i64
                digest payload
    flags    := 1 | version:3 (=2) | digest_code:4       # MSB set tells V2 from V1
    digest   := crc32:u64 (value in the low 32 bits)      # code 1
              | hmac_sha1:20 keyed with SHA1("mac"+pw)    # code 2
              | crc32c:u32                                # code 3
              | (empty)                                   # code 4, DUMMY

The digest covers every header byte and the payload. ``length`` is the ledger's
cumulative length in bytes up to and including this entry; ``lac`` is the
highest entry id acknowledged before the entry was sent (-1 for the first).
"""

import hashlib
import operator
import hmac
import uuid as _uuid

from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING

from embedlog.errors import (CorruptedDataError, DigestMismatchError, IllegalOpError)

el_crc_init()

DIGEST_CODES = {"crc32": DIGEST_CRC32, "mac": DIGEST_MAC, "hmac": DIGEST_MAC,
                "crc32c": DIGEST_CRC32C, "dummy": DIGEST_DUMMY}
DIGEST_NAMES = {DIGEST_CRC32: "crc32", DIGEST_MAC: "mac", DIGEST_CRC32C: "crc32c",
                DIGEST_DUMMY: "dummy"}
DIGEST_SIZES = {DIGEST_CRC32: 8, DIGEST_MAC: 20, DIGEST_CRC32C: 4, DIGEST_DUMMY: 0}
HW_CRC32C = bool(el_crc_hw)

cdef uint64_t MAX_U64 = 0xFFFFFFFFFFFFFFFF
# The highest entry id a bookie takes: its index file puts entry e's location at byte
# 1024 + 8 e, so 2^40 entries need 8 TiB of (sparse) file, within ext4's 16 TiB limit.
# Only a stream's ledger goes that far (its positions are that one ledger's ids for its
# whole life: 12 days at a million entries a second); other ledgers stop at 2^32 - 1
# (bookie.py). Anything above is refused at the door instead of failing a checkpoint.
MAX_ENTRY_ID = (1 << 40) - 1
cdef uint64_t V1_LIMIT = 1 << 63


def digest_code(digest):
    """The digest type code for a name ("crc32c") or a code (3)."""
    if isinstance(digest, int):
        if digest in DIGEST_NAMES:
            return digest
    elif isinstance(digest, str) and digest.lower() in DIGEST_CODES:
        return DIGEST_CODES[digest.lower()]
    raise IllegalOpError(f"unknown digest type {digest!r}; expected one of crc32, crc32c, mac, dummy")


def master_key(password: bytes) -> bytes:
    """The 20-byte key bookies check: SHA1("ledger" + password), as BookKeeper derives it."""
    return hashlib.sha1(b"ledger" + bytes(password)).digest()


def mac_key(password: bytes) -> bytes:
    """The HMAC-SHA1 key of MAC-digest ledgers: SHA1("mac" + password)."""
    return hashlib.sha1(b"mac" + bytes(password)).digest()


def crc32c(data, unsigned int value=0):
    """CRC-32C of a buffer, chaining from ``value`` like zlib.crc32."""
    cdef const uint8_t[::1] view = data
    cdef uint32_t r
    with nogil:
        r = el_crc32c(value, &view[0] if view.shape[0] else NULL, view.shape[0])
    return r


def crc32(data, unsigned int value=0):
    """CRC-32 (IEEE), the same values as zlib.crc32."""
    cdef const uint8_t[::1] view = data
    cdef uint32_t r
    with nogil:
        r = el_crc32(value, &view[0] if view.shape[0] else NULL, view.shape[0])
    return r


cdef class LedgerId:
    """A 128-bit ledger id: (scope id, ledger id), each an unsigned 64-bit number.

    Scope 0 is BookKeeper's 63-bit range, so its ledger id stays below 2^63.
    ``qualified_name`` is the 32-lowercase-hex-digit form used by tools.
    """

    def __cinit__(self, scope_id, ledger_id):
        try:
            scope_id = operator.index(scope_id)
            ledger_id = operator.index(ledger_id)
        except TypeError:
            raise IllegalOpError(f"ledger ids are integers, got {scope_id!r}, {ledger_id!r}") from None
        if not (0 <= scope_id <= MAX_U64) or not (0 <= ledger_id <= MAX_U64):
            raise IllegalOpError(f"ledger id out of the unsigned 64-bit range: ({scope_id}, {ledger_id})")
        if scope_id == 0 and ledger_id >= V1_LIMIT:
            raise IllegalOpError(f"scope-0 ledger ids stay below 2^63, got {ledger_id}")
        self.scope_id = scope_id
        self.ledger_id = ledger_id

    @property
    def qualified_name(self):
        return "%016x%016x" % (self.scope_id, self.ledger_id)

    @staticmethod
    def parse(name):
        """The LedgerId for a 32-hex-digit qualified name."""
        if not isinstance(name, str) or len(name) != 32:
            raise IllegalOpError(f"a ledger qualified name is 32 hex digits, got {name!r}")
        try:
            value = int(name, 16)
        except ValueError:
            raise IllegalOpError(f"a ledger qualified name is 32 hex digits, got {name!r}") from None
        if name.startswith(("+", "-")) or "_" in name or " " in name:
            raise IllegalOpError(f"a ledger qualified name is 32 hex digits, got {name!r}")
        return LedgerId(value >> 64, value & MAX_U64)

    @staticmethod
    def from_uuid(u):
        """Split a UUID into scope id (high 64 bits) and ledger id (low 64 bits)."""
        if not isinstance(u, _uuid.UUID):
            u = _uuid.UUID(str(u))
        return LedgerId(u.int >> 64, u.int & MAX_U64)

    @staticmethod
    def coerce(value):
        """A LedgerId from a LedgerId, or from an int meaning scope 0."""
        return as_ledger_id(value)

    def to_uuid(self):
        return _uuid.UUID(int=(int(self.scope_id) << 64) | int(self.ledger_id))

    def __int__(self):
        return (int(self.scope_id) << 64) | int(self.ledger_id)

    def __hash__(self):
        return hash((self.scope_id, self.ledger_id))

    def __richcmp__(self, other, int op):
        if not isinstance(other, LedgerId):
            if isinstance(other, int) and not isinstance(other, bool):
                other = LedgerId(0, other) if 0 <= other < V1_LIMIT else None
            else:
                other = None
            if other is None:
                if op == 2:
                    return False
                if op == 3:
                    return True
                return NotImplemented
        a = (self.scope_id, self.ledger_id)
        b = ((<LedgerId>other).scope_id, (<LedgerId>other).ledger_id)
        if op == 0: return a < b
        if op == 1: return a <= b
        if op == 2: return a == b
        if op == 3: return a != b
        if op == 4: return a > b
        return a >= b

    def __repr__(self):
        return f"LedgerId(scope_id={self.scope_id}, ledger_id={self.ledger_id})"

    def __str__(self):
        if self.scope_id == 0:
            return str(self.ledger_id)
        return self.qualified_name

    def __reduce__(self):
        return (LedgerId, (self.scope_id, self.ledger_id))


cdef LedgerId as_ledger_id(object value):
    if isinstance(value, LedgerId):
        return <LedgerId>value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise IllegalOpError(f"ledger ids are not negative, got {value}")
        return LedgerId(0, value)
    raise IllegalOpError(f"a ledger id is a LedgerId or an int, got {value!r}")


cdef int digest_size(int digest) except -1:
    if digest == DIGEST_CRC32C:
        return 4
    if digest == DIGEST_CRC32:
        return 8
    if digest == DIGEST_MAC:
        return 20
    if digest == DIGEST_DUMMY:
        return 0
    raise CorruptedDataError(f"unknown digest type code {digest}")


cdef Py_ssize_t encoded_size(uint64_t scope, int digest, Py_ssize_t n) except -1:
    return (V1_HEADER_SIZE if scope == 0 else V2_HEADER_SIZE) + digest_size(digest) + n


cdef Py_ssize_t put_header(uint8_t *dst, uint64_t scope, uint64_t lid, int64_t eid,
                           int64_t lac, int64_t length, int digest) noexcept nogil:
    """Write an entry's header (V1 for scope 0, V2 otherwise); returns its size."""
    if scope == 0:
        el_put64(dst, lid)
        el_put64(dst + 8, <uint64_t>eid)
        el_put64(dst + 16, <uint64_t>lac)
        el_put64(dst + 24, <uint64_t>length)
        return V1_HEADER_SIZE
    dst[0] = V2_FLAGS | digest
    el_put64(dst + 1, scope)
    el_put64(dst + 9, lid)
    el_put64(dst + 17, <uint64_t>eid)
    el_put64(dst + 25, <uint64_t>lac)
    el_put64(dst + 33, <uint64_t>length)
    return V2_HEADER_SIZE


cdef bytes _mac(object key, const uint8_t *hdr, Py_ssize_t h, const uint8_t *payload, Py_ssize_t n):
    m = hmac.new(key, PyBytes_FromStringAndSize(<char *>hdr, h), hashlib.sha1)
    m.update(PyBytes_FromStringAndSize(<char *>payload, n) if n else b"")
    return m.digest()


cdef Py_ssize_t encode_into(uint8_t *dst, uint64_t scope, uint64_t lid, int64_t eid,
                            int64_t lac, int64_t length, int digest, object mac_key,
                            const uint8_t *payload, Py_ssize_t n) except -1:
    """Write one encoded entry at ``dst`` (room for encoded_size bytes); returns its size."""
    cdef Py_ssize_t h = put_header(dst, scope, lid, eid, lac, length, digest)
    cdef uint32_t c
    cdef bytes m
    if digest == DIGEST_CRC32C:
        c = el_crc32c(0, dst, h)
        c = el_crc32c(c, payload, n)
        el_put32(dst + h, c)
        h += 4
    elif digest == DIGEST_CRC32:
        c = el_crc32(0, dst, h)
        c = el_crc32(c, payload, n)
        el_put64(dst + h, c)
        h += 8
    elif digest == DIGEST_MAC:
        m = _mac(mac_key, dst, h, payload, n)
        memcpy(dst + h, PyBytes_AS_STRING(m), 20)
        h += 20
    elif digest != DIGEST_DUMMY:
        raise IllegalOpError(f"unknown digest type code {digest}")
    if n:
        memcpy(dst + h, payload, n)
    return h + n


cdef int parse_ids(const uint8_t *buf, Py_ssize_t n, uint64_t *scope, uint64_t *lid,
                   int64_t *eid) except -1:
    """Read the ids of an encoded entry without checking its digest."""
    if n >= 1 and buf[0] & 0x80:
        if n < V2_HEADER_SIZE:
            raise CorruptedDataError(f"V2 entry of {n} bytes is shorter than its 41-byte header")
        if (buf[0] >> 4) & 7 != 2:
            raise CorruptedDataError(f"unknown entry format version {(buf[0] >> 4) & 7}")
        scope[0] = el_get64(buf + 1)
        lid[0] = el_get64(buf + 9)
        eid[0] = <int64_t>el_get64(buf + 17)
        if scope[0] == 0:
            raise CorruptedDataError("a V2 entry carries scope id 0; scope-0 entries are V1")
        return 2
    if n < V1_HEADER_SIZE:
        raise CorruptedDataError(f"entry of {n} bytes is shorter than its 32-byte header")
    scope[0] = 0
    lid[0] = el_get64(buf)
    eid[0] = <int64_t>el_get64(buf + 8)
    return 1


cdef Py_ssize_t check_entry(const uint8_t *buf, Py_ssize_t n, uint64_t scope, uint64_t lid,
                            int64_t eid, int digest, object mac_key, bint crc_known=False) except -1:
    """Check an encoded entry against what the reader expected (ids, digest); returns where
    its payload starts. For MAC digests the entry is copied first (hashing may release the
    GIL, and buf may point into a mapping or a memtable). ``crc_known``: a CRC32C digest
    over these very bytes was just checked (a journal segment's ENTRY_CRC32C record, read
    for the first time): everything else is still checked."""
    cdef uint64_t s, l
    cdef int64_t e
    cdef Py_ssize_t h
    cdef int d = digest
    cdef int ds
    cdef uint32_t c
    cdef bytes m
    version = parse_ids(buf, n, &s, &l, &e)
    if version == 2:
        d = buf[0] & 0x0F
        if d != digest:
            if d not in DIGEST_NAMES:
                raise CorruptedDataError(f"unknown digest type code {d} in entry flags")
            raise DigestMismatchError(
                f"entry {e} of ledger {ledger_name(s, l)} has digest type {d}, ledger uses {digest}")
        h = V2_HEADER_SIZE
    else:
        h = V1_HEADER_SIZE
    if s != scope or l != lid or e != eid:
        raise CorruptedDataError(
            f"expected entry {eid} of ledger {ledger_name(scope, lid)}, found entry {e} of "
            f"ledger {ledger_name(s, l)}")
    ds = digest_size(d)
    if n < h + ds:
        raise CorruptedDataError(f"entry {eid} of {n} bytes is shorter than header and digest")
    if d == DIGEST_CRC32C and not crc_known:
        c = el_crc32c(0, buf, h)
        c = el_crc32c(c, buf + h + 4, n - h - 4)
        if c != el_get32(buf + h):
            raise DigestMismatchError(f"CRC32C mismatch on entry {eid} of ledger {ledger_name(scope, lid)}")
    elif d == DIGEST_CRC32:
        c = el_crc32(0, buf, h)
        c = el_crc32(c, buf + h + 8, n - h - 8)
        if <uint64_t>c != el_get64(buf + h):
            raise DigestMismatchError(f"CRC32 mismatch on entry {eid} of ledger {ledger_name(scope, lid)}")
    elif d == DIGEST_MAC:
        whole = PyBytes_FromStringAndSize(<char *>buf, n)
        m = _mac(mac_key, <const uint8_t *>PyBytes_AS_STRING(whole), h,
                 <const uint8_t *>PyBytes_AS_STRING(whole) + h + 20, n - h - 20)
        if not hmac.compare_digest(m, whole[h:h + 20]):
            raise DigestMismatchError(f"MAC mismatch on entry {eid} of ledger {ledger_name(scope, lid)}")
    return h + ds


cdef object decode_payload(const uint8_t *buf, Py_ssize_t n, uint64_t scope, uint64_t lid,
                           int64_t eid, int digest, object mac_key, bint crc_known=False):
    """Check an encoded entry against what the reader expected; return its payload."""
    cdef Py_ssize_t h
    if digest == DIGEST_MAC:
        # copy first: hashing may release the GIL, and buf may point into a mapping
        whole = PyBytes_FromStringAndSize(<char *>buf, n)
        h = check_entry(<const uint8_t *>PyBytes_AS_STRING(whole), n, scope, lid, eid, digest,
                        mac_key)
        return whole[h:]
    h = check_entry(buf, n, scope, lid, eid, digest, mac_key, crc_known)
    return PyBytes_FromStringAndSize(<char *>buf + h, n - h)


def encode_entry(scope_id, ledger_id, entry_id, lac, length, digest, payload, mac_key=None):
    """Encode one entry (V1 for scope 0, V2 otherwise) and return its bytes."""
    cdef int d = digest_code(digest)
    cdef const uint8_t[::1] p = payload
    if entry_id < 0:
        raise IllegalOpError(f"entry ids are not negative, got {entry_id}")
    lid = LedgerId(scope_id, ledger_id)
    if d == DIGEST_MAC and mac_key is None:
        raise IllegalOpError("MAC digest needs a mac_key")
    cdef Py_ssize_t size = encoded_size(scope_id, d, p.shape[0])
    out = PyBytes_FromStringAndSize(NULL, size)
    encode_into(<uint8_t *>PyBytes_AS_STRING(out), scope_id, ledger_id, entry_id, lac, length,
                d, mac_key, &p[0] if p.shape[0] else NULL, p.shape[0])
    return out


def decode_entry(data, scope_id, ledger_id, entry_id, digest, mac_key=None):
    """Verify an encoded entry is the one expected and intact; return its payload."""
    cdef const uint8_t[::1] v = data
    cdef int d = digest_code(digest)
    if v.shape[0] == 0:
        raise CorruptedDataError("empty entry buffer")
    return decode_payload(&v[0], v.shape[0], scope_id, ledger_id, entry_id, d, mac_key)


def parse_entry_header(data):
    """(version, scope_id, ledger_id, entry_id, lac, length, digest_code or None) of an entry."""
    cdef const uint8_t[::1] v = data
    cdef uint64_t s, l
    cdef int64_t e
    if v.shape[0] == 0:
        raise CorruptedDataError("empty entry buffer")
    version = parse_ids(&v[0], v.shape[0], &s, &l, &e)
    if version == 2:
        return (2, s, l, e, <int64_t>el_get64(&v[25]), <int64_t>el_get64(&v[33]), v[0] & 0x0F)
    return (1, 0, l, e, <int64_t>el_get64(&v[16]), <int64_t>el_get64(&v[24]), None)


def ledger_name(scope, lid):
    """How messages spell a ledger id: str(LedgerId), the number in scope 0, else the
    32-hex-digit qualified name (what the CLI takes)."""
    return str(LedgerId(scope, lid))
