"""BookKeeper's ledger metadata record (LedgerMetadataSerDe), to and from LedgerMetadata.

The znode of a ledger holds::

    record  = "BookieMetadataFormatVersion\\t" version "\\n" body      version: decimal ASCII
    body v3 = varint length, LedgerMetadataFormat in protobuf binary (BookKeeper 4.9+)
    body v2 = LedgerMetadataFormat in protobuf text format (4.2+; no cToken)
    (v1, the 4.0 text lines, is refused: no BookKeeper since 4.2 writes it)

    LedgerMetadataFormat (DataFormats.proto, proto2)
      1  quorumSize     int32, required     write quorum
      2  ensembleSize   int32, required
      3  length         int64, required     bytes; meaningful once CLOSED
      4  lastEntryId    int64               -1 until CLOSED with entries
      5  state          enum, required      OPEN=1 IN_RECOVERY=2 CLOSED=3
      6  segment        repeated message    one per ensemble, in entry order:
           1 ensembleMember  repeated string    bookie ids
           2 firstEntryId    int64, required
      7  digestType     enum                CRC32=1 HMAC=2 CRC32C=3 DUMMY=4 (embedlog's codes)
      8  password       bytes
      9  ackQuorumSize  int32               absent: the write quorum
      10 ctime          int64               ms; absent unless the writer stores it, and then
                                            the znode's creation time stands in
      11 customMetadata repeated message { 1 key string, 2 value bytes }
      12 cToken         int64               random token of the creating client (v3 only)

What BookKeeper's record cannot carry is refused by ``encode`` (MetadataError): a scope
id other than 0, a ledger id from 2^63, unbounded ledgers (streams) and their terms, a
first entry id above 0 and per-fragment times. What embedlog has no field for (cToken,
whether ctime was stored, the format version, unknown fields of the record and of its
segments) rides on ``LedgerMetadata.preserved`` as a ``Preserved``, so a rewrite keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedlog._native.format import LedgerId
from embedlog.errors import MetadataError
from embedlog.meta.api import DigestType, LedgerMetadata, LedgerState
from embedlog.meta.bookkeeper import protobuf as pb
from embedlog.meta.bookkeeper import textformat as tf

HEADER = b"BookieMetadataFormatVersion\t"
VERSION_DIGITS_MAX = 10                     # as LedgerMetadataSerDe reads the header
V2, V3 = 2, 3
LEDGER_ID_LIMIT = 1 << 63                   # a Java long

# field numbers of LedgerMetadataFormat, its Segment and its cMetadataMapEntry
QUORUM_SIZE, ENSEMBLE_SIZE, LENGTH, LAST_ENTRY_ID, STATE, SEGMENT = 1, 2, 3, 4, 5, 6
DIGEST_TYPE, PASSWORD, ACK_QUORUM_SIZE, CTIME, CUSTOM_METADATA, CTOKEN = 7, 8, 9, 10, 11, 12
SEG_ENSEMBLE_MEMBER, SEG_FIRST_ENTRY_ID = 1, 2
ENTRY_KEY, ENTRY_VALUE = 1, 2

_NAMES = {QUORUM_SIZE: "quorumSize", ENSEMBLE_SIZE: "ensembleSize", LENGTH: "length",
          LAST_ENTRY_ID: "lastEntryId", STATE: "state", SEGMENT: "segment",
          DIGEST_TYPE: "digestType", PASSWORD: "password", ACK_QUORUM_SIZE: "ackQuorumSize",
          CTIME: "ctime", CUSTOM_METADATA: "customMetadata", CTOKEN: "cToken"}
_NUMBERS = {v: k for k, v in _NAMES.items()}
DIGEST_NAMES = {DigestType.CRC32: "CRC32", DigestType.MAC: "HMAC", DigestType.CRC32C: "CRC32C",
                DigestType.DUMMY: "DUMMY"}
_DIGESTS = {v: k for k, v in DIGEST_NAMES.items()}


@dataclass(frozen=True)
class Preserved:
    """What a BookKeeper record held that LedgerMetadata has no field for.

    ``unknown``: the record's unknown fields as read (tag and value bytes, in order);
    ``segment_unknown``: those of each segment, by its first entry id. Unknown fields of
    custom-metadata entries are not kept (none exist in any BookKeeper release)."""
    format_version: int = V3
    ctime_stored: bool = True
    ctoken: int | None = None
    unknown: bytes = b""
    segment_unknown: tuple[tuple[int, bytes], ...] = ()


def check_representable(md: LedgerMetadata) -> None:
    """MetadataError naming what BookKeeper's record cannot carry, if anything."""
    lid = md.ledger_id
    why = None
    if lid.scope_id != 0:
        why = (f"its id is in scope {lid.scope_id}: BookKeeper's ledger ids are 63-bit, "
               f"scope 0 only")
    elif not 0 <= lid.ledger_id < LEDGER_ID_LIMIT:
        why = "its id is not below 2^63 (a Java long)"
    elif md.unbounded or md.term:
        why = "it is unbounded (a stream, fenced by terms), which BookKeeper has no field for"
    elif md.first_entry_id or md.fragment_ctimes_ms:
        why = "it has a retention point and fragment times (a stream), which BookKeeper has no field for"
    elif not md.fragments or md.fragments[0][0] != 0:
        why = "its first fragment does not start at entry 0"
    if why:
        raise MetadataError(f"ledger {lid} cannot be stored in BookKeeper's format: {why}")


def _preserved(md: LedgerMetadata) -> Preserved:
    return md.preserved if isinstance(md.preserved, Preserved) else Preserved()


def encode(md: LedgerMetadata) -> bytes:
    """The record BookKeeper's LedgerMetadataSerDe writes for ``md`` (v3 unless ``md`` was
    read from a v2 record, which BookKeeper also rewrites as v2)."""
    check_representable(md)
    keep = _preserved(md)
    if keep.format_version == V2:
        return HEADER + b"2\n" + _encode_v2(md, keep).encode("utf-8")
    return HEADER + b"3\n" + pb.delimited(_encode_v3(md, keep))


def _encode_v3(md: LedgerMetadata, keep: Preserved) -> bytes:
    w = pb.Writer()
    w.varint(QUORUM_SIZE, md.write_quorum).varint(ENSEMBLE_SIZE, md.ensemble_size)
    w.varint(LENGTH, md.length).varint(LAST_ENTRY_ID, md.last_entry_id)
    w.varint(STATE, int(md.state))
    seg_unknown = dict(keep.segment_unknown)
    for first, bookies in md.fragments:
        s = pb.Writer()
        for b in bookies:
            s.string(SEG_ENSEMBLE_MEMBER, b)
        s.varint(SEG_FIRST_ENTRY_ID, first).raw(seg_unknown.get(first, b""))
        w.data(SEGMENT, s.getvalue())
    w.varint(DIGEST_TYPE, int(md.digest_type)).data(PASSWORD, md.password)
    w.varint(ACK_QUORUM_SIZE, md.ack_quorum)
    if keep.ctime_stored:
        w.varint(CTIME, md.ctime_ms)
    for key, value in md.custom_metadata.items():
        w.data(CUSTOM_METADATA, pb.Writer().string(ENTRY_KEY, key).data(ENTRY_VALUE, value).getvalue())
    if keep.ctoken is not None:
        w.varint(CTOKEN, keep.ctoken)
    return w.raw(keep.unknown).getvalue()


def _encode_v2(md: LedgerMetadata, keep: Preserved) -> str:
    p = tf.Printer()
    p.scalar("quorumSize", md.write_quorum).scalar("ensembleSize", md.ensemble_size)
    p.scalar("length", md.length).scalar("lastEntryId", md.last_entry_id)
    p.scalar("state", md.state.name)
    for first, bookies in md.fragments:
        p.begin("segment")
        for b in bookies:
            p.string("ensembleMember", b)
        p.scalar("firstEntryId", first).end()
    p.scalar("digestType", DIGEST_NAMES[md.digest_type]).string("password", md.password)
    p.scalar("ackQuorumSize", md.ack_quorum)
    if keep.ctime_stored:
        p.scalar("ctime", md.ctime_ms)
    for key, value in md.custom_metadata.items():
        p.begin("customMetadata").string("key", key).string("value", value).end()
    return p.getvalue()


def read_header(data: bytes) -> tuple[int, int]:
    """(format version, offset of the body); MetadataError unless BookKeeper's header."""
    if not data.startswith(HEADER):
        raise MetadataError("not BookKeeper ledger metadata: no BookieMetadataFormatVersion header")
    end = data.find(b"\n", len(HEADER), len(HEADER) + VERSION_DIGITS_MAX + 1)
    digits = data[len(HEADER):end] if end >= 0 else b""
    if not digits.isdigit():
        raise MetadataError(f"corrupted BookKeeper ledger metadata header: "
                            f"{data[:len(HEADER) + VERSION_DIGITS_MAX + 1]!r}")
    return int(digits), end + 1


def is_bookkeeper_record(data: bytes) -> bool:
    return bytes(data[:len(HEADER)]) == HEADER


def decode(data: bytes, ledger_id: LedgerId, znode_ctime_ms: int = 0) -> LedgerMetadata:
    """LedgerMetadata of a BookKeeper record; ``znode_ctime_ms`` stands in for an unstored
    ctime, as BookKeeper does. MetadataError for anything but a well-formed v2 or v3 record."""
    data = bytes(data)
    version, at = read_header(data)
    try:
        if version == V3:
            # trailing bytes after the message are ignored, as protobuf-java's
            # mergeDelimitedFrom ignores them
            message, _ = pb.read_delimited(data, at)
            values, keep = _fields_v3(message)
        elif version == V2:
            values, keep = _fields_v2(data[at:])
        else:
            raise MetadataError(f"BookKeeper ledger metadata format version {version} is not "
                                f"read (only 2 and 3; 1 is BookKeeper 4.0's)")
        return _metadata(values, keep, ledger_id, znode_ctime_ms)
    except MetadataError as exc:
        raise MetadataError(f"ledger {ledger_id}: {exc}") from None


def _fields_v3(message: bytes) -> tuple[dict, Preserved]:
    values: dict = {"segments": [], "custom": {}}
    unknown, seg_unknown = [], []
    for f in pb.parse(message):
        n = f.number
        if n == SEGMENT and f.wire_type == pb.LEN:
            members, first, extra = [], None, []
            for s in pb.parse(f.data):
                if s.number == SEG_ENSEMBLE_MEMBER and s.wire_type == pb.LEN:
                    members.append(pb.text(s.data, "an ensemble member"))
                elif s.number == SEG_FIRST_ENTRY_ID and s.wire_type == pb.VARINT:
                    first = pb.signed64(s.value)
                else:
                    extra.append(s.raw)
            if first is None:
                raise MetadataError("corrupted ledger metadata: a segment without firstEntryId")
            values["segments"].append((first, tuple(members)))
            if extra:
                seg_unknown.append((first, b"".join(extra)))
        elif n == CUSTOM_METADATA and f.wire_type == pb.LEN:
            key, value = "", b""
            for e in pb.parse(f.data):
                if e.number == ENTRY_KEY and e.wire_type == pb.LEN:
                    key = pb.text(e.data, "a custom metadata key")
                elif e.number == ENTRY_VALUE and e.wire_type == pb.LEN:
                    value = e.data
            values["custom"][key] = value
        elif n == PASSWORD and f.wire_type == pb.LEN:
            values["password"] = f.data
        elif n in (QUORUM_SIZE, ENSEMBLE_SIZE, ACK_QUORUM_SIZE) and f.wire_type == pb.VARINT:
            values[_NAMES[n]] = pb.signed32(f.value)
        elif n in (LENGTH, LAST_ENTRY_ID, CTIME, CTOKEN) and f.wire_type == pb.VARINT:
            values[_NAMES[n]] = pb.signed64(f.value)
        elif n in (STATE, DIGEST_TYPE) and f.wire_type == pb.VARINT:
            values[_NAMES[n]] = pb.signed32(f.value)
        else:
            unknown.append(f.raw)
    return values, Preserved(format_version=V3, ctime_stored="ctime" in values,
                             ctoken=values.get("cToken"), unknown=b"".join(unknown),
                             segment_unknown=tuple(seg_unknown))


def _fields_v2(body: bytes) -> tuple[dict, Preserved]:
    values: dict = {"segments": [], "custom": {}}
    enums = {"state": {s.name: int(s) for s in LedgerState},
             "digestType": {name: int(d) for d, name in DIGEST_NAMES.items()}}
    for name, value in tf.parse(body):
        if name == "segment" and isinstance(value, list):
            members = [_text(v) for k, v in value if k == "ensembleMember"]
            firsts = [v for k, v in value if k == "firstEntryId" and isinstance(v, int)]
            if not firsts or len(members) + len(firsts) != len(value):
                raise MetadataError(f"corrupted ledger metadata: a segment with unknown or "
                                    f"missing fields: {value!r:.100}")
            values["segments"].append((firsts[-1], tuple(members)))
        elif name == "customMetadata" and isinstance(value, list):
            entry = dict(value)
            values["custom"][_text(entry.get("key", b""))] = bytes(entry.get("value", b""))
        elif name == "password" and isinstance(value, bytes):
            values["password"] = value
        elif name in enums and isinstance(value, tf.Ident) and value in enums[name]:
            values[name] = enums[name][value]
        elif name in _NUMBERS and isinstance(value, int) and name not in enums:
            values[name] = value
        else:
            # protobuf-java's TextFormat.merge refuses an unknown field name too
            raise MetadataError(f"corrupted ledger metadata: unknown or mistyped field {name!r} "
                                f"in a version 2 record")
    return values, Preserved(format_version=V2, ctime_stored="ctime" in values, ctoken=None)


def _text(value) -> str:
    if not isinstance(value, bytes):
        raise MetadataError(f"corrupted ledger metadata: {value!r:.40} is not a string")
    return pb.text(value, "a string field")


def _metadata(values: dict, keep: Preserved, lid: LedgerId, znode_ctime_ms: int) -> LedgerMetadata:
    for required in ("quorumSize", "ensembleSize", "length", "state"):
        if required not in values:
            raise MetadataError(f"corrupted ledger metadata: required field {required} is missing")
    try:
        state = LedgerState(values["state"])
    except ValueError:
        raise MetadataError(f"corrupted ledger metadata: unknown state {values['state']}") from None
    digest_code = values.get("digestType", int(DigestType.CRC32))   # proto2's default: the first
    try:
        digest = DigestType(digest_code)
    except ValueError:
        raise MetadataError(f"corrupted ledger metadata: unknown digest type {digest_code}") from None
    closed = state == LedgerState.CLOSED
    return LedgerMetadata(
        ledger_id=lid, ensemble_size=values["ensembleSize"], write_quorum=values["quorumSize"],
        ack_quorum=values.get("ackQuorumSize", values["quorumSize"]), digest_type=digest,
        password=values.get("password", b""), state=state,
        last_entry_id=values.get("lastEntryId", 0 if closed else -1), length=values["length"],
        fragments=tuple(values["segments"]),
        ctime_ms=values["ctime"] if "ctime" in values else int(znode_ctime_ms),
        custom_metadata=values["custom"], preserved=keep)


def with_ctoken(md: LedgerMetadata, ctoken: int) -> LedgerMetadata:
    """``md`` carrying a creator token (a v3 record's; v2 has no field for it)."""
    keep = _preserved(md)
    if keep.format_version == V2:
        return md
    return md.with_(preserved=Preserved(keep.format_version, keep.ctime_stored, ctoken,
                                        keep.unknown, keep.segment_unknown))


def ctoken_of(md: LedgerMetadata) -> int | None:
    return _preserved(md).ctoken
