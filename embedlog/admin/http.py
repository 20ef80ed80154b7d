"""The admin HTTP server of one bookie process: off by default, on with
``http_server_enabled`` / ``--http-port`` (docs/OPERATIONS.md).

The endpoints and what they answer are admin/routes.py's; this module is the server that
carries them.

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
from urllib.parse import urlsplit

from embedlog.admin.metrics import BookieMetrics
from embedlog.admin.routes import BookieRoutes, HttpError, Params
from embedlog.client.context import ClientConfig, ClientContext
from embedlog.fileio import atomic_write
from embedlog.net.security import read_token
from embedlog.errors import (ConfigError, EmbedlogError, IllegalOpError, MetadataError,
                             NoSuchEntryError, NoSuchLedgerError)

log = logging.getLogger("embedlog.admin")

WORKERS = 4
MAX_BODY_BYTES = 64 * 1024       # a request body (PUT's JSON)
QUEUE_LIMIT = 64                 # whole requests waiting for a worker; past it: 503
REQUEST_TIMEOUT_S = 10.0         # a worker's socket timeout while it answers
REQUEST_DEADLINE_S = 5.0         # a request must arrive whole within this; then it is dropped
PENDING_LIMIT = 1024             # connections still sending their request; past it: 503
MAX_HEAD_BYTES = 64 * 1024       # request line and headers


def _status_of(exc: EmbedlogError) -> int:
    if isinstance(exc, (NoSuchLedgerError, NoSuchEntryError)):
        return 404
    if isinstance(exc, IllegalOpError):
        return 400
    if isinstance(exc, MetadataError):
        return 503
    return 500


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


ADMIN_TOKEN_FILE = "admin-token"


def admin_token(path: str) -> bytes:
    """The admin token in ``path``, made (random, 0600) if the file does not exist yet."""
    if not os.path.exists(path):
        atomic_write(path, secrets.token_hex(32).encode() + b"\n")
        log.warning("admin HTTP: changing requests need the token in %s", path)
    return read_token(path)


class AdminServer(BookieRoutes):
    """Serves admin/routes.py's endpoints for one bookie; start() binds, stop() closes."""

    def __init__(self, bookie, server, meta, *, host: str = "127.0.0.1", port: int = 8080,
                 metrics=None, advertised_address: str | None = None, client_config: dict | None = None):
        """``client_config``: ClientConfig options (TLS, token) for what this server asks of
        other bookies as a client (reading a ledger's entries, an audit).

        Requests that change something always need a token: the bookie's wire token when it
        has one (``--auth-token-file``), else the one in ``<bookie dir>/admin-token``,
        generated (0600) at the first start (``token_file`` names it)."""
        BookieRoutes.__init__(self)             # the endpoints' own state, and the route table
        self.bookie = bookie
        self.server = server                   # the BookieServer (wire address, stats)
        self.meta = meta
        if metrics is None:
            metrics = BookieMetrics(bookie).watch(server)
        self.metrics = metrics
        self.metrics.underreplicated = self._underreplicated_count
        self.metrics.group_lags = self._group_lags
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
        self.ready = False
        self.shutting_down = False
        self.started_at = time.time()
        self._httpd: _PooledServer | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

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
