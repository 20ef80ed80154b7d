# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The journal's record grammar and its file header: written once here, derived from
everywhere else (the buffer frames records, the scanner checks them, replay decodes them).

Grammar (big-endian; see docs/FORMATS.md)::

    journal_file := header(512) record* zeros*
    header       := "ELJN" version:u32(=4 in layout 2; 3 before, 2 before recycling,
                    1 before ENTRY_CRC32C)
                    log_id:u64 header_crc:u32 prev_log_id:u64 chain_crc:u32
                    min_size:u64 size_crc:u32 recycled_from:u64 salt:u32 salt_crc:u32
                    segment:u32 segment_crc:u32 flags:u32 flags_crc:u32 zeros(436)
                    # segment: the number index locations name this file by (layout 2,
                    # the journal's segments are the entries' storage), segment_crc =
                    # crc32c(bytes 0..63); 0, 0 in layout 1. flags (flags_crc = crc32c of
                    # bytes 0..71): FLAG_GROUPS (1), every group written to this life of
                    # the file begins with a GROUP record
                    # header_crc = crc32c(bytes 0..15); chain_crc = crc32c(bytes 0..27): the
                    # journal written before this one (0: none), so a missing file is seen;
                    # size_crc = crc32c(bytes 0..39): min_size, the size its preallocated
                    # zeros (or its previous life) gave the file (0: none), so a file found
                    # shorter was cut; salt_crc = crc32c(bytes 0..51): a recycled file's
                    # previous journal id and the salt of this life (0, 0: a new file);
                    # headers written before a field existed hold zeros there
    record       := len:u32 crc:u32 type:u8 body[len]     # len > 0
    crc          := crc32c(len:u32 type:u8 body) ^ salt   # all types but ENTRY_CRC32C
    type ENTRY(1)        body := encoded entry (V1 or V2), as the client sent it
    type ENTRY_CRC32C(9) body := encoded entry (V1 or V2) with a CRC32C digest; crc covers
                                 len, type and the entry's header and digest only: the digest
                                 (crc32c of header and payload) covers the payload, so the
                                 add path reads each payload once. Valid = both match.
    type LEDGER_KEY(2)   body := scope:u64 ledger:u64 master_key
    type FENCE(3)        body := scope:u64 ledger:u64
    type EXPLICIT_LAC(4) body := scope:u64 ledger:u64 lac:i64
    type TERM(5)         body := scope:u64 ledger:u64 term:u64
    type TRUNCATE(6)     body := scope:u64 ledger:u64 last_kept_entry:i64
    type DELETE_LEDGER(7)body := scope:u64 ledger:u64
    type TRIM(8)         body := scope:u64 ledger:u64 first_kept_entry:i64
    type INCARNATION(10) body := scope:u64 ledger:u64 ctime_ms:i64
    type GROUP(11)       body := group_len:u32   # the bytes of the group this record begins,
                                                 # itself included (one write, one fdatasync)

A recycled file (journal_reuse_files: a trimmed journal renamed and overwritten, as
BookKeeper's journalReuseFiles and RocksDB's recycled WAL do) still holds its previous life's
records after the new tail. Every record crc of a life is xored with that life's salt, never
the previous life's, so no stale record checks as a current one: the first one ends the log.
What a recycled file cannot tell is a torn last record from a damaged one (the sectors a torn
write missed hold stale bytes, not zeros): replay takes it as torn, as RocksDB does.

A zero ``len`` is the end of the log: new files are preallocated with zeros, so a
preallocated tail never parses; a zero ``len`` followed by a good record is corruption,
as a bad record followed by a good one is. Replay skips records of unknown type with a good
crc, so newer record types can be added.

Bounds: a header's ``min_size`` is read only behind its own crc; ``decode_record`` checks
each body's length against its type before reading a field.
"""

from embedlog._native.format cimport el_put32, el_put64, el_get32, el_get64, el_crc32c, el_crc_init
from libc.string cimport memcpy

from embedlog._native.format import parse_entry_header
from embedlog.errors import JournalCorruptedError

el_crc_init()

HEADER_SIZE = 512
MAX_MASTER_KEY = 64            # what an index file can hold (index.pyx MAX_KEY)
MAGIC = b"ELJN"
FORMAT_VERSION = 3            # 3: salted record crcs (recycled files); 2: ENTRY_CRC32C records
SEGMENT_VERSION = 4           # a segment number: an older embedlog must not trim such a file
READABLE_VERSIONS = (1, 2, 3, 4)
RECORD_TYPES = {REC_ENTRY: "entry", REC_ENTRY_CRC32C: "entry", REC_LEDGER_KEY: "ledger_key", REC_FENCE: "fence",
                REC_EXPLICIT_LAC: "explicit_lac", REC_TERM: "term", REC_TRUNCATE: "truncate",
                REC_DELETE_LEDGER: "delete_ledger", REC_TRIM: "trim",
                REC_INCARNATION: "incarnation", REC_GROUP: "group"}
ENTRY, LEDGER_KEY, FENCE, EXPLICIT_LAC, TERM, TRUNCATE, DELETE_LEDGER, TRIM, INCARNATION = (
    REC_ENTRY, REC_LEDGER_KEY, REC_FENCE, REC_EXPLICIT_LAC, REC_TERM, REC_TRUNCATE,
    REC_DELETE_LEDGER, REC_TRIM, REC_INCARNATION)
ENTRY_CRC32C = REC_ENTRY_CRC32C
GROUP = REC_GROUP
ENTRY_TYPES = (REC_ENTRY, REC_ENTRY_CRC32C)
FLAG_GROUPS = 1               # header flag: each group begins with a GROUP record


def file_header(unsigned long long log_id, unsigned long long prev_log_id=0,
                unsigned long long min_size=0, unsigned long long recycled_from=0,
                uint32_t salt=0, uint32_t segment=0, uint32_t flags=0):
    """The 512-byte header of journal file ``log_id``, written after ``prev_log_id``, whose
    preallocation (or previous life) made it ``min_size`` bytes long; a recycled file names
    the journal it was (``recycled_from``) and the ``salt`` its records' crcs are xored with;
    ``segment``: its number as layout 2's storage (0: layout 1); ``flags``: FLAG_GROUPS."""
    cdef bytearray h = bytearray(512)
    cdef uint8_t *p = h
    memcpy(p, b"ELJN", 4)
    el_put32(p + 4, SEGMENT_VERSION if segment else FORMAT_VERSION)
    el_put64(p + 8, log_id)
    el_put32(p + 16, el_crc32c(0, p, 16))
    el_put64(p + 20, prev_log_id)
    el_put32(p + 28, el_crc32c(0, p, 28))
    el_put64(p + 32, min_size)
    el_put32(p + 40, el_crc32c(0, p, 40))
    el_put64(p + 44, recycled_from)
    el_put32(p + 52, salt)
    el_put32(p + 56, el_crc32c(0, p, 56))
    if segment:
        el_put32(p + 60, segment)
        el_put32(p + 64, el_crc32c(0, p, 64))
    if flags:
        el_put32(p + 68, flags)
        el_put32(p + 72, el_crc32c(0, p, 72))
    return bytes(h)


def file_flags(data):
    """The flags of a journal header (0: none, or a header from before the field; call
    check_file_header first)."""
    cdef const uint8_t[::1] v = data
    if v.shape[0] < 76 or el_get32(&v[72]) != el_crc32c(0, &v[0], 72):
        return 0
    return el_get32(&v[68])


def file_segment(data):
    """The segment number of a journal header (0: none, layout 1; call check_file_header
    first)."""
    cdef const uint8_t[::1] v = data
    if v.shape[0] < 68 or el_get32(&v[64]) != el_crc32c(0, &v[0], 64):
        return 0
    return el_get32(&v[60])


def file_salt(data):
    """(recycled_from, salt) of a journal header: (0, 0) for a new file or a header from
    before recycling (call check_file_header first)."""
    cdef const uint8_t[::1] v = data
    if v.shape[0] < 60 or el_get32(&v[56]) != el_crc32c(0, &v[0], 56):
        return 0, 0
    return el_get64(&v[44]), el_get32(&v[52])


def new_salt(unsigned long long log_id, uint32_t old_salt):
    """The salt of a life of a journal file: derived from its id, never 0 (a new file's)
    nor the previous life's ``old_salt``."""
    cdef uint8_t b[8]
    el_put64(b, log_id)
    cdef uint32_t s = el_crc32c(0, b, 8)
    while s == 0 or s == old_salt:
        s += 1
    return s


def file_min_size(data):
    """The size a journal file's preallocation gave it (0: none, or a header from before
    the field; call check_file_header first)."""
    cdef const uint8_t[::1] v = data
    if v.shape[0] < 44 or el_get32(&v[40]) != el_crc32c(0, &v[0], 40):
        return 0
    return el_get64(&v[32])


def file_chain(data):
    """The id of the journal written before this one (0: none), or None for a header
    written before journals were chained (call check_file_header first)."""
    cdef const uint8_t[::1] v = data
    if el_get32(&v[28]) != el_crc32c(0, &v[0], 28):
        return None
    return el_get64(&v[20])


class JournalHeaderError(JournalCorruptedError, ValueError):
    """A journal file whose header does not parse (a ValueError too, as callers expect)."""


def check_file_header(data):
    """The log id of a journal header; JournalHeaderError if it is not one."""
    cdef const uint8_t[::1] v = data
    if v.shape[0] < 512 or bytes(data[:4]) != MAGIC:
        raise JournalHeaderError("not an embedlog journal (bad magic)")
    if el_get32(&v[16]) != el_crc32c(0, &v[0], 16):
        raise JournalHeaderError("journal header checksum mismatch")
    if el_get32(&v[4]) not in READABLE_VERSIONS:
        raise JournalHeaderError(f"unknown journal format version {el_get32(&v[4])}")
    return el_get64(&v[8])


def decode_record(int rtype, body):
    """The fields of one record's body, as replay applies them: ENTRY -> the entry's header
    (format.parse_entry_header); LEDGER_KEY -> (scope, ledger, master_key); FENCE and
    DELETE_LEDGER -> (scope, ledger); EXPLICIT_LAC, TRUNCATE, TRIM, INCARNATION -> (scope,
    ledger, i64); TERM -> (scope, ledger, u64); GROUP -> (group_len,); an unknown type ->
    None (skipped: newer types may be added).
    JournalCorruptedError when the body does not fit its type."""
    cdef const uint8_t[::1] v = body
    cdef Py_ssize_t n = v.shape[0]
    if rtype == REC_ENTRY or rtype == REC_ENTRY_CRC32C:
        return parse_entry_header(body)
    if rtype not in RECORD_TYPES:
        return None
    if rtype == REC_GROUP:
        if n != 4:
            raise JournalCorruptedError(f"group record of {n} bytes, expected 4")
        return (el_get32(&v[0]),)
    if rtype == REC_LEDGER_KEY:
        if not 16 <= n <= 16 + MAX_MASTER_KEY:
            raise JournalCorruptedError(f"ledger key record of {n} bytes (16 + a key of at most "
                                        f"{MAX_MASTER_KEY})")
        return el_get64(&v[0]), el_get64(&v[8]), bytes(body[16:])
    if rtype == REC_FENCE or rtype == REC_DELETE_LEDGER:
        if n != 16:
            raise JournalCorruptedError(f"{RECORD_TYPES[rtype]} record of {n} bytes, expected 16")
        return el_get64(&v[0]), el_get64(&v[8])
    if n != 24:
        raise JournalCorruptedError(f"{RECORD_TYPES[rtype]} record of {n} bytes, expected 24")
    if rtype == REC_TERM:
        return el_get64(&v[0]), el_get64(&v[8]), el_get64(&v[16])
    return el_get64(&v[0]), el_get64(&v[8]), <int64_t>el_get64(&v[16])
