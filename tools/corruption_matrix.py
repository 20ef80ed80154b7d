"""The corruption matrix: damage each kind of file of an embedded log and reopen.

For a clean base (closed cleanly) and a crashed one (a writer killed by SIGKILL after a
checkpoint), in each storage layout, each file kind -- entry logs (layout 1: the first,
sealed, and the last) or journal segments (layout 2: the first and last ``.seg``, the
first's ``.seg.map``, current/LAYOUT), index files, the newest journal file, the metadata
(meta.db) and the cookies (current/VERSION, journal/VERSION) -- is flipped (one byte),
truncated (to half) and deleted, on a fresh copy of the base; the copy is reopened and
every acknowledged entry read back through recovery.
Each case is classified:

  refused     opening or reading raised an embedlog error (the damage is named)
  reported    it opened and the damage was repaired or its loss logged (WARNING or worse)
  unaffected  every acknowledged entry came back, byte for byte, and nothing needed saying
  silent      an acknowledged entry is missing or wrong and nothing was raised or logged

Usage: python tools/corruption_matrix.py [--verbose] [--layout 1|2]. Exit status 1 if any
case is silent.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import embedlog  # noqa: E402
from embedlog import LedgerId  # noqa: E402
from embedlog._native import entrylog as nel  # noqa: E402
from embedlog._native import index as nix  # noqa: E402
from embedlog._native import journal_format as jformat, journal_scan as jscan  # noqa: E402
from embedlog.bookie.journal_files import journal_ids  # noqa: E402
from embedlog.errors import EmbedlogError  # noqa: E402

CFG = dict(journal_pre_alloc_size_mb=1, skip_list_size_limit=64 << 10,
           entry_log_size_limit=1 << 20, flush_interval_ms=3_600_000)


def config(layout: int) -> dict:
    # layout 2: journals of 1 MiB, so the entries fill several segments
    return dict(CFG, storage_layout=layout, **({"journal_max_size_mb": 1} if layout == 2 else {}))
N_CHECKPOINTED, N_AFTER = 1500, 40

CHILD = r"""
import sys, time, embedlog
cfg = dict(journal_pre_alloc_size_mb=1, skip_list_size_limit=64 << 10,
           entry_log_size_limit=1 << 20, flush_interval_ms=3_600_000,
           storage_layout=int(sys.argv[4]))
if cfg["storage_layout"] == 2:
    cfg["journal_max_size_mb"] = 1
n1, n2 = int(sys.argv[2]), int(sys.argv[3])
log = embedlog.open(sys.argv[1], **cfg)
ws = [log.create_ledger(digest=d) for d in ("crc32c", "dummy")]
for w in ws:
    w.append_many([b"%s-%06d" % (d, i) + bytes(300) for d in [w.ledger_id.qualified_name.encode()]
                   for i in range(n1)])
log.bookie.checkpoint()
for w in ws:
    for i in range(n1, n1 + n2):
        w.append(b"%s-%06d" % (w.ledger_id.qualified_name.encode(), i) + bytes(300))
    print(w.ledger_id.qualified_name, w.last_add_confirmed, flush=True)
time.sleep(600)
"""


def payload(q: str, i: int) -> bytes:
    return b"%s-%06d" % (q.encode(), i) + bytes(300)


def make_clean(path, layout) -> dict:
    with embedlog.open(path, **config(layout)) as log:
        out = {}
        for d in ("crc32c", "dummy"):
            w = log.create_ledger(digest=d)
            q = w.ledger_id.qualified_name
            w.append_many([payload(q, i) for i in range(N_CHECKPOINTED + N_AFTER)])
            w.close()
            out[q] = N_CHECKPOINTED + N_AFTER - 1
    return out


def make_crashed(path, layout) -> dict:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(N_CHECKPOINTED),
                              str(N_AFTER), str(layout)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": ROOT})
    out = {}
    try:
        for _ in range(2):
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(child.stderr.read())
            q, last = line.split()
            out[q] = int(last)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return out


def targets(path, acked) -> list:
    """(kind, file, offset) of each file to damage in a copy of the base at ``path``: where a
    byte is flipped (None: the middle) and, for an entry log, where it is cut."""
    cur = os.path.join(path, "current")
    jdir = os.path.join(path, "journal")
    logs = sorted((int(n[:-4], 16), n) for n in os.listdir(cur) if n.endswith(".log"))
    out = []
    for which, (log_id, name) in (("first", logs[0]), ("last", logs[-1])) if logs else ():
        m = nel.MappedLog.open_existing(os.path.join(cur, name), log_id)
        middle = (nel.HEADER_SIZE + m.position) // 2             # inside its entries
        m.close()
        out.append((f"entry log ({which})", os.path.join(cur, name), middle))
    segs = journal_ids(jdir, ".seg")
    for which, i in (("first", segs[0]), ("last", segs[-1])) if segs else ():
        seg = os.path.join(jdir, "%x.seg" % i)
        _records, end, _status, _skipped = jscan.scan_file(open(seg, "rb").read())
        out.append((f"segment ({which})", seg, (jformat.HEADER_SIZE + end) // 2))
    if segs:
        out.append(("segment map (first)", os.path.join(jdir, "%x.seg.map" % segs[0]), None))
        out.append(("current/LAYOUT", os.path.join(cur, "LAYOUT"), 0))
    for q in sorted(acked):
        lid = LedgerId.parse(q)
        idx = nix.index_path(cur, lid.scope_id, lid.ledger_id)
        # a byte of entry 10's location (page 0)
        out.append((f"index file ({'dummy' if q == sorted(acked)[1] else 'crc32c'})", idx,
                    nix.HEADER_SIZE + 8 * 10 + 1))
    newest = os.path.join(jdir, "%x.txn" % journal_ids(jdir)[-1])
    data = open(newest, "rb").read()
    _records, end, _status, _skipped = jscan.scan_file(data)
    out.append(("journal (newest)", newest, (jformat.HEADER_SIZE + end) // 2))
    out.append(("metadata meta.db", os.path.join(path, "meta.db"), None))
    out.append(("cookie current/VERSION", os.path.join(cur, "VERSION"), None))
    out.append(("cookie journal/VERSION", os.path.join(jdir, "VERSION"), None))
    return out


def damage(path: str, action: str, flip_at) -> None:
    size = os.path.getsize(path)
    if action == "delete":
        os.unlink(path)
    elif action == "truncate":
        os.truncate(path, flip_at if flip_at is not None and path.endswith((".log", ".seg"))
                    else size // 2)
    else:
        off = flip_at if flip_at is not None else size // 2
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def reopen(path, acked, layout) -> tuple[str, str]:
    """(class, detail) of reopening a damaged copy and reading every acknowledged entry."""
    handler = _Records()
    logger = logging.getLogger("embedlog")
    logger.addHandler(handler)
    try:
        try:
            with embedlog.open(path, **config(layout)) as log:
                problems = []
                for q, last in acked.items():
                    r = log.open_ledger(LedgerId.parse(q))
                    if r.last_add_confirmed < last:
                        problems.append(f"{q}: LAC {r.last_add_confirmed} < {last} acknowledged")
                    top = min(last, r.last_add_confirmed)
                    if top >= 0:
                        got = r.read_batch(0, top)
                        bad = [i for i, g in enumerate(got) if g != payload(q, i)]
                        if bad:
                            problems.append(f"{q}: {len(bad)} entries differ (first {bad[0]})")
                stats = log.bookie.statistics()
                reported = handler.records or stats["damaged_ledgers"] or \
                    stats["replay"].get("torn") or stats["replay"].get("skipped")
        except EmbedlogError as exc:
            return "refused", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    finally:
        logger.removeHandler(handler)
    if problems:
        return ("reported" if reported else "silent"), "; ".join(problems) + (
            f" [logged: {handler.records[0][:120]}]" if handler.records else "")
    if reported:
        return "reported", (handler.records[0][:160] if handler.records else
                            f"damaged ledgers {list(stats['damaged_ledgers'])}")
    return "unaffected", ""


def run(verbose: bool, layouts=(1, 2)) -> dict:
    counts = {"refused": 0, "reported": 0, "unaffected": 0, "silent": 0}
    rows = []
    with tempfile.TemporaryDirectory(prefix="embedlog-matrix-") as tmp:
        for layout, base_name, make in ((la, n, m) for la in layouts for n, m in
                                        (("clean", make_clean), ("crashed", make_crashed))):
            base = os.path.join(tmp, f"{base_name}{layout}")
            acked = make(base, layout)
            base_name = f"{base_name}/{layout}"
            for kind, file, flip_at in targets(base, acked):
                for action in ("flip", "truncate", "delete"):
                    case = os.path.join(tmp, "case")
                    shutil.rmtree(case, ignore_errors=True)
                    shutil.copytree(base, case, ignore=shutil.ignore_patterns("LOCK"))
                    damage(os.path.join(case, os.path.relpath(file, base)), action, flip_at)
                    cls, detail = reopen(case, acked, layout)
                    counts[cls] += 1
                    rows.append((base_name, kind, action, cls, detail))
                    if verbose or cls == "silent":
                        print(f"{base_name:8} {kind:26} {action:9} {cls:10} {detail}", flush=True)
    return {"counts": counts, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose", action="store_true", help="print every case, not only silent ones")
    ap.add_argument("--layout", type=int, choices=(1, 2), action="append",
                    help="the storage layout of the bases (default: both)")
    args = ap.parse_args()
    logging.getLogger("embedlog").setLevel(logging.WARNING)
    logging.getLogger("embedlog").propagate = False
    out = run(args.verbose, tuple(args.layout or (1, 2)))
    print(" ".join(f"{k}={v}" for k, v in out["counts"].items()))
    return 1 if out["counts"]["silent"] else 0


if __name__ == "__main__":
    sys.exit(main())
