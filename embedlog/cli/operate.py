"""What a BookKeeper operator does every day, against a cluster's metadata store:

    embedlog bookie list                      every bookie: state (down: a cookie, no registration),
                                              address, free disk
    embedlog bookie readonly on|off BOOKIE    an operator's read-only mode (admin HTTP API)
    embedlog bookie recover BOOKIE            copy a lost bookie's fragments to other bookies
    embedlog bookie decommission BOOKIE       the same for a stopped bookie, then its cookie goes
    embedlog autorecovery status | audit      the auditor, under-replicated ledgers; audit now
    embedlog metadata format                  make a new, empty metadata store at a URI
    embedlog cookie show | delete BOOKIE      a bookie's cookie in the metadata store

Re-replication is autorecovery's (client/autorecovery.py): for each fragment of a CLOSED
ledger, or a fragment of an OPEN one that is not its last (its writer handles that one),
the entries the bookie should hold are copied from the surviving replicas to a new bookie,
which replaces it in the ensemble by compare-and-set. A stream's current fragment is
copied when its term was released; otherwise `recover` takes the stream over at once (a
leader still writing must take_over() again), as BookKeeper's recover fences open ledgers.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import click

from embedlog.bookie.cookies import Cookie, read_dir_cookie
from embedlog.cli.common import (EXIT_NOT_FOUND, EXIT_REFUSED, EmbedlogGroup, confirm_delete, emit,
                                 fail, json_option, ledger_label, metadata_option, open_client,
                                 require_metadata, table)
from embedlog.client.autorecovery import AutoRecovery, current_auditor, ledgers_on, underreplicated
from embedlog.client.context import ClientConfig, ClientContext
from embedlog.errors import EmbedlogError, IllegalOpError, MetadataError, UnauthorizedAccessError
from embedlog.meta import open_metadata_store, parse_metadata_uri
from embedlog.meta.api import LedgerState
from embedlog.meta.views import ledger_ref
from embedlog.net.security import read_token

HTTP_TIMEOUT_S = 10.0
STATE_WAIT_S = 15.0           # for a bookie's registration to follow its new state


def _registration(client, bookie_id: str):
    for r in client.metadata.registration_client.get_all_bookies():
        if r.bookie_id == bookie_id:
            return r
    return None


def _admin_of(client, bookie_id: str, as_json: bool, hint: str = "") -> tuple:
    """(registration, admin HTTP address) of a registered bookie, or exit with why not."""
    reg = _registration(client, bookie_id)
    if reg is None:
        fail(f"no bookie {bookie_id} is registered", EXIT_NOT_FOUND, as_json)
    address = (reg.info or {}).get("http")
    if not address:
        raise IllegalOpError(f"bookie {bookie_id} runs no admin HTTP server (start it with "
                             f"--http-port{hint})")
    return reg, address


def _token_file(reg, given: str | None) -> str | None:
    """The token file for changing requests: the one given, else the admin token the bookie
    registered, when this host and user can read it."""
    if given is not None:
        return given
    local = (reg.info or {}).get("admin_token_file")
    return local if local and os.access(local, os.R_OK) else None


def _refuse_if_registered(client, bookie_id: str, what: str, as_json: bool) -> None:
    if _registration(client, bookie_id) is not None:
        fail(f"bookie {bookie_id} is registered (running); stop it before {what}", EXIT_REFUSED,
             as_json)


# -- bookie list / readonly ----------------------------------------------------------------------

def bookie_rows(client) -> list:
    regs = client.metadata.registration_client.get_all_bookies()
    infos = client.bookie_info([r.bookie_id for r in regs])
    rows = []
    for r in regs:
        info = infos.get(r.bookie_id)
        row = {"bookie_id": r.bookie_id, "state": "read_only" if r.read_only else "writable",
               "address": (r.info or {}).get("address"), "http": (r.info or {}).get("http"),
               "reachable": info is not None}
        if info is not None:
            row.update(free_bytes=info.get("free_bytes"), total_bytes=info.get("total_bytes"),
                       ledgers=info.get("ledgers"), read_only_reasons=info.get("read_only_reasons", []))
        else:
            row["state"] = "unreachable"
        rows.append(row)
    return rows + _down_rows(client.metadata, {r.bookie_id for r in regs})


def _down_rows(store, registered: set) -> list:
    """A bookie with a cookie and no registration is down (crashed, stopped, its
    registration expired), not gone: BookKeeper's cookies list every bookie until it is
    decommissioned. Records that are not cookies (the auditor's lease) are skipped."""
    rows = []
    for name in store.cookies.list_cookies():
        v = None if name in registered else store.cookies.read_cookie(name)
        if v is None:
            continue
        try:
            Cookie.from_bytes(bytes(v.value), f"cookie of {name}")
        except EmbedlogError:
            continue
        rows.append({"bookie_id": name, "state": "down", "address": None, "http": None,
                     "reachable": False})
    return rows


def _gib(n) -> str:
    return "-" if n is None else f"{n / (1 << 30):,.1f} GiB"


@click.command("list")
@metadata_option
@json_option
def bookie_list(metadata_uri, as_json):
    """Every registered bookie: state (writable, read-only and why, unreachable), address,
    admin address, free disk and ledgers (each bookie asked over the wire); then every
    bookie with a cookie but no registration, as down (until decommissioned)."""
    with open_client(metadata_uri) as client:
        rows = bookie_rows(client)
    if as_json:
        emit(True, rows)
        return
    down = sum(1 for r in rows if r["state"] == "down")
    table(["bookie", "state", "address", "free disk", "disk", "ledgers", "admin"],
          [[r["bookie_id"], r["state"] + (f" ({', '.join(r['read_only_reasons'])})"
                                          if r.get("read_only_reasons") else ""),
            r["address"] or "-", _gib(r.get("free_bytes")), _gib(r.get("total_bytes")),
            r.get("ledgers", "-"), r["http"] or "-"] for r in rows],
          f"{len(rows) - down} bookies registered" + (f", {down} down" if down else ""))


def admin_request(address: str, method: str, path: str, body: dict | None = None,
                  token_file: str | None = None) -> dict:
    """One request to a bookie's admin HTTP API; its JSON answer, or the error it gave as an
    embedlog error (4xx/5xx: the server's message)."""
    headers = {"Content-Type": "application/json"}
    if token_file:
        headers["Authorization"] = "Bearer " + read_token(token_file).decode("latin-1")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{address}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        cls = UnauthorizedAccessError if exc.code in (401, 403) else EmbedlogError
        raise cls(f"bookie admin {address}: {exc.code} {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EmbedlogError(f"bookie admin {address} did not answer: "
                            f"{getattr(exc, 'reason', exc)}") from None


@click.command("missing")
@click.argument("bookie_id")
@metadata_option
@click.option("--delete", "delete", is_flag=True,
              help="Delete them: the operator's confirmation that they are gone for good.")
@click.option("--ledger", "ledgers", multiple=True, metavar="QUALIFIED_NAME",
              help="With --delete: only this ledger (repeatable).")
@click.option("--auth-token-file", type=click.Path(dir_okay=False), default=None,
              help="The bookie's token, for --delete (as for `bookie readonly`).")
@json_option
def bookie_missing(bookie_id, metadata_uri, delete, ledgers, auth_token_file, as_json):
    """Ledgers a running bookie holds that the metadata store lacks without a deletion
    record (a lost row, a restored older backup, a wrong root). GC keeps them; this lists
    them, and with --delete removes them (through the bookie's admin HTTP API)."""
    with open_client(metadata_uri) as client:
        reg, address = _admin_of(client, bookie_id, as_json)
        store = client.metadata
    path = "/api/v1/bookie/missing_ledgers"
    if not delete:
        out = admin_request(address, "GET", path)
        if as_json:
            emit(True, out)
            return
        table(["ledger", "missing since"],
              [[ledger_label(store, m), time.strftime("%Y-%m-%d %H:%M:%S",
                                                          time.localtime(m["first_seen_ms"] / 1000))]
               for m in out["missing"]], f"{out['count']} ledgers missing from the metadata store")
        return
    auth_token_file = _token_file(reg, auth_token_file)
    deleted = 0
    for q in ledgers or [None]:
        query = "" if q is None else f"?ledger_qualified_name={q}"
        deleted += admin_request(address, "DELETE", path + query, token_file=auth_token_file)["deleted"]
    emit(as_json, {"deleted": deleted}, f"deleted {deleted} missing ledgers")


@click.command("deletion-halt")
@click.argument("bookie_id")
@metadata_option
@click.option("--resume", is_flag=True,
              help="Resume deletion: the operator's confirmation that the metadata store is right.")
@click.option("--auth-token-file", type=click.Path(dir_okay=False), default=None,
              help="The bookie's token, for --resume (as for `bookie readonly`).")
@json_option
def bookie_deletion_halt(bookie_id, metadata_uri, resume, auth_token_file, as_json):
    """Whether a running bookie has halted ledger deletion because the metadata store looks
    older than what it has seen (a restored backup: its id generator went back, ledgers it
    has not handed out yet are missing, ids came back over held ledgers), and why; with
    --resume, deletion goes on."""
    with open_client(metadata_uri) as client:
        reg, address = _admin_of(client, bookie_id, as_json)
    path = "/api/v1/bookie/deletion_halt"
    if not resume:
        out = admin_request(address, "GET", path)
        lines = [f"- {r['reason']} (since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['since_ms'] / 1000))})"
                 for r in out["reasons"]]
        emit(as_json, out, "ledger deletion halted:\n" + "\n".join(lines) if out["halted"]
             else "ledger deletion is not halted")
        return
    out = admin_request(address, "DELETE", path, token_file=_token_file(reg, auth_token_file))
    emit(as_json, out, f"ledger deletion resumed ({len(out['resumed'])} reason(s) lifted)")


@click.command("readonly")
@click.argument("mode", type=click.Choice(["on", "off"]))
@click.argument("bookie_id")
@metadata_option
@click.option("--auth-token-file", type=click.Path(dir_okay=False), default=None,
              help="The bookie's token: its --auth-token-file, else the admin-token file in "
                   "its directory (the admin API needs one for every change).")
@json_option
def bookie_readonly(mode, bookie_id, metadata_uri, auth_token_file, as_json):
    """Turn a running bookie's operator read-only mode on or off (through its admin HTTP
    API, BookKeeper's PUT /api/v1/bookie/state/readonly), and wait until its registration
    says so. A bookie its disks made read-only stays read-only until they have room."""
    flag = mode == "on"
    with open_client(metadata_uri) as client:
        reg, address = _admin_of(client, bookie_id, as_json, ", or send it SIGUSR1 / SIGUSR2")
        state = admin_request(address, "PUT", "/api/v1/bookie/state/readonly", {"readOnly": flag},
                              _token_file(reg, auth_token_file))
        deadline = time.monotonic() + STATE_WAIT_S
        while True:
            reg = _registration(client, bookie_id)
            if reg is not None and reg.read_only == state["readOnly"]:
                break
            if time.monotonic() > deadline:
                raise EmbedlogError(f"bookie {bookie_id} did not re-register in {STATE_WAIT_S} s")
            time.sleep(0.05)
    out = {"bookie_id": bookie_id, "read_only": state["readOnly"], "reasons": state.get("reasons", [])}
    why = f" ({', '.join(out['reasons'])})" if out["reasons"] else ""
    emit(as_json, out, f"bookie {bookie_id} is {'read-only' if out['read_only'] else 'writable'}{why}")


# -- recover / decommission ------------------------------------------------------------------------

def rereplicate(store, bookie_id: str, progress=None) -> dict:
    """Copy every fragment on ``bookie_id`` to other bookies where autorecovery can: CLOSED
    ledgers, OPEN ledgers' fragments before their last, and streams (taken over when their
    term is not released). {"replicated": [ledger dicts],
    "left": [ledger dicts with the reason]}."""
    ctx = ClientContext(store, ClientConfig(client_name="embedlog-cli"))
    try:
        worker = AutoRecovery(ctx, "embedlog-cli", open_stream_grace_s=0.0)   # an operator's act
        mds = ledgers_on(store, bookie_id)
        done, left = [], []
        for k, md in enumerate(mds):
            if progress is not None:
                progress(k, len(mds))
            try:
                ok = worker.replicate_ledger(md.ledger_id, {bookie_id})
            except EmbedlogError as exc:
                left.append({**ledger_ref(md.ledger_id), "reason": str(exc)})
                continue
            if ok:
                done.append(ledger_ref(md.ledger_id))
            else:
                reason = ("OPEN, and the bookie is in its last fragment: its writer replaces it, "
                          "or `embedlog ledger recover` closes it"
                          if md.state != LedgerState.CLOSED else "its metadata kept changing")
                left.append({**ledger_ref(md.ledger_id), "reason": reason})
        return {"replicated": done, "left": left}
    finally:
        ctx.close()


def _report(store, bookie_id: str, result: dict, as_json: bool, extra: dict | None = None) -> None:
    out = {"bookie_id": bookie_id, **result, **(extra or {})}
    if as_json:
        emit(True, out)
    else:
        click.echo(f"bookie {bookie_id}: {len(result['replicated'])} ledgers re-replicated, "
                   f"{len(result['left'])} left")
        for r in result["left"]:
            click.echo(f"  ledger {ledger_label(store, r)}: {r['reason']}", err=True)


@click.command("recover")
@click.argument("bookie_id")
@metadata_option
@json_option
def bookie_recover(bookie_id, metadata_uri, as_json):
    """Copy a lost bookie's fragments to other bookies (BookKeeper's `recover`). The bookie
    must not be registered. Exit 1 if some ledgers are left (their reasons on stderr)."""
    with open_client(metadata_uri) as client:
        _refuse_if_registered(client, bookie_id, "recovering its data elsewhere", as_json)
        result = rereplicate(client.metadata, bookie_id)
    _report(client.metadata, bookie_id, result, as_json)
    if result["left"]:
        raise SystemExit(1)


@click.command("decommission")
@click.argument("bookie_id")
@metadata_option
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def bookie_decommission(bookie_id, metadata_uri, yes, as_json):
    """Retire a stopped bookie: re-replicate every ledger that has a fragment on it, then
    delete its cookie (BookKeeper's `decommissionbookie`). Its cookie stays, and the exit
    code is 1, while any ledger still names it."""
    confirm_delete(f"bookie {bookie_id} (its data is copied elsewhere first)", yes, as_json)
    with open_client(metadata_uri) as client:
        _refuse_if_registered(client, bookie_id, "decommissioning it", as_json)
        result = rereplicate(client.metadata, bookie_id)
        removed = False
        if not result["left"]:
            cookies = client.metadata.cookies
            v = cookies.read_cookie(bookie_id)
            if v is not None:
                cookies.remove_cookie(bookie_id, v.version)
                removed = True
    _report(client.metadata, bookie_id, result, as_json, {"cookie_removed": removed,
                                         "decommissioned": not result["left"]})
    if result["left"]:
        raise SystemExit(1)
    if not as_json:
        click.echo(f"bookie {bookie_id} decommissioned" + ("; its cookie is removed" if removed else ""))


# -- autorecovery ----------------------------------------------------------------------------------

@click.group(cls=EmbedlogGroup)
def autorecovery():
    """The auditor and the under-replicated ledgers."""


def autorecovery_state(store) -> dict:
    ur = underreplicated(store)
    return {"auditor": current_auditor(store),
            "underreplicated": [{**ledger_ref(lid), "missing_bookies": list(missing)}
                                for lid, missing in sorted(ur.items(), key=lambda kv: (
                                    kv[0].scope_id, kv[0].ledger_id))]}


@autorecovery.command("status")
@metadata_option
@json_option
def autorecovery_status(metadata_uri, as_json):
    """Who is the auditor, and which ledgers are marked under-replicated (missing bookies)."""
    with open_client(metadata_uri) as client:
        out = autorecovery_state(client.metadata)
        store = client.metadata
    if as_json:
        emit(True, out)
        return
    click.echo(f"auditor: {out['auditor'] or '(none elected: no bookie runs --autorecovery)'}")
    table(["under-replicated ledger", "missing bookies"],
          [[ledger_label(store, r), ", ".join(r["missing_bookies"])] for r in out["underreplicated"]],
          f"{len(out['underreplicated'])} under-replicated ledgers")


def run_audit(store) -> list:
    """An audit now: mark every ledger with a fragment on a bookie that is not registered
    (no grace period: the operator asked). The running replication workers copy them."""
    ctx = ClientContext(store, ClientConfig(client_name="embedlog-audit"))
    try:
        return AutoRecovery(ctx, "embedlog-audit", lost_bookie_grace_s=0.0).audit()
    finally:
        ctx.close()


@autorecovery.command("audit")
@metadata_option
@json_option
def autorecovery_audit(metadata_uri, as_json):
    """Audit now (BookKeeper's triggeraudit): mark every ledger with a fragment on a bookie
    that is not registered as under-replicated, for the autorecovery workers to copy."""
    with open_client(metadata_uri) as client:
        marked = run_audit(client.metadata)
        ur = client.metadata.underreplication.list_underreplicated()
    rows = [{**ledger_ref(lid), "missing_bookies": list(ur.get(lid, []))} for lid in marked]
    emit(as_json, {"marked": rows}, f"audit: {len(rows)} ledgers marked under-replicated")
    if not as_json:
        for r in rows:
            click.echo(f"  {ledger_label(client.metadata, r)}: missing {', '.join(r['missing_bookies'])}")


# -- metadata format / cookies -------------------------------------------------------------------

@click.group(cls=EmbedlogGroup)
def metadata():
    """The metadata store itself."""


@metadata.command("format")
@metadata_option
@json_option
def metadata_format(metadata_uri, as_json):
    """Make a new, empty metadata store at the URI (its layout and instance id), as
    BookKeeper's `metaformat` does for a new cluster. Exit 4 if one is there already: this
    command never wipes a store."""
    uri = require_metadata(metadata_uri)
    scheme, _servers, path, _opts = parse_metadata_uri(uri)
    try:
        with open_metadata_store(uri, create=False) as store:
            fail(f"{uri} already holds a metadata store (instance {store.instance_id}); "
                 f"nothing was changed", EXIT_REFUSED, as_json)
    except MetadataError as exc:
        if "no metadata store" not in str(exc):
            raise
    if scheme == "sqlite":
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    with open_metadata_store(uri) as store:
        out = {"metadata_uri": uri, "instance_id": store.instance_id, "formatted": True}
    emit(as_json, out, f"formatted {uri}: instance {out['instance_id']}")


@click.group(cls=EmbedlogGroup)
def cookie():
    """Bookie cookies in the metadata store (what ties a bookie's directories to it)."""


def _read_cookie(store, bookie_id: str, as_json: bool):
    v = store.cookies.read_cookie(bookie_id)
    if v is None:
        fail(f"no cookie for bookie {bookie_id} in {store.uri}", EXIT_NOT_FOUND, as_json)
    return v


@cookie.command("show")
@click.argument("bookie_id")
@metadata_option
@json_option
def cookie_show(bookie_id, metadata_uri, as_json):
    """A bookie's cookie: its directories and the metadata store instance it belongs to."""
    with open_client(metadata_uri) as client:
        v = _read_cookie(client.metadata, bookie_id, as_json)
    try:
        c = Cookie.from_bytes(bytes(v.value), f"cookie of {bookie_id}")
        out = {"bookie_id": c.bookie_id, "instance_id": c.instance_id, "metadata_uri": c.metadata_uri,
               "journal_dir": c.journal_dir, "ledger_dirs": list(c.ledger_dirs), "version": v.version}
    except EmbedlogError:
        # not a bookie's cookie (the auditor's lease lives beside them): show its bytes
        out = {"bookie_id": bookie_id, "raw": bytes(v.value).decode("utf-8", "replace"),
               "version": v.version}
    if as_json:
        emit(True, out)
        return
    for k, value in out.items():
        click.echo(f"{k}: {', '.join(value) if isinstance(value, list) else value}")


@cookie.command("create")
@click.argument("bookie_id")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False, exists=True),
              help="The bookie's directory (or one of its ledger or journal directories).")
@metadata_option
@json_option
def cookie_create(bookie_id, directory, metadata_uri, as_json):
    """Write a bookie's cookie to the metadata store again from its directory's, so that a
    decommissioned bookie (its cookie deleted) starts again with its data, as BookKeeper's
    `cookie_create`. Refused (exit 4) when the store has a cookie for the bookie, or the
    directory's names another bookie or another store."""
    found = read_dir_cookie(directory, False) or read_dir_cookie(directory, True)
    if found is None:
        fail(f"{directory} holds no bookie cookie (current/VERSION or VERSION)", EXIT_NOT_FOUND,
             as_json)
    if found.bookie_id != bookie_id:
        fail(f"{directory} belongs to bookie {found.bookie_id}, not {bookie_id}", EXIT_REFUSED,
             as_json)
    with open_client(metadata_uri) as client:
        store = client.metadata
        if found.instance_id is not None and found.instance_id != store.instance_id:
            fail(f"{directory} was stamped for metadata store instance {found.instance_id}, "
                 f"not {store.instance_id} ({store.uri})", EXIT_REFUSED, as_json)
        if store.cookies.read_cookie(bookie_id) is not None:
            fail(f"bookie {bookie_id} has a cookie in {store.uri} already; nothing was changed",
                 EXIT_REFUSED, as_json)
        store.cookies.write_cookie(bookie_id, found.to_bytes(), None)
    emit(as_json, {"bookie_id": bookie_id, "created": True, "instance_id": found.instance_id},
         f"wrote the cookie of bookie {bookie_id} from {directory}")


@cookie.command("delete")
@click.argument("bookie_id")
@metadata_option
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def cookie_delete(bookie_id, metadata_uri, yes, as_json):
    """Delete a bookie's cookie (a bookie whose directories were wiped can then start as
    new). Refused (exit 4) while the bookie is registered."""
    confirm_delete(f"the cookie of bookie {bookie_id}", yes, as_json)
    with open_client(metadata_uri) as client:
        _refuse_if_registered(client, bookie_id, "deleting its cookie", as_json)
        v = _read_cookie(client.metadata, bookie_id, as_json)
        client.metadata.cookies.remove_cookie(bookie_id, v.version)
    emit(as_json, {"bookie_id": bookie_id, "deleted": True}, f"deleted the cookie of bookie {bookie_id}")


def add_to(main: click.Group, bookie: click.Group) -> None:
    for cmd in (bookie_list, bookie_readonly, bookie_missing, bookie_deletion_halt, bookie_recover,
                bookie_decommission):
        bookie.add_command(cmd)
    for group in (autorecovery, metadata, cookie):
        main.add_command(group)
