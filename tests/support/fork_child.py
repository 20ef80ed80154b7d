"""A process that forks while its embedded log is open, then appends until it is killed.

Usage: fork_child.py DIR. Appends entries 0..99, then starts a child with multiprocessing's
fork start method and another with os.fork(); each child tries to append to the inherited
ledger, create a ledger and close the log, and reports what happened. Prints
"CHILD <report>" for each, then "ACK <entry id>" after every add returns (durable) from
then on; payloads are payload(entry id)."""
import multiprocessing
import os
import sys

import embedlog
from embedlog.errors import ForkedProcessError


def payload(entry_id: int) -> bytes:
    return b"parent entry %d " % entry_id * 8


def try_in_child(log, w) -> str:
    """What a forked child gets from the inherited log: 'ok' when every use is refused
    with ForkedProcessError and close() returns."""
    for use in (lambda: w.append(b"child"), lambda: log.create_ledger()):
        try:
            use()
            return "an add in the child was accepted"
        except ForkedProcessError:
            pass
        except BaseException as exc:
            return f"{type(exc).__name__}: {exc}"
    w.close()
    log.close()
    return "ok"


def _mp_child(log, w, pipe):
    pipe.send(try_in_child(log, w))


def main():
    out = sys.stdout
    log = embedlog.open(sys.argv[1])
    w = log.create_ledger()
    acked = w.append_many([payload(i) for i in range(100)])
    out.write("".join(f"ACK {i}\n" for i in range(acked + 1)))
    mine, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(target=_mp_child, args=(log, w, theirs))
    child.start()
    out.write(f"CHILD {mine.recv() if mine.poll(60) else 'no answer'}\n")
    out.flush()
    child.join()
    r, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(wr, try_in_child(log, w).encode())
        os._exit(0)
    os.close(wr)
    with os.fdopen(r, "rb") as f:
        out.write(f"CHILD {f.read().decode() or 'no answer'}\n")
    os.waitpid(pid, 0)
    out.flush()
    while True:
        eid = w.append(payload(acked + 1))
        acked = eid
        out.write(f"ACK {eid}\n")
        out.flush()


if __name__ == "__main__":
    main()
