#!/usr/bin/env python
"""The same Pulsar broker on Java bookies and on embedlog bookies, side by side.

    python benchmarks/vs_pulsar.py [--rounds 3] [--messages 50000] [--sizes 100,1024]
                                   [--rate 1000] [--seconds 5] [--backlog 50000] [--out FILE]

Two PulsarClusters (embedlog.harness.peers.pulsar: Pulsar 4.0.0's broker from Maven
Central, set up as its operators do it), one on three Java bookies (BookKeeper's newest
peer, journal fsync on: BookKeeper's default) and one on three embedlog bookies (fdatasync
of the journal before an acknowledgement: embedlog's default); managed ledgers 3/2/2 in
both, the same broker settings. The driver is Python's pulsar-client (Pulsar's C++ client)
in this process, the same for both sides.

Cells, each on a topic of its own:

- ``publish``: ``--messages`` messages of each size, batching on and off, sent with
  send_async as fast as the client takes them (block_if_queue_full) until every one is
  acknowledged: msgs/s, and p50/p99 of each message's send-to-callback latency; the three
  bookies' CPU time (user + system, from /proc) per message;
- ``e2e``: a producer (batching off) sends ``--rate`` messages/s for ``--seconds`` s, each
  carrying its send time; a consumer in this process records receive - send: p50/p99;
- ``catchup``: ``--backlog`` 1 KiB messages published (batching on), the topic unloaded so
  the broker's cache is gone, then read by a new subscription from the earliest: msgs/s,
  served by the bookies from their storage.

Each side first publishes 5,000 messages of each size, unmeasured (the JVMs' JITs, the
connections, the first ledgers). Rounds are interleaved (every cell once per round, Java then embedlog, then the other way
round in the next round) and the load average is recorded per cell; the table shows the
median over rounds and the ratio embedlog / Java (above 1.0: embedlog is faster; for
latency, Java's / embedlog's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

NS = "persistent://public/default"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, IndexError, ValueError):
            pass
    return total


def bookie_pids(pc) -> list:
    if pc.bookies is not None:
        return [pc.bookies.pid(i) for i in range(3)]
    return [pc.java_bookies.pid(i) for i in range(3)]


def percentile(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def publish(pulsar, client, topic: str, n: int, size: int, batching: bool) -> dict:
    producer = client.create_producer(topic, batching_enabled=batching, block_if_queue_full=True,
                                      send_timeout_millis=120_000, max_pending_messages=10_000)
    payload = b"x" * size
    sent_at = [0.0] * n
    lat = [0.0] * n
    failed = []
    done = threading.Semaphore(0)

    def callback(res, _mid, i):
        lat[i] = time.perf_counter() - sent_at[i]
        if res != pulsar.Result.Ok:
            failed.append(res)
        done.release()
    t0 = time.perf_counter()
    for i in range(n):
        sent_at[i] = time.perf_counter()
        producer.send_async(payload, lambda res, mid, i=i: callback(res, mid, i))
    producer.flush()
    for _ in range(n):
        done.acquire()
    elapsed = time.perf_counter() - t0
    producer.close()
    if failed:
        raise RuntimeError(f"{len(failed)} sends failed: {failed[:3]}")
    return {"rate": n / elapsed, "p50_ms": percentile(lat, 0.5) * 1e3,
            "p99_ms": percentile(lat, 0.99) * 1e3}


def e2e(pulsar, client, topic: str, rate: int, seconds: float) -> dict:
    consumer = client.subscribe(topic, "e2e")
    producer = client.create_producer(topic, batching_enabled=False)
    n = int(rate * seconds)
    lat = []

    def consume():
        for _ in range(n):
            msg = consumer.receive(timeout_millis=120_000)
            lat.append(time.perf_counter() - struct.unpack(">d", msg.data()[:8])[0])
            consumer.acknowledge(msg)
    reader = threading.Thread(target=consume)
    reader.start()
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        while (now := time.perf_counter()) < due:
            time.sleep(min(0.001, due - now))
        producer.send_async(struct.pack(">d", time.perf_counter()) + b"x" * 92, None)
    producer.flush()
    reader.join()
    producer.close()
    consumer.close()
    return {"p50_ms": percentile(lat, 0.5) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3}


def catchup(pulsar, client, pc, topic: str, n: int) -> dict:
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    for _ in range(n):
        producer.send_async(b"y" * 1024, None)
    producer.flush()
    producer.close()
    name = topic.rsplit("/", 1)[1]
    req = urllib.request.Request(f"{pc.web_url}/admin/v2/persistent/public/default/{name}/unload",
                                 method="PUT")
    urllib.request.urlopen(req, timeout=60).read()
    consumer = client.subscribe(topic, "catchup",
                                initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=5000)
    t0 = time.perf_counter()
    for _ in range(n):
        consumer.acknowledge(consumer.receive(timeout_millis=120_000))
    elapsed = time.perf_counter() - t0
    consumer.close()
    return {"rate": n / elapsed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--backlog", type=int, default=50_000)
    ap.add_argument("--out", default=None, help="write every measurement as JSON here")
    args = ap.parse_args(argv)
    import pulsar
    from embedlog.harness.peers.pulsar import PulsarCluster
    sizes = [int(s) for s in args.sizes.split(",")]
    print("starting a broker on 3 Java bookies and one on 3 embedlog bookies ...", flush=True)
    sides = {"java": PulsarCluster(bookies=0, java_bookies=3, ensemble=(3, 2, 2)),
             "embedlog": PulsarCluster(bookies=3, ensemble=(3, 2, 2))}
    rows = []
    try:
        clients = {k: pulsar.Client(pc.service_url, operation_timeout_seconds=120,
                                    logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
                   for k, pc in sides.items()}
        for side, pc in sides.items():          # JITs, connections, first ledgers
            for size in sizes:
                publish(pulsar, clients[side], f"{NS}/warmup-{size}", 5_000, size, False)
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            cells = [("publish", size, batching) for size in sizes for batching in (True, False)]
            cells += [("e2e", 100, False), ("catchup", 1024, True)]
            for cell in cells:
                for side in order:
                    pc, client = sides[side], clients[side]
                    kind, size, batching = cell
                    topic = f"{NS}/{kind}-{size}-{int(batching)}-r{r}"
                    load = os.getloadavg()[0]
                    cpu0 = cpu_seconds(bookie_pids(pc))
                    if kind == "publish":
                        got = publish(pulsar, client, topic, args.messages, size, batching)
                        got["bookie_cpu_us_per_msg"] = \
                            (cpu_seconds(bookie_pids(pc)) - cpu0) / args.messages * 1e6
                    elif kind == "e2e":
                        got = e2e(pulsar, client, topic, args.rate, args.seconds)
                    else:
                        got = catchup(pulsar, client, pc, topic, args.backlog)
                    row = {"round": r, "side": side, "cell": kind, "size": size,
                           "batching": batching, "load": round(load, 1), **got}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        for c in clients.values():
            c.close()
    finally:
        for pc in sides.values():
            pc.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print_table(rows)
    return 0


def print_table(rows) -> None:
    keys = sorted({(r["cell"], r["size"], r["batching"]) for r in rows})
    print("\n| cell | size | batching | figure | Java bookies | embedlog bookies | ratio | load |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- |")
    for cell, size, batching in keys:
        mine = [r for r in rows if (r["cell"], r["size"], r["batching"]) == (cell, size, batching)]
        for figure in ("rate", "p50_ms", "p99_ms", "bookie_cpu_us_per_msg"):
            vals = {s: [r[figure] for r in mine if r["side"] == s and figure in r]
                    for s in ("java", "embedlog")}
            if not vals["java"] or not vals["embedlog"]:
                continue
            j, e = statistics.median(vals["java"]), statistics.median(vals["embedlog"])
            ratio = e / j if figure == "rate" else j / e
            loads = [r["load"] for r in mine]
            print(f"| {cell} | {size} | {'on' if batching else 'off'} | {figure} | {j:,.2f} | "
                  f"{e:,.2f} | {ratio:.2f}x | {min(loads)}-{max(loads)} |")


if __name__ == "__main__":
    sys.exit(main())
