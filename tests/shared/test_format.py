"""Entry formats against byte vectors built independently (struct, zlib, google-crc32c,
hmac), bit flips over every header byte, and the native CRCs against libraries."""
import hashlib
import hmac
import os
import random
import struct
import uuid
import zlib

import google_crc32c
import pytest

from embedlog import LedgerId
from embedlog._native import format as fmt
from embedlog.errors import CorruptedDataError, DigestMismatchError, IllegalOpError

PAYLOAD = b"embedlog golden payload"
PASSWORD = b"secret"


def golden(scope, lid, eid, lac, length, digest, payload):
    """Build an entry by hand from the format grammar, not with the encoder."""
    if scope == 0:
        header = struct.pack(">qqqq", lid, eid, lac, length)
    else:
        code = {"crc32": 1, "mac": 2, "crc32c": 3, "dummy": 4}[digest]
        header = struct.pack(">BQQqqq", 0x80 | (2 << 4) | code, scope, lid, eid, lac, length)
    body = header + payload
    if digest == "crc32":
        d = struct.pack(">Q", zlib.crc32(body))
    elif digest == "crc32c":
        d = struct.pack(">I", google_crc32c.value(body))
    elif digest == "mac":
        key = hashlib.sha1(b"mac" + PASSWORD).digest()
        d = hmac.new(key, body, hashlib.sha1).digest()
    else:
        d = b""
    return header + d + payload


CASES = [(scope, digest) for scope in (0, 0xDEADBEEF01) for digest in ("crc32", "crc32c", "mac", "dummy")]


@pytest.mark.parametrize("scope,digest", CASES)
def test_golden_vectors(scope, digest):
    mk = fmt.mac_key(PASSWORD) if digest == "mac" else None
    want = golden(scope, 42, 7, 6, 1000, digest, PAYLOAD)
    got = fmt.encode_entry(scope, 42, 7, 6, 1000, digest, PAYLOAD, mk)
    assert got == want
    assert fmt.decode_entry(want, scope, 42, 7, digest, mk) == PAYLOAD
    assert len(got) == (32 if scope == 0 else 41) + fmt.DIGEST_SIZES[fmt.digest_code(digest)] + len(PAYLOAD)


def test_known_constants():
    # BookKeeper's master key of the empty password, and the CRC check values
    assert fmt.master_key(b"").hex() == "850bf1071c5e3d8c24235676f8816ae0cbe2f14f"
    assert fmt.crc32c(b"123456789") == 0xE3069283
    assert fmt.crc32(b"123456789") == 0xCBF43926
    # a V1 CRC32C entry spelled out byte by byte
    e = fmt.encode_entry(0, 1, 0, -1, 5, "crc32c", b"hello")
    assert e.hex() == ("0000000000000001" "0000000000000000" "ffffffffffffffff" "0000000000000005"
                       + "%08x" % google_crc32c.value(bytes.fromhex(
                           "0000000000000001" "0000000000000000" "ffffffffffffffff" "0000000000000005")
                           + b"hello") + b"hello".hex())


@pytest.mark.parametrize("scope,digest", [c for c in CASES if c[1] != "dummy"])
def test_every_header_and_digest_bit_flip_is_caught(scope, digest):
    mk = fmt.mac_key(PASSWORD) if digest == "mac" else None
    good = fmt.encode_entry(scope, 42, 7, 6, 1000, digest, PAYLOAD, mk)
    covered = (32 if scope == 0 else 41) + fmt.DIGEST_SIZES[fmt.digest_code(digest)]
    for i in range(covered + 3):
        for bit in (0, 3, 7):
            bad = bytearray(good)
            bad[i] ^= 1 << bit
            with pytest.raises((CorruptedDataError, DigestMismatchError)):
                fmt.decode_entry(bytes(bad), scope, 42, 7, digest, mk)


def test_dummy_digest_still_checks_ids():
    good = fmt.encode_entry(0, 42, 7, 6, 1000, "dummy", PAYLOAD)
    for i in range(16):
        bad = bytearray(good)
        bad[i] ^= 0x01
        with pytest.raises(CorruptedDataError):
            fmt.decode_entry(bytes(bad), 0, 42, 7, "dummy")


def test_short_and_unknown_buffers_raise():
    good = fmt.encode_entry(5, 42, 7, 6, 1000, "crc32c", PAYLOAD)
    for n in range(0, 45):
        with pytest.raises(CorruptedDataError):
            fmt.decode_entry(good[:n], 5, 42, 7, "crc32c")
    bad = bytearray(good)
    bad[0] = 0x80 | (2 << 4) | 9        # unknown digest code
    with pytest.raises((CorruptedDataError, DigestMismatchError)):
        fmt.decode_entry(bytes(bad), 5, 42, 7, "crc32c")
    bad[0] = 0x80 | (5 << 4) | 3        # unknown version
    with pytest.raises(CorruptedDataError):
        fmt.decode_entry(bytes(bad), 5, 42, 7, "crc32c")
    with pytest.raises(IllegalOpError):
        fmt.digest_code("sha256")


def test_v1_refuses_scope_and_large_ids():
    with pytest.raises(IllegalOpError):
        LedgerId(0, 1 << 63)
    with pytest.raises(IllegalOpError):
        fmt.encode_entry(0, 1 << 63, 0, -1, 0, "crc32c", b"")
    assert LedgerId(1, (1 << 64) - 1).qualified_name == "0000000000000001ffffffffffffffff"


def test_crc32c_against_library_every_length():
    rnd = random.Random(7)
    data = bytes(rnd.getrandbits(8) for _ in range(4096 + 64))
    for n in range(0, 4097):
        off = n % 8
        chunk = data[off:off + n]
        assert fmt.crc32c(chunk) == google_crc32c.value(chunk), n
    for n in (8191, 8192 * 3, 8192 * 3 + 5, 1 << 20, (1 << 20) + 777):
        chunk = os.urandom(n)
        assert fmt.crc32c(chunk) == google_crc32c.value(chunk)
        assert fmt.crc32(chunk) == zlib.crc32(chunk)
    for n in range(0, 300):
        assert fmt.crc32(data[:n]) == zlib.crc32(data[:n])


def test_ledger_id_names_and_order():
    a = LedgerId(0, 5)
    assert a.qualified_name == "0" * 31 + "5"
    assert LedgerId.parse(a.qualified_name) == a == 5
    assert LedgerId.parse("00000000000000010000000000000002") == LedgerId(1, 2)
    u = uuid.uuid4()
    lid = LedgerId.from_uuid(u)
    assert lid.to_uuid() == u and lid.scope_id == u.int >> 64
    assert sorted([LedgerId(1, 0), LedgerId(0, 9), LedgerId(0, 2)]) == [LedgerId(0, 2), LedgerId(0, 9), LedgerId(1, 0)]
    assert len({LedgerId(3, 4), LedgerId(3, 4)}) == 1
    import pickle
    assert pickle.loads(pickle.dumps(LedgerId(9, 9))) == LedgerId(9, 9)
    for bad in ("xyz", "0" * 31, "g" * 32, "-" + "0" * 31, 5):
        with pytest.raises(IllegalOpError):
            LedgerId.parse(bad)
    for bad in ((-1, 0), (0, -1), (1 << 64, 0), ("a", 1)):
        with pytest.raises(IllegalOpError):
            LedgerId(*bad)


def test_add_path_copy_and_checksum_in_one_pass_matches_the_library_every_length():
    """The add path copies and checksums each payload in one pass (el_crc32c_copy): the
    digest it writes is google-crc32c's over header and payload, at every length and
    source alignment up to past the one-pass limit."""
    from embedlog._native import (journal_buffer as jbuffer, journal_kernels as jkernels,
                                  memtable as nmt)
    rnd = random.Random(11)
    data = bytes(rnd.getrandbits(8) for _ in range(1000))
    payloads = [memoryview(data)[n % 8:n % 8 + n] for n in range(0, 900)]
    mt = nmt.MemTable(1 << 24)
    n, _ = jkernels.add_payloads(jbuffer.JournalBuffer(), mt, 0, 9, 0, -1, 0, fmt.DIGEST_CODES["crc32c"], None,
                           payloads, 0, 1 << 20)
    assert n == len(payloads)
    for eid, p in enumerate(payloads):
        e = mt.get_encoded(0, 9, eid)
        assert e[36:] == p and int.from_bytes(e[32:36], "big") == google_crc32c.value(e[:32] + e[36:])
        assert fmt.decode_entry(e, 0, 9, eid, "crc32c") == p
