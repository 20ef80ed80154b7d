"""PulsarCluster: a real Apache Pulsar broker whose topics live on embedlog bookies.

    with PulsarCluster(bookies=3) as pc:       # managed ledgers 2/2/2, Pulsar's default
        client = pulsar.Client(pc.service_url)
        ...
        pc.bookies.kill_bookie(0)              # the bookies are a LocalCluster

Set up as Pulsar's and BookKeeper's operators do it, each step a process of its own:
ZooKeeper; Pulsar's ``PulsarClusterMetadataSetup`` (what ``pulsar
initialize-cluster-metadata`` runs), which leaves ``/ledgers`` with an INSTANCEID and no
LAYOUT; embedlog bookies started with ``embedlog bookie serve --metadata
zk+hierarchical://ZK/ledgers`` (a LocalCluster, which opens that root first: a root Pulsar
initialised is BookKeeper's); then one broker (``PulsarBrokerStarter``, functions worker
off, a small heap), ready when its admin API lists the cluster. The jars are the
``pulsar-broker-4.0.0`` peer of embedlog.harness.peers.jars. ``close()`` stops the broker, the
bookies and ZooKeeper and removes the directory; the broker also dies with the process
that started it (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

from embedlog.errors import IllegalOpError
from embedlog.harness.peers import jars
from embedlog.harness.peers.bookkeeper import BookKeeperCluster
from embedlog.harness.cluster import LocalCluster
from embedlog.harness.servers import ZooKeeperServer, die_with_parent, free_ports

PULSAR_PEER = "pulsar-broker-4.0.0"
CLUSTER = "embedlog"
START_TIMEOUT_S = 120.0         # a broker's JVM on two loaded cores
STOP_TIMEOUT_S = 15.0
HEAP = ["-Xms128m", "-Xmx768m", "-XX:MaxDirectMemorySize=512m"]


class PulsarCluster:
    def __init__(self, bookies: int = 3, base_dir: str | None = None, *,
                 ensemble: tuple[int, int, int] = (2, 2, 2), broker_config: dict | None = None,
                 bookie_config: dict | None = None, java_bookies: int = 0,
                 java_bookie_config: dict | None = None):
        """``bookies`` embedlog bookies and ``java_bookies`` Java bookies (BookKeeper's
        newest peer version, a BookKeeperCluster: ``self.java_bookies``) on the root Pulsar
        initialised; either may be 0 (``self.bookies`` is then None)."""
        self._own_dir = base_dir is None
        self.dir = base_dir or tempfile.mkdtemp(prefix="embedlog-pulsar-")
        os.makedirs(self.dir, exist_ok=True)
        self.java = jars.java()
        self.classpath = jars.classpath(PULSAR_PEER)
        self._log4j = os.path.join(self.dir, "log4j2.properties")
        with open(self._log4j, "w") as f:
            f.write(jars.LOG4J2_WARN)
        self.zk: ZooKeeperServer | None = None
        self.bookies: LocalCluster | None = None
        self.java_bookies = None
        self._broker: subprocess.Popen | None = None
        self._closed = False
        atexit.register(self.close)
        try:
            self.zk = ZooKeeperServer()
            self.broker_port, self.web_port = free_ports(2)
            self.metadata_uri = f"zk+hierarchical://{self.zk.hosts}/ledgers"
            self._setup_metadata()
            if bookies:
                self.bookies = LocalCluster(bookies=bookies, metadata=self.metadata_uri,
                                            base_dir=os.path.join(self.dir, "bookies"),
                                            proxies=False, autorecovery=False,
                                            bookie_config=bookie_config)
            if java_bookies:
                version = max(jars.BOOKKEEPER_VERSIONS,
                              key=lambda v: tuple(map(int, v.split("."))))
                self.java_bookies = BookKeeperCluster(
                    version, bookies=java_bookies, zk_hosts=self.zk.hosts, root="/ledgers",
                    format=False, bookie_config=java_bookie_config,
                    base_dir=os.path.join(self.dir, "java-bookies"))
            e, qw, qa = ensemble
            self.broker_config = {
                "metadataStoreUrl": f"zk:{self.zk.hosts}",
                "configurationMetadataStoreUrl": f"zk:{self.zk.hosts}",
                "clusterName": CLUSTER, "brokerServicePort": str(self.broker_port),
                "webServicePort": str(self.web_port), "advertisedAddress": "127.0.0.1",
                "bindAddress": "127.0.0.1", "functionsWorkerEnabled": "false",
                "bookkeeperMetadataServiceUri": self.metadata_uri,
                "managedLedgerDefaultEnsembleSize": str(e),
                "managedLedgerDefaultWriteQuorum": str(qw),
                "managedLedgerDefaultAckQuorum": str(qa),
                **{k: str(v) for k, v in (broker_config or {}).items()}}
            self.start_broker()
        except BaseException:
            self.close()
            raise

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, "broker.log")

    def _java(self, main: str, *args: str, heap=("-Xmx256m",)) -> list[str]:
        return [self.java, *jars.JVM_OPTS, *heap, f"-Dlog4j2.configurationFile={self._log4j}",
                "-cp", self.classpath, main, *args]

    def _setup_metadata(self) -> None:
        """Pulsar's own set-up, as `pulsar initialize-cluster-metadata` runs it."""
        zk = f"zk:{self.zk.hosts}"
        run = subprocess.run(self._java(
            "org.apache.pulsar.PulsarClusterMetadataSetup", "--cluster", CLUSTER,
            "--metadata-store", zk, "--configuration-metadata-store", zk,
            "--web-service-url", self.web_url, "--broker-service-url", self.service_url),
            capture_output=True, text=True, timeout=START_TIMEOUT_S, cwd=self.dir)
        if run.returncode != 0:
            raise RuntimeError(f"PulsarClusterMetadataSetup exited {run.returncode}: "
                               f"{(run.stdout + run.stderr)[-2000:]}")

    def _one(self, i: int) -> None:
        if i != 0:
            raise IllegalOpError(f"no broker {i!r}: a PulsarCluster has one, broker 0")

    def pid(self, i: int = 0) -> int | None:
        self._one(i)
        return self._broker.pid if self.is_running(i) else None

    def is_running(self, i: int = 0) -> bool:
        self._one(i)
        return self._broker is not None and self._broker.poll() is None

    def start_broker(self, i: int = 0) -> None:
        """Start the broker (after kill_broker or stop_broker) and wait until its admin
        API answers."""
        if self.is_running(i):
            raise IllegalOpError("the Pulsar broker is running")
        conf = os.path.join(self.dir, "broker.conf")
        with open(conf, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in self.broker_config.items())
        with open(self.log_path, "ab") as log:
            self._broker = subprocess.Popen(
                self._java("org.apache.pulsar.PulsarBrokerStarter", "--broker-conf", conf,
                           heap=HEAP),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir,
                # PDEATHSIG follows the spawning thread: only the main one outlives the broker
                preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread()
                else None)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self._broker.poll() is not None:
                raise RuntimeError(f"the Pulsar broker exited {self._broker.returncode}: "
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Pulsar broker did not come up within "
                                   f"{START_TIMEOUT_S:.0f} s: {self.log_tail()}")
            time.sleep(0.25)             # polling a JVM's start; bounded by the deadline

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.web_url}/admin/v2/clusters", timeout=2) as r:
                return r.status == 200 and CLUSTER.encode() in r.read()
        except (urllib.error.URLError, OSError):
            return False

    def kill_broker(self, i: int = 0) -> None:
        """SIGKILL the broker (a crash); returns once it is gone."""
        self._signal(i, signal.SIGKILL)

    def stop_broker(self, i: int = 0) -> None:
        """Stop the broker cleanly (SIGTERM; SIGKILL after STOP_TIMEOUT_S)."""
        self._signal(i, signal.SIGTERM)

    def restart_broker(self, i: int = 0) -> None:
        """Stop the broker (if running) and start it again."""
        self.stop_broker(i)
        self.start_broker(i)

    def _signal(self, i: int, sig: int) -> None:
        self._one(i)
        if self.is_running(i):
            self._broker.send_signal(sig)
            try:
                self._broker.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._broker.kill()
                self._broker.wait()

    def log_tail(self, n_bytes: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop_broker()
        if self.bookies is not None:
            self.bookies.close()
        if self.java_bookies is not None:
            self.java_bookies.close()
        if self.zk is not None:
            self.zk.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
