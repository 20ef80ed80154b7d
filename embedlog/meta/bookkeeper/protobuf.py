"""Protocol Buffers' binary wire format: the little of it BookKeeper's metadata needs.

A reader that keeps every field it does not know, byte for byte, so a record that a
newer BookKeeper wrote with more fields can be rewritten without losing them (the Java
classes BookKeeper uses keep them the same way). Grammar
(https://protobuf.dev/programming-guides/encoding/)::

    message = field*
    field   = tag value
    tag     = varint: field_number << 3 | wire_type       field_number in 1 .. 2^29 - 1
    value   = wire type 0 (VARINT): varint                at most 10 bytes, below 2^64
            | wire type 1 (I64):    8 bytes little-endian
            | wire type 2 (LEN):    varint length, then that many bytes
            | wire type 5 (I32):    4 bytes little-endian
    (wire types 3 and 4, groups, are refused: no BookKeeper message has them)

Signed int32 and int64 fields are two's complement in a varint, so -1 takes ten bytes;
protobuf-java writes a negative int32 sign-extended to 64 bits and reads back its low 32.
protobuf-java writes known fields in field-number order and the unknown ones after them;
``Writer`` callers do the same to reproduce its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedlog.errors import MetadataError

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_FIXED = {I64: 8, I32: 4}
VARINT_BYTES_MAX = 10
FIELD_NUMBER_MAX = (1 << 29) - 1
U64 = 1 << 64


@dataclass(frozen=True)
class Field:
    """One field as read: ``value`` is the unsigned varint or fixed value (0 for LEN), ``data``
    the bytes of a LEN field (empty otherwise); ``raw`` is the tag and value exactly as
    they were on the wire."""
    number: int
    wire_type: int
    value: int
    data: bytes
    raw: bytes


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); MetadataError if cut short or longer than 10 bytes."""
    value = shift = 0
    for i in range(VARINT_BYTES_MAX):
        if pos + i >= len(data):
            raise MetadataError(f"malformed protobuf: varint cut short at byte {pos + i}")
        b = data[pos + i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if value >= U64:
                raise MetadataError(f"malformed protobuf: varint at byte {pos} exceeds 64 bits")
            return value, pos + i + 1
        shift += 7
    raise MetadataError(f"malformed protobuf: varint at byte {pos} longer than 10 bytes")


def encode_varint(value: int) -> bytes:
    """A varint of ``value``; a negative value is written as its 64-bit two's complement."""
    if value < 0:
        value += U64
    if not 0 <= value < U64:
        raise MetadataError(f"protobuf varint out of range: {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def signed64(value: int) -> int:
    return value - U64 if value >= 1 << 63 else value


def signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def parse(data: bytes) -> list[Field]:
    """Every field of one message, in wire order; MetadataError on malformed input."""
    data = bytes(data)
    fields, pos = [], 0
    while pos < len(data):
        start = pos
        tag, pos = read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if not 1 <= number <= FIELD_NUMBER_MAX:
            raise MetadataError(f"malformed protobuf: field number {number} at byte {start}")
        value, body = 0, b""
        if wire_type == VARINT:
            value, pos = read_varint(data, pos)
        elif wire_type == LEN:
            size, pos = read_varint(data, pos)
            if size > len(data) - pos:
                raise MetadataError(f"malformed protobuf: field {number} at byte {start} claims "
                                    f"{size} bytes, {len(data) - pos} remain")
            body, pos = data[pos:pos + size], pos + size
        elif wire_type in _FIXED:
            width = _FIXED[wire_type]
            if width > len(data) - pos:
                raise MetadataError(f"malformed protobuf: field {number} at byte {start} cut short")
            value, pos = int.from_bytes(data[pos:pos + width], "little"), pos + width
        else:
            raise MetadataError(f"malformed protobuf: wire type {wire_type} (field {number}) "
                                f"at byte {start}")
        fields.append(Field(number, wire_type, value, body, data[start:pos]))
    return fields


def tag(number: int, wire_type: int) -> bytes:
    return encode_varint(number << 3 | wire_type)


class Writer:
    """Builds one message; the caller writes fields in the order protobuf-java would."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def varint(self, number: int, value: int) -> "Writer":
        """int32, int64, enum or bool; negative values sign-extended to 64 bits."""
        self._parts += (tag(number, VARINT), encode_varint(int(value)))
        return self

    def data(self, number: int, value: bytes) -> "Writer":
        """A bytes, string or embedded-message field."""
        value = bytes(value)
        self._parts += (tag(number, LEN), encode_varint(len(value)), value)
        return self

    def string(self, number: int, text: str) -> "Writer":
        return self.data(number, text.encode("utf-8"))

    def raw(self, data: bytes) -> "Writer":
        """Fields already encoded (unknown fields kept from a read)."""
        self._parts.append(bytes(data))
        return self

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


def delimited(message: bytes) -> bytes:
    """protobuf-java's writeDelimitedTo: a varint length, then the message."""
    return encode_varint(len(message)) + message


def read_delimited(data: bytes, pos: int = 0) -> tuple[bytes, int]:
    """(message, position after it) of a varint-length-prefixed message."""
    size, pos = read_varint(data, pos)
    if size > len(data) - pos:
        raise MetadataError(f"malformed protobuf: delimited message claims {size} bytes, "
                            f"{len(data) - pos} remain")
    return data[pos:pos + size], pos + size


def text(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise MetadataError(f"malformed protobuf: {what} is not UTF-8") from None
