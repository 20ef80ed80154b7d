"""Protocol Buffers' text format: the subset BookKeeper writes (cookies, ledger metadata v2).

protobuf-java's ``TextFormat`` prints a message as below, and BookKeeper stores that text
in ZooKeeper for its cookies and for version-2 ledger metadata. Grammar of what is read::

    message = field*
    field   = name ":" scalar
            | name [":"] ( "{" message "}" | "<" message ">" )
    scalar  = string+ (adjacent strings join) | integer (decimal, 0x hex or 0 octal, signed)
            | identifier (an enum value, true, false)
    string  = '"' ... '"' | "'" ... "'", with C escapes: \\a \\b \\f \\n \\r \\t \\v \\\\ \\' \\"
              \\ooo (octal) \\xHH (hex)
    "#" starts a comment to the end of the line; whitespace separates tokens

``parse`` returns ``[(name, value)]`` in text order: a string is ``bytes``, an integer
``int``, an identifier ``Ident``, a message a nested list. ``Printer`` writes what
protobuf-java 3.x writes: ``name: value`` lines, messages as ``name {`` ... ``}`` with two
spaces of indent per level, strings escaped byte by byte (printable ASCII as itself, the
named escapes, anything else as three octal digits).
"""

from __future__ import annotations

import re

from embedlog.errors import MetadataError

NESTING_MAX = 16          # BookKeeper's messages nest two deep: a bound for hostile input


class Ident(str):
    """An identifier value (an enum name, true or false), as opposed to a quoted string."""


_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|[0-9]+))(?![\w.])
  | (?P<ident>[-]?[A-Za-z_][\w.]*)
  | (?P<punct>[:{}<>])
""", re.VERBOSE)

_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11,
            "\\": 92, "'": 39, '"': 34, "?": 63}


def _unescape(body: str, where: int) -> bytes:
    out, i = bytearray(), 0
    raw = body.encode("utf-8")
    while i < len(raw):
        c = raw[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        nxt = chr(raw[i + 1]) if i + 1 < len(raw) else ""
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "01234567" and nxt:
            octal = re.match(rb"[0-7]{1,3}", raw[i + 1:i + 4])
            assert octal is not None          # nxt is an octal digit
            out.append(int(octal.group(), 8) & 0xFF)
            i += 1 + len(octal.group())
        elif nxt in "xX" and nxt:
            m = re.match(rb"[0-9a-fA-F]{1,2}", raw[i + 2:i + 4])
            if not m:
                raise MetadataError(f"malformed protobuf text at {where}: \\x without hex digits")
            out.append(int(m.group(), 16))
            i += 2 + len(m.group())
        else:
            raise MetadataError(f"malformed protobuf text at {where}: unknown escape \\{nxt}")
    return bytes(out)


def _tokens(text: str):
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise MetadataError(f"malformed protobuf text at character {pos}: {text[pos:pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "space":
            yield kind, m.group(kind), m.start()
    yield "end", "", pos


def parse(text: str | bytes) -> list:
    """[(name, value)] of a message in text format; MetadataError when malformed."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise MetadataError("malformed protobuf text: not UTF-8") from None
    tokens = list(_tokens(text))
    fields, pos = _message(tokens, 0, None, 0)
    return fields


def _message(tokens, pos: int, close: str | None, depth: int):
    if depth > NESTING_MAX:
        raise MetadataError(f"malformed protobuf text: nested deeper than {NESTING_MAX}")
    fields: list = []
    while True:
        kind, value, at = tokens[pos]
        if kind == "end" or (kind == "punct" and value in "}>"):
            if (kind == "end") != (close is None) or (close and value != close):
                raise MetadataError(f"malformed protobuf text at character {at}: unbalanced "
                                    f"{value or 'end of text'!r}")
            return fields, pos + 1
        if kind != "ident":
            raise MetadataError(f"malformed protobuf text at character {at}: expected a field "
                                f"name, found {value!r}")
        name, pos = value, pos + 1
        kind, value, at = tokens[pos]
        colon = kind == "punct" and value == ":"
        if colon:
            pos += 1
            kind, value, at = tokens[pos]
        if kind == "punct" and value in "{<":
            nested, pos = _message(tokens, pos + 1, "}" if value == "{" else ">", depth + 1)
            fields.append((name, nested))
            continue
        if not colon:
            raise MetadataError(f"malformed protobuf text at character {at}: expected ':' after {name}")
        if kind == "string":
            parts = []
            while kind == "string":
                parts.append(_unescape(value[1:-1], at))
                pos += 1
                kind, value, at = tokens[pos]
            fields.append((name, b"".join(parts)))
        elif kind == "number":
            fields.append((name, _integer(value, at)))
            pos += 1
        elif kind == "ident":
            fields.append((name, Ident(value)))
            pos += 1
        else:
            raise MetadataError(f"malformed protobuf text at character {at}: no value for {name}")


def _integer(token: str, at: int) -> int:
    sign = -1 if token.startswith("-") else 1
    digits = token.lstrip("+-")
    try:
        if digits[:2] in ("0x", "0X"):
            return sign * int(digits[2:], 16)
        if len(digits) > 1 and digits[0] == "0":
            return sign * int(digits[1:], 8)
        return sign * int(digits)
    except ValueError:
        raise MetadataError(f"malformed protobuf text at character {at}: bad integer {token!r}") from None


def escape(data: bytes) -> str:
    """protobuf-java's TextFormat.escapeBytes."""
    out = []
    for b in bytes(data):
        if b in _NAMED:
            out.append(_NAMED[b])
        elif 0x20 <= b <= 0x7E:
            out.append(chr(b))
        else:
            out.append(f"\\{b >> 6 & 3}{b >> 3 & 7}{b & 7}")
    return "".join(out)


_NAMED = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v",
          92: "\\\\", 39: "\\'", 34: '\\"'}


class Printer:
    """Writes fields as protobuf-java's TextFormat printer does."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._indent = ""

    def scalar(self, name: str, value: int | str) -> "Printer":
        """An integer, or an enum value's name."""
        self._lines.append(f"{self._indent}{name}: {value}\n")
        return self

    def string(self, name: str, value: bytes | str) -> "Printer":
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        self._lines.append(f'{self._indent}{name}: "{escape(data)}"\n')
        return self

    def begin(self, name: str) -> "Printer":
        self._lines.append(f"{self._indent}{name} {{\n")
        self._indent += "  "
        return self

    def end(self) -> "Printer":
        self._indent = self._indent[:-2]
        self._lines.append(f"{self._indent}}}\n")
        return self

    def getvalue(self) -> str:
        return "".join(self._lines)
