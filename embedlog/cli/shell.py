"""`embedlog shell`: look inside a bookie's files (BookKeeper's bookie shell).

Every command reads files only (journal, entry logs, index files, lastMark, cookies), so
it works on a stopped bookie and on a running one without taking its lock; on a
running bookie the index files show the last checkpoint. Output is for people by
default and JSON with ``--json``. A ledger is named by its id, with
``--ledger-scope-id`` for scope != 0, or by ``--ledger-qualified-name`` (32 hex digits).

Directories: ``--dir`` is the bookie's directory; its ledger and journal directories
come from its cookie (``current/VERSION`` or ``journal/VERSION``), or from
``--ledger-dir`` / ``--journal-dir``.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
import sys

import click

from embedlog._native import entrylog as nel
from embedlog._native import index as nix
from embedlog._native import journal_format as jformat, journal_scan as jscan
from embedlog._native.format import LedgerId, crc32c, decode_entry, mac_key, parse_entry_header
from embedlog.bookie.cookies import read_dir_cookie
from embedlog.bookie.files import list_files
from embedlog.bookie.journal_files import journal_ids, read_segment
from embedlog.bookie.scrub import damaged_records, journal_cuts, segments_held, unindexed_entries
from embedlog.cli.common import EmbedlogGroup, console, json_option, make_table
from embedlog.errors import (ConfigError, CorruptedDataError, EmbedlogError, IllegalOpError,
                             NoSuchLedgerError)
from embedlog.meta import open_metadata_store

# -- where things are -----------------------------------------------------------------------


class Layout:
    def __init__(self, home: str, ledger_dirs: list[str], journal_dir: str, metadata_uri: str | None):
        self.home = home
        self.ledger_dirs = ledger_dirs
        self.journal_dir = journal_dir
        self.metadata_uri = metadata_uri

    @property
    def currents(self) -> list[str]:
        return [os.path.join(d, "current") for d in self.ledger_dirs]


def _layout(directory, ledger_dirs, journal_dir, metadata_uri) -> Layout:
    home = os.path.abspath(directory)
    if not os.path.isdir(home):
        raise ConfigError(f"--dir {home} is not a directory")
    cookie = None
    if not ledger_dirs or not journal_dir:
        for where, journal in ((home, False), (os.path.join(home, "journal"), True),
                               (journal_dir, True)):
            if where and cookie is None:
                try:
                    cookie = read_dir_cookie(where, journal)
                except EmbedlogError:
                    cookie = None

    def resolve(p):
        return p if os.path.isabs(p) else os.path.normpath(os.path.join(home, p))

    lds = [os.path.abspath(p) for p in ledger_dirs] or (
        [resolve(p) for p in cookie.ledger_dirs] if cookie else [home])
    jd = os.path.abspath(journal_dir) if journal_dir else (
        resolve(cookie.journal_dir) if cookie else os.path.join(home, "journal"))
    uri = metadata_uri or (cookie.metadata_uri if cookie else None)
    if not uri and os.path.exists(os.path.join(home, "meta.db")):
        uri = "sqlite://" + os.path.join(home, "meta.db")
    layout = Layout(home, lds, jd, uri)
    if cookie is None and not os.path.isdir(jd) and not any(os.path.isdir(c) for c in layout.currents):
        # no cookie, no journal, no current/: whatever this is, it is not a bookie's
        raise ConfigError(f"--dir {home} is not a bookie directory (no cookie, no journal/, no "
                          f"current/); name the bookie's directory, or --ledger-dir and --journal-dir")
    return layout


def _ledger_key(ledger_id, scope_id, qualified_name):
    if qualified_name:
        if ledger_id is not None or scope_id:
            raise click.UsageError("give a ledger id or --ledger-qualified-name, not both")
        try:
            lid = LedgerId.parse(qualified_name)
        except (ValueError, EmbedlogError) as exc:
            raise click.UsageError(f"bad --ledger-qualified-name {qualified_name!r}: {exc}") from None
        return lid.scope_id, lid.ledger_id
    if ledger_id is None:
        return None
    if ledger_id < 0 or ledger_id >= 1 << 64 or scope_id < 0 or scope_id >= 1 << 64:
        raise click.UsageError("ledger and scope ids are unsigned 64-bit numbers")
    return scope_id, ledger_id


def _name(key) -> dict:
    return {"ledger_scope_id": key[0], "ledger_id": key[1],
            "qualified_name": LedgerId(*key).qualified_name}


def _short(key) -> str:
    return str(key[1]) if key[0] == 0 else f"{key[0]}:{key[1]}"


def _index_file(layout: Layout, key):
    for current in layout.currents:
        path = nix.index_path(current, key[0], key[1])
        if os.path.exists(path):
            return current, path
    return None, None


def _open_index(layout: Layout, key):
    current, _ = _index_file(layout, key)
    if current is None:
        return None
    return nix.IndexCache(current, 1 << 20).open(key[0], key[1], True, current)


def _segment_paths(layout: Layout) -> dict:
    """Layout 2's journal segments: location id (bit 31 | segment number) -> file."""
    out = {}
    for suffix in (".txn", ".seg"):
        for i in journal_ids(layout.journal_dir, suffix):
            path = os.path.join(layout.journal_dir, "%x%s" % (i, suffix))
            segment = read_segment(path)
            if segment:
                out[segment | 0x80000000] = path
    return out


def _log_paths(layout: Layout) -> dict:
    out = {}
    for current in layout.currents:
        try:
            names = os.listdir(current)
        except FileNotFoundError:
            continue
        for n in names:
            if n.endswith(".log"):
                try:
                    out[int(n[:-4], 16)] = os.path.join(current, n)
                except ValueError:
                    pass
    return out


def _open_log(layout: Layout, which: str):
    if os.path.sep in which or which.endswith(".log"):
        path = os.path.abspath(which)
        log_id = int(os.path.basename(path).split(".")[0], 16)
    else:
        try:
            log_id = int(which, 16)
        except ValueError:
            raise click.UsageError(f"an entry log is named by its hex id or its path, got {which!r}") from None
        path = _log_paths(layout).get(log_id)
        if path is None:
            raise IllegalOpError(f"no entry log {which} in {', '.join(layout.currents)}")
    if not os.path.isfile(path):
        raise IllegalOpError(f"no entry log {path}")
    return nel.MappedLog.open_existing(path, log_id)


def _journal_paths(layout: Layout) -> dict:
    try:
        return {i: os.path.join(layout.journal_dir, "%x.txn" % i) for i in journal_ids(layout.journal_dir)}
    except FileNotFoundError:
        return {}


# -- output ----------------------------------------------------------------------------------


def _emit(as_json: bool, obj, human) -> None:
    """JSON, or what ``human(obj)`` yields: lines, and rich tables (made by _table)."""
    if as_json:
        click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))
        return
    out = None
    for item in human(obj):
        if isinstance(item, str):
            click.echo(item)
        else:
            out = out or console()
            out.print(item)


_NUMERIC = {"offset", "bytes", "on disk", "entry", "entry/value"}


def _table(rows: list[list], header: list[str]):
    """One rich table (yielded by the human() generators; numbers right-aligned)."""
    if rows:
        yield make_table(header, rows, right=tuple(h for h in header if h in _NUMERIC))


def _common(f):
    f = json_option(f)
    f = click.option("--metadata", "metadata_uri", default=None,
                     help="Metadata service URI (default: the cookie's, or DIR/meta.db).")(f)
    f = click.option("--journal-dir", default=None, type=click.Path(file_okay=False),
                     help="The journal directory (default: from the cookie).")(f)
    f = click.option("--ledger-dir", "ledger_dirs", multiple=True, type=click.Path(file_okay=False),
                     help="A ledger directory (repeat; default: from the cookie).")(f)
    f = click.option("--dir", "directory", default=".", show_default=True,
                     type=click.Path(file_okay=False), help="The bookie's directory.")(f)
    return f


def _ledger_options(required: bool):
    def deco(f):
        f = click.option("--ledger-qualified-name", "qualified_name", default=None,
                         help="The ledger's 128-bit id as 32 hex digits.")(f)
        f = click.option("--ledger-scope-id", "scope_id", type=int, default=0, show_default=True,
                         help="The ledger's scope id (the high 64 bits).")(f)
        f = click.argument("ledger_id", type=int, required=False)(f)
        return f
    return deco


@click.group(cls=EmbedlogGroup)
def shell():
    """Inspect a stopped or running bookie's files (journal, entry logs, index, metadata)."""


# -- lastmark --------------------------------------------------------------------------------


@shell.command()
@_common
def lastmark(directory, ledger_dirs, journal_dir, metadata_uri, as_json):
    """The LastLogMark of each ledger directory: where journal replay starts."""
    layout = _layout(directory, ledger_dirs, journal_dir, metadata_uri)
    out = []
    for current in layout.currents:
        path = os.path.join(current, "lastMark")
        row = {"path": path}
        try:
            data = open(path, "rb").read()
        except FileNotFoundError:
            row["error"] = "missing"
        else:
            if len(data) != 20 or crc32c(data[:16]) != struct.unpack(">I", data[16:])[0]:
                row["error"] = "damaged (bad length or checksum)"
            else:
                jid, off = struct.unpack(">QQ", data[:16])
                row.update(journal_id="%x" % jid, offset=off,
                           journal_file=os.path.join(layout.journal_dir, "%x.txn" % jid))
        out.append(row)

    def human(rows):
        for r in rows:
            if "error" in r:
                yield f"{r['path']}: {r['error']}"
            else:
                yield f"{r['path']}: journal {r['journal_id']} offset {r['offset']}"
    _emit(as_json, out, human)


# -- listfilesondisc -------------------------------------------------------------------------


@shell.command()
@_common
@click.option("--journal/--no-journal", "show_journal", default=True, help="List journal files.")
@click.option("--entrylog/--no-entrylog", "show_logs", default=True, help="List entry logs.")
@click.option("--index/--no-index", "show_index", default=True, help="List index files.")
def listfilesondisc(directory, ledger_dirs, journal_dir, metadata_uri, as_json, show_journal,
                    show_logs, show_index):
    """Journal files, entry logs and index files, with their sizes."""
    layout = _layout(directory, ledger_dirs, journal_dir, metadata_uri)
    kinds = (["journal"] if show_journal else []) + (["entrylog", "compaction"] if show_logs else []) \
        + (["index"] if show_index else [])
    out = list_files(layout.currents, layout.journal_dir, kinds)

    def human(rows):
        yield from _table([[r["kind"], r["path"], r["bytes"], r["allocated_bytes"]] for r in rows],
                          ["kind", "path", "bytes", "on disk"])
        yield f"{len(rows)} files, {sum(r['allocated_bytes'] for r in rows)} bytes on disk"
    _emit(as_json, out, human)


# -- readjournal ------------------------------------------------------------------------------


@shell.command()
@_common
@click.argument("journal", required=False)
@click.option("--ledger", "ledger_filter", type=int, default=None, help="Only records of this ledger id.")
@click.option("--limit", type=int, default=None, help="At most this many records.")
def readjournal(directory, ledger_dirs, journal_dir, metadata_uri, as_json, journal, ledger_filter,
                limit):
    """The records of a journal file (hex id or path; default: the newest)."""
    layout = _layout(directory, ledger_dirs, journal_dir, metadata_uri)
    paths = _journal_paths(layout)
    if journal is None:
        if not paths:
            raise IllegalOpError(f"no journal files in {layout.journal_dir}")
        path = paths[max(paths)]
    elif os.path.sep in journal or journal.endswith(".txn"):
        path = os.path.abspath(journal)
    else:
        try:
            path = paths[int(journal, 16)]
        except (ValueError, KeyError):
            raise IllegalOpError(f"no journal {journal} in {layout.journal_dir}") from None
    if not os.path.isfile(path):
        raise IllegalOpError(f"no journal file {path}")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < jformat.HEADER_SIZE:
            raise CorruptedDataError(f"{path} is shorter than a journal header")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            try:
                file_id = jformat.check_file_header(mm[:jformat.HEADER_SIZE])
            except ValueError as exc:
                raise CorruptedDataError(f"{path}: {exc}") from None
            records, end, status, _ = jscan.scan_file(mm)
            rows = []
            for off, rtype, start, n in records:
                body = mm[start:start + n]
                row = {"offset": off, "type": jformat.RECORD_TYPES.get(rtype, f"unknown({rtype})"),
                       "bytes": n}
                if rtype in jformat.ENTRY_TYPES:
                    v, s, l, e, lac, length, _d = parse_entry_header(body)
                    row.update(_name((s, l)), entry_id=e, lac=lac, length=length, format=f"V{v}")
                elif n >= 16:
                    s, l = struct.unpack_from(">QQ", body)
                    row.update(_name((s, l)))
                    if n >= 24 and rtype in (jformat.EXPLICIT_LAC, jformat.TRUNCATE,
                                             jformat.TRIM, jformat.INCARNATION):
                        row["value"] = struct.unpack_from(">q", body, 16)[0]
                    elif n >= 24 and rtype == jformat.TERM:
                        row["value"] = struct.unpack_from(">Q", body, 16)[0]
                if ledger_filter is not None and row.get("ledger_id") != ledger_filter:
                    continue
                rows.append(row)
                if limit is not None and len(rows) >= limit:
                    break
        finally:
            mm.close()
    out = {"path": path, "journal_id": "%x" % file_id, "end": end, "status": status, "records": rows}

    def human(o):
        yield f"journal {o['journal_id']} ({o['path']}): {len(o['records'])} records shown, " \
              f"ends at {o['end']} ({o['status']})"
        yield from _table([[r["offset"], r["type"], _short((r["ledger_scope_id"], r["ledger_id"]))
                            if "ledger_id" in r else "-", r.get("entry_id", r.get("value", "-")),
                            r["bytes"]] for r in o["records"]],
                          ["offset", "type", "ledger", "entry/value", "bytes"])
    _emit(as_json, out, human)


# -- readlog ------------------------------------------------------------------------------------


@shell.command()
@_common
@click.argument("log")
@click.option("--map", "show_map", is_flag=True, help="Show the ledgers map instead of the entries.")
@click.option("--ledger", "ledger_filter", type=int, default=None, help="Only entries of this ledger id.")
@click.option("--ledger-scope-id", "scope_filter", type=int, default=None, help="... of this scope.")
@click.option("--entry-id", type=int, default=None, help="Only this entry id.")
@click.option("--limit", type=int, default=None, help="At most this many entries.")
def readlog(directory, ledger_dirs, journal_dir, metadata_uri, as_json, log, show_map, ledger_filter,
            scope_filter, entry_id, limit):
    """The entries of an entry log (hex id or path), or its ledgers map (--map)."""
    layout = _layout(directory, ledger_dirs, journal_dir, metadata_uri)
    m = _open_log(layout, log)
    try:
        info = {"path": m.path, "log_id": "%x" % m.log_id, "bytes": m.mapped, "sealed": m.sealed}
        if show_map:
            mp = m.ledgers_map()
            info["map_source"] = "ledgers map" if mp is not None else "scan (no ledgers map)"
            if mp is None:
                mp = m.scanned_ledgers()
            info["ledgers"] = [{**_name(k), "bytes": n} for k, n in sorted(mp.items())]
        else:
            locs, sizes, scopes, lids, eids = m.entry_table()
            rows = []
            for loc, n, s, l, e in zip(locs.tolist(), sizes.tolist(), scopes.tolist(), lids.tolist(),
                                       eids.tolist()):
                if ledger_filter is not None and l != ledger_filter:
                    continue
                if scope_filter is not None and s != scope_filter:
                    continue
                if entry_id is not None and e != entry_id:
                    continue
                rows.append({**_name((s, l)), "entry_id": e, "offset": loc & 0xFFFFFFFF,
                             "location": loc, "bytes": n})
                if limit is not None and len(rows) >= limit:
                    break
            info["entries"] = rows
    finally:
        m.close()

    def human(o):
        yield f"entry log {o['log_id']} ({o['path']}), {o['bytes']} bytes, " \
              f"{'sealed' if o['sealed'] else 'not sealed'}"
        if "ledgers" in o:
            yield f"ledgers map ({o['map_source']}):"
            yield from _table([[_short((r["ledger_scope_id"], r["ledger_id"])), r["qualified_name"],
                                r["bytes"]] for r in o["ledgers"]], ["ledger", "qualified name", "bytes"])
        else:
            yield from _table([[r["offset"], _short((r["ledger_scope_id"], r["ledger_id"])),
                                r["entry_id"], r["bytes"]] for r in o["entries"]],
                              ["offset", "ledger", "entry", "bytes"])
    _emit(as_json, info, human)


# -- readledger -----------------------------------------------------------------------------------


@shell.command()
@_common
@_ledger_options(True)
@click.option("--limit", type=int, default=None, help="At most this many entries.")
def readledger(directory, ledger_dirs, journal_dir, metadata_uri, as_json, ledger_id, scope_id,
               qualified_name, limit):
    """A ledger's index file: its state and where each entry is."""
    layout = _layout(directory, ledger_dirs, journal_dir, metadata_uri)
    key = _ledger_key(ledger_id, scope_id, qualified_name)
    if key is None:
        raise click.UsageError("name a ledger: LEDGER_ID [--ledger-scope-id S] or --ledger-qualified-name")
    idx = _open_index(layout, key)
    if idx is None:
        raise NoSuchLedgerError(f"no index file for ledger {_short(key)} in {', '.join(layout.currents)}")
    entries = []
    for e in idx.entry_ids():
        loc = idx.get_location(e)
        entries.append({"entry_id": e, "log_id": "%x" % (loc >> 32), "offset": loc & 0xFFFFFFFF})
        if limit is not None and len(entries) >= limit:
            break
    out = {**_name(key), "path": idx.path, "fenced": bool(idx.fenced), "term": idx.term,
           "explicit_lac": idx.explicit_lac,
           # the key is what the wire needs to write, and a weak password is found from it
           # by trying a dictionary: whether there is one, never its bytes
           "has_master_key": idx.master_key is not None,
           "last_entry_id": idx.last_entry_id(), "entries": entries}

    def human(o):
        yield f"ledger {_short(key)} ({o['qualified_name']}), index {o['path']}"
        yield f"  fenced {o['fenced']}, term {o['term']}, explicit LAC {o['explicit_lac']}, " \
              f"last entry {o['last_entry_id']}, master key {'set' if o['has_master_key'] else '-'}"
        yield from _table([[r["entry_id"], r["log_id"], r["offset"]] for r in o["entries"]],
                          ["entry", "entry log", "offset"])
    _emit(as_json, out, human)


# -- listledgers / ledgermetadata --------------------------------------------------------------------


def _local_ledgers(layout: Layout) -> list:
    keys = []
    for current in layout.currents:
        for scoped, root in ((False, "ledgers"), (True, "ledgers-scoped")):
            for _dp, _d, files in os.walk(os.path.join(current, root)):
                for n in files:
                    key = nix.parse_index_name(n, scoped)
                    if key is not None:
                        keys.append(key)
    return sorted(keys)


def _open_store(layout: Layout):
    if not layout.metadata_uri:
        raise ConfigError("no metadata store: pass --metadata URI")
    return open_metadata_store(layout.metadata_uri, create=False)


@shell.command()
@_common
@click.option("--from-metadata", is_flag=True, help="List the metadata store's ledgers instead.")
@click.option("--ledger-scope-id", "scope_id", type=int, default=None, help="Only this scope.")
def listledgers(directory, ledger_dirs, journal_dir, metadata_uri, as_json, from_metadata, scope_id):
    """The ledgers this bookie holds an index for (or, --from-metadata, the store's)."""
    layout = _layout(directory, ledger_dirs, journal_dir, metadata_uri)
    if from_metadata:
        with _open_store(layout) as store:
            keys = [(i.scope_id, i.ledger_id) for i in store.ledger_manager.iterate_ledgers(scope_id)]
    else:
        keys = [k for k in _local_ledgers(layout) if scope_id is None or k[0] == scope_id]
    out = [_name(k) for k in keys]

    def human(rows):
        for r in rows:
            yield f"{_short((r['ledger_scope_id'], r['ledger_id']))}\t{r['qualified_name']}"
        yield f"{len(rows)} ledgers"
    _emit(as_json, out, human)


@shell.command()
@_common
@_ledger_options(True)
def ledgermetadata(directory, ledger_dirs, journal_dir, metadata_uri, as_json, ledger_id, scope_id,
                   qualified_name):
    """A ledger's metadata from the metadata store."""
    layout = _layout(directory, ledger_dirs, journal_dir, metadata_uri)
    key = _ledger_key(ledger_id, scope_id, qualified_name)
    if key is None:
        raise click.UsageError("name a ledger: LEDGER_ID [--ledger-scope-id S] or --ledger-qualified-name")
    with _open_store(layout) as store:
        v = store.ledger_manager.read_ledger_metadata(LedgerId(*key))
    md = v.value
    out = {**_name(key), "version": v.version, "state": md.state.name,
           "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum,
           "ack_quorum": md.ack_quorum, "digest_type": md.digest_type.name,
           "last_entry_id": md.last_entry_id, "length": md.length,
           "fragments": [{"first_entry_id": f, "ensemble": list(b)} for f, b in md.fragments],
           "ctime_ms": md.ctime_ms, "term": md.term, "unbounded": md.unbounded,
           "custom_metadata": {k: v.hex() for k, v in md.custom_metadata.items()}}

    def human(o):
        yield f"ledger {_short(key)} ({o['qualified_name']}), metadata version {o['version']}"
        for k in ("state", "ensemble_size", "write_quorum", "ack_quorum", "digest_type",
                  "last_entry_id", "length", "term", "unbounded", "ctime_ms"):
            yield f"  {k}: {o[k]}"
        for f in o["fragments"]:
            yield f"  fragment from entry {f['first_entry_id']}: {', '.join(f['ensemble'])}"
    _emit(as_json, out, human)


# -- localconsistencycheck ----------------------------------------------------------------------------


def check_ledger(layout: Layout, key, logs: dict, digest=None, mac_key=None) -> dict:
    """Every location in the ledger's index points at a readable entry of that ledger
    with a good digest. ``digest``: the ledger's digest code if known (from metadata);
    otherwise V2 entries name theirs and V1 entries are tried against CRC32C, CRC32 and
    DUMMY (a MAC ledger cannot be checked without its password)."""
    idx = _open_index(layout, key)
    report = {**_name(key), "entries": 0, "good": 0, "unchecked_digest": 0, "errors": []}
    if idx is None:
        report["errors"].append({"entry_id": None, "error": "no index file"})
        return report
    for e in idx.entry_ids():
        loc = idx.get_location(e)
        report["entries"] += 1
        log_id = loc >> 32
        m = logs.get(log_id)
        if m is None:
            segment = log_id & 0x80000000
            path = (_segment_paths if segment else _log_paths)(layout).get(log_id)
            if path is not None:
                m = logs[log_id] = (nel.MappedLog.open_segment(path, log_id) if segment else
                                    nel.MappedLog.open_existing(path, log_id))
        if m is None:
            report["errors"].append({"entry_id": e, "location": loc,
                                     "error": f"entry log (or journal segment) {log_id:x} is missing"})
            continue
        try:
            data = m.read_at(loc)
        except EmbedlogError as exc:
            report["errors"].append({"entry_id": e, "location": loc, "error": str(exc)})
            continue
        try:
            v, s, l, eid, _lac, _len, code = parse_entry_header(data)
            if (s, l, eid) != (key[0], key[1], e):
                raise EmbedlogError(f"holds entry {eid} of ledger {_short((s, l))}")
            codes = [digest] if digest is not None else ([code] if code is not None else [3, 1, 4])
            if codes == [2] and mac_key is None:
                report["unchecked_digest"] += 1
                report["good"] += 1
                continue
            last = None
            for c in codes:
                try:
                    decode_entry(data, s, l, eid, c, mac_key if c == 2 else None)
                    break
                except EmbedlogError as exc:
                    last = exc
            else:
                if digest is None and v == 1:
                    report["unchecked_digest"] += 1      # V1 of unknown type: a MAC ledger?
                    report["good"] += 1
                    continue
                raise last
            report["good"] += 1
        except EmbedlogError as exc:
            report["errors"].append({"entry_id": e, "location": loc, "error": str(exc)})
    return report


@shell.command()
@_common
@_ledger_options(False)
def localconsistencycheck(directory, ledger_dirs, journal_dir, metadata_uri, as_json, ledger_id,
                          scope_id, qualified_name):
    """Check that every index location points at a readable entry with a good digest
    (every ledger, or one). Exit status 1 if anything is wrong."""
    layout = _layout(directory, ledger_dirs, journal_dir, metadata_uri)
    key = _ledger_key(ledger_id, scope_id, qualified_name)
    keys = [key] if key is not None else _local_ledgers(layout)
    store = None
    if layout.metadata_uri:
        try:
            store = _open_store(layout)
        except EmbedlogError:
            store = None
    logs: dict = {}
    reports = []
    try:
        for k in keys:
            digest = mk = None
            if store is not None:
                try:
                    md = store.ledger_manager.read_ledger_metadata(LedgerId(*k)).value
                    digest = int(md.digest_type)
                    mk = mac_key(md.password) if digest == 2 else None
                except EmbedlogError:
                    pass
            reports.append(check_ledger(layout, k, logs, digest, mk))
        unindexed = _unindexed(layout, store) if key is None else []
    finally:
        for m in logs.values():
            m.close()
        if store is not None:
            store.close()
    bad = [r for r in reports if r["errors"]]
    # entry-log blocks whose bytes changed since the seal (every ledger, DUMMY ones too), and
    # index files the bookie set aside as damaged and rebuilt
    scrub = damaged_records(_log_paths(layout).items())
    set_aside = _damaged_index_files(layout)
    out = {"ledgers": len(reports), "entries": sum(r["entries"] for r in reports),
           "good": sum(r["good"] for r in reports),
           "unchecked_digest": sum(r["unchecked_digest"] for r in reports),
           "errors": [{**{k: r[k] for k in ("ledger_scope_id", "ledger_id", "qualified_name")}, **err}
                      for r in bad for err in r["errors"]],
           "damaged_entry_log_blocks": scrub,
           "damaged_index_files": set_aside,
           "unindexed_ledgers": unindexed,
           "ok": not bad and not scrub and not unindexed}

    def human(o):
        for err in o["errors"]:
            where = f"entry {err['entry_id']}" if err.get("entry_id") is not None else "ledger"
            yield f"ledger {_short((err['ledger_scope_id'], err['ledger_id']))} {where}: {err['error']}"
        for b in o["damaged_entry_log_blocks"]:
            what = b.get("error") or f"bytes {b['offset']}..{b['end']} changed since the seal"
            held = ", ".join(f"{q} entry {e}" for q, e in b["entries"][:5])
            more = f" (+{len(b['entries']) - 5} more)" if len(b["entries"]) > 5 else ""
            yield f"entry log {b['file']}: {what}" + (f"; holds {held}{more}" if held else "")
        for f in o["damaged_index_files"]:
            yield f"index file set aside as damaged (its ledger's index was rebuilt): {f}"
        for u in o["unindexed_ledgers"]:
            yield f"ledger {u['qualified_name']}: {u['problem']} ({u['file']}); the entry logs " \
                  f"hold {u['entries']} entries it lacks (the bookie rebuilds it at start-up)"
        yield f"{o['ledgers']} ledgers, {o['entries']} entries: {o['good']} good, " \
              f"{len(o['errors'])} bad, {len(o['damaged_entry_log_blocks'])} damaged entry-log " \
              f"blocks" + (f" ({o['unchecked_digest']} digests not checked: MAC "
                           f"ledgers without metadata)" if o["unchecked_digest"] else "")
        yield "OK" if o["ok"] else "INCONSISTENT"
    _emit(as_json, out, human)
    if not out["ok"]:
        sys.exit(1)


def _unindexed(layout: Layout, store) -> list:
    """Ledgers whose index file is missing or cut while the entry logs or layout 2's
    segments hold their entries (scrub.unindexed_entries, as a bookie's start looks for
    them); a missing file counts only for a ledger the store lists."""
    def find_index(key):
        for current in layout.currents:
            path = nix.index_path(current, *key)
            if os.path.exists(path):
                return path
        return None

    def keep(key, missing):
        if not missing or store is None:
            return True
        try:
            store.ledger_manager.read_ledger_metadata(LedgerId(*key))
            return True
        except EmbedlogError:
            return False

    journals = sorted(_segment_paths(layout).items())
    # a segment whose map is gone is counted from its records (read only: no map written)
    segments = [(log_id, path, held) for log_id, path, held, _read in segments_held(journals)
                if held is not None]
    found = unindexed_entries(_log_paths(layout).items(), find_index, keep, segments,
                              lambda: journal_cuts(journals))
    return [{"ledger_scope_id": k[0], "ledger_id": k[1], "qualified_name": LedgerId(*k).qualified_name,
             "file": r["file"] or nix.index_path(layout.currents[0], *k), "problem": r["problem"],
             "entries": len(r["eids"]), "first_entry_id": int(r["eids"][0]),
             "last_entry_id": int(r["eids"][-1])} for k, r in sorted(found.items())]


def _damaged_index_files(layout: Layout) -> list:
    """Index files a bookie set aside (``<file>.damaged``) when it rebuilt their ledger's index."""
    found = []
    for current in layout.currents:
        for root in ("ledgers", "ledgers-scoped"):
            for dirpath, _d, files in os.walk(os.path.join(current, root)):
                found.extend(os.path.join(dirpath, n) for n in files if n.endswith(".damaged"))
    return sorted(found)
