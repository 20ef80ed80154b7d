"""The admin HTTP server of one bookie process: off by default, on with
``http_server_enabled`` / ``--http-port`` (docs/OPERATIONS.md).

Endpoints (BookKeeper's paths where it has one). Answers are JSON unless noted; an error is
``{"error": message, "status": code}`` with a 4xx or 5xx status; an unknown query parameter
is a 400 (a misspelt ``ledger_scope_id`` must not silently mean scope 0)::

    GET    /heartbeat                                    "OK" (liveness)
    GET    /api/v1/bookie/is_ready                       200 {"ready": true} | 503 {"ready": false}
    GET    /api/v1/bookie/state                          running, read-only, shutting down
    GET    /api/v1/bookie/info                           identity, state, disk, journal, entry logs,
                                                         memtable, compaction
    GET    /api/v1/bookie/list_bookies?type=rw|ro|all    registered bookies
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
    GET    /metrics                                      Prometheus text format
    GET    /status                                       the status page (HTML); / redirects there

Requests that change something (every method but GET) must carry ``Authorization: Bearer
<token>``, or get 401: the bookie's shared token (``--auth-token-file``) when it has one,
else the admin token generated at its first start in ``<bookie dir>/admin-token`` (0600).
Reads stay open, as the status page is viewed in a browser (docs/SECURITY.md).

One reader thread receives every request whole (a deadline of REQUEST_DEADLINE_S each, so
slow or half-sent requests hold sockets, not threads); a fixed pool of worker threads
answers them, behind a bounded queue (a full queue answers 503 at once): the metadata
drivers keep a connection per thread, so a thread per request would open connections
without bound.
"""
from __future__ import annotations

import asyncio
import collections
import hmac
import io
import http.server
import json
import logging
import os
import queue
import re
import secrets
import selectors
import socket
import socketserver
import threading
import time
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

import embedlog
from embedlog._native.format import LedgerId
from embedlog.admin.metrics import BookieMetrics, compaction_progress
from embedlog.admin.status import render
from embedlog.bookie.files import KINDS, list_files
from embedlog.client.autorecovery import AutoRecovery, current_auditor
from embedlog.client.context import ClientConfig, ClientContext
from embedlog.client.read import ReadHandle
from embedlog.fileio import atomic_write
from embedlog.net.security import read_token
from embedlog.errors import (ConfigError, EmbedlogError, IllegalOpError, MetadataError,
                             NoSuchEntryError, NoSuchLedgerError)
from embedlog.meta.views import data_dict, ledger_ref, metadata_dict
from embedlog.net import protocol as P
from embedlog.net.transport import BookieConnection

log = logging.getLogger("embedlog.admin")

U64_MAX = (1 << 64) - 1
WORKERS = 4
MAX_BODY_BYTES = 64 * 1024       # a request body (PUT's JSON)
READ_ENTRIES_MAX = 1000          # entries /api/v1/ledger/read answers at most
QUEUE_LIMIT = 64                 # whole requests waiting for a worker; past it: 503
REQUEST_TIMEOUT_S = 10.0         # a worker's socket timeout while it answers
REQUEST_DEADLINE_S = 5.0         # a request must arrive whole within this; then it is dropped
PENDING_LIMIT = 1024             # connections still sending their request; past it: 503
MAX_HEAD_BYTES = 64 * 1024       # request line and headers
LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 1000, 100_000
STATUS_LEDGERS_MAX = 200         # ledgers the status page shows
HISTORY_POINTS = 300             # this bookie's rate history, one point a second
UNDERREPLICATED_CACHE_S = 5.0
BOOKIE_INFO_TIMEOUT_S = 1.0


class HttpError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def _status_of(exc: EmbedlogError) -> int:
    if isinstance(exc, (NoSuchLedgerError, NoSuchEntryError)):
        return 404
    if isinstance(exc, IllegalOpError):
        return 400
    if isinstance(exc, MetadataError):
        return 503
    return 500


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


# -- the server -----------------------------------------------------------------------------------

class _PooledServer(http.server.HTTPServer):
    """HTTPServer whose requests are read whole by one reader thread (a selector over every
    connection still sending, each with REQUEST_DEADLINE_S to finish), then answered by a
    fixed pool of workers. A slow or half-sent request holds a socket, never a worker, so
    80 of them cannot make /heartbeat wait or answer 503."""

    def __init__(self, address, handler, admin, family=socket.AF_INET):
        self.admin = admin
        self.address_family = family
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_LIMIT)
        self._pending: dict = {}          # socket -> [client address, bytes so far, deadline]
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        self._local = threading.local()
        self._stopping = False
        super().__init__(address, handler)
        # after the bind: a port in use leaves nothing open behind
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._reader = threading.Thread(target=self._read_requests, name="embedlog-admin-reader",
                                        daemon=True)
        self._reader.start()
        self._workers = [threading.Thread(target=self._work, name=f"embedlog-admin-{i}", daemon=True)
                         for i in range(WORKERS)]
        for t in self._workers:
            t.start()

    def server_bind(self):
        # HTTPServer.server_bind asks DNS for the host's FQDN; an admin port needs no name
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address):
        self._incoming.put((request, client_address))
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _refuse(self, request, status: bytes, message: bytes) -> None:
        body = b'{"error": "%s", "status": %s}' % (message, status[:3])
        try:
            request.setblocking(True)
            request.settimeout(1.0)
            request.sendall(b"HTTP/1.0 " + status + b"\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        except OSError:
            pass
        self.shutdown_request(request)

    def _read_requests(self):
        while not self._stopping:
            for key, _ in self._selector.select(timeout=0.25):
                if key.fileobj is self._wake_r:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                    continue
                self._read_more(key.fileobj)
            while True:
                try:
                    request, client_address = self._incoming.get_nowait()
                except queue.Empty:
                    break
                if len(self._pending) >= PENDING_LIMIT:
                    self._refuse(request, b"503 Service Unavailable", b"admin server busy")
                    continue
                request.setblocking(False)
                self._pending[request] = [client_address, b"", time.monotonic() + REQUEST_DEADLINE_S]
                self._selector.register(request, selectors.EVENT_READ)
            now = time.monotonic()
            for request in [r for r, (_a, _b, deadline) in self._pending.items() if deadline <= now]:
                self._drop(request)
                self._refuse(request, b"408 Request Timeout", b"the request did not arrive in time")

    def _drop(self, request) -> None:
        self._pending.pop(request, None)
        try:
            self._selector.unregister(request)
        except (KeyError, ValueError):
            pass

    def _read_more(self, request) -> None:
        entry = self._pending.get(request)
        if entry is None:
            return
        try:
            chunk = request.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:                          # the client went away
            self._drop(request)
            self.shutdown_request(request)
            return
        entry[1] += chunk
        data = entry[1]
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > MAX_HEAD_BYTES:
                self._drop(request)
                self._refuse(request, b"431 Request Header Fields Too Large", b"headers too large")
            return
        m = re.search(rb"(?im)^content-length:[ \t]*(\d{1,12})[ \t]*\r?$", data[:end])
        need = end + 4 + (int(m.group(1)) if m else 0)
        if need - end - 4 > MAX_BODY_BYTES:
            self._drop(request)
            self._refuse(request, b"413 Payload Too Large", b"request body too large")
            return
        if len(data) < need:
            return
        self._drop(request)
        request.setblocking(True)
        try:
            self._queue.put_nowait((request, entry[0], data))
        except queue.Full:
            self._refuse(request, b"503 Service Unavailable", b"admin server busy")

    def _work(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, client_address, data = item
            self._local.data = data
            try:
                self.finish_request(request, client_address)
            except Exception:
                log.exception("admin request from %s failed", client_address)
            finally:
                self.shutdown_request(request)

    def request_bytes(self) -> bytes:
        """The request the current worker is answering, as the reader received it."""
        return self._local.data

    def handle_error(self, request, client_address):
        log.exception("admin request from %s failed", client_address)

    def server_close(self):
        super().server_close()
        self._stopping = True
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._reader.join(timeout=2)
        for request in list(self._pending):
            self._drop(request)
            self.shutdown_request(request)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        for _ in self._workers:
            try:
                self._queue.put(None, timeout=1)
            except queue.Full:
                break
        for t in self._workers:
            t.join(timeout=2)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "embedlog-admin"
    protocol_version = "HTTP/1.0"
    timeout = REQUEST_TIMEOUT_S

    def setup(self):
        # the reader thread has received the whole request: parse it from memory
        self.connection = self.request
        self.connection.settimeout(self.timeout)
        self.rfile = io.BytesIO(self.server.request_bytes())
        self.wfile = self.connection.makefile("wb", buffering=0)

    def log_message(self, fmt, *args):          # no access log on stderr
        log.debug("admin %s " + fmt, self.client_address[0], *args)

    def send_error(self, code, message=None, explain=None):
        # malformed requests (the stdlib's own errors) answer JSON too, with a status line
        # even when the request line was too broken to name an HTTP version
        self.request_version = "HTTP/1.0"
        self.close_connection = True
        self._send_json(code, {"error": message or self.responses.get(code, ("error",))[0],
                               "status": code})

    def do_GET(self):
        self._handle("GET")

    def do_DELETE(self):
        self._handle("DELETE")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def _handle(self, method: str):
        admin = self.server.admin
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        try:
            route = admin.routes.get(path)
            if route is None:
                raise HttpError(404, f"no such endpoint {path!r}")
            methods, handler, accepted = route
            if method not in methods:
                raise HttpError(405, f"{path} takes {', '.join(methods)}, not {method}",
                                {"Allow": ", ".join(methods)})
            if method != "GET":
                admin.check_token(self.headers.get("Authorization"))
            params = Params(parts.query, accepted)
            params.method, params.body = method, self._json_body()
            result = handler(params)
        except HttpError as exc:
            self._send_json(exc.status, {"error": exc.message, "status": exc.status}, exc.headers)
            return
        except EmbedlogError as exc:
            status = _status_of(exc)
            self._send_json(status, {"error": str(exc), "status": status, "type": type(exc).__name__,
                                     "code": exc.code})
            return
        except Exception as exc:          # a bug: answer 500, keep serving, log it
            log.exception("admin endpoint %s failed", path)
            self._send_json(500, {"error": f"{type(exc).__name__}: {exc}", "status": 500})
            return
        status, content_type, body, headers = result
        self._send(status, content_type, body, headers)

    def _json_body(self) -> dict:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise HttpError(400, "bad Content-Length") from None
        if n <= 0:
            return {}
        if n > MAX_BODY_BYTES:
            raise HttpError(413, f"a request body is at most {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(self.rfile.read(n))
        except (ValueError, RecursionError):
            raise HttpError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the request body is a JSON object")
        return body

    def _send_json(self, status: int, obj, headers=None):
        self._send(status, "application/json", json.dumps(obj, default=str).encode(), headers)

    def _send(self, status: int, content_type: str, body: bytes, headers=None):
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:
            pass                     # the client went away


def _json(obj, status: int = 200):
    return status, "application/json", json.dumps(obj, default=str).encode(), None


ADMIN_TOKEN_FILE = "admin-token"


def admin_token(path: str) -> bytes:
    """The admin token in ``path``, made (random, 0600) if the file does not exist yet."""
    if not os.path.exists(path):
        atomic_write(path, secrets.token_hex(32).encode() + b"\n")
        log.warning("admin HTTP: changing requests need the token in %s", path)
    return read_token(path)


class AdminServer:
    """Serves the endpoints above for one bookie; start() binds, stop() closes."""

    def __init__(self, bookie, server, meta, *, host: str = "127.0.0.1", port: int = 8080,
                 metrics=None, advertised_address: str | None = None, client_config: dict | None = None):
        """``client_config``: ClientConfig options (TLS, token) for what this server asks of
        other bookies as a client (reading a ledger's entries, an audit).

        Requests that change something always need a token: the bookie's wire token when it
        has one (``--auth-token-file``), else the one in ``<bookie dir>/admin-token``,
        generated (0600) at the first start (``token_file`` names it)."""
        self.bookie = bookie
        self.server = server                   # the BookieServer (wire address, stats)
        self.meta = meta
        if metrics is None:
            metrics = BookieMetrics(bookie).watch(server)
        self.metrics = metrics
        self.metrics.underreplicated = self._underreplicated_count
        self.host, self.port = host, port
        self.advertised_address = advertised_address
        # the wire's shared token, when the bookie has one, guards what changes things here;
        # without one, a token of the admin server's own (never no token: anyone reaching the
        # port could delete ledgers)
        self.auth_token: bytes | None = getattr(server, "auth_token", None)
        self.token_file: str | None = None
        if self.auth_token is None:
            self.token_file = os.path.join(bookie.directory, ADMIN_TOKEN_FILE)
            self.auth_token = admin_token(self.token_file)
        self.autorecovery = None
        self.client_config = dict(client_config or {})
        self._client_ctx = None
        self._client_lock = threading.Lock()
        self._gc_lock = threading.Lock()
        self._gc_thread: threading.Thread | None = None
        self._gc_last: dict | None = None
        self.ready = False
        self.shutting_down = False
        self.started_at = time.time()
        self._httpd: _PooledServer | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._history: collections.deque = collections.deque(maxlen=HISTORY_POINTS)
        self._ur_lock = threading.Lock()
        self._ur_cache = (-1e9, None)
        self.routes = {
            "/heartbeat": (("GET",), self.heartbeat, ()),
            "/api/v1/bookie/is_ready": (("GET",), self.is_ready, ()),
            "/api/v1/bookie/state": (("GET",), self.state, ()),
            "/api/v1/bookie/info": (("GET",), self.info, ()),
            "/api/v1/bookie/list_bookies": (("GET",), self.list_bookies, ("type", "print_hostnames")),
            "/api/v1/bookie/ledgers": (("GET",), self.local_ledgers, ("ledger_scope_id", "limit")),
            "/api/v1/bookie/cluster_info": (("GET",), self.cluster_info, ()),
            "/api/v1/bookie/last_log_mark": (("GET",), self.last_log_mark, ()),
            "/api/v1/bookie/list_disk_file": (("GET",), self.list_disk_file, ("file_type",)),
            "/api/v1/bookie/state/readonly": (("GET", "PUT"), self.readonly, ()),
            "/api/v1/bookie/gc": (("GET", "PUT"), self.gc, ("force_major", "force_minor")),
            "/api/v1/bookie/missing_ledgers": (("GET", "DELETE"), self.missing_ledgers, LEDGER_PARAMS),
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

    def check_token(self, authorization: str | None) -> None:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("latin-1"),
                                                                 self.auth_token):
            raise HttpError(401, "changing requests need the bookie's token (its --auth-token-file, "
                                 "else the admin-token file in its directory): send "
                                 "'Authorization: Bearer <token>'",
                            {"WWW-Authenticate": 'Bearer realm="embedlog"'})

    # -- lifetime ------------------------------------------------------------------------------

    def start(self) -> "AdminServer":
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            self._httpd = _PooledServer((self.host, self.port), _Handler, self, family)
        except OSError as exc:
            raise ConfigError(f"http_server_port: cannot listen on {self.host}:{self.port}: "
                              f"{exc.strerror}") from None
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.25},
                                        name="embedlog-admin", daemon=True)
        self._thread.start()
        threading.Thread(target=self._sample_loop, name="embedlog-admin-sampler", daemon=True).start()
        return self

    @property
    def address(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"{host}:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._gc_thread is not None:
            self._gc_thread.join(timeout=60)
        with self._client_lock:
            ctx, self._client_ctx = self._client_ctx, None
        if ctx is not None:
            ctx.close()

    def client_ctx(self):
        """A client context of this bookie's cluster (made on first use; closed by stop())."""
        with self._client_lock:
            if self._client_ctx is None:
                self._client_ctx = ClientContext(self.meta, ClientConfig(
                    client_name=f"admin-{self.bookie.bookie_id}", **self.client_config))
            return self._client_ctx

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            st = self.bookie.stats
            self._history.append((time.time(), st.get("adds", 0), st.get("reads", 0)))
            self._stop.wait(1.0)

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
        return self.meta.underreplication.list_underreplicated()

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
