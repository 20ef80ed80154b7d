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

An embedlog bookie on a BookKeeper root keeps its cookie at ``cookies/<id>`` in this
format too, so that BookKeeper's cookie tools read it (BookieShell ``cookie_get``):
``from_embedlog`` and ``to_embedlog`` translate embedlog's cookie record (bookie/cookies.py:
``"embedlog-cookie\\t1\\n"`` JSON with bookie_id, instance_id, metadata_uri, journal_dir,
ledger_dirs) field by field. metadata_uri, only informative, has no field and is dropped.
"""

from __future__ import annotations

import json
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


EMBEDLOG_COOKIE_MAGIC = b"embedlog-cookie\t1\n"     # bookie/cookies.py's record, version 1


def from_embedlog(data: bytes) -> bytes | None:
    """BookKeeper's cookie for embedlog's cookie record ``data``; None when ``data`` is not
    one (another record kept among cookies, such as the auditor lease: stored as given)."""
    data = bytes(data)
    if not data.startswith(EMBEDLOG_COOKIE_MAGIC):
        return None
    try:
        d = json.loads(data[len(EMBEDLOG_COOKIE_MAGIC):])
        return Cookie(str(d["bookie_id"]), str(d["journal_dir"]),
                      encode_dirs([str(p) for p in d["ledger_dirs"]]),
                      d["instance_id"]).to_bytes()
    except (ValueError, KeyError, TypeError) as exc:
        raise MetadataError(f"damaged embedlog cookie record ({exc})") from None


def to_embedlog(data: bytes) -> bytes:
    """embedlog's cookie record for a BookKeeper cookie; other bytes as they are."""
    data = bytes(data)
    if data.startswith(EMBEDLOG_COOKIE_MAGIC) or not data[:1].isdigit():
        return data
    c = Cookie.from_bytes(data)
    journal = decode_dirs(c.journal_dirs)
    body = {"bookie_id": c.bookie_id, "instance_id": c.instance_id, "metadata_uri": None,
            "journal_dir": journal[0] if len(journal) == 1 else c.journal_dirs,
            "ledger_dirs": decode_dirs(c.ledger_dirs)}
    return EMBEDLOG_COOKIE_MAGIC + json.dumps(body, sort_keys=True).encode()
