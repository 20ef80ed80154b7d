"""KafkaCluster: real Apache Kafka brokers (KRaft) as child processes: the peer
benchmarks/vs_kafka.py measures embedlog against.

    with KafkaCluster(brokers=3) as kc:            # RF 3, min.insync.replicas 2
        kc.create_topic("events", partitions=1)    # rf defaults to min(3, brokers)
        producer = confluent_kafka.Producer({"bootstrap.servers": kc.bootstrap, "acks": "all"})
        kc.kill_broker(2)                          # SIGKILL one broker; start_broker(2) brings it back

Each broker is one JVM running ``kafka.Kafka`` from the pinned jars of
embedlog.harness.peers.jars (``kafka-4.4.0``, fetched into the peers cache), in combined mode
(``process.roles=broker,controller``, every broker a voter of the KRaft quorum), on free
loopback ports, with its storage formatted first by Kafka's own storage tool
(``kafka.tools.StorageTool format`` with a cluster id made here). A broker is ready when
the cluster's metadata, asked over Kafka's protocol (confluent-kafka's AdminClient), lists
it: KRaft lists only registered, unfenced brokers. ``close()`` stops every broker (SIGTERM,
then SIGKILL) and removes the directory; the brokers also die with the process that
started them (PR_SET_PDEATHSIG: create the cluster from a thread that outlives it).

Durability is Kafka's: by default a broker acknowledges ``acks=all`` once every in-sync
replica has the record in its page cache, and flushes when the OS does. A topic created
with ``config={"flush.messages": "1"}`` fsyncs the log after every append (a produce
request's batch) before the acknowledgement. ``fast_start=True`` (tests) runs the JVM with
the C1 compiler and a small heap; benchmarks pass ``fast_start=False`` (Kafka's own G1
settings, full JIT) and a larger heap.

``spark_jars()`` is the ``spark.jars`` value for Spark's Kafka source and sink
(``spark-sql-kafka-0-10``): the connector's jars that PySpark does not ship.
"""
from __future__ import annotations

import atexit
import base64
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from embedlog import forking
from embedlog.errors import IllegalOpError
from embedlog.harness.peers import jars, jvmcds
from embedlog.harness.servers import (PortTaken, ServerMissing, die_with_parent, free_ports,
                                      port_taken)

KAFKA_PEER = "kafka-4.4.0"
SPARK_KAFKA_PEER = "spark-sql-kafka-4.2.0"
START_TIMEOUT_S = 90.0          # three JVMs on two loaded cores
STOP_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 4


# Kafka's own start script on Java 17 (kafka-run-class.sh), for benchmarks
G1_OPTS = ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
           "-XX:+ExplicitGCInvokesConcurrent"]
# tests: start fast, run slower
FAST_OPTS = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]


def _rdkafka_quiet() -> dict:
    """librdkafka settings that keep a probing client off stderr."""
    log = logging.getLogger("embedlog.harness.peers.kafka.rdkafka")
    log.propagate = False
    log.addHandler(logging.NullHandler())
    return {"log_level": 0, "logger": log, "log.connection.close": False}


def _admin_class():
    try:
        # optional: confluent-kafka comes with the test and bench extras
        from confluent_kafka.admin import AdminClient
    except ImportError as exc:
        raise ServerMissing("confluent-kafka is not installed (the test and bench extras: "
                            "pip install -e '.[test]')") from exc
    return AdminClient


def _admin(bootstrap: str):
    return _admin_class()({"bootstrap.servers": bootstrap, **_rdkafka_quiet()})


def _cluster_id() -> str:
    """A Kafka Uuid in its text form (URL-safe base64, no padding); Kafka's own generator
    never starts one with '-', which command lines would take for an option."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _nothing() -> None:
    pass


class _Broker:
    def __init__(self, node_id: int, directory: str):
        self.node_id = node_id
        self.directory = directory
        self.port = 0
        self.controller_port = 0
        self.process: subprocess.Popen | None = None
        self.exited = _nothing             # call once the JVM has exited (its CDS archive)
        self.log_path = os.path.join(directory, "broker.log")
        self.config_path = os.path.join(directory, "server.properties")
        self.data_dir = os.path.join(directory, "data")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, n_bytes: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return ""


class KafkaCluster:
    """``brokers`` Kafka brokers on 127.0.0.1 (1, or 3 with replication factor 3 and
    min.insync.replicas 2), started and ready when the constructor returns."""

    def __init__(self, brokers: int = 1, base_dir: str | None = None, *, heap_mb: int = 384,
                 fast_start: bool = True, broker_config: dict | None = None):
        if brokers < 1:
            raise IllegalOpError(f"a Kafka cluster needs at least one broker, got {brokers}")
        self.java = jars.java()
        self.classpath = jars.classpath(KAFKA_PEER)
        _admin_class()                               # confluent-kafka is there, or ServerMissing
        self._own_dir = base_dir is None
        self.base_dir = os.path.abspath(base_dir or tempfile.mkdtemp(prefix="embedlog-kafka-"))
        os.makedirs(self.base_dir, exist_ok=True)
        self.heap_mb = heap_mb
        self.fast_start = fast_start
        self.broker_config = dict(broker_config or {})
        self.cluster_id = _cluster_id()
        self._brokers = [_Broker(i + 1, os.path.join(self.base_dir, f"broker-{i}"))
                         for i in range(brokers)]
        # class-data-sharing archives (jvmcds.py): the first JVM of a role makes one, later
        # ones start faster; only for fast_start, whose JVM options the archives are made with
        cds = os.path.join(jars.cache_dir(), "cds")
        self._archives = {role: jvmcds.ClassArchive(cds, f"{KAFKA_PEER}-{role}", self.java,
                                                    self.classpath)
                          for role in ("broker", "format")}
        self._log4j = os.path.join(self.base_dir, "log4j2.properties")
        with open(self._log4j, "w") as f:
            f.write(jars.LOG4J2_WARN)
        self._closed = False
        atexit.register(self._close_at_exit)
        forking.track(self)
        t0 = time.monotonic()
        try:
            self._start_all()
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - t0      # format + start + ready, all brokers

    # -- configuration ----------------------------------------------------------------

    def _properties(self, b: _Broker) -> dict:
        n = len(self._brokers)
        rf = min(3, n)
        voters = ",".join(f"{x.node_id}@127.0.0.1:{x.controller_port}" for x in self._brokers)
        props = {
            "process.roles": "broker,controller",
            "node.id": b.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{b.port},CONTROLLER://127.0.0.1:{b.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{b.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": b.data_dir,
            "auto.create.topics.enable": "false",
            "default.replication.factor": rf,
            "min.insync.replicas": 2 if n >= 3 else 1,
            # the internal topics: one partition, replicated like the data
            "offsets.topic.num.partitions": 1,
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.num.partitions": 1,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": 2 if n >= 3 else 1,
            "share.coordinator.state.topic.num.partitions": 1,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": 2 if n >= 3 else 1,
            "group.initial.rebalance.delay.ms": 0,
            # a killed broker is fenced (and leaves the ISR) after this, not after Kafka's 9 s,
            # and a restarted one registers again once its old session ran out (tests kill
            # and restart; the benchmark sets Kafka's defaults back, 2000 and 9000)
            "broker.heartbeat.interval.ms": 500,
            "broker.session.timeout.ms": 3000,
        }
        props.update(self.broker_config)
        return props

    def _write_config(self, b: _Broker) -> None:
        os.makedirs(b.directory, exist_ok=True)
        with open(b.config_path, "w") as f:
            for k, v in self._properties(b).items():
                f.write(f"{k}={v}\n")

    def _jvm(self) -> list[str]:
        heap = [f"-Xmx{self.heap_mb}m", f"-Xms{min(self.heap_mb, 256)}m"]
        return [self.java, *heap, *(FAST_OPTS if self.fast_start else G1_OPTS),
                "-Djava.awt.headless=true", "-Djava.net.preferIPv4Stack=true",
                f"-Dlog4j2.configurationFile=file:{self._log4j}", "-cp", self.classpath]

    # -- starting ---------------------------------------------------------------------

    def _format(self, brokers: list[_Broker]) -> None:
        """Kafka's storage tool for each broker's log dir, in parallel (a JVM each)."""
        procs = []
        for b in brokers:
            shutil.rmtree(b.data_dir, ignore_errors=True)
            out = open(os.path.join(b.directory, "format.log"), "wb")
            cds, exited = self._archives["format"].options()
            procs.append((b, out, exited, subprocess.Popen(
                [self.java, "-Xmx128m", *FAST_OPTS, *cds, "-cp", self.classpath,
                 f"-Dlog4j2.configurationFile=file:{self._log4j}",
                 "kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                 "-c", b.config_path], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)))
        for b, out, exited, p in procs:
            rc = p.wait(timeout=START_TIMEOUT_S)
            exited()
            out.close()
            if rc != 0:
                with open(os.path.join(b.directory, "format.log"), errors="replace") as f:
                    raise RuntimeError(f"kafka storage format of broker {b.node_id} failed "
                                       f"({rc}): {f.read()[-2000:]}")

    def _spawn(self, b: _Broker) -> None:
        log = open(b.log_path, "ab")
        cds, b.exited = self._archives["broker"].options() if self.fast_start else ([], _nothing)
        try:
            b.process = subprocess.Popen([*self._jvm(), *cds, "kafka.Kafka", b.config_path],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=b.directory,
                                         preexec_fn=die_with_parent)
        finally:
            log.close()

    def _start_all(self) -> None:
        for attempt in range(PORT_ATTEMPTS):
            ports = free_ports(2 * len(self._brokers))
            for i, b in enumerate(self._brokers):
                b.port, b.controller_port = ports[2 * i], ports[2 * i + 1]
            for b in self._brokers:              # every voter's port is known now
                self._write_config(b)
            self._format(self._brokers)
            for b in self._brokers:
                self._spawn(b)
            try:
                self._wait_ready(self._brokers)
                return
            except PortTaken:
                for b in self._brokers:
                    self._kill(b)
                if attempt == PORT_ATTEMPTS - 1:
                    raise

    def _wait_ready(self, brokers: list[_Broker]) -> None:
        """Until the cluster's metadata lists every running broker (registered, unfenced)."""
        admin = _admin(",".join(f"127.0.0.1:{b.port}" for b in brokers))
        want = {b.node_id for b in self._brokers if b.running()}
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for b in brokers:
                if b.process.poll() is not None:
                    tail = b.log_tail()
                    if port_taken(tail):
                        raise PortTaken(tail)
                    raise RuntimeError(f"kafka broker {b.node_id} exited with "
                                       f"{b.process.returncode}: {tail}")
            try:
                listed = set(admin.list_topics(timeout=1.0).brokers)
            except Exception:          # KafkaException: not answering yet
                listed = set()
            if want <= listed:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"kafka brokers {sorted(want - listed)} not ready within "
                                   f"{START_TIMEOUT_S} s: {brokers[0].log_tail()}")
            time.sleep(0.05)

    # -- what tests and benchmarks use --------------------------------------------------

    def __len__(self) -> int:
        return len(self._brokers)

    def _b(self, i: int) -> _Broker:
        if not isinstance(i, int) or not 0 <= i < len(self._brokers):
            raise IllegalOpError(f"no broker {i!r} in a Kafka cluster of {len(self._brokers)}")
        return self._brokers[i]

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: every broker, running or not."""
        return ",".join(f"127.0.0.1:{b.port}" for b in self._brokers)

    def port(self, i: int) -> int:
        return self._b(i).port

    def pid(self, i: int) -> int | None:
        """Broker ``i``'s process id; None when it is not running."""
        b = self._b(i)
        return b.process.pid if b.running() else None

    def data_dir(self, i: int) -> str:
        return self._b(i).data_dir

    def is_running(self, i: int) -> bool:
        return self._b(i).running()

    def log_tail(self, i: int, n_bytes: int = 3000) -> str:
        return self._b(i).log_tail(n_bytes)

    def admin(self):
        """A confluent-kafka AdminClient on this cluster (quiet)."""
        return _admin(self.bootstrap)

    def create_topic(self, name: str, partitions: int = 1, rf: int | None = None,
                     config: dict | None = None, timeout_s: float = 60.0) -> None:
        """Create ``name`` and wait until every partition has a leader and its full ISR.
        ``config`` holds topic settings (``{"flush.messages": "1"}``: fsync every append)."""
        # optional dependency (test and bench extras); _admin_class checked it at start
        from confluent_kafka.admin import NewTopic
        rf = min(3, len(self._brokers)) if rf is None else rf
        admin = self.admin()
        topic = NewTopic(name, num_partitions=partitions, replication_factor=rf,
                         config={k: str(v) for k, v in (config or {}).items()})
        admin.create_topics([topic], operation_timeout=timeout_s)[name].result(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            md = admin.list_topics(name, timeout=5.0).topics.get(name)
            if (md is not None and md.error is None and len(md.partitions) == partitions
                    and all(p.leader >= 0 and len(p.isrs) == rf for p in md.partitions.values())):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name!r} has no leader or a short ISR after "
                                   f"{timeout_s} s: {md}")
            time.sleep(0.05)

    def kill_broker(self, i: int) -> None:
        """SIGKILL broker ``i`` (no controlled shutdown: a crash)."""
        self._kill(self._b(i))

    def stop_broker(self, i: int) -> None:
        """Stop broker ``i`` cleanly (SIGTERM: Kafka's controlled shutdown)."""
        self._stop(self._b(i))

    def start_broker(self, i: int) -> None:
        """Start broker ``i`` again on its ports and data (after kill_broker or
        stop_broker); returns when it is listed."""
        b = self._b(i)
        if b.running():
            raise IllegalOpError(f"kafka broker {i} is running")
        self._spawn(b)
        self._wait_ready([b])

    def restart_broker(self, i: int) -> None:
        """Stop broker ``i`` (if running) and start it again on its ports and data."""
        self.stop_broker(i)
        self.start_broker(i)

    def _kill(self, b: _Broker) -> None:
        if b.running():
            b.process.kill()
        self._reap(b)

    @staticmethod
    def _reap(b: _Broker) -> None:
        if b.process is not None:
            b.process.wait()
            b.exited()
            b.exited = _nothing

    def _stop(self, b: _Broker, timeout_s: float = STOP_TIMEOUT_S) -> None:
        if b.running():
            b.process.terminate()
            try:
                b.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                b.process.kill()
        self._reap(b)

    def close(self) -> None:
        """Stop every broker (SIGTERM to all, SIGKILL to any still running after
        STOP_TIMEOUT_S) and remove the directory the cluster made."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_at_exit)
        for b in self._brokers:
            if b.running():
                b.process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for b in self._brokers:
            if b.process is None:
                continue
            try:
                b.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                b.process.kill()
            self._reap(b)
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _after_fork(self, _gone) -> None:
        # a forked child: the brokers are the parent's
        atexit.unregister(self._close_at_exit)
        self._closed = True

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except Exception as exc:
            print(f"KafkaCluster at exit: {exc}", file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        running = sum(b.running() for b in self._brokers)
        return f"KafkaCluster({len(self._brokers)} brokers, {running} running, {self.bootstrap})"


def spark_jars() -> str:
    """``spark.jars`` for format("kafka"): the connector's jars that PySpark does not ship
    (the connector, kafka-clients, commons-pool2, the token provider). Jars of the same
    artifact as one in PySpark's jars directory (scala-library, hadoop-client, lz4, snappy,
    slf4j, spark-tags) are left out, so Spark's own versions are the only ones loaded."""
    import pyspark  # optional: the spark extra
    shipped = {_artifact(f) for f in os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))}
    d = jars.fetch(SPARK_KAFKA_PEER)
    return ",".join(os.path.join(d, f) for f in sorted(os.listdir(d))
                    if f.endswith(".jar") and _artifact(f) not in shipped)


def _artifact(jar: str) -> str:
    """'kafka-clients-3.9.2.jar' -> 'kafka-clients', 'zstd-jni-1.5.7-7.jar' -> 'zstd-jni',
    'spark-sql-kafka-0-10_2.13-4.2.0.jar' -> 'spark-sql-kafka-0-10_2.13'."""
    m = re.match(r"(.+?)-\d+(?:\.\d+)+", jar)
    return m.group(1) if m else jar.removesuffix(".jar")
