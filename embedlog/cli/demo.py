"""`embedlog demo`: the main job on the embedded default.

A writer process appends a realistic workload (several ledgers, event-sized
payloads, single, batched and asynchronous appends) durably, reporting
progress; the parent shows a progress bar, SIGKILLs the writer once everything
is acknowledged (no clean shutdown: the journal must bring it back), reopens
the directory, verifies every entry byte for byte, reads everything back, and
prints throughput and latency percentiles.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

import embedlog
from embedlog import LedgerId


def payload(ledger_index: int, entry_id: int) -> bytes:
    """Deterministic event-like payload (60-400 bytes), so the reader can verify it."""
    h = hashlib.blake2b(b"%d/%d" % (ledger_index, entry_id), digest_size=32).digest()
    size = 60 + (h[0] | (h[1] << 8)) % 340
    head = b'{"ledger":%d,"entry":%d,"kind":"event","body":"' % (ledger_index, entry_id)
    return (head + h.hex().encode() * 13)[:size]


def writer(path: str, ledgers: int, entries: int, seed: int) -> None:
    """Runs in the child: append, print progress lines, never close cleanly."""
    rnd = random.Random(seed)
    log = embedlog.open(path)
    handles = [log.create_ledger(digest="crc32c") for _ in range(ledgers)]
    per = [entries // ledgers + (1 if i < entries % ledgers else 0) for i in range(ledgers)]
    done = [0] * ledgers
    single_lat, batch_lat = [], []
    print(json.dumps({"ledgers": [h.ledger_id.qualified_name for h in handles], "per": per}), flush=True)
    t0 = time.perf_counter()
    written = 0
    last_report = 0.0
    while written < entries:
        i = rnd.randrange(ledgers)
        if done[i] >= per[i]:
            i = next(k for k in range(ledgers) if done[k] < per[k])
        h = handles[i]
        if rnd.random() < 0.02:          # a few lone durable appends, to see their latency
            s = time.perf_counter()
            h.append(payload(i, done[i]))
            single_lat.append(time.perf_counter() - s)
            n = 1
        else:
            n = min(rnd.choice([100, 500, 1000]), per[i] - done[i])
            batch = [payload(i, done[i] + k) for k in range(n)]
            s = time.perf_counter()
            h.append_many(batch)
            batch_lat.append((time.perf_counter() - s, n))
        done[i] += n
        written += n
        now = time.perf_counter()
        if now - last_report > 0.1 or written == entries:
            print(json.dumps({"written": written}), flush=True)
            last_report = now
    elapsed = time.perf_counter() - t0
    print(json.dumps({"done": True, "elapsed_s": elapsed, "single_lat": single_lat,
                      "batch_lat": batch_lat, "journal": log.statistics()["journal"]}), flush=True)
    time.sleep(3600)                     # wait to be killed: no clean shutdown


def run(path: str, ledgers: int = 8, entries: int = 1_000_000, seed: int = 1, console=None,
        out=None) -> dict:
    """The demo in ``path`` (a fresh directory); progress and messages on ``console`` (a rich
    Console, default stderr), the table of figures on ``out`` (default: ``console``)."""


    console = console or Console(stderr=True)
    out = out or console
    path = os.path.abspath(path)
    if os.path.exists(path) and os.listdir(path):
        raise embedlog.errors.ConfigError(f"{path} is not empty; the demo needs a fresh directory")
    os.makedirs(path, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-m", "embedlog.cli.demo", path, str(ledgers),
                              str(entries), str(seed)], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(child.stdout.readline())
        result = None
        with Progress(TextColumn("[bold]writing"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"),
                      TimeRemainingColumn(), console=console, transient=False) as bar:
            task = bar.add_task("write", total=entries)
            for line in child.stdout:
                msg = json.loads(line)
                if "written" in msg:
                    bar.update(task, completed=msg["written"])
                if msg.get("done"):
                    result = msg
                    break
        if result is None:
            raise embedlog.errors.EmbedlogError(f"the writer died (exit code {child.poll()})")
    finally:
        child.send_signal(signal.SIGKILL)       # the crash: no checkpoint, no close
        child.wait()
    console.print(f"writer killed with SIGKILL after {entries:,} acknowledged entries; reopening")

    t0 = time.perf_counter()
    log = embedlog.open(path)
    reopen_s = time.perf_counter() - t0
    try:
        replayed = log.bookie.replay_report["records"]
        verified = 0
        t0 = time.perf_counter()
        with Progress(TextColumn("[bold]verifying"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"),
                      console=console) as bar:
            task = bar.add_task("verify", total=entries)
            for i, (q, n) in enumerate(zip(info["ledgers"], info["per"])):
                r = log.open_ledger(LedgerId.parse(q))          # recovery closes it
                if r.last_add_confirmed != n - 1:
                    raise embedlog.errors.CorruptedDataError(
                        f"ledger {q}: recovered at entry {r.last_add_confirmed}, expected {n - 1}")
                for start in range(0, n, 50_000):
                    got = r.read_batch(start, min(n, start + 50_000) - 1)
                    for k, data in enumerate(got):
                        if data != payload(i, start + k):
                            raise embedlog.errors.CorruptedDataError(f"ledger {q} entry {start + k} differs")
                    verified += len(got)
                    bar.update(task, completed=verified)
        verify_s = time.perf_counter() - t0
        # read-back figures: a sequential scan and random point reads
        handles = [log.open_ledger(LedgerId.parse(q)) for q in info["ledgers"]]
        t0 = time.perf_counter()
        scanned = sum(len(h.read_batch(0, h.last_add_confirmed)) for h in handles)
        scan_s = time.perf_counter() - t0
        rnd = random.Random(seed)
        picks = [(handles[j], rnd.randrange(info["per"][j])) for j in
                 (rnd.randrange(ledgers) for _ in range(100_000))]
        t0 = time.perf_counter()
        for h, e in picks:
            h.read_entry(e)
        point_s = time.perf_counter() - t0
    finally:
        log.close()

    single = np.array(result["single_lat"]) * 1e6 if result["single_lat"] else None
    batch = np.array([t for t, _ in result["batch_lat"]]) * 1e6
    table = Table(title=f"embedlog demo: {entries:,} entries in {ledgers} ledgers ({path})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("durable append throughput", f"{entries / result['elapsed_s']:,.0f} entries/s")
    table.add_row("lone append latency p50 / p99", "-" if single is None else
                  f"{np.percentile(single, 50):,.0f} / {np.percentile(single, 99):,.0f} µs")
    table.add_row("batch append latency p50 / p99 / max", f"{np.percentile(batch, 50):,.0f} / {np.percentile(batch, 99):,.0f} / {batch.max():,.0f} µs")
    table.add_row("fdatasyncs (shared by groups)", f"{result['journal']['fsyncs']:,}")
    table.add_row("reopen after SIGKILL (journal replay)", f"{reopen_s:.2f} s, {replayed:,} records")
    table.add_row("verified entries", f"{verified:,} of {entries:,} ({verify_s:.1f} s)")
    table.add_row("sequential scan (read_batch)", f"{scanned / scan_s:,.0f} entries/s")
    table.add_row("random point reads (read_entry)", f"{len(picks) / point_s:,.0f} reads/s")
    out.print(table)
    return {"entries": entries, "verified": verified, "append_per_s": entries / result["elapsed_s"],
            "reopen_s": reopen_s, "scan_per_s": scanned / scan_s, "point_per_s": len(picks) / point_s}


if __name__ == "__main__":
    writer(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
