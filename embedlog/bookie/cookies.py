"""Cookies: each directory of a bookie stamped with who it belongs to.

A cookie (BookKeeper's Cookie) names the bookie id, the metadata store instance the
bookie belongs to (its INSTANCEID), the journal directory and the set of ledger
directories. It is written to ``<ledger dir>/current/VERSION`` and
``<journal dir>/VERSION`` and to the metadata store (``cookies/<bookie id>``).
At start-up every configured directory's cookie must agree with the store's, so a
bookie never starts on:

- a **missing** directory: one its cookie lists is not configured, or has lost its
  cookie (a wiped or swapped disk): its ledgers would silently be gone;
- an **extra** directory: a configured one the cookie does not list (allowed, if empty,
  with ``allow_storage_expansion``);
- a **foreign** directory: stamped by another bookie;
- **another metadata store**: whose garbage collection would see every ledger of this
  bookie as deleted and collect them all.

Format (UTF-8)::

    cookie := "embedlog-cookie\\t1\\n" json     # json keys: bookie_id, instance_id,
                                               # metadata_uri, journal_dir, ledger_dirs

``metadata_uri`` is only informative (the same store may be reached by other names);
``instance_id`` decides. Directories inside the bookie's own directory are recorded
relative to it (``.``, ``journal``), so a bookie directory copied or moved whole (a backup,
a test fixture) still opens; others are absolute.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from embedlog.fileio import atomic_write, private_dir
from embedlog.errors import BadVersionError, CorruptedDataError, InvalidCookieError, MetadataError

MAGIC = b"embedlog-cookie\t"
VERSION = 1
FILE = "VERSION"


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    instance_id: str | None
    journal_dir: str
    ledger_dirs: tuple[str, ...]
    metadata_uri: str | None = None

    def to_bytes(self) -> bytes:
        body = {"bookie_id": self.bookie_id, "instance_id": self.instance_id,
                "metadata_uri": self.metadata_uri, "journal_dir": self.journal_dir,
                "ledger_dirs": list(self.ledger_dirs)}
        return MAGIC + str(VERSION).encode() + b"\n" + json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "Cookie":
        if not data.startswith(MAGIC):
            raise CorruptedDataError(f"{where} is not an embedlog cookie")
        header, _, body = data[len(MAGIC):].partition(b"\n")
        try:
            version = int(header)
        except ValueError:
            raise CorruptedDataError(f"{where}: bad cookie header {header[:20]!r}") from None
        if version != VERSION:
            raise CorruptedDataError(f"{where}: unknown cookie version {version}")
        try:
            d = json.loads(body)
            if not all(v is None or isinstance(v, str) for v in (d["instance_id"], d.get("metadata_uri"))):
                raise TypeError("instance_id and metadata_uri are strings or null")
            return cls(str(d["bookie_id"]), d["instance_id"], str(d["journal_dir"]),
                       tuple(str(p) for p in d["ledger_dirs"]), d.get("metadata_uri"))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CorruptedDataError(f"{where}: damaged cookie ({exc})") from None

    def same_dirs(self, other: "Cookie") -> bool:
        return (self.journal_dir == other.journal_dir
                and sorted(self.ledger_dirs) == sorted(other.ledger_dirs))


def cookie_path(directory: str, journal: bool) -> str:
    return os.path.join(directory, FILE) if journal else os.path.join(directory, "current", FILE)


def read_dir_cookie(directory: str, journal: bool) -> Cookie | None:
    path = cookie_path(directory, journal)
    try:
        data = open(path, "rb").read()
    except FileNotFoundError:
        return None
    return Cookie.from_bytes(data, path)


def write_dir_cookie(directory: str, journal: bool, cookie: Cookie) -> None:
    path = cookie_path(directory, journal)
    private_dir(os.path.dirname(path))
    atomic_write(path, cookie.to_bytes())


def _has_data(directory: str, journal: bool) -> bool:
    """Does a directory hold bookie data (journals, entry logs, indexes)?"""
    if journal:
        try:
            return any(n.endswith(".txn") for n in os.listdir(directory))
        except FileNotFoundError:
            return False
    cur = os.path.join(directory, "current")
    try:
        names = os.listdir(cur)
    except FileNotFoundError:
        return False
    return any(n.endswith(".log") or n in ("ledgers", "ledgers-scoped", "lastMark") for n in names)


def _where(instance_id, uri) -> str:
    return f"instance {instance_id}" + (f" ({uri})" if uri else "")


def _foreign_store(d: str, c: Cookie, instance: str, uri: str | None, home: str | None) -> str:
    """Why a directory stamped for another metadata store is refused, and what to do."""
    said = (f"directory {d} belongs to metadata store {_where(c.instance_id, c.metadata_uri)}, "
            f"but this bookie was started against {_where(instance, uri)}; its garbage "
            f"collection would see every ledger as deleted. ")
    elsewhere = (f"Start it with --metadata {c.metadata_uri} (metadata_uri= for embedlog.open) "
                 f"if that store still exists; if" if c.metadata_uri and c.metadata_uri != uri
                 else "If")
    where = home or d
    return (said + f"{elsewhere} that store was lost or replaced (a missing store is made "
            f"anew, empty), restore its backup (instance {c.instance_id}) to "
            f"{c.metadata_uri or 'its URI'}, over the new one. Without a backup the ledgers' "
            f"metadata is gone but their entries are still in these files: `embedlog shell "
            f"listledgers --dir {where}` lists them and `embedlog shell readlog --dir {where} "
            f"LOG --ledger ID` prints them. To use the directory for a new store, move its "
            f"data away first.")


def cookie_form(home: str | None, path: str) -> str:
    """How a directory is named in a cookie: relative to the bookie's directory if inside it."""
    if home is None:
        return path
    rel = os.path.relpath(path, home)
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel


def check_and_stamp(bookie_id: str, ledger_dirs: list[str], journal_dir: str, metadata=None,
                    allow_storage_expansion: bool = False, home: str | None = None) -> Cookie:
    """Compare every directory's cookie and the metadata store's with the configuration;
    stamp a new bookie's directories. Raises InvalidCookieError saying what is wrong and
    how to fix it; returns the cookie in force. ``home``: the bookie's own directory."""
    instance = getattr(metadata, "instance_id", None) if metadata is not None else None
    uri = getattr(metadata, "uri", None) if metadata is not None else None
    dirs = [(journal_dir, True)] + [(d, False) for d in ledger_dirs]
    found = {d: read_dir_cookie(d, j) for d, j in dirs}
    stored = None
    stored_version = None
    if metadata is not None:
        try:
            v = metadata.cookies.read_cookie(bookie_id)
        except MetadataError as exc:
            raise MetadataError(f"cannot read the cookie of bookie {bookie_id}: {exc}") from exc
        if v is not None:
            stored = Cookie.from_bytes(bytes(v.value), f"the metadata store's cookie of {bookie_id}")
            stored_version = v.version

    # foreign directories: another bookie's, or another metadata store's
    for (d, j), c in zip(dirs, found.values()):
        if c is None:
            continue
        if c.bookie_id != bookie_id:
            raise InvalidCookieError(
                f"directory {d} belongs to bookie {c.bookie_id}, not to {bookie_id} (its cookie "
                f"{cookie_path(d, j)} says so). Configure this bookie with its own directories, "
                f"or start bookie {c.bookie_id} on it.")
        if instance is not None and c.instance_id is not None and c.instance_id != instance:
            raise InvalidCookieError(_foreign_store(d, c, instance, uri, home))
    if stored is not None and stored.bookie_id != bookie_id:
        raise InvalidCookieError(f"the metadata store's cookie for {bookie_id} names {stored.bookie_id}")

    real = dict(zip([cookie_form(home, d) for d in ledger_dirs], ledger_dirs))
    real[cookie_form(home, journal_dir)] = journal_dir
    journal_dir = cookie_form(home, journal_dir)
    ledger_dirs = [cookie_form(home, d) for d in ledger_dirs]
    dirs = [(real[d], j) for d, j in [(journal_dir, True)] + [(d, False) for d in ledger_dirs]]
    master = Cookie(bookie_id, instance, journal_dir, tuple(ledger_dirs), uri)
    reference = stored or next((c for c in found.values() if c is not None), None)
    if reference is None:
        # a new bookie (or one from before cookies, adopted as it is)
        _stamp(master, dirs, metadata, None, create=True)
        return master

    if stored is None and instance is not None and reference.instance_id == instance and \
            any(_has_data(d, j) for d, j in dirs):
        # the directories were stamped for this store and hold data, but the store has no
        # cookie: the bookie was decommissioned (its cookie deleted). A crash between the
        # stamps of a new bookie leaves no data. BookKeeper's bookie refuses this start too
        raise InvalidCookieError(
            f"bookie {bookie_id}'s cookie is not in the metadata store {uri or instance}, though "
            f"its directories hold its data and were stamped for that store: the bookie was "
            f"decommissioned (`embedlog bookie decommission`, BookKeeper's decommissionbookie or "
            f"cookie_delete). A decommissioned bookie stays out: start a new one on empty "
            f"directories. To bring this one back with its data, write its cookie again: "
            f"`embedlog cookie create {bookie_id} --dir {home or real[journal_dir]} "
            f"--metadata URI`.")
    if reference.journal_dir != journal_dir:
        raise InvalidCookieError(
            f"bookie {bookie_id} keeps its journal in {reference.journal_dir} (cookie), but was "
            f"started with journal directory {journal_dir}. Configure journal_directory="
            f"{reference.journal_dir}, or move the journal directory there.")
    missing = [d for d in reference.ledger_dirs if d not in ledger_dirs]
    if missing:
        raise InvalidCookieError(
            f"ledger directories {', '.join(missing)} of bookie {bookie_id} are missing from its "
            f"configuration (its cookie lists {', '.join(reference.ledger_dirs)}); their ledgers "
            f"would be lost. Add them back to ledger_directories.")
    for (d, j), c in zip(dirs, found.values()):
        listed = j or cookie_form(home, d) in reference.ledger_dirs
        if c is None and listed:
            raise InvalidCookieError(
                f"directory {d} of bookie {bookie_id} has lost its cookie "
                f"({cookie_path(d, j)}): it was wiped or replaced, and the ledgers it held are "
                f"gone. Restore it; or, to give up this bookie's data, remove the bookie's cookie "
                f"from the metadata store and start with fresh directories under a new bookie id.")
        if c is not None and not c.same_dirs(reference) and listed:
            raise InvalidCookieError(
                f"the cookie in {cookie_path(d, j)} lists directories {c.ledger_dirs} "
                f"(journal {c.journal_dir}) but bookie {bookie_id}'s cookie lists "
                f"{reference.ledger_dirs} (journal {reference.journal_dir}). Restore the "
                f"matching directories.")
    extra = [d for d in ledger_dirs if d not in reference.ledger_dirs]
    if extra:
        if not allow_storage_expansion:
            raise InvalidCookieError(
                f"ledger directories {', '.join(extra)} are not in bookie {bookie_id}'s cookie "
                f"(it lists {', '.join(reference.ledger_dirs)}). Remove them from "
                f"ledger_directories, or set allow_storage_expansion=true to add them (they "
                f"must be empty).")
        for d in extra:
            if found.get(real[d]) is not None or _has_data(real[d], False):
                raise InvalidCookieError(
                    f"directory {d} is not empty: only empty directories can be added to "
                    f"bookie {bookie_id} (allow_storage_expansion)")
        _stamp(master, dirs, metadata, stored_version, create=stored is None)
        return master
    if instance is not None and (stored is None or any(c.instance_id is None for c in found.values())):
        # stamped before the store was known, or a crash between stamping the directories
        # and the store: the instances agree (checked above), record it everywhere
        _stamp(master, dirs, metadata, stored_version, create=stored is None)
        return master
    return reference


def _stamp(cookie: Cookie, dirs, metadata, version, create: bool) -> None:
    """Directories first, then the store: a crash in between leaves stamped directories and
    no cookie in the store, which the next start completes. (The other order would leave a
    cookie in the store and none in the directories: a wiped bookie, refused.)"""
    for d, j in dirs:
        write_dir_cookie(d, j, cookie)
    if metadata is None or cookie.instance_id is None:
        return
    try:
        metadata.cookies.write_cookie(cookie.bookie_id, cookie.to_bytes(), None if create else version)
    except BadVersionError as exc:
        raise InvalidCookieError(
            f"the cookie of bookie {cookie.bookie_id} in the metadata store changed while this "
            f"bookie started (another bookie with the same id?)") from exc
