"""A child process that appends until it is killed, reporting each acknowledgement.

Usage: crash_child.py DIR SEED. Prints "ACK <qualified name> <entry id>" after an
add returns (so it is durable); payloads are a function of (ledger, entry id)."""
import hashlib
import os
import random
import sys

import embedlog
from embedlog.bookie import journal


def payload(qualified_name: str, entry_id: int) -> bytes:
    seed = hashlib.sha256(f"{qualified_name}/{entry_id}".encode()).digest()
    n = seed[0] * 8 + seed[1] % 7
    return (seed * (n // 32 + 1))[:n]


def main():
    path, seed = sys.argv[1], int(sys.argv[2])
    rnd = random.Random(seed)
    cfg = dict(skip_list_size_limit=256 << 10, entry_log_size_limit=1 << 20,
               journal_max_size_mb=int(os.environ.get("CRASH_CHILD_JOURNAL_MB", "1")),
               journal_pre_alloc_size_mb=1,
               journal_max_backups=int(os.environ.get("CRASH_CHILD_JOURNAL_BACKUPS", "5")),
               flush_interval_ms=rnd.choice([20, 100, 1000]),
               storage_layout=int(os.environ.get("CRASH_CHILD_LAYOUT", "2")),
               enable_busy_wait=os.environ.get("CRASH_CHILD_BUSY_WAIT") == "1")
    if cfg["enable_busy_wait"]:
        journal.BUSY_SYNC_MAX_S = float("inf")      # the thread's path however slow the disk syncs
    out = sys.stdout
    with embedlog.open(path, **cfg) as log:
        scope = rnd.choice([0, 0, 12345])
        w = log.create_ledger(digest=rnd.choice(["crc32c", "crc32", "dummy"]), scope_id=scope)
        q = w.ledger_id.qualified_name
        out.write(f"LEDGER {q}\n")
        out.flush()
        eid = 0
        while True:
            mode = rnd.random()
            if mode < 0.5:
                got = w.append(payload(q, eid))
                acked = [got]
            elif mode < 0.8:
                # mostly short batches; some long enough to span memtable swaps and journal rolls
                n = rnd.randint(2, 50) if mode < 0.75 else rnd.randint(300, 900)
                last = w.append_many([payload(q, eid + i) for i in range(n)])
                acked = list(range(eid, last + 1))
            else:
                futs = [w.append_async(payload(q, eid + i)) for i in range(rnd.randint(2, 20))]
                acked = [f.result() for f in futs]
            eid = acked[-1] + 1
            out.write("".join(f"ACK {q} {e}\n" for e in acked))
            out.flush()


if __name__ == "__main__":
    main()
