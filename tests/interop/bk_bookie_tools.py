"""What test_bookkeeper_bookie.py's tests share: driving BkDriver line by line, BkLedgers and
BkCookie runs (one JVM for many ledgers or cookies), and looks at what a bookie left (its
log's failpoint lines, a ledger's index header)."""
from __future__ import annotations

import glob
import os
import re
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

from embedlog.harness.peers import jars

PASSWORD = "bookie-pw"


def parallel(*calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def send_lines(proc, payloads) -> None:
    proc.stdin.write("".join(p.hex() + "\n" for p in payloads))
    proc.stdin.flush()


def driver_lines(proc, result, until, what: str) -> None:
    while not until(result):
        line = proc.stdout.readline()
        assert line, f"BkDriver ended before {what}: {result.lines} {proc.stderr.read()[-2000:]}"
        result.feed(line)


def finish(proc, result) -> int:
    proc.stdin.close()
    for line in proc.stdout:
        result.feed(line)
    return proc.wait(timeout=60)


def java_read_many(bk, lids) -> dict:
    """embedlog/harness/peers/java/BkLedgers.java read: per ledger (lac, [(eid, payload)]) or its error."""
    source = jars.java_source("BkLedgers.java")
    out = subprocess.run([jars.java(), *jars.JVM_OPTS, "-Xmx192m", "-cp",
                          jars.classpath(f"bookkeeper-{bk.version}"), source, "read",
                          bk.metadata_uri, PASSWORD, *map(str, lids)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    got: dict = {}
    for line in out.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "lac":
            lid, lac = map(int, rest.split())
            got[lid] = (lac, [])
        elif word == "entry":
            lid, eid, data = rest.split(" ")
            got[int(lid)][1].append((int(eid), bytes.fromhex(data)))
        elif word == "error":
            lid, _, why = rest.partition(" ")
            got[int(lid)] = why
    return got


def entries(n: int, tag: str = "entry") -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def java_cookies(bk, ids) -> dict:
    """embedlog/harness/peers/java/BkCookie.java: per bookie id, the cookie BookKeeper's Cookie class read
    (its toString) or the error."""
    source = jars.java_source("BkCookie.java")
    out = subprocess.run([jars.java(), *jars.JVM_OPTS, "-Xmx128m", "-cp",
                          jars.classpath(f"bookkeeper-{bk.version}"), source,
                          bk.metadata_uri, *ids], capture_output=True, text=True, timeout=120)
    got: dict = {}
    current = None
    for line in out.stdout.splitlines():
        if current is None and line.startswith("cookie "):
            current = line.split()[1]
            got[current] = ""
        elif current is None and line.startswith("error "):
            _, bid, why = line.split(" ", 2)
            got[bid] = RuntimeError(why)
        elif line == "end":
            current = None
        elif current is not None:
            got[current] += line + "\n"
    assert set(got) == set(ids), out.stdout + out.stderr[-3000:]
    return got


def closed_by_peer(s: socket.socket) -> bool:
    try:
        while True:
            if not s.recv(65536):
                return True
    except socket.timeout:
        return False
    except OSError:
        return True


def lac_body_on_disk(lc, i: int, lid: int) -> bytes | None:
    """The WRITE_LAC body in the index header of ``lid`` on embedlog bookie ``i``, or None."""
    from embedlog._native import index as ni
    paths = glob.glob(os.path.join(lc.bookie_dir(i), "**", f"{lid:x}.idx"), recursive=True)
    if not paths:
        return None
    with open(paths[0], "rb") as f:
        h = f.read(ni.HEADER_SIZE)
    if len(h) < ni.HEADER_SIZE or not int.from_bytes(h[8:12], "big") & ni.STATE_LAC_BODY:
        return None
    return h[116:116 + int.from_bytes(h[112:116], "big")]


def fired_on(lc, bookie_id: str) -> list[tuple[str, str]]:
    """(point, fault) of each message failpoint the bookie's log says fired."""
    with open(os.path.join(lc.bookie_dir(lc.index_of(bookie_id)), "bookie.log")) as f:
        return re.findall(r"failpoint (bkserver\.\w+): \('(\w+)'", f.read())
