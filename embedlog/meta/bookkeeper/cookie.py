"""BookKeeper's bookie cookie (bookie/Cookie.java), as stored at ``ROOT/cookies/<bookie id>``
and in each of a Java bookie's directories as ``current/VERSION``.

A cookie ties a bookie id to its directories and to the cluster's instance id, so a
bookie restarted with a missing directory, or pointed at another cluster, refuses to
start. Grammar::

    cookie    = layout_version "\\n" body
    body (layout_version >= 4, BookKeeper writes 5) = CookieFormat in protobuf text format:
        bookieHost string (required)     the bookie id
        journalDir string (required)     as configured (several: count "\\t" dir "\\t" dir ...)
        ledgerDirs string (required)     count "\\t" dir ["\\t" dir]...
        instanceId string                the cluster's INSTANCEID
        indexDirs  string                like ledgerDirs, when configured apart
    body (layout_version 3) = bookie id "\\n" journal dirs "\\n" ledger dirs "\\n"
"""

from __future__ import annotations

from dataclasses import dataclass

from embedlog.errors import MetadataError
from embedlog.meta.bookkeeper import textformat as tf

COOKIE_LAYOUT_VERSION = 5
_FIELDS = ("bookieHost", "journalDir", "ledgerDirs", "instanceId", "indexDirs")


def encode_dirs(dirs: list[str]) -> str:
    """Cookie.encodeDirPaths: the count, then each directory, tab separated."""
    return "\t".join([str(len(dirs))] + [str(d) for d in dirs])


def decode_dirs(text: str) -> list[str]:
    parts = text.split("\t")
    if not parts[0].isdigit() or int(parts[0]) != len(parts) - 1:
        return [text]                    # journalDir is often stored as one plain path
    return parts[1:]


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    journal_dirs: str
    ledger_dirs: str
    instance_id: str | None = None
    index_dirs: str | None = None
    layout_version: int = COOKIE_LAYOUT_VERSION

    def to_bytes(self) -> bytes:
        if self.layout_version <= 3:
            return (f"3\n{self.bookie_id}\n{self.journal_dirs}\n"
                    f"{self.ledger_dirs}\n").encode("utf-8")
        p = tf.Printer().string("bookieHost", self.bookie_id).string("journalDir", self.journal_dirs)
        p.string("ledgerDirs", self.ledger_dirs)
        if self.instance_id is not None:
            p.string("instanceId", self.instance_id)
        if self.index_dirs is not None:
            p.string("indexDirs", self.index_dirs)
        return f"{COOKIE_LAYOUT_VERSION}\n{p.getvalue()}".encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> "Cookie":
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise MetadataError("corrupted BookKeeper cookie: not UTF-8") from None
        first, _, body = text.partition("\n")
        if not first.strip().isdigit():
            raise MetadataError(f"corrupted BookKeeper cookie: no layout version in {first[:40]!r}")
        version = int(first.strip())
        if version == 3:
            lines = body.split("\n")
            if len(lines) < 3:
                raise MetadataError("corrupted BookKeeper cookie: version 3 needs three lines")
            return cls(lines[0], lines[1], lines[2], layout_version=3)
        if version < 3:
            raise MetadataError(f"BookKeeper cookie layout version {version} is not read (3 and up)")
        fields: dict = {}
        for name, value in tf.parse(body):
            if name not in _FIELDS or not isinstance(value, bytes):
                raise MetadataError(f"corrupted BookKeeper cookie: unknown field {name!r}")
            fields[name] = value.decode("utf-8", "replace")
        missing = [f for f in _FIELDS[:3] if f not in fields]
        if missing:
            raise MetadataError(f"corrupted BookKeeper cookie: {', '.join(missing)} missing")
        return cls(fields["bookieHost"], fields["journalDir"], fields["ledgerDirs"],
                   fields.get("instanceId") or None, fields.get("indexDirs") or None, version)
