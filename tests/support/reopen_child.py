"""A child process that writes, then SIGKILLs itself; run again on the same directory it
reopens (replaying the journal), holds the background checkpoint after replay at a named
failure point, writes more and is killed again before that checkpoint ends.

Usage: reopen_child.py DIR first|again [POINT]. Prints "ACK <qualified name> <entry id>"
once an add is durable and "HELD" when the checkpoint has reached POINT; "again" recovers
(fences) every ledger it finds first, printing "FENCED <qualified name> <LAC>"."""
import os
import signal
import sys
import threading

import embedlog
from embedlog import failpoints

from support.crash_child import payload

# small memtables, checkpointed as each is flushed: what replay finds is mostly still in memory
CONFIG = dict(skip_list_size_limit=64 << 10, entry_log_size_limit=256 << 10,
              journal_max_size_mb=1, journal_pre_alloc_size_mb=1, flush_interval_ms=3_600_000)


def write(log, out, ledgers=3, batches=40):
    handles = [log.create_ledger() for _ in range(ledgers)]
    for b in range(batches):
        for h in handles:
            q = h.ledger_id.qualified_name
            last = h.append_many([payload(q, b * 10 + k) for k in range(10)])
            out.write("".join(f"ACK {q} {e}\n" for e in range(last - 9, last + 1)))
    out.flush()


def main():
    path, phase = sys.argv[1], sys.argv[2]
    out = sys.stdout
    if phase == "again":
        held = threading.Event()

        def hold():                       # the checkpoint after replay stops here for good
            held.set()
            threading.Event().wait()
        failpoints.arm(sys.argv[3], hold)
    log = embedlog.open(path, **CONFIG)
    if phase == "again":
        for lid in log.list_ledgers():    # recovery fences them: journalled after the reopen
            r = log.open_ledger(lid)
            out.write(f"FENCED {lid.qualified_name} {r.last_add_confirmed}\n")
        held.wait()
        out.write("HELD\n")
    write(log, out)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
