"""Real ZooKeeper 3.8 and etcd 3.4 as child processes of the test run.

Each server listens on a free loopback port (started again on new ports if another
process took one first), keeps its data in a throwaway directory, is declared ready
only when it answers its own protocol (ZooKeeper ``ruok`` -> ``imok``, etcd
``GET /health``), and is stopped by its PID (SIGTERM, then SIGKILL): the commands are in
ZooKeeperServer and EtcdServer below. A missing binary raises ServerMissing; the
fixtures turn that into a failure when the CI variable is set and a skip otherwise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

from embedlog.meta import parse_metadata_uri
from embedlog.meta.sqlite import write_lock_holder
from embedlog.net.ports import free_ports
from embedlog.proc import process_state

ZK_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/zookeeper-jute.jar",
           "/usr/share/java/slf4j-api.jar", "/usr/share/java/slf4j-simple.jar")
READY_TIMEOUT_S = 30.0
PORT_ATTEMPTS = 4               # spawns with fresh ports when another process took one


class ServerMissing(RuntimeError):
    """The server's binary or jars are not installed."""


class PortTaken(RuntimeError):
    """A child server could not bind its port: another process took it after free_ports()."""


def port_taken(log_tail: str) -> bool:
    return "address already in use" in log_tail.lower()


def start_retrying(launch, what: str, before_retry=None):
    """``launch()`` spawns a server on ports from free_ports() and waits until it is ready.
    A port is only free when probed: if another process binds it first (PortTaken), call
    ``before_retry()`` (new ports) and launch again, a few times."""
    for _ in range(PORT_ATTEMPTS):
        try:
            return launch()
        except PortTaken as exc:
            taken = exc
            if before_retry is not None:
                before_retry()
    raise RuntimeError(f"{what}: ports taken on {PORT_ATTEMPTS} attempts: {taken}")


def die_with_parent() -> None:
    """SIGKILL this process when the thread that started it dies (PR_SET_PDEATHSIG): a child
    of a killed test run or benchmark must not stay behind. As a ``preexec_fn`` it runs
    between fork and exec; a multiprocessing child calls it first thing."""
    import ctypes  # lazy: only in children
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    return free_ports(1)[0]


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:   # LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def suspend(pid: int, timeout_s: float = 30.0, sqlite_uri: str | None = None) -> None:
    """SIGSTOP ``pid`` and return once every thread of it is stopped. The kernel starts the
    stop when the one thread it picked for the signal next runs, and the other threads go
    on meanwhile: on a loaded machine a SIGSTOPped ZooKeeper answered a sync and five reads
    after kill() returned.

    With ``sqlite_uri`` (a SQLite metadata store the process writes), the process is stopped
    at a moment it holds no write lock on it: stopped inside a write it would hold every
    other writer back (SQLite has no lease), where the process that hangs is what a test
    means, not the store; CI once saw a consumer stopped so, never evicted."""
    deadline = time.monotonic() + timeout_s
    while True:
        os.kill(pid, signal.SIGSTOP)
        while not _stopped(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"process {pid} not stopped {timeout_s}s after SIGSTOP")
            time.sleep(0.005)
        if sqlite_uri is None or write_lock_holder(parse_metadata_uri(sqlite_uri)[2]) != pid:
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(random.uniform(0.0, 0.05))       # stop it at another point of its work
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} held the write lock of {sqlite_uri} at every stop")


def _stopped(pid: int) -> bool:
    """Every thread of ``pid`` stopped (or gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return all(process_state(pid, tid) in ("", "T", "t", "Z", "X") for tid in tids)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


class _Child:
    """A server process with its own temp dir and log file."""

    name = "server"

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix=f"embedlog-{self.name}-")
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(self.dir, "server.log")

    def _spawn(self, argv: list[str], env: dict | None = None) -> None:
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=self.dir)
        finally:
            log.close()

    def _wait_ready(self, probe) -> None:
        """Until ``probe()`` answers from this server; PortTaken if the server exited
        because a port was in use, or if what answers on its port is another process
        (one that bound it first: this server would exit, and a test stopping or
        killing this server by its PID would not touch the one it talks to)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                if port_taken(tail):
                    raise PortTaken(tail)
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {tail}")
            if probe():
                if listens_on(self.proc.pid, self.port):
                    return
                self._end()          # started again on new ports, in the same directory
                raise PortTaken(f"{self.name}: port {self.port} answers from another process")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} not ready within {READY_TIMEOUT_S}s: {self.log_tail()}")

    def log_tail(self, n_bytes: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self._end()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _end(self) -> None:
        """The process ends (SIGTERM, then SIGKILL); its directory stays."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class ZooKeeperServer(_Child):
    name = "zookeeper"

    def __init__(self, heap_mb: int = 256):
        java = shutil.which("java")
        missing = [j for j in ZK_JARS if not os.path.exists(j)]
        if java is None or missing:
            raise ServerMissing("ZooKeeper needs java and the Debian package 'zookeeper' "
                                f"(missing: {'java' if java is None else ', '.join(missing)})")
        super().__init__()
        start_retrying(lambda: self._launch(java, heap_mb), self.name)

    def _launch(self, java: str, heap_mb: int) -> None:
        self.port = free_port()
        shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)   # a failed try's
        cfg = os.path.join(self.dir, "zoo.cfg")
        with open(cfg, "w") as f:
            f.write("\n".join([
                "tickTime=500", f"dataDir={self.dir}/data", f"clientPort={self.port}",
                "clientPortAddress=127.0.0.1", "maxClientCnxns=0",
                "admin.enableServer=false", "4lw.commands.whitelist=ruok,srvr,stat,mntr",
                "autopurge.purgeInterval=0",
                # short ticks and sessions let tests see an ephemeral znode vanish
                # quickly (ZooKeeper expires sessions on tick boundaries)
                "minSessionTimeout=1000", ""]))
        self._spawn([java, f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                     "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                     "-cp", ":".join(ZK_JARS),
                     "org.apache.zookeeper.server.ZooKeeperServerMain", cfg])
        self._wait_ready(self._ruok)

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def backup(self, to: str) -> None:
        """Copy the data directory to ``to`` as it is on disk now (what a disk snapshot of a
        running server holds: ZooKeeper syncs every transaction before answering it)."""
        shutil.copytree(os.path.join(self.dir, "data"), to)

    def restore(self, backup: str) -> None:
        """Stop, put ``backup`` in place of the data directory and start again on the same
        port: the server comes back as it was when the backup was taken."""
        self._end()
        data = os.path.join(self.dir, "data")
        shutil.rmtree(data)
        shutil.copytree(backup, data)
        self._spawn(self.proc.args)
        self._wait_ready(self._ruok)

    def _ruok(self) -> bool:
        # "imok" says the process runs; "srvr" says it serves sessions: right after a start
        # (a restore's, say) it may answer imok while it still loads its data and drops
        # every client that connects ("not currently serving requests")
        return self._four_letters(b"ruok") == b"imok" and \
            b"Mode:" in self._four_letters(b"srvr")

    def _four_letters(self, word: bytes) -> bytes:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(word)
                out = b""
                while chunk := s.recv(4096):
                    out += chunk
                return out
        except OSError:
            return b""


class EtcdServer(_Child):
    name = "etcd"

    def __init__(self):
        binary = shutil.which("etcd")
        if binary is None:
            raise ServerMissing("etcd is not installed (Debian package 'etcd-server')")
        super().__init__()
        start_retrying(lambda: self._launch(binary), self.name)

    def _launch(self, binary: str) -> None:
        self.port, peer = free_ports(2)
        shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)   # a failed try's
        client_url, peer_url = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
        # an ETCD_* variable repeating a flag makes etcd exit at once
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        self._spawn([binary, "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
                     "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                     "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                     "--initial-cluster", f"t={peer_url}", "--initial-cluster-state", "new",
                     "--heartbeat-interval", "10", "--election-timeout", "100",
                     "--logger", "zap", "--log-level", "warn"], env=env)
        self._wait_ready(self._healthy)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError):
            return False
