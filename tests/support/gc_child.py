"""A child process that builds a bookie with dead and live ledgers, then runs GC and
compaction, to be killed (SIGKILL) at a named failure point (EMBEDLOG_FAILPOINTS).

Usage: gc_child.py DIR. Prints "LIVE <qualified name> <entries>" and "DEAD <qualified
name>" for each ledger, then "GC" just before the cycle, "DONE" after it."""
import os
import sys

import embedlog

from support.crash_child import payload

CONFIG = dict(skip_list_size_limit=128 << 10, entry_log_size_limit=256 << 10,
              journal_max_size_mb=1, journal_pre_alloc_size_mb=1, flush_interval_ms=50,
              gc_wait_time_ms=0, compaction_rate_by_entries=1_000_000,
              storage_layout=int(os.environ.get("GC_CHILD_LAYOUT", "1")))   # 1: entry logs
ENTRIES = 150
DEAD = (0, 2, 3, 5, 7)


def main():
    path = sys.argv[1]
    out = sys.stdout
    with embedlog.open(path, **CONFIG) as log:
        handles = [log.create_ledger(scope_id=(0 if i % 3 else 77)) for i in range(9)]
        doomed = [h for i, h in enumerate(handles) if i in DEAD]
        for e in range(ENTRIES):
            for h in handles:
                h.append(payload(h.ledger_id.qualified_name, e))
        # then more of the doomed ledgers alone: entry logs that hold only dead ledgers
        for e in range(ENTRIES, 2 * ENTRIES):
            for h in doomed:
                h.append(payload(h.ledger_id.qualified_name, e))
        for h in handles:
            h.close()
        log.bookie.checkpoint()
        for i, h in enumerate(handles):
            q = h.ledger_id.qualified_name
            if i in DEAD:
                # metadata only: the bookie's copy is for GC to find
                log.metadata.ledger_manager.remove_ledger_metadata(h.ledger_id)
                out.write(f"DEAD {q}\n")
            else:
                out.write(f"LIVE {q} {ENTRIES}\n")
        out.write("GC\n")
        out.flush()
        log.bookie.gc.run_once(force_major=True)
        out.write("DONE\n")
        out.flush()


if __name__ == "__main__":
    main()
