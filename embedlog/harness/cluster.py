"""LocalCluster: N bookie processes on 127.0.0.1, with faults on demand.

Each bookie is a fresh interpreter (`python -m embedlog.cli bookie serve`), never a
fork, with its own directory under ``base_dir``. With ``proxies=True`` (the default)
each bookie advertises the address of a FaultProxy in this process, so a test can
delay, drop or cut one bookie's traffic; the proxy keeps its port across restarts.
With ``tls=True`` the cluster makes a throwaway CA and certificates (trustme) under
``base_dir/tls``; with ``tls_client_auth=True`` bookies also require client certificates;
with ``auth_token`` bookies require that token. ``client()`` gets the matching options.

A bookie process that exits unasked (not by kill_bookie, stop_bookie, restart_bookie or
close) is a crash: the next verb, ``client()`` or ``close()`` raises BookieCrashedError with
its exit code or signal and its log's last lines, once per crash, so a test whose bookie
died fails saying so instead of timing out on a missing bookie.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from embedlog import forking
from embedlog.errors import BookieCrashedError, ConfigError, EmbedlogError, IllegalOpError
from embedlog.fileio import file_in_the_way
from embedlog.client import Client
from embedlog.harness.faults import Faults
from embedlog.harness.proxy import FaultProxy
from embedlog.harness import servers
from embedlog.harness.servers import PortTaken, free_port, port_taken, start_retrying
from embedlog.meta import open_metadata_store

START_TIMEOUT_S = 30.0


class _Bookie:
    def __init__(self, index: int, directory: str):
        self.index = index
        self.directory = directory
        self.process: subprocess.Popen | None = None
        self.port = free_port()
        self.proxy: FaultProxy | None = None
        self.bookie_id: str | None = None
        self.read_only = False
        self.env: dict = {}              # more environment for its process (restart_bookie)
        self.log_path = os.path.join(directory, "bookie.log")
        # its exit is known to the owner: asked for, or already reported as a crash
        self.exit_known = False

    def crashed(self) -> bool:
        return (self.process is not None and not self.exit_known
                and self.process.poll() is not None)


class LocalCluster:
    """A local BookKeeper cluster for tests and users (docs/ARCHITECTURE.md, "Public names")."""

    def __init__(self, bookies: int = 3, metadata: str = "sqlite", base_dir: str | None = None, *,
                 proxies: bool = True, bookie_config: dict | None = None, start: bool = True,
                 autorecovery: bool = True, lost_bookie_grace_s: float = 3.0,
                 tls: bool = False, tls_client_auth: bool = False, auth_token: str | bytes | None = None):
        if metadata not in ("sqlite", "zk", "etcd") and "://" not in metadata:
            raise IllegalOpError(f"metadata is 'sqlite', 'zk', 'etcd' or a metadata URI of a "
                                 f"store that exists, got {metadata!r}")
        self._own_dir = base_dir is None
        self.base_dir = os.path.abspath(base_dir or tempfile.mkdtemp(prefix="embedlog-cluster-"))
        blocker = file_in_the_way(self.base_dir)
        if blocker is not None:
            raise ConfigError(f"LocalCluster cannot keep its data in {self.base_dir}: {blocker} "
                              f"is a file, not a directory")
        os.makedirs(self.base_dir, exist_ok=True)
        self.metadata_kind = metadata
        self.proxies = proxies
        self.bookie_config = dict(bookie_config or {})
        self.autorecovery = autorecovery
        self.lost_bookie_grace_s = lost_bookie_grace_s
        self._bookies: list[_Bookie] = []
        self._spawned: list = []                # every bookie process ever started: none outlives close()
        self.faults = Faults(self)              # per-message rules and metadata gates (faults.py)
        self._server = None
        self._clients: list = []
        self.serve_options: list[str] = []      # security options for every bookie
        self.client_config: dict = {}           # and the matching ClientConfig options
        # an owner that never calls close() (no `with`, an exception) still stops the bookies
        # and removes its directory at exit; a SIGKILLed one's bookies stop on their own
        # (--parent-pid: each watches its parent)
        atexit.register(self._close_at_exit)
        forking.track(self)
        self._make_security(tls, tls_client_auth, auth_token)
        self.metadata_uri = self._start_metadata()
        if start:
            try:
                for _ in range(bookies):
                    self.add_bookie()
            except BaseException:
                self.close()
                raise

    def _make_security(self, tls: bool, client_auth: bool, token) -> None:
        if client_auth and not tls:
            raise IllegalOpError("tls_client_auth=True needs tls=True")
        if tls:
            import trustme  # lazy: a test-only package, needed only for tls=True
            d = os.path.join(self.base_dir, "tls")
            os.makedirs(d, exist_ok=True)
            ca = trustme.CA()
            paths = {n: os.path.join(d, n) for n in ("ca.pem", "bookie.pem", "client.pem")}
            ca.cert_pem.write_to_path(paths["ca.pem"])
            # the bookies listen (and proxies advertise) on 127.0.0.1: an IP address SAN, so
            # the client's hostname check stays on
            ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
                paths["bookie.pem"])
            ca.issue_cert("embedlog-client.invalid").private_key_and_cert_chain_pem.write_to_path(
                paths["client.pem"])
            self.tls_files = paths
            self.serve_options += ["--tls-cert-file", paths["bookie.pem"]]
            self.client_config["tls_ca_file"] = paths["ca.pem"]
            if client_auth:
                self.serve_options += ["--tls-ca-file", paths["ca.pem"]]
                self.client_config["tls_cert_file"] = paths["client.pem"]
        if token is not None:
            path = os.path.join(self.base_dir, "auth-token")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(token.encode() if isinstance(token, str) else bytes(token))
            self.auth_token_file = path
            self.serve_options += ["--auth-token-file", path]
            self.client_config["auth_token_file"] = path

    # -- metadata ---------------------------------------------------------------------

    def _start_metadata(self) -> str:
        if "://" in self.metadata_kind:
            # a store someone else runs (a BookKeeper cluster's root): the bookies join it,
            # and bookies never make one, so a new root is formatted here first (in the
            # format the URI asks for; a root that exists is left as it is)
            open_metadata_store(self.metadata_kind, **(
                {"timeout_s": 30} if self.metadata_kind.startswith("zk") else {})).close()
            return self.metadata_kind
        if self.metadata_kind == "sqlite":
            uri = "sqlite://" + os.path.join(self.base_dir, "meta.db")
        elif self.metadata_kind == "zk":
            self._server = servers.ZooKeeperServer()
            uri = f"zk+hierarchical://{self._server.hosts}/ledgers"
        else:
            self._server = servers.EtcdServer()
            uri = f"etcd://{self._server.endpoint}/embedlog"
        # the cluster makes its store (a client only opens one that exists), before any bookie;
        # a ZooKeeper just started may take its time to take a session on a loaded machine
        open_metadata_store(uri, **({"timeout_s": 30} if self.metadata_kind == "zk" else {})).close()
        return uri

    # -- bookies ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._bookies)

    def _b(self, i: int) -> _Bookie:
        if not isinstance(i, int) or not 0 <= i < len(self._bookies):
            raise IllegalOpError(f"no bookie {i!r} in a cluster of {len(self._bookies)}")
        return self._bookies[i]

    def add_bookie(self) -> int:
        """Start one more bookie; returns its index."""
        self.check_bookies()
        i = len(self._bookies)
        b = _Bookie(i, os.path.join(self.base_dir, f"bookie-{i}"))
        os.makedirs(b.directory, exist_ok=True)
        if self.proxies:
            b.proxy = FaultProxy(b.port)
        self._bookies.append(b)
        self._start(b)
        return i

    def _start(self, b: _Bookie) -> None:
        def new_port():
            b.port = free_port()
            if b.proxy is not None:
                b.proxy.retarget(b.port)
        start_retrying(lambda: self._launch(b), f"bookie {b.index}", new_port)

    def _launch(self, b: _Bookie) -> None:
        ready = os.path.join(b.directory, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        cmd = [sys.executable, "-m", "embedlog.cli", "bookie", "serve", "--dir", b.directory,
               "--listen", f"127.0.0.1:{b.port}", "--metadata", self.metadata_uri,
               "--ready-file", ready, "--parent-pid", str(os.getpid())]
        if b.proxy is not None:
            cmd += ["--advertised-address", b.proxy.address]
        if b.read_only:
            cmd.append("--read-only")
        if self.autorecovery:
            cmd += ["--autorecovery", "--lost-bookie-grace", str(self.lost_bookie_grace_s)]
        for k, v in self.bookie_config.items():
            cmd += ["--set", f"{k}={v}"]
        cmd += self.serve_options
        env = dict(os.environ, **b.env)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        log = open(b.log_path, "ab")
        b.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        b.exit_known = False
        self._spawned.append(b.process)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(ready):
            if b.process.poll() is not None:
                b.exit_known = True               # the error below says so
                if port_taken(_tail(b.log_path)):
                    raise PortTaken(_tail(b.log_path))
                raise EmbedlogError(f"bookie {b.index} exited with {b.process.returncode}; "
                                    f"see {b.log_path}:\n{_tail(b.log_path)}")
            if time.monotonic() > deadline:
                b.exit_known = True
                b.process.kill()
                raise EmbedlogError(f"bookie {b.index} did not start in {START_TIMEOUT_S} s; "
                                    f"see {b.log_path}:\n{_tail(b.log_path)}")
            time.sleep(0.01)
        with open(ready) as f:
            b.bookie_id = f.read().split()[0]

    def kill_bookie(self, i: int) -> None:
        """SIGKILL: no clean shutdown, its registration expires on its own."""
        self.check_bookies()
        b = self._b(i)
        b.exit_known = True
        if b.process is not None and b.process.poll() is None:
            os.kill(b.process.pid, signal.SIGCONT)
            b.process.kill()
            b.process.wait()

    def stop_bookie(self, i: int) -> None:
        """SIGTERM: the bookie leaves the metadata store and closes cleanly."""
        self.check_bookies()
        b = self._b(i)
        b.exit_known = True
        if b.process is not None and b.process.poll() is None:
            os.kill(b.process.pid, signal.SIGCONT)
            b.process.terminate()
            try:
                b.process.wait(30)
            except subprocess.TimeoutExpired:
                b.process.kill()
                b.process.wait()

    def start_bookie(self, i: int) -> None:
        """Start bookie ``i`` again on its directories and port (after kill_bookie or
        stop_bookie); returns once it is ready."""
        self.check_bookies()
        b = self._b(i)
        if b.process is not None and b.process.poll() is None:
            raise IllegalOpError(f"bookie {i} is running")
        self._start(b)

    def restart_bookie(self, i: int, env: dict | None = None) -> None:
        """Stop (if running) and start again on the same directories. ``env``: more
        environment for this process only (EMBEDLOG_FAILPOINTS, say), kept until the next
        restart. Setting os.environ instead reached every process started meanwhile, such
        as another cluster's bookies started in the background (tests/interop/prestart.py)."""
        b = self._b(i)
        self.stop_bookie(i)
        if b.proxy is not None:
            b.proxy.heal()
        b.env = dict(env or {})
        self._start(b)

    def suspend_bookie(self, i: int) -> None:
        """SIGSTOP bookie ``i``; returns once all its threads are stopped, none of them inside
        a write to a SQLite metadata store (which would hold every other writer back)."""
        sqlite_uri = self.metadata_uri if self.metadata_uri.startswith("sqlite:") else None
        servers.suspend(self._running(i).pid, sqlite_uri=sqlite_uri)

    def resume_bookie(self, i: int) -> None:
        os.kill(self._running(i).pid, signal.SIGCONT)

    def set_read_only(self, i: int, flag: bool = True) -> None:
        """Turn a bookie read-only (adds fail with ReadOnlyBookieError) or writable again."""
        b = self._b(i)
        b.read_only = bool(flag)
        proc = self._running(i)
        os.kill(proc.pid, signal.SIGUSR1 if flag else signal.SIGUSR2)
        # wait until the registration says so
        deadline = time.monotonic() + 10
        with self.client() as c:
            while time.monotonic() < deadline:
                writable, readonly = c.bookies()
                if (b.bookie_id in readonly) == b.read_only and (b.bookie_id in writable) != b.read_only:
                    return
                time.sleep(0.02)
        raise EmbedlogError(f"bookie {i} did not turn {'read-only' if flag else 'writable'}")

    def _running(self, i: int):
        self.check_bookies()
        b = self._b(i)
        if b.process is None or b.process.poll() is not None:
            raise IllegalOpError(f"bookie {i} is not running")
        return b.process

    def proxy(self, i: int) -> FaultProxy:
        b = self._b(i)
        if b.proxy is None:
            raise IllegalOpError("this cluster was started with proxies=False")
        return b.proxy

    def bookie_id(self, i: int) -> str:
        return self._b(i).bookie_id

    def address(self, i: int) -> str:
        """Where clients reach bookie ``i``: its fault proxy with proxies, else the bookie."""
        b = self._b(i)
        return b.proxy.address if b.proxy is not None else f"127.0.0.1:{b.port}"

    def bookie_dir(self, i: int) -> str:
        return self._b(i).directory

    def pid(self, i: int) -> int | None:
        """Bookie ``i``'s process id; None when it is not running."""
        b = self._b(i)
        return b.process.pid if self.is_running(i) else None

    def index_of(self, bookie_id: str) -> int:
        for b in self._bookies:
            if b.bookie_id == bookie_id:
                return b.index
        raise IllegalOpError(f"no bookie {bookie_id!r} in this cluster")

    def is_running(self, i: int) -> bool:
        b = self._b(i)
        return b.process is not None and b.process.poll() is None

    # -- clients and lifetime ---------------------------------------------------------------

    def client(self, name: str = "", **config):
        """A Client of this cluster; ``name`` identifies it in fault rules (``faults``)."""
        self.check_bookies()
        c = Client(self.metadata_uri, faults=self.faults, client_name=name,
                   **{**self.client_config, **config})
        self._clients.append(c)
        return c

    def crashed_bookies(self) -> list[dict]:
        """Each bookie that exited unasked since the last call (index, bookie_id, exit: its
        exit code or signal, log, log_tail: the log's last lines); each crash is reported once."""
        out = []
        for b in self._bookies:
            if b.crashed():
                b.exit_known = True
                out.append({"index": b.index, "bookie_id": b.bookie_id,
                            "exit": exit_reason(b.process.returncode), "log": b.log_path,
                            "log_tail": _tail(b.log_path).rstrip()})
        return out

    def check_bookies(self) -> None:
        """Raise BookieCrashedError if a bookie exited unasked since the last check."""
        _raise_crashed(self.crashed_bookies())

    def close(self) -> None:
        """Stop everything and clean up; then raise BookieCrashedError if a bookie had
        exited unasked and that was not reported yet."""
        atexit.unregister(self._close_at_exit)
        crashed = self.crashed_bookies()   # before close's own SIGTERMs, which are asked for
        for b in self._bookies:
            b.exit_known = True
        self.faults.clear()              # nothing held keeps a client from closing
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        for b in self._bookies:
            if b.process is not None and b.process.poll() is None:
                try:
                    os.kill(b.process.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                b.process.terminate()
        for b in self._bookies:
            if b.process is not None:
                try:
                    b.process.wait(15)
                except subprocess.TimeoutExpired:
                    b.process.kill()
                    b.process.wait()
            if b.proxy is not None:
                b.proxy.close()
        for proc in self._spawned:          # one left behind by a failed start or restart
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                proc.kill()
                proc.wait()
        if self._server is not None:
            self._server.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        _raise_crashed(crashed)

    def _after_fork(self, _gone) -> None:
        # a forked child (embedlog.forking): the bookies and the directory are the parent's,
        # so neither its exit nor a close() there (a `with` block it leaves) stops them
        atexit.unregister(self._close_at_exit)
        self.close = lambda: None

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except Exception as exc:         # the interpreter is ending: say it, go on
            print(f"LocalCluster at exit: {exc}", file=sys.stderr)

    def __enter__(self):
        return self

    def __repr__(self) -> str:
        running = sum(1 for b in self._bookies if b.process is not None and b.process.poll() is None)
        return (f"LocalCluster({len(self._bookies)} bookies, {running} running, "
                f"metadata {self.metadata_uri!r})")

    def __exit__(self, *exc):
        self.close()


def _raise_crashed(crashed: list[dict]) -> None:
    if crashed:
        raise BookieCrashedError("\n".join(
            f"bookie {c['index']} ({c['bookie_id']}) exited unasked: {c['exit']}; "
            f"the end of {c['log']}:\n{c['log_tail']}" for c in crashed))


def exit_reason(returncode: int) -> str:
    """'killed by SIGSEGV' or 'exit code 1', from a Popen returncode."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def _tail(path: str, n: int = 20) -> str:
    try:
        return "".join(open(path, errors="replace").readlines()[-n:])
    except OSError:
        return ""
