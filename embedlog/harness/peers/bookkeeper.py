"""Real Apache BookKeeper from its published jars: a test and benchmark peer.

``BookKeeperCluster`` runs N Java bookies (``org.apache.bookkeeper.server.Main``) as child
processes on a ZooKeeper root that BookieShell formatted, and offers BookieShell as an
oracle (metadata, entries, bookies, ledgers) plus ``java/BkDriver.java`` (package data), our
own driver of BookKeeper's Java client, for what the shell cannot do (create with a chosen
quorum and digest, write while a test kills things, recovery opens, long-poll tails,
benchmarks; the jar, its arguments and its output are bkdriver.py's, the shell's output
parsers shell_output.py's)::

    with BookKeeperCluster("4.17.2", bookies=3) as bk:
        made = bk.java_client("create", ensemble=3, write_quorum=2, ack_quorum=2, count=100)
        assert [p for _, p in bk.read_ledger(made.ledger_id)][0] == b"entry-0"

Each bookie: a generated ``bk_server.conf`` (``conf_path(i)``), journal and ledger dirs and a
log under the cluster's temp dir, a port from free_ports() kept across ``kill_bookie``/``start_bookie``.
Ready = its registration znode ``ROOT/available/127.0.0.1:PORT`` exists, made by this
incarnation's session (a SIGKILLed bookie's znode lives until its session expires, so
``start_bookie(i)`` waits for the new one), and its port answers. Bookies start in parallel.

Start-up is most of what a test pays, so: bookies start in parallel; every JVM maps a
class-data-sharing archive (jvmcds.py) made by its first run (``python -m
embedlog.harness.peers.bookkeeper warm`` makes them all ahead); BkDriver is compiled once into a
jar. Measured here (2 cores, Java 17; interleaved rounds while other test runs loaded the
machine to 17-21): 3 bookies ready in 3.1 s (4.16.6) / 4.6 s (4.17.2) with archives, 7.3 /
8.0 s without (medians of 3); initnewcluster 0.9-1.5 s; a BookieShell or BkDriver run
1-1.5 s; stop 0.4 s. At load ~5: 3 bookies ready ~1.4 s with archives, ~3 s without.
A bookie's log is ``bookie-I/bookie.log`` under the cluster's directory.

What differed from ../shared/reference/RECIPES.md (its recipe had never run here):

- BookieShell prints its results through its logger (SLF4J -> log4j2 at INFO), not to
  stdout: with the jar's own log4j2.xml results and ZooKeeper chatter share stdout. We give
  every JVM our own log4j2 configuration: tools log results (``org.apache.bookkeeper.tools``
  and ``BookieShell``) as bare lines on stdout and everything else at WARN on stderr.
- The default ``ledgerStorageClass`` in ServerConfiguration is SortedLedgerStorage, not
  DbLedgerStorage (only the shipped bk_server.conf picks DbLedgerStorage). We keep
  SortedLedgerStorage (``ledger_storage="sorted"``, ~0.5 s faster to start: no RocksDB);
  ``ledger_storage="db"`` is what Pulsar runs, with small caches here (its defaults take a
  quarter of the direct memory for each).
- BookKeeper.close() in a client JVM waits ~2 s for its worker pool ("mainWorkerPool did not
  shutdown cleanly"): simpletest pays it; BkDriver halts instead of closing its client.
- A killed bookie's registration znode lives until its ZooKeeper session expires, and a
  restarted bookie waits for it: bookies use zkTimeout=4000 so ``start_bookie(i)`` after a SIGKILL
  takes ~4-5 s. An ensemble change needs a spare bookie: with 3 bookies, kill tests write
  E=2 ledgers (a 3/2/2 ledger on 3 bookies has no replacement: its writer stalls, no error).
- ``initnewcluster`` on a root that exists exits 1 ("Ledger root path: ... already exists").
- ``readledger`` prints payloads with ``-m`` through ``entryFormatterClass`` (a string by
  default): we configure HexDumpEntryFormatter and parse its columns. With ``-b BOOKIE`` it
  needs ``-fe``/``-le`` (else it prints nothing), takes ``-le`` as exclusive (inclusive
  without ``-b``), reads every id in the range from that bookie
  (ids outside its write set print "No such entry") and dumps the whole stored entry,
  BookKeeper's entry header and digest included, in Netty's boxed hex format.
- A failing shell command exits 255 and prints "Got an exception" and a stack on stdout.
- ``initnewcluster`` works as written (~0.9 s); ``metaformat`` is not needed. ``simpletest``
  deletes its ledger afterwards.
- Class-data sharing refuses a class directory on the classpath: BkDriver is put in a jar.
- Hosts in ``metadataServiceUri`` are separated by ``;`` (a ZooKeeper connect string's
  commas are translated).
- Every client JVM warns that RackawareEnsemblePlacementPolicy found no DNS-resolver script:
  harmless.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Callable

from embedlog.errors import IllegalOpError
from embedlog.harness.peers import jars, jvmcds
from embedlog.harness.peers.bkdriver import (DRIVER_SOURCE, BookKeeperToolError, DriverResult,
                                       driver_args, driver_classpath)
from embedlog.harness.peers.shell_output import field, parse_boxed_entries, parse_hexdump_entries
from embedlog.harness.servers import (PORT_ATTEMPTS, ServerMissing, ZooKeeperServer,
                                      die_with_parent, free_port, free_ports, port_taken)

READY_TIMEOUT_S = 60.0          # a bookie on a loaded 2-core machine (load 8) is slow to start
STOP_TIMEOUT_S = 10.0
DUMP_TIMEOUT_S = 60.0           # more for a JVM writing a class-data-sharing archive at exit
TOOL_TIMEOUT_S = 120.0
BOOKIE_ZK_TIMEOUT_MS = 4000     # a killed bookie's znode outlives it by this: restarts wait on it
DIGEST_BYTES = {"CRC32": 8, "CRC32C": 4, "MAC": 20, "DUMMY": 0}
ENTRY_HEADER_BYTES = 32         # ledger id, entry id, LAC, length: 4 longs before the digest

BOOKIE_HEAP = ["-Xmx256m", "-XX:MaxDirectMemorySize=256m"]
TOOL_HEAP = ["-Xmx192m", "-XX:MaxDirectMemorySize=128m"]

# ledger_storage= names. "sorted" is ServerConfiguration's default and starts ~0.5 s faster
# here than "db" (RocksDB), which the shipped bk_server.conf and Pulsar use.
LEDGER_STORAGE = {
    "sorted": "org.apache.bookkeeper.bookie.SortedLedgerStorage",
    "db": "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
    "interleaved": "org.apache.bookkeeper.bookie.InterleavedLedgerStorage",
}

# Every bookie's settings; bookie_config= overrides or adds keys. Sizes are small so three
# bookies fit next to the tests on 2 cores: DbLedgerStorage would take a quarter of the
# direct memory for each of its caches.
BOOKIE_DEFAULTS = {
    "advertisedAddress": "127.0.0.1",
    "allowLoopback": "true",
    "httpServerEnabled": "false",
    "dbStorage_writeCacheMaxSizeMb": "16",
    "dbStorage_readAheadCacheMaxSizeMb": "8",
    "dbStorage_rocksDB_blockCacheSize": str(8 << 20),
    "dbStorage_rocksDB_writeBufferSizeMB": "4",
    "journalPreAllocSizeMB": "4",
    "journalMaxSizeMB": "64",
    "numReadWorkerThreads": "2",
    "numHighPriorityWorkerThreads": "2",
    "zkTimeout": str(BOOKIE_ZK_TIMEOUT_MS),
    # a CI disk fuller than 95 % must not turn the bookies read-only
    "diskUsageThreshold": "0.99",
    "diskUsageWarnThreshold": "0.98",
    "diskUsageLwmThreshold": "0.98",
}

_BOOKIE_LOG4J = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders><Console name="OUT" target="SYSTEM_OUT">
    <PatternLayout pattern="%d{HH:mm:ss.SSS} %-5p [%t] %c{1} - %m%n"/></Console></Appenders>
  <Loggers><Root level="INFO"><AppenderRef ref="OUT"/></Root></Loggers>
</Configuration>
"""
# tools: results (logged by the command classes) as bare stdout lines, the rest on stderr
_TOOL_LOG4J = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <Console name="OUT" target="SYSTEM_OUT"><PatternLayout pattern="%m%n"/></Console>
    <Console name="ERR" target="SYSTEM_ERR">
      <PatternLayout pattern="%d{HH:mm:ss.SSS} %-5p [%t] %c{1} - %m%n"/></Console>
  </Appenders>
  <Loggers>
    <Root level="WARN"><AppenderRef ref="ERR"/></Root>
    <Logger name="org.apache.bookkeeper.tools" level="INFO" additivity="false">
      <AppenderRef ref="OUT"/></Logger>
    <Logger name="org.apache.bookkeeper.bookie.BookieShell" level="INFO" additivity="false">
      <AppenderRef ref="OUT"/></Logger>
  </Loggers>
</Configuration>
"""


_DRIVER_SETUP = threading.Lock()


def _preexec():
    # a SIGKILLed test run leaves no JVMs behind (atexit covers ordinary exits); PDEATHSIG
    # follows the spawning *thread*: only the main thread lives as long as we do
    return die_with_parent if threading.current_thread() is threading.main_thread() else None


# -- the cluster --------------------------------------------------------------------------

class _Bookie:
    def __init__(self, index: int, directory: str, port: int):
        self.index = index
        self.dir = directory
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.exited: Callable[[], None] = _nothing  # after proc exits (a CDS dump to keep)
        self.owner: int | None = None       # session owning its registration znode when ready
        self.log_path = os.path.join(directory, "bookie.log")
        self.conf_path = os.path.join(directory, "bk_server.conf")

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reap(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Wait for its exit (SIGKILL after ``timeout``) and settle what its exit leaves."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        exited, self.exited = self.exited, _nothing
        exited()


class BookKeeperCluster:
    """Java bookies of one BookKeeper version on a ZooKeeper root (see the module doc)."""

    def __init__(self, version: str = "4.17.2", bookies: int = 3, zk_hosts: str | None = None,
                 root: str = "/ledgers", *, format: bool = True, start: bool = True,
                 ledger_storage: str = "sorted", bookie_config: dict | None = None,
                 base_dir: str | None = None):
        if version not in jars.BOOKKEEPER_VERSIONS:
            raise IllegalOpError(f"BookKeeper {version!r} is not a peer; served: "
                             f"{', '.join(jars.BOOKKEEPER_VERSIONS)}")
        if not root.startswith("/") or root.endswith("/") or root == "/":
            raise IllegalOpError(f"root is an absolute znode path like /ledgers, got {root!r}")
        if ledger_storage not in LEDGER_STORAGE:
            raise IllegalOpError(f"ledger_storage is one of {', '.join(LEDGER_STORAGE)}, "
                             f"got {ledger_storage!r}")
        self.version = version
        self.root = root
        self.java = jars.java()
        self.classpath = jars.classpath(f"bookkeeper-{version}")
        self._driver_cp: tuple[str, str | None] | None = None
        cds = os.path.join(jars.cache_dir(), "cds")
        self._archives = {role: jvmcds.ClassArchive(cds, f"bookkeeper-{version}-{role}",
                                                    self.java, self.classpath)
                          for role in ("bookie", "shell")}
        self._own_dir = base_dir is None        # close() removes only a directory it made
        self.dir = base_dir or tempfile.mkdtemp(prefix=f"embedlog-bk-{version}-")
        os.makedirs(self.dir, exist_ok=True)
        self._zk_server: ZooKeeperServer | None = None
        self._zk = None
        self._bookies: list[_Bookie] = []
        self._autorecovery: list[_Bookie] = []
        self._stopped = False
        self.bookie_config = {**BOOKIE_DEFAULTS,
                              "ledgerStorageClass": LEDGER_STORAGE[ledger_storage],
                              **{k: str(v) for k, v in (bookie_config or {}).items()}}
        atexit.register(self.close)
        try:
            if zk_hosts is None:
                self._zk_server = ZooKeeperServer()
                zk_hosts = self._zk_server.hosts
            self.zk_hosts = zk_hosts
            self._write_tool_files()
            if format:
                self.format()
            ports = free_ports(bookies)
            for i, port in enumerate(ports):
                self._bookies.append(_Bookie(i, os.path.join(self.dir, f"bookie-{i}"), port))
            if start:
                self.start_all()
        except BaseException:
            self.close()
            raise

    # -- addresses and files --

    @property
    def metadata_uri(self) -> str:
        return f"zk+hierarchical://{self.zk_hosts.replace(',', ';')}{self.root}"

    @property
    def bookie_ids(self) -> list[str]:
        return [b.bookie_id for b in self._bookies]

    def __len__(self) -> int:
        return len(self._bookies)

    def _b(self, i: int) -> _Bookie:
        if not isinstance(i, int) or not 0 <= i < len(self._bookies):
            raise IllegalOpError(f"no bookie {i!r} in a cluster of {len(self._bookies)}")
        return self._bookies[i]

    def conf_path(self, i: int) -> str:
        return self._b(i).conf_path

    def pid(self, i: int) -> int | None:
        b = self._b(i)
        return b.proc.pid if b.alive() else None

    def is_running(self, i: int) -> bool:
        return self._b(i).alive()

    def log_tail(self, i: int, n_bytes: int = 4000) -> str:
        try:
            with open(self._b(i).log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _write_tool_files(self) -> None:
        self._bookie_log4j = os.path.join(self.dir, "log4j2-bookie.xml")
        self._tool_log4j = os.path.join(self.dir, "log4j2-tool.xml")
        self.client_conf_path = os.path.join(self.dir, "client.conf")
        with open(self._bookie_log4j, "w") as f:
            f.write(_BOOKIE_LOG4J)
        with open(self._tool_log4j, "w") as f:
            f.write(_TOOL_LOG4J)
        with open(self.client_conf_path, "w") as f:
            f.write(f"metadataServiceUri={self.metadata_uri}\nzkTimeout=10000\n"
                    "entryFormatterClass=org.apache.bookkeeper.util.HexDumpEntryFormatter\n")

    def _write_bookie_conf(self, b: _Bookie) -> None:
        journal, ledgers = os.path.join(b.dir, "journal"), os.path.join(b.dir, "ledgers")
        os.makedirs(journal, exist_ok=True)
        os.makedirs(ledgers, exist_ok=True)
        conf = {"metadataServiceUri": self.metadata_uri, "bookiePort": str(b.port),
                "journalDirectories": journal, "ledgerDirectories": ledgers,
                **self.bookie_config}
        with open(b.conf_path, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in conf.items())

    def _zk_client(self):
        if self._zk is None:
            from kazoo.client import KazooClient  # lazy: the optional 'zk' extra
            self._zk = KazooClient(hosts=self.zk_hosts, timeout=10.0)
            self._zk.start(timeout=30)
        return self._zk

    # -- bookies --

    def format(self) -> str:
        """Format the root as BookKeeper does (``initnewcluster``: the root, available/,
        available/readonly, INSTANCEID, LAYOUT); fails if the root exists."""
        return self.shell("initnewcluster")

    def _spawn(self, b: _Bookie) -> None:
        self._write_bookie_conf(b)
        cds, b.exited = self._archives["bookie"].options()
        log = open(b.log_path, "ab")
        try:
            b.proc = subprocess.Popen(
                [self.java, *jars.JVM_OPTS, *BOOKIE_HEAP, *cds,
                 f"-Dlog4j2.configurationFile={self._bookie_log4j}",
                 "-cp", self.classpath, "org.apache.bookkeeper.server.Main",
                 "--conf", b.conf_path],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=b.dir,
                preexec_fn=_preexec())
        finally:
            log.close()
        b.owner = None

    def _registered_owner(self, b: _Bookie) -> int | None:
        zk = self._zk_client()
        for path in (f"{self.root}/available/{b.bookie_id}",
                     f"{self.root}/available/readonly/{b.bookie_id}"):
            stat = zk.exists(path)
            if stat is not None and stat.ephemeralOwner:
                return stat.ephemeralOwner
        return None

    @staticmethod
    def _port_answers(port: int) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    def _wait_ready(self, pending: dict[int, int | None]) -> None:
        """Until every bookie in ``pending`` (index -> stale znode owner or None) has
        registered with a new session and answers; raise with its log if one exits."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pending:
            for i in list(pending):
                b = self._bookies[i]
                if b.proc.poll() is not None:
                    b.reap()
                    tail = self.log_tail(i)
                    if port_taken(tail):
                        raise _PortTaken(i)
                    raise BookKeeperToolError(
                        f"bookie {i} ({b.bookie_id}) exited with {b.proc.returncode}: {tail}",
                        tail, b.proc.returncode)
                owner = self._registered_owner(b)
                if owner is not None and owner != pending[i] and self._port_answers(b.port):
                    b.owner = owner
                    del pending[i]
            if not pending:
                return
            if time.monotonic() > deadline:
                i = next(iter(pending))
                raise BookKeeperToolError(f"bookie {i} not ready in {READY_TIMEOUT_S}s: "
                                          f"{self.log_tail(i)}")
            time.sleep(0.05)

    def start_all(self) -> None:
        """Start every bookie that is not running, in parallel, and wait until all are ready.
        A first start whose port another process took gets a fresh port and empty dirs."""
        pending = {b.index: b.owner for b in self._bookies if not b.alive()}
        for i in pending:
            if self._bookies[i].proc is not None:
                self._bookies[i].reap()     # it died: settle its exit first
            self._spawn(self._bookies[i])
        for _ in range(PORT_ATTEMPTS):
            try:
                self._wait_ready(dict(pending))
                return
            except _PortTaken as taken:
                b = self._bookies[taken.index]
                if b.owner is not None:             # its dirs and cookie name this port
                    raise BookKeeperToolError(f"bookie {b.index}: port {b.port} is taken")
                shutil.rmtree(b.dir, ignore_errors=True)
                b.port = free_port()
                self._spawn(b)
        raise BookKeeperToolError(f"bookies: ports taken on {PORT_ATTEMPTS} attempts")

    def start_bookie(self, i: int) -> None:
        """Start bookie ``i`` again on its dirs and port (after kill_bookie or stop_bookie)."""
        b = self._b(i)
        if b.alive():
            raise IllegalOpError(f"bookie {i} is running")
        b.reap()                            # it died: settle its exit first
        self._spawn(b)
        self._wait_ready({i: self._registered_owner(b)})

    def kill_bookie(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to bookie ``i``; for SIGKILL/SIGTERM/SIGINT wait until it is gone.
        A SIGKILLed bookie's registration stays until its ZooKeeper session expires."""
        b = self._b(i)
        if not b.alive():
            raise IllegalOpError(f"bookie {i} is not running")
        os.kill(b.proc.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            b.reap(STOP_TIMEOUT_S + (DUMP_TIMEOUT_S if b.exited is not _nothing else 0))

    def stop_bookie(self, i: int) -> None:
        """Stop bookie ``i`` gracefully (SIGTERM: it unregisters and flushes)."""
        self.kill_bookie(i, signal.SIGTERM)

    def restart_bookie(self, i: int) -> None:
        """Stop bookie ``i`` (if running) and start it again on its dirs and port."""
        if self._b(i).alive():
            self.stop_bookie(i)
        self.start_bookie(i)

    def start_autorecovery(self, **settings) -> str:
        """BookKeeper's AutoRecoveryMain (its auditor elector and replication worker) in a
        process of its own on this root, with ``settings`` over its configuration (default:
        a lost bookie audited at once). Returns the bookie id it votes with; close() stops it."""
        n = len(self._autorecovery)
        ar = _Bookie(n, os.path.join(self.dir, f"autorecovery-{n}"), free_ports(1)[0])
        os.makedirs(ar.dir, exist_ok=True)
        conf = {"metadataServiceUri": self.metadata_uri, "bookiePort": str(ar.port),
                "advertisedAddress": "127.0.0.1", "allowLoopback": "true",
                "zkTimeout": str(BOOKIE_ZK_TIMEOUT_MS), "lostBookieRecoveryDelay": "0",
                **{k: str(v) for k, v in settings.items()}}
        with open(ar.conf_path, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in conf.items())
        log = open(ar.log_path, "ab")
        try:
            ar.proc = subprocess.Popen(
                [self.java, *jars.JVM_OPTS, *BOOKIE_HEAP,
                 f"-Dlog4j2.configurationFile={self._bookie_log4j}", "-cp", self.classpath,
                 "org.apache.bookkeeper.replication.AutoRecoveryMain", "--conf", ar.conf_path],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ar.dir,
                preexec_fn=_preexec())
        finally:
            log.close()
        self._autorecovery.append(ar)
        return ar.bookie_id

    def close(self) -> None:
        """Stop every bookie and autorecovery process (SIGTERM, SIGKILL after a while), our
        ZooKeeper, remove dirs."""
        if self._stopped:
            return
        self._stopped = True
        live = [b for b in self._bookies + self._autorecovery if b.alive()]
        for b in live:
            os.kill(b.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for b in self._bookies + self._autorecovery:
            if b.proc is not None:
                # a bookie writing its class archive at exit takes seconds more
                extra = DUMP_TIMEOUT_S if b.exited is not _nothing else 0
                b.reap(timeout=max(0.1, deadline - time.monotonic()) + extra)
        if self._zk is not None:
            try:
                self._zk.stop()
                self._zk.close()
            except Exception:  # noqa: BLE001 - a dead ZooKeeper must not stop the cleanup
                pass
        if self._zk_server is not None:
            self._zk_server.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- BookieShell --

    def _tool_opts(self) -> list[str]:
        return [*jars.JVM_OPTS, *TOOL_HEAP, f"-Dlog4j2.configurationFile={self._tool_log4j}"]

    def shell(self, *args: object, check: bool = True, timeout: float = TOOL_TIMEOUT_S) -> str:
        """Run ``BookieShell -conf <client.conf> ARGS``; its result lines (stdout). A non-zero
        exit raises BookKeeperToolError carrying stdout and stderr."""
        # the shell's archive holds the classes of the command that made it: let one that
        # runs BookKeeper's client make it, the commands used most
        cds, exited = self._archives["shell"].options(dump=str(args[0]) in _SHELL_DUMPERS)
        try:
            run = subprocess.run([self.java, *self._tool_opts(), *cds, "-cp", self.classpath,
                                  "org.apache.bookkeeper.bookie.BookieShell",
                                  "-conf", self.client_conf_path, *map(str, args)],
                                 capture_output=True, text=True, timeout=timeout, cwd=self.dir,
                                 stdin=subprocess.DEVNULL)
        finally:
            exited()
        if check and run.returncode != 0:
            raise BookKeeperToolError(
                f"BookieShell {' '.join(map(str, args))} exited {run.returncode}: "
                f"{run.stdout[-3000:]}{run.stderr[-2000:]}", run.stdout + run.stderr,
                run.returncode)
        return run.stdout

    def ledger_metadata(self, ledger_id: int) -> str:
        """BookKeeper's own rendering of the metadata: ``LedgerMetadata{formatVersion=3, ...}``."""
        out = self.shell("ledgermetadata", "-l", ledger_id)
        for line in out.splitlines():
            if line.startswith("LedgerMetadata{"):
                return line
        raise BookKeeperToolError(f"ledgermetadata {ledger_id}: no metadata in {out!r}", out)

    def dump_metadata(self, ledger_id: int) -> bytes:
        """The ledger's metadata znode as stored (``ledgermetadata -dumptofile``)."""
        path = os.path.join(self.dir, f"dump-{ledger_id}-{time.monotonic_ns()}.bin")
        try:
            self.shell("ledgermetadata", "-l", ledger_id, "-dumptofile", path)
            with open(path, "rb") as f:
                return f.read()
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def restore_metadata(self, ledger_id: int, blob: bytes, update: bool = False) -> None:
        """Write ``blob`` as the ledger's metadata (``-restorefromfile``, parsed by BookKeeper
        first); without ``update`` the ledger must not exist."""
        path = os.path.join(self.dir, f"restore-{ledger_id}-{time.monotonic_ns()}.bin")
        with open(path, "wb") as f:
            f.write(blob)
        try:
            self.shell("ledgermetadata", "-l", ledger_id, "-restorefromfile", path,
                       *(["-update"] if update else []))
        finally:
            os.unlink(path)

    def list_bookies(self, readonly: bool = False) -> list[str]:
        """Bookie ids registered read-write (or read-only), as the shell lists them."""
        out = self.shell("listbookies", "-ro" if readonly else "-rw")
        return re.findall(r"^BookieID:(\S+?),", out, re.M)

    def list_ledgers(self) -> list[int]:
        out = self.shell("listledgers")
        return [int(x) for x in re.findall(r"^ledgerID: (\d+)", out, re.M)]

    def simpletest(self, ensemble: int = 3, write_quorum: int = 3, ack_quorum: int = 2,
                   entries: int = 10) -> str:
        """BookKeeper's own smoke test (writes, reads back, deletes a ledger)."""
        out = self.shell("simpletest", "-e", ensemble, "-w", write_quorum, "-a", ack_quorum,
                         "-n", entries)
        if f"{entries} entries written" not in out:
            raise BookKeeperToolError(f"simpletest did not finish: {out}", out)
        return out

    def read_ledger(self, ledger_id: int, bookie: str | None = None, first: int = 0,
                    last: int | None = None, raw: bool = False,
                    digest: str | None = None) -> list[tuple[int, bytes]]:
        """Entries ``first..last`` as ``(entry_id, payload)`` via ``readledger -m``. With
        ``bookie`` only what that bookie stores (ids outside its write set are absent); then
        ``raw=True`` keeps BookKeeper's stored entry (header and digest) whole, and ``last``
        and ``digest`` (to strip it) are read from the metadata unless given. ``last``
        defaults to the LAC (the last entry of a closed ledger)."""
        if bookie is None:
            args = ["readledger", "-m", "-l", ledger_id, "-fe", first]
            if last is not None:
                args += ["-le", last]
            return parse_hexdump_entries(self.shell(*args))
        meta = ""
        if last is None or (digest is None and not raw):
            meta = self.ledger_metadata(ledger_id)
        if last is None:
            last = int(field(meta, "lastEntryId"))
            if last < 0:
                raise IllegalOpError(f"ledger {ledger_id} is open: give last= to read it "
                                     f"from {bookie}")
        # with -b the last id is exclusive (without it, inclusive)
        out = self.shell("readledger", "-m", "-l", ledger_id, "-b", bookie, "-fe", first,
                         "-le", last + 1)
        stored = parse_boxed_entries(out)
        if raw:
            return stored
        digest = digest or field(meta, "digestType")
        skip = ENTRY_HEADER_BYTES + DIGEST_BYTES[digest.upper()]
        return [(eid, data[skip:]) for eid, data in stored]

    # -- the Java client (BkDriver) --

    def driver_command(self, dump: bool = False) -> tuple[list[str], Callable[[], None]]:
        """``java ... BkDriver --metadata-uri URI``, and what to call after it exits."""
        with _DRIVER_SETUP:        # threads starting their first BkDriver at once
            if self._driver_cp is None:
                found = driver_classpath(self.version)
                self._archives["driver"] = jvmcds.ClassArchive(
                    os.path.join(jars.cache_dir(), "cds"), f"bookkeeper-{self.version}-driver",
                    self.java, found[0])
                self._driver_cp = found
        cp, main = self._driver_cp
        cds, exited = self._archives["driver"].options(dump) if main else ([], _nothing)
        return ([self.java, *self._tool_opts(), *cds, "-cp", cp, main or DRIVER_SOURCE,
                 "--metadata-uri", self.metadata_uri], exited)

    def java_client_popen(self, command: str, *positional, stdin: bool = False,
                          v2: bool = False, **options) -> subprocess.Popen:
        """Start BkDriver COMMAND (text mode, stdout piped; stdin piped if ``stdin``): feed
        its lines to ``DriverResult.feed`` as they come, or kill it between them."""
        return self._driver_popen(command, positional, stdin, v2, options)[0]

    def _driver_popen(self, command, positional, stdin, v2, options, dump=False):
        args = driver_args(command, *positional, **options)
        if stdin:
            args.append("--stdin")
        cmd, exited = self.driver_command(dump)
        try:
            proc = subprocess.Popen(cmd + (["--v2"] if v2 else []) + args,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    text=True, bufsize=1, cwd=self.dir, preexec_fn=_preexec())
        except BaseException:
            exited()
            raise
        return proc, exited

    def java_client(self, command: str, *positional, check: bool = True,
                    payloads: list[bytes] | None = None, v2: bool = False,
                    timeout: float = TOOL_TIMEOUT_S, **options) -> DriverResult:
        """Run BkDriver to the end and parse what it printed. ``payloads`` (for create) are
        written one entry each instead of the generated ``entry-<id>``. ``check`` raises
        BookKeeperToolError on a non-zero exit (an ``error`` line)."""
        proc, exited = self._driver_popen(command, positional, payloads is not None, v2,
                                          options, dump=True)
        feed = "".join(p.hex() + "\n" for p in payloads) if payloads is not None else None
        try:
            out, err = proc.communicate(feed, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise BookKeeperToolError(f"BkDriver {command} timed out after {timeout}s: "
                                      f"{out[-2000:]}{err[-2000:]}", out + err)
        finally:
            exited()
        result = DriverResult(returncode=proc.returncode)
        for line in out.splitlines():
            result.feed(line)
        if check and proc.returncode != 0:
            raise BookKeeperToolError(f"BkDriver {command} exited {proc.returncode}: "
                                      f"{out[-2000:]}{err[-2000:]}", out + err, proc.returncode)
        return result


def _nothing() -> None:
    pass


class _PortTaken(Exception):
    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


_SHELL_DUMPERS = ("simpletest", "readledger")


def warm(versions=jars.BOOKKEEPER_VERSIONS) -> None:
    """Build BkDriver's jar and the class-data-sharing archives of bookies, shell and driver
    ahead of the tests (each is otherwise made by its first run, 2-3 s slower)."""
    with ZooKeeperServer() as zk:
        for version in versions:
            with BookKeeperCluster(version, bookies=1, zk_hosts=zk.hosts,
                                   root=f"/warm-{version}") as bk:
                bk.simpletest(ensemble=1, write_quorum=1, ack_quorum=1)
                made = bk.java_client("create", ensemble=1, write_quorum=1, ack_quorum=1,
                                      count=10)
                bk.java_client("read", made.ledger_id)


def main(argv: list[str] | None = None) -> int:
    import argparse  # lazy: only the command line needs it
    ap = argparse.ArgumentParser(description="the Java BookKeeper peer")
    ap.add_argument("command", choices=["warm"],
                    help="warm: build BkDriver and the JVMs' class-data-sharing archives")
    ap.add_argument("versions", nargs="*", help=f"default: {' '.join(jars.BOOKKEEPER_VERSIONS)}")
    args = ap.parse_args(argv)
    started = time.monotonic()
    warm(args.versions or jars.BOOKKEEPER_VERSIONS)
    print(f"BookKeeper peers warm in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
