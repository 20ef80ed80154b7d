"""BkDriver (java/BkDriver.java, package data), our driver of BookKeeper's Java client: built
once per version and source into a jar, its arguments from Python names, its output parsed.
BookKeeperCluster (bookkeeper.py) runs it; the grammar of what it prints is at the
top of BkDriver.java."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time

from embedlog.harness.peers import jars

OLD_BUILD_S = 86400.0           # a build of another BkDriver.java is removed at this age
DRIVER_SOURCE = os.path.join(jars.JAVA_DIR, "BkDriver.java")


class BookKeeperToolError(RuntimeError):
    """A BookieShell command or a BkDriver run failed; ``output`` holds what it printed."""

    def __init__(self, message: str, output: str = "", returncode: int | None = None):
        super().__init__(message)
        self.output = output
        self.returncode = returncode


def _lock(path: str):
    f = open(path, "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def driver_classpath(version: str) -> tuple[str, str | None]:
    """(classpath, main) running BkDriver on ``version``'s jars: compiled once per version
    and source (javac ~1.5 s) into a jar under ``<cache>/bkdriver/`` (a jar, not a class
    directory, so class-data sharing takes it); without javac, (jars, None): run the source
    file with Java's source launcher, which compiles on every run."""
    cp = jars.classpath(f"bookkeeper-{version}")
    javac = shutil.which("javac")
    if javac is None:
        return cp, None
    with open(DRIVER_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    home = os.path.join(jars.cache_dir(), "bkdriver")
    jar = os.path.join(home, f"BkDriver-{version}-{digest}.jar")
    if not os.path.exists(jar):
        os.makedirs(home, exist_ok=True)
        with _lock(os.path.join(home, ".lock")):
            if not os.path.exists(jar):
                _compile_driver(javac, cp, jar)
                _forget_old_builds(home, version, jar)
    return f"{cp}:{jar}", "BkDriver"


def _forget_old_builds(home: str, version: str, jar: str) -> None:
    """Remove builds of an earlier BkDriver.java a day old: a younger one may be running
    (another checkout's tests, e.g. a before/after timing run, use the other source)."""
    for old in os.listdir(home):
        path = os.path.join(home, old)
        if old.startswith(f"BkDriver-{version}-") and path != jar:
            try:
                if time.time() - os.path.getmtime(path) > OLD_BUILD_S:
                    os.unlink(path)
            except FileNotFoundError:        # another process removed it first
                pass


def _compile_driver(javac: str, cp: str, jar: str) -> None:
    import zipfile  # lazy: only when the driver is (re)built
    with tempfile.TemporaryDirectory(prefix="bkdriver-") as classes:
        run = subprocess.run([javac, "-nowarn", "-d", classes, "-cp", cp, DRIVER_SOURCE],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise BookKeeperToolError(f"javac BkDriver.java failed: {run.stderr[-2000:]}",
                                      run.stderr, run.returncode)
        staging = f"{jar}.{os.getpid()}.tmp"
        with zipfile.ZipFile(staging, "w") as z:
            for name in sorted(os.listdir(classes)):
                z.write(os.path.join(classes, name), name)
        os.replace(staging, jar)


@dataclasses.dataclass
class DriverResult:
    """What a BkDriver run printed, parsed (see the grammar at the top of BkDriver.java)."""
    returncode: int | None = None
    lines: list[str] = dataclasses.field(default_factory=list)
    ledger_id: int | None = None
    acked: list[int] = dataclasses.field(default_factory=list)
    ensembles: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    lac: int | None = None
    length: int | None = None
    closed: bool | None = None
    entries: list[tuple[int, bytes]] = dataclasses.field(default_factory=list)
    error: str | None = None        # "CODE NAME MESSAGE" of an error line
    error_code: int | None = None   # BookKeeper's BKException code (e.g. -102 unauthorized)
    bench: dict | None = None
    explicit_lac: int | None = None     # readExplicitLastConfirmed (READ_LAC)
    custom_metadata: dict[str, bytes] = dataclasses.field(default_factory=dict)
    batches: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (first, count)

    def feed(self, line: str) -> None:
        """Take one output line."""
        import json  # lazy: only bench output needs it
        line = line.rstrip("\n")
        self.lines.append(line)
        word, _, rest = line.partition(" ")
        if word == "ledger":
            self.ledger_id = int(rest)
        elif word == "ack":
            self.acked.append(int(rest))
        elif word == "ensemble":
            first, _, bookies = rest.partition(" ")
            self.ensembles[int(first)] = bookies.split(",") if bookies else []
        elif word == "lac":
            self.lac = int(rest)
        elif word == "length":
            self.length = int(rest)
        elif word == "closed":
            self.closed = rest == "true"
        elif word == "entry":
            eid, _, data = rest.partition(" ")
            self.entries.append((int(eid), bytes.fromhex(data)))
        elif word == "explicitlac":
            self.explicit_lac = int(rest)
        elif word == "meta":
            key, _, data = rest.partition(" ")
            self.custom_metadata[key] = bytes.fromhex(data)
        elif word == "batch":
            first, count = rest.split()
            self.batches.append((int(first), int(count)))
        elif word in ("error", "usage"):
            self.error = rest
            code = rest.split(" ", 1)[0]
            self.error_code = int(code) if re.fullmatch(r"-?\d+", code) else None
        elif line.startswith("{"):
            self.bench = json.loads(line)


def driver_args(command: str, *positional, **options) -> list[str]:
    """BkDriver arguments from Python names: ``write_quorum=2`` -> ``--write-quorum 2``,
    ``recover=True`` -> ``--recover`` (False or None leave an option out)."""
    args = [command, *(str(p) for p in positional)]
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args
