"""Jars of the Java test and benchmark peers (Apache BookKeeper, Kafka, Spark's Kafka
connector, Pulsar's broker), fetched from Maven Central into a cache; never a runtime dependency.

Each peer is a pinned list of Maven coordinates. ``fetch(name)`` resolves them with their
runtime dependencies (``mvn dependency:copy-dependencies`` on a throwaway pom) into
``<cache>/<name>/``, which is complete once its ``.complete`` marker exists; later calls
return at once. The cache is ``$EMBEDLOG_PEERS_DIR`` or ``~/.cache/embedlog/peers``.
``make peers`` (and so ``make test``) fills it on a fresh machine.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import tempfile

from embedlog.harness.servers import ServerMissing

# name -> Maven coordinates (group, artifact, version). BookKeeper 4.17.2 is the newest
# 4.17; 4.16.6 the newest 4.16 served here (4.16.7 is not on Maven Central), the line Pulsar
# 3.x uses. bookkeeper-benchmark is not published for either.
PEERS: dict[str, list[tuple[str, str, str]]] = {
    "bookkeeper-4.17.2": [("org.apache.bookkeeper", "bookkeeper-server", "4.17.2")],
    "bookkeeper-4.16.6": [("org.apache.bookkeeper", "bookkeeper-server", "4.16.6")],
    # Kafka's broker (KRaft) for benchmarks/vs_kafka.py's side by side (embedlog/harness/peers/kafka.py)
    # (log4j-slf4j-impl: Kafka logs through SLF4J 1.7, and its runtime dependencies bind none)
    "kafka-4.4.0": [("org.apache.kafka", "kafka_2.13", "4.4.0"),
                    ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.5")],
    # Spark's Kafka source and sink. PySpark runs 4.3.0, whose connector is not served;
    # 4.2.0 is the newest that is. Only the jars Spark does not ship go on spark.jars
    # (embedlog.harness.peers.kafka.spark_jars).
    "spark-sql-kafka-4.2.0": [("org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.2.0")],
    # Pulsar's broker (embedlog/harness/peers/pulsar.py): 4.0.0, the 4.0 LTS release that resolves
    # whole here (4.0.8 lacks pulsar-opentelemetry on this registry). jetcd-core-shaded is
    # only for etcd metadata, and is not served
    "pulsar-broker-4.0.0": [("org.apache.pulsar", "pulsar-broker", "4.0.0")],
}
EXCLUDE = {"pulsar-broker-4.0.0": [("org.apache.pulsar", "jetcd-core-shaded")]}
# Pulsar's poms declare repositories besides Maven Central that cannot be reached from
# here, and Maven stops at the first: every other repository mirrors to an empty folder
SETTINGS = ("<settings><mirrors><mirror><id>unreachable</id><mirrorOf>*,!central</mirrorOf>"
            "<url>file://{empty}</url></mirror></mirrors></settings>")
BOOKKEEPER_VERSIONS = ("4.17.2", "4.16.6")
MARKER = ".complete"

# The JVM options BookKeeper's own scripts use on Java 17, and a heap that fits 2 cores.
JVM_OPTS = ["-Djava.net.preferIPv4Stack=true", "-Dio.netty.tryReflectionSetAccessible=true",
            "--add-opens", "java.base/java.nio=ALL-UNNAMED",
            "--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
            "--add-opens", "java.base/java.io=ALL-UNNAMED",
            "--add-opens", "java.base/java.util.zip=ALL-UNNAMED",
            "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


# log4j2 properties for a peer's JVM: warnings and errors on its console (the process log)
LOG4J2_WARN = """status = error
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
"""


# Our Java programs (BkDriver, BkMeta, BkLedgers, BkCookie): package data next to this module,
# so an installed embedlog compiles them as a checkout does.
JAVA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java")


def java_source(name: str) -> str:
    """The path of one of our Java programs (``"BkDriver"`` or ``"BkDriver.java"``)."""
    path = os.path.join(JAVA_DIR, name if name.endswith(".java") else name + ".java")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: embedlog's package data is missing this Java source")
    return path


def cache_dir() -> str:
    return os.environ.get("EMBEDLOG_PEERS_DIR") or os.path.expanduser("~/.cache/embedlog/peers")


def peer_dir(name: str) -> str:
    return os.path.join(cache_dir(), name)


def is_fetched(name: str) -> bool:
    return os.path.exists(os.path.join(peer_dir(name), MARKER))


def _pom(coords: list[tuple[str, str, str]], exclude: list[tuple[str, str]]) -> str:
    excl = "".join(f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
                   for g, a in exclude)
    deps = "".join(f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
                   f"<version>{v}</version><exclusions>{excl}</exclusions></dependency>"
                   for g, a, v in coords)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            '<groupId>embedlog.peers</groupId><artifactId>peer</artifactId><version>1</version>'
            f"<dependencies>{deps}</dependencies></project>")


def fetch(name: str) -> str:
    """The directory holding ``name``'s jars, fetched first if missing (ServerMissing when
    Maven or the network cannot provide them)."""
    if name not in PEERS:
        raise KeyError(f"unknown peer {name!r}; known: {', '.join(sorted(PEERS))}")
    target = peer_dir(name)
    if is_fetched(name):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServerMissing(f"{name}: Maven (mvn) is not installed, so its jars cannot be fetched")
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)       # two test processes fetch once
        if is_fetched(name):
            return target
        with tempfile.TemporaryDirectory(prefix="embedlog-pom-") as tmp:
            pom, settings = os.path.join(tmp, "pom.xml"), os.path.join(tmp, "settings.xml")
            with open(pom, "w") as f:
                f.write(_pom(PEERS[name], EXCLUDE.get(name, [])))
            os.makedirs(os.path.join(tmp, "empty"))
            with open(settings, "w") as f:
                f.write(SETTINGS.format(empty=os.path.join(tmp, "empty")))
            staging = target + ".partial"
            shutil.rmtree(staging, ignore_errors=True)
            run = subprocess.run(
                [mvn, "-B", "-q", "-s", settings, "-f", pom, "dependency:copy-dependencies",
                 "-DincludeScope=runtime", f"-DoutputDirectory={staging}"],
                capture_output=True, text=True)
            if run.returncode != 0:
                raise ServerMissing(f"{name}: mvn could not fetch {PEERS[name]}: "
                                    f"{(run.stdout + run.stderr)[-1500:]}")
            open(os.path.join(staging, MARKER), "w").close()
            shutil.rmtree(target, ignore_errors=True)
            os.rename(staging, target)
    return target


def classpath(name: str) -> str:
    """``name``'s jars joined for ``java -cp`` (fetched first if missing)."""
    d = fetch(name)
    return ":".join(sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".jar")))


def java() -> str:
    path = shutil.which("java")
    if path is None:
        raise ServerMissing("java is not installed (Java 17 runs the BookKeeper and Kafka peers)")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fetch the Java peers' jars into the cache")
    ap.add_argument("names", nargs="*", help=f"peers (default all): {', '.join(PEERS)}")
    args = ap.parse_args(argv)
    for name in args.names or list(PEERS):
        print(f"{name}: {fetch(name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
