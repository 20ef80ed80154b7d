"""The endpoints of a bookie's admin HTTP API (the server that carries them, its threads and its
token are admin/http.py's).

Endpoints (BookKeeper's paths where it has one). Answers are JSON unless noted; an error is
``{"error": message, "status": code}`` with a 4xx or 5xx status; an unknown query parameter
is a 400 (a misspelt ``ledger_scope_id`` must not silently mean scope 0)::

    GET    /heartbeat                                    "OK" (liveness)
    GET    /api/v1/bookie/is_ready                       200 {"ready": true} | 503 {"ready": false}
    GET    /api/v1/bookie/state                          running, read-only, shutting down
    GET    /api/v1/bookie/info                           identity, state, disk, journal, entry logs,
                                                         memtable, compaction
    GET    /api/v1/bookie/list_bookies?type=rw|ro|all    registered bookies
    GET    /api/v1/bookie/list_bookie_info               every bookie's free and total disk, and the
                                                         cluster's (BookKeeper's text shape)
    GET    /api/v1/bookie/ledgers?ledger_scope_id=S      ledgers stored on this bookie
    GET    /api/v1/bookie/cluster_info                   bookie counts by state, the auditor
    GET    /api/v1/bookie/last_log_mark                  where journal replay would start
    GET    /api/v1/bookie/list_disk_file[?file_type=journal,entrylog,index]
    GET|PUT /api/v1/bookie/state/readonly                {"readOnly": bool}: the operator's mode
    GET|PUT /api/v1/bookie/gc[?force_major=&force_minor=] a garbage collection cycle now; status
    GET    /api/v1/config/server_config                  the configuration this bookie runs with
    GET    /api/v1/ledger/list?ledger_scope_id=S[&print_metadata=true][&limit=N]
    GET    /api/v1/ledger/metadata?ledger_id=L[&ledger_scope_id=S] | ?ledger_qualified_name=Q
    GET    /api/v1/ledger/read?ledger_id=L[...][&start_entry_id=A][&end_entry_id=B]
    DELETE /api/v1/ledger/delete?ledger_id=L[&ledger_scope_id=S] | ?ledger_qualified_name=Q
    GET    /api/v1/autorecovery/status
    GET    /api/v1/autorecovery/list_under_replicated_ledger
    GET    /api/v1/autorecovery/who_is_auditor
    PUT    /api/v1/autorecovery/trigger_audit             mark ledgers on unregistered bookies now
    GET    /api/v1/status/rates                          add/read counts of every bookie
    GET    /api/v1/status/history                        this bookie's add/read rates, last 5 min
    GET    /api/v1/bookie/missing_ledgers                ledgers held here that the store lacks
    DELETE /api/v1/bookie/missing_ledgers[?ledger]       delete them (an operator's confirmation)
    GET    /api/v1/bookie/deletion_halt                  whether GC deletes nothing (the store went back)
    DELETE /api/v1/bookie/deletion_halt                  resume deletion (an operator's confirmation)
    GET    /metrics                                      Prometheus text format
    GET    /status                                       the status page (HTML); / redirects there
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import threading
import time
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST

import embedlog
from embedlog._native.format import LedgerId
from embedlog.admin.metrics import compaction_progress
from embedlog.admin.status import render
from embedlog.bookie.files import KINDS, list_files
from embedlog.client.autorecovery import AutoRecovery, current_auditor, underreplicated
from embedlog.client.client import bookie_infos
from embedlog.client.group import group_lags
from embedlog.client.read import ReadHandle, read_lac
from embedlog.client.stream import find_stream
from embedlog.errors import EmbedlogError, IllegalOpError, NoSuchLedgerError
from embedlog.meta.views import data_dict, ledger_ref, metadata_dict
from embedlog.net import protocol as P
from embedlog.net.transport import BookieConnection

log = logging.getLogger("embedlog.admin")

U64_MAX = (1 << 64) - 1
READ_ENTRIES_MAX = 1000          # entries /api/v1/ledger/read answers at most
LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 1000, 100_000
STATUS_LEDGERS_MAX = 200         # ledgers the status page shows
HISTORY_POINTS = 300             # this bookie's rate history, one point a second
UNDERREPLICATED_CACHE_S = 5.0
GROUP_LAG_CACHE_S = 2.0          # consumer group lag on /metrics: one read per stream per 2 s
BOOKIE_INFO_TIMEOUT_S = 1.0


class HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


# -- query parameters -------------------------------------------------------------------------

class Params:
    """One request's query string: each parameter at most once, only the accepted ones; and
    its method and JSON body (``body``: a dict, empty without one)."""

    method = "GET"
    body: dict = {}

    def __init__(self, query: str, accepted: tuple):
        try:
            raw = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=32)
        except ValueError as exc:
            raise HttpError(400, f"bad query string: {exc}") from None
        for name, values in raw.items():
            if name not in accepted:
                hint = ", ".join(accepted) if accepted else "none"
                raise HttpError(400, f"unknown parameter {name!r} (accepted: {hint})")
            if len(values) > 1:
                raise HttpError(400, f"parameter {name!r} given {len(values)} times")
        self.values = {k: v[0] for k, v in raw.items()}

    def get(self, name: str):
        return self.values.get(name)

    def int(self, name: str, default=None, lo: int = 0, hi: int = U64_MAX):
        text = self.values.get(name)
        if text is None:
            return default
        try:
            value = int(text, 10)
        except ValueError:
            raise HttpError(400, f"{name} must be an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise HttpError(400, f"{name} must be in {lo}..{hi}, got {value}")
        return value

    def bool(self, name: str, default: bool = False) -> bool:
        text = self.values.get(name)
        if text is None:
            return default
        low = text.lower()
        if low in ("true", "1", "yes", ""):
            return True
        if low in ("false", "0", "no"):
            return False
        raise HttpError(400, f"{name} must be true or false, got {text!r}")

    def ledger_id(self):
        """BP-35: ledger_id with ledger_scope_id (default 0), or ledger_qualified_name."""
        qname = self.values.get("ledger_qualified_name")
        scope = self.int("ledger_scope_id")
        if qname is not None:
            if "ledger_id" in self.values:
                raise HttpError(400, "give ledger_id or ledger_qualified_name, not both")
            try:
                lid = LedgerId.parse(qname)
            except IllegalOpError as exc:
                raise HttpError(400, str(exc)) from None
            if scope is not None and scope != lid.scope_id:
                raise HttpError(400, f"ledger_scope_id {scope} disagrees with the qualified name's "
                                     f"scope id {lid.scope_id}")
            return lid
        lid_value = self.int("ledger_id")
        if lid_value is None:
            raise HttpError(400, "ledger_id (with ledger_scope_id) or ledger_qualified_name is required")
        try:
            return LedgerId(scope or 0, lid_value)
        except IllegalOpError as exc:
            raise HttpError(400, str(exc)) from None


LEDGER_PARAMS = ("ledger_id", "ledger_scope_id", "ledger_qualified_name")


def _json(obj, status: int = 200):
    return status, "application/json", json.dumps(obj, default=str).encode(), None


class BookieRoutes:
    """The endpoints above, each a method taking the request's Params and answering (status,
    content type, body, headers); ``routes`` maps each path to (methods, method, accepted
    parameters). AdminServer (admin/http.py) is one: it supplies ``bookie``, ``server``,
    ``meta``, ``metrics``, ``autorecovery``, ``ready``, ``shutting_down``, ``started_at``,
    ``advertised_address``, ``address`` and ``client_ctx()``, and samples ``_history``."""

    def __init__(self):
        self._gc_lock = threading.Lock()
        self._gc_thread: threading.Thread | None = None
        self._gc_last: dict | None = None
        self._history: collections.deque = collections.deque(maxlen=HISTORY_POINTS)
        self._ur_lock = threading.Lock()
        self._ur_cache = (-1e9, None)
        self._lag_lock = threading.Lock()
        self._lag_cache = (-1e9, None)
        self.routes = {
            "/heartbeat": (("GET",), self.heartbeat, ()),
            "/api/v1/bookie/is_ready": (("GET",), self.is_ready, ()),
            "/api/v1/bookie/state": (("GET",), self.state, ()),
            "/api/v1/bookie/info": (("GET",), self.info, ()),
            "/api/v1/bookie/list_bookies": (("GET",), self.list_bookies, ("type", "print_hostnames")),
            "/api/v1/bookie/list_bookie_info": (("GET",), self.list_bookie_info, ()),
            "/api/v1/bookie/ledgers": (("GET",), self.local_ledgers, ("ledger_scope_id", "limit")),
            "/api/v1/bookie/cluster_info": (("GET",), self.cluster_info, ()),
            "/api/v1/bookie/last_log_mark": (("GET",), self.last_log_mark, ()),
            "/api/v1/bookie/list_disk_file": (("GET",), self.list_disk_file, ("file_type",)),
            "/api/v1/bookie/state/readonly": (("GET", "PUT"), self.readonly, ()),
            "/api/v1/bookie/gc": (("GET", "PUT"), self.gc, ("force_major", "force_minor")),
            "/api/v1/bookie/missing_ledgers": (("GET", "DELETE"), self.missing_ledgers, LEDGER_PARAMS),
            "/api/v1/bookie/deletion_halt": (("GET", "DELETE"), self.deletion_halt, ()),
            "/api/v1/config/server_config": (("GET",), self.server_config, ()),
            "/api/v1/ledger/list": (("GET",), self.ledger_list,
                                    ("ledger_scope_id", "print_metadata", "limit")),
            "/api/v1/ledger/metadata": (("GET",), self.ledger_metadata, LEDGER_PARAMS),
            "/api/v1/ledger/read": (("GET",), self.ledger_read,
                                    LEDGER_PARAMS + ("start_entry_id", "end_entry_id")),
            "/api/v1/ledger/delete": (("DELETE",), self.ledger_delete, LEDGER_PARAMS),
            "/api/v1/autorecovery/status": (("GET",), self.autorecovery_status, ()),
            "/api/v1/autorecovery/list_under_replicated_ledger": (("GET",), self.underreplicated, ()),
            "/api/v1/autorecovery/who_is_auditor": (("GET",), self.who_is_auditor, ()),
            "/api/v1/autorecovery/trigger_audit": (("PUT",), self.trigger_audit, ()),
            "/api/v1/status/rates": (("GET",), self.rates, ()),
            "/api/v1/status/history": (("GET",), self.history, ()),
            "/metrics": (("GET",), self.prometheus, ()),
            "/status": (("GET",), self.status_page, ()),
            "/": (("GET",), self.root, ()),
        }

    # -- bookie ------------------------------------------------------------------------------

    def heartbeat(self, p):
        return 200, "text/plain; charset=utf-8", b"OK\n", None

    def _state_name(self) -> str:
        if self.shutting_down:
            return "shutting_down"
        return "read_only" if self.bookie.read_only else "writable"

    def is_ready(self, p):
        ready = self.ready and not self.shutting_down
        return _json({"ready": ready, "state": self._state_name()}, 200 if ready else 503)

    def state(self, p):
        return _json({"bookie_id": self.bookie.bookie_id, "running": not self.shutting_down,
                      "ready": self.ready and not self.shutting_down,
                      "read_only": bool(self.bookie.read_only),
                      "read_only_reasons": sorted(self.bookie.read_only_reasons),
                      "shutting_down": self.shutting_down, "state": self._state_name()})

    def readonly(self, p):
        """BookKeeper's state/readonly: GET the mode, PUT {"readOnly": bool} to set or lift the
        operator's reason (the disks' reason stays until they have room)."""
        if p.method == "PUT":
            flag = p.body.get("readOnly", p.body.get("read_only"))
            if not isinstance(flag, bool):
                raise HttpError(400, 'PUT a JSON body {"readOnly": true|false}')
            self.bookie.set_read_only("operator", flag)
            log.warning("operator read-only mode %s through the admin API", "on" if flag else "off")
        return _json({"readOnly": bool(self.bookie.read_only),
                      "reasons": sorted(self.bookie.read_only_reasons)})

    def last_log_mark(self, p):
        mark = self.bookie.statistics().get("last_log_mark")
        journal_id, offset = (mark if isinstance(mark, (tuple, list)) and len(mark) == 2 else (None, None))
        return _json({self.bookie.journal_dir: {
            "journal_id": "%x" % journal_id if isinstance(journal_id, int) else None,
            "offset": offset}})

    def list_disk_file(self, p):
        wanted = [k.strip() for k in (p.get("file_type") or ",".join(KINDS)).split(",") if k.strip()]
        for k in wanted:
            if k not in KINDS:
                raise HttpError(400, f"file_type is a list of {', '.join(KINDS)}; got {k!r}")
        files = list_files(self.bookie.ledger_currents, self.bookie.journal_dir, wanted)
        return _json({"files": files, "count": len(files),
                      "bytes": sum(f["bytes"] for f in files)})

    def gc(self, p):
        """PUT: a garbage collection cycle now, in the background (BookKeeper's forceGC);
        GET: whether one is under way, and the last report."""
        if p.method == "PUT":
            major, minor = p.bool("force_major"), p.bool("force_minor")
            with self._gc_lock:
                if self._gc_thread is None or not self._gc_thread.is_alive():
                    def cycle():
                        try:
                            self._gc_last = self.bookie.gc.run_once(force_major=major,
                                                                    force_minor=minor)
                        except Exception as exc:      # logged and reported, never raised here
                            log.exception("garbage collection asked through the admin API failed")
                            self._gc_last = {"error": f"{type(exc).__name__}: {exc}"}
                    self._gc_thread = threading.Thread(target=cycle, name="embedlog-admin-gc",
                                                       daemon=True)
                    self._gc_thread.start()
        running = self._gc_thread is not None and self._gc_thread.is_alive()
        return _json({"is_in_force_gc": running, "last": self._gc_last,
                      "stats": dict(self.bookie.gc.stats)})

    def missing_ledgers(self, p):
        """GET: the ledgers this bookie holds that the metadata store has neither a row nor a
        deletion record for (GC keeps them: docs/METADATA.md); DELETE: an operator's
        confirmation, for one ledger (a ledger parameter) or all of them."""
        gc = self.bookie.gc
        if p.method == "DELETE":
            one = p.ledger_id() if any(p.values.get(k) is not None for k in LEDGER_PARAMS) else None
            return _json({"deleted": gc.delete_missing(None if one is None else [one])})
        rows = [{**ledger_ref(lid), "first_seen_ms": ms} for lid, ms in gc.missing_ledgers()]
        return _json({"count": len(rows), "missing": rows})

    def deletion_halt(self, p):
        """GET: whether ledger deletion is halted here because the metadata store looks older
        than what the bookie has seen (bookie/rollback.py), and why; DELETE: resume it."""
        gc = self.bookie.gc
        if p.method == "DELETE":
            return _json({"resumed": list(gc.resume_deletion().values())})
        return _json({"halted": gc.halt.halted, "reasons": list(gc.halt.reasons.values()),
                      "highest_mark": gc.halt.highest_mark})

    def bookie_info(self) -> dict:
        s = self.bookie.statistics()
        j = s.get("journal", {})
        disk = self.metrics.disk.get()
        cfg = self.bookie.config
        ver = getattr(embedlog, "__version__", "unknown")
        return {
            "bookie_id": self.bookie.bookie_id,
            "address": self.advertised_address or self.server.address,
            "listen": self.server.address,
            "http": self.address,
            "pid": os.getpid(),
            "version": ver,
            "uptime_s": round(time.time() - self.started_at, 3),
            "state": self._state_name(),
            "read_only": bool(self.bookie.read_only),
            "directory": self.bookie.directory,
            "ledgers": s.get("ledgers", 0),
            "add_entries": s.get("adds", 0),
            "add_bytes": s.get("add_bytes", 0),
            "read_entries": s.get("reads", 0),
            "disk": disk,
            "journal": {**j, "directory": self.bookie.journal_dir,
                        "last_log_mark": s.get("last_log_mark"),
                        "max_group_wait_ms": cfg.journal_max_group_wait_ms,
                        "sync_data": cfg.journal_sync_data},
            "entry_logs": {"count": disk["entry_logs"], "bytes": disk["entry_log_bytes"],
                           "rolls": s.get("entry_log_rolls", 0),
                           "size_limit_bytes": cfg.entry_log_size_limit},
            "memtable": {"bytes": s.get("memtable_bytes", 0), "entries": s.get("memtable_entries", 0),
                         "allocated_bytes": s.get("memtable_allocated_bytes", 0),
                         "flushes": s.get("memtable_flushes", 0),
                         "limit_bytes": cfg.skip_list_size_limit},
            "index_pages_cached": s.get("index_pages_cached", 0),
            "checkpoints": s.get("checkpoints", 0),
            "compaction": {"progress": compaction_progress(s)},
            "server": {k: v for k, v in self.server.stats.items() if isinstance(v, int)},
        }

    def info(self, p):
        return _json(self.bookie_info())

    def list_bookies(self, p):
        kind = p.get("type") or "all"
        if kind not in ("rw", "ro", "all"):
            raise HttpError(400, f"type must be rw, ro or all, got {kind!r}")
        p.bool("print_hostnames")
        rc = self.meta.registration_client
        regs = rc.get_all_bookies()
        out = {}
        if kind in ("rw", "all"):
            out["writable"] = [_reg(r) for r in regs if not r.read_only]
        if kind in ("ro", "all"):
            out["read_only"] = [_reg(r) for r in regs if r.read_only]
        return _json(out)

    def local_ledgers(self, p):
        scope = p.int("ledger_scope_id", 0)
        limit = p.int("limit", LIST_LIMIT_DEFAULT, 1, LIST_LIMIT_MAX)
        lids = sorted(self.bookie.list_ledgers(scope), key=lambda l: l.ledger_id)
        out = []
        for lid in lids[:limit]:
            row = ledger_ref(lid)
            try:
                row["last_entry_id"] = self.bookie.read_last_entry_id(lid)
            except NoSuchLedgerError:
                continue
            out.append(row)
        return _json({"bookie_id": self.bookie.bookie_id, "ledger_scope_id": scope,
                      "ledgers": out, "count": len(out), "truncated": len(lids) > limit})

    def server_config(self, p):
        return _json(self.bookie.config.as_dict())

    # -- ledgers (metadata store) -----------------------------------------------------------------

    def ledger_list(self, p):
        scope = p.int("ledger_scope_id", 0)
        details = p.bool("print_metadata")
        limit = p.int("limit", LIST_LIMIT_DEFAULT, 1, LIST_LIMIT_MAX)
        lm = self.meta.ledger_manager
        out, truncated = [], False
        for lid in lm.iterate_ledgers(scope):
            if len(out) >= limit:
                truncated = True
                break
            if details:
                try:
                    out.append(metadata_dict(lm.read_ledger_metadata(lid).value))
                except NoSuchLedgerError:
                    continue            # deleted while we listed
            else:
                out.append(ledger_ref(lid))
        return _json({"ledger_scope_id": scope, "ledgers": out, "count": len(out),
                      "truncated": truncated})

    def ledger_metadata(self, p):
        lid = p.ledger_id()
        return _json(metadata_dict(self.meta.ledger_manager.read_ledger_metadata(lid).value))

    def ledger_read(self, p):
        """Entries of a ledger, read from its bookies as a client reads them (digests
        checked): start_entry_id (default 0) to end_entry_id (default the LAC), at most
        READ_ENTRIES_MAX of them."""
        lid = p.ledger_id()
        md = self.meta.ledger_manager.read_ledger_metadata(lid).value
        r = ReadHandle(self.client_ctx(), md, md.password)
        first = p.int("start_entry_id", 0, 0, (1 << 63) - 1)
        last = p.int("end_entry_id", None, 0, (1 << 63) - 1)
        lac = r.last_add_confirmed
        last = lac if last is None else min(last, lac)
        truncated = last - first + 1 > READ_ENTRIES_MAX
        last = min(last, first + READ_ENTRIES_MAX - 1)
        entries = ([{"entry_id": first + i, **data_dict(d)}
                    for i, d in enumerate(r.read_batch(first, last))] if last >= first else [])
        return _json({**ledger_ref(lid), "last_add_confirmed": lac, "entries": entries,
                      "truncated": truncated})

    def ledger_delete(self, p):
        lid = p.ledger_id()
        self.meta.ledger_manager.remove_ledger_metadata(lid)
        return _json({**ledger_ref(lid), "deleted": True})

    # -- autorecovery ------------------------------------------------------------------------------

    def _underreplicated(self) -> dict:
        return underreplicated(self.meta)

    def _underreplicated_count(self):
        with self._ur_lock:
            at, count = self._ur_cache
            if time.monotonic() - at < UNDERREPLICATED_CACHE_S:
                return count
        try:
            count = len(self._underreplicated())
        except EmbedlogError:
            count = None                 # the store is unreachable: no figure rather than a wrong one
        with self._ur_lock:
            self._ur_cache = (time.monotonic(), count)
        return count

    def _group_lags(self):
        """Consumer groups' lag per stream (client/group.py), read at most every
        GROUP_LAG_CACHE_S: the groups' records, and each stream's LAC from its bookies."""
        with self._lag_lock:
            at, rows = self._lag_cache
            if time.monotonic() - at < GROUP_LAG_CACHE_S:
                return rows
            try:
                ends: dict = {}

                def end(name):
                    # the client context is made only when a group has positions to compare
                    if name not in ends:
                        v, _ = find_stream(self.meta, name)
                        ctx = self.client_ctx()
                        ends[name] = (None if v is None else
                                      ctx.run(read_lac(ctx, v.value, f"stream {name!r}")) + 1)
                    return ends[name]
                rows = group_lags(self.meta, end)
            except EmbedlogError:
                rows = None              # unreachable: no figure rather than a wrong one
            self._lag_cache = (time.monotonic(), rows)
            return rows

    def autorecovery_status(self, p):
        ar = self.autorecovery
        out = {"enabled": ar is not None, "bookie_id": self.bookie.bookie_id}
        if ar is not None:
            out.update(is_auditor=bool(ar.is_auditor), stats=dict(ar.stats),
                       interval_s=ar.interval_s, lost_bookie_grace_s=ar.grace_s)
        out["underreplicated_ledgers"] = len(self._underreplicated())
        return _json(out)

    def who_is_auditor(self, p):
        return _json({"auditor": current_auditor(self.meta)})

    def trigger_audit(self, p):
        """An audit now: every ledger with a fragment on an unregistered bookie is marked
        under-replicated (no grace period) for the replication workers."""
        marked = AutoRecovery(self.client_ctx(), self.bookie.bookie_id,
                              lost_bookie_grace_s=0.0).audit()
        return _json({"marked": [ledger_ref(lid) for lid in marked], "count": len(marked)})

    def list_bookie_info(self, p):
        """BookKeeper's list_bookie_info: each bookie's free and total disk space as its
        BOOKIE_INFO says (the bookies that answer), and the sums, in BookKeeper's strings."""
        ctx = self.client_ctx()
        infos = {b: i for b, i in ctx.run(bookie_infos(ctx, None, BOOKIE_INFO_TIMEOUT_S)).items()
                 if i is not None}
        if not infos:
            raise HttpError(404, "Not found any Bookie info.")
        out, free, total = {}, 0, 0
        for bookie_id, info in sorted(infos.items()):
            f, t = int(info.get("free_bytes", 0)), int(info.get("total_bytes", 0))
            out[bookie_id] = f": {{Free: {f}{_readable(f)}, Total: {t}{_readable(t)}}},"
            free, total = free + f, total + t
        out["ClusterInfo: "] = f"{{Free: {free}{_readable(free)}, Total: {total}{_readable(total)}}}"
        return _json(out)

    def cluster_info(self, p):
        """BookKeeper's cluster_info: bookie counts by state (unavailable: named in some
        ledger's ensemble, not registered), the auditor and the under-replicated count."""
        regs = self.meta.registration_client.get_all_bookies()
        registered = {r.bookie_id for r in regs}
        named, truncated = set(), False
        lm = self.meta.ledger_manager
        for k, lid in enumerate(lm.iterate_ledgers(None)):
            if k >= LIST_LIMIT_MAX:
                truncated = True
                break
            try:
                named.update(b for _f, ens in lm.read_ledger_metadata(lid).value.fragments for b in ens)
            except NoSuchLedgerError:
                continue
        auditor = current_auditor(self.meta)
        ur = len(self._underreplicated())
        return _json({"auditor_elected": auditor is not None, "auditor_id": auditor,
                      "cluster_under_replicated": ur > 0, "under_replicated_ledgers": ur,
                      "ledger_replication_enabled": self.autorecovery is not None or auditor is not None,
                      "total_bookies_count": len(registered | named),
                      "writable_bookies_count": sum(1 for r in regs if not r.read_only),
                      "readonly_bookies_count": sum(1 for r in regs if r.read_only),
                      "unavailable_bookies_count": len(named - registered),
                      "ledgers_scanned_truncated": truncated})

    def underreplicated(self, p):
        rows = [{**ledger_ref(lid), "missing_bookies": list(missing)}
                for lid, missing in sorted(self._underreplicated().items(),
                                           key=lambda kv: (kv[0].scope_id, kv[0].ledger_id))]
        return _json({"ledgers": rows, "count": len(rows)})

    # -- status page and its data -----------------------------------------------------------------

    def cluster_bookies(self) -> list:
        """Every registered bookie with its state and, asked over the wire, its counts."""
        rc = self.meta.registration_client
        regs = [(r, "read_only" if r.read_only else "writable") for r in rc.get_all_bookies()]
        infos = asyncio.run(_bookie_infos([(r.info or {}).get("address") for r, _ in regs]))
        out = []
        for (r, state), info in zip(regs, infos):
            row = {"bookie_id": r.bookie_id, "address": (r.info or {}).get("address"),
                   "http": (r.info or {}).get("http"), "state": state, "reachable": info is not None}
            if info is not None:
                row.update(add_entries=info.get("add_entries"), read_entries=info.get("read_entries"),
                           written_entries=info.get("written_entries"),
                           read_only_reasons=info.get("read_only_reasons", []),
                           ledgers=info.get("ledgers"), free_bytes=info.get("free_bytes"),
                           total_bytes=info.get("total_bytes"))
            else:
                row["state"] = "unreachable"
            out.append(row)
        return out

    def rates(self, p):
        return _json({"time": time.time(), "bookies": self.cluster_bookies()})

    def history(self, p):
        return _json({"bookie_id": self.bookie.bookie_id, "points": _rates(list(self._history))})

    def status_snapshot(self) -> dict:
        lm = self.meta.ledger_manager
        ledgers, truncated = [], False
        for lid in lm.iterate_ledgers(None):
            if len(ledgers) >= STATUS_LEDGERS_MAX:
                truncated = True
                break
            try:
                ledgers.append(metadata_dict(lm.read_ledger_metadata(lid).value))
            except NoSuchLedgerError:
                continue
        bookies = self.cluster_bookies()
        known = {b["bookie_id"] for b in bookies}
        down = sorted({b for md in ledgers for f in md["fragments"] for b in f["ensemble"]} - known)
        bookies += [{"bookie_id": b, "state": "down", "reachable": False} for b in down]
        return {"this": self.bookie_info(), "bookies": bookies, "ledgers": ledgers,
                "ledgers_truncated": truncated, "metadata_uri": getattr(self.meta, "uri", ""),
                "underreplicated": [{**ledger_ref(lid), "missing_bookies": list(m)}
                                    for lid, m in self._underreplicated().items()],
                "history": _rates(list(self._history)), "time": time.time()}

    def status_page(self, p):
        return 200, "text/html; charset=utf-8", render(self.status_snapshot()).encode(), None

    def root(self, p):
        return 302, "text/plain", b"see /status\n", {"Location": "/status"}

    def prometheus(self, p):
        return 200, CONTENT_TYPE_LATEST, self.metrics.exposition(), None


def _reg(r) -> dict:
    info = r.info or {}
    return {"bookie_id": r.bookie_id, "address": info.get("address"), "http": info.get("http"),
            "read_only": r.read_only}


def _rates(points: list) -> list:
    """[(t, adds, reads)] counters -> [{"t", "add_per_s", "read_per_s"}] between samples."""
    out = []
    for (t0, a0, r0), (t1, a1, r1) in zip(points, points[1:]):
        dt = t1 - t0
        if dt > 0:
            out.append({"t": round(t1, 3), "add_per_s": round(max(0, a1 - a0) / dt, 1),
                        "read_per_s": round(max(0, r1 - r0) / dt, 1)})
    return out


def _readable(n: int) -> str:
    """BookKeeper's getReadable: "(12.345GB)" in powers of 1000, rounded down; "" below 1000."""
    units, k = ("", "KB", "MB", "GB", "TB"), 0
    while n >= 1000 ** (k + 1) and k < len(units) - 1:
        k += 1
    if k == 0:
        return ""
    whole, rest = divmod(n * 1000 // 1000 ** k, 1000)
    return f"({whole}{'.' + f'{rest:03d}'.rstrip('0') if rest else ''}{units[k]})"


async def _bookie_infos(addresses: list) -> list:
    """BOOKIE_INFO of each address over the wire (None where it does not answer in time)."""

    async def one(addr):
        if not addr:
            return None
        conn = BookieConnection(addr, connect_timeout_s=BOOKIE_INFO_TIMEOUT_S)
        try:
            resp = await conn.call(lambda rid: P.bookie_info_request(rid), BOOKIE_INFO_TIMEOUT_S)
            return json.loads(bytes(resp.body))
        except (EmbedlogError, ValueError, OSError):
            return None
        finally:
            conn.close()

    return await asyncio.gather(*(one(a) for a in addresses))
