"""BookKeeper's own Java code as the oracle of embedlog's BookKeeper metadata formats.

Runs ``java/BkMeta.java`` (ours, package data) against the jars of one BookKeeper version:

- ``shell_batch``: many BookieShell commands in one JVM (a JVM start costs ~1-2 s; a
  command in a warm one ~0.1 s), each command's output and return code apart;
- ``create_many``: BookKeeper's client creating ledgers as fast as it can (ids from its
  own LongZkLedgerIdGenerator), for races against embedlog's generator;
- ``goldens``: ledgers of every kind BookKeeper makes, and what its getters say of them
  (tools/make_bookkeeper_goldens.py keeps them under tests/fixtures/bookkeeper/).

BkMeta.java is compiled once per version and source hash into the jar cache (the source
launcher when javac is missing).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from embedlog.harness.peers import jars

SOURCE = os.path.join(jars.JAVA_DIR, "BkMeta.java")
HEAP = ["-Xmx192m", "-XX:MaxDirectMemorySize=128m"]
TIMEOUT_S = 120.0
_BEGIN = re.compile(r"^### begin (\d+)$")
_END = re.compile(r"^### end (\d+) (-?\d+)$")


class BkMetaError(RuntimeError):
    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def command(version: str) -> list[str]:
    """``java ... BkMeta`` against ``version``'s jars."""
    java, cp = jars.java(), jars.classpath(f"bookkeeper-{version}")
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    javac = shutil.which("javac")
    if javac is None:
        return [java, *jars.JVM_OPTS, *HEAP, "-cp", cp, SOURCE]
    out = os.path.join(jars.cache_dir(), f"bkmeta-{version}-{digest}")
    if not os.path.exists(os.path.join(out, "BkMeta.class")):
        with open(out + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)          # two test processes compile once
            if not os.path.exists(os.path.join(out, "BkMeta.class")):
                staging = tempfile.mkdtemp(prefix=".bkmeta-", dir=jars.cache_dir())
                run = subprocess.run([javac, "-nowarn", "-d", staging, "-cp", cp, SOURCE],
                                     capture_output=True, text=True)
                if run.returncode != 0:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise BkMetaError(f"javac BkMeta.java failed: {run.stderr[-2000:]}", run.stderr)
                shutil.rmtree(out, ignore_errors=True)
                os.rename(staging, out)
    return [java, *jars.JVM_OPTS, *HEAP, "-cp", f"{out}:{cp}", "BkMeta"]


def _run(version: str, args: list[str], stdin: str | None = None, cwd: str | None = None) -> str:
    run = subprocess.run(command(version) + args, input=stdin, capture_output=True, text=True,
                         timeout=TIMEOUT_S, cwd=cwd)
    if run.returncode != 0:
        raise BkMetaError(f"BkMeta {' '.join(args)} exited {run.returncode}: "
                          f"{run.stdout[-3000:]}{run.stderr[-2000:]}", run.stdout + run.stderr)
    return run.stdout


def shell_batch(version: str, conf_path: str, commands: list[list]) -> list[tuple[int, str]]:
    """(return code, output) of each BookieShell command, run one after another in one JVM
    with the client configuration ``conf_path`` (a command whose first word is ``@PATH``
    uses the configuration PATH). Output is what BookieShell logged and printed on stdout
    between the command's markers (log lines keep their prefixes)."""
    lines = "".join(" ".join(map(str, c)) + "\n" for c in commands)
    out = _run(version, ["--conf", conf_path, "shell"], stdin=lines)
    results: list[tuple[int, str]] = []
    current: list[str] | None = None
    for line in out.splitlines():
        if _BEGIN.match(line):
            current = []
        elif (m := _END.match(line)) and current is not None:
            results.append((int(m.group(2)), "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    if len(results) != len(commands):
        raise BkMetaError(f"shell batch ran {len(results)} of {len(commands)} commands", out)
    return results


def create_many_popen(version: str, metadata_uris: list[str], count: int, *, ensemble: int = 1,
                      in_flight: int = 8) -> subprocess.Popen:
    """BookKeeper's client creating ``count`` ledgers on each root (one client per root, in
    turns); it prints "ledger ROOT_INDEX ID" per ledger as created, then "end". Read its
    stdout to the end, then wait()."""
    return subprocess.Popen(command(version) + ["--metadata-uri", "|".join(metadata_uris),
                                                "create-many", str(count), "--ensemble",
                                                str(ensemble), "--in-flight", str(in_flight)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)


def goldens(version: str, metadata_uri: str, out_dir: str) -> None:
    """Make the golden ledgers on a cluster (3 bookies at least) and write
    ``out_dir/manifest.json``: name -> what BookKeeper's getters say of that ledger."""
    _run(version, ["--metadata-uri", metadata_uri, "goldens", os.path.abspath(out_dir)])
