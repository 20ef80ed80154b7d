"""An embedlog writer for crash tests against Java bookies (test_bookkeeper_recovery.py):
it creates a ledger, appends ``payload(i)`` for i = 0, 1, 2... with a window of adds in
flight until it is killed, and prints each acknowledgement as it gets it (one flushed
line), so the parent knows a subset of what was acknowledged whenever the SIGKILL comes.

    python bk_writer_child.py METADATA_URI ENSEMBLE WRITE_QUORUM ACK_QUORUM DIGEST PASSWORD

Output: ``ledger LID``, ``ensemble B1,B2,...``, then ``ack EID`` lines in any order.
"""
import sys
import threading

from embedlog import Client

IN_FLIGHT = 16
LIMIT = 1_000_000           # entries, should the parent never kill it


def payload(i: int) -> bytes:
    """Entry i's bytes (the parent computes the same): sizes vary from 8 to 80 bytes."""
    return (b"py-%d|" % i) * (1 + i % 7)


def main(uri, ensemble, write_quorum, ack_quorum, digest, password):
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def acked(fut) -> None:
        if fut.exception() is None:
            say(f"ack {fut.result()}")
        else:
            say(f"error {type(fut.exception()).__name__} {fut.exception()}")

    client = Client(uri, max_pending_adds=IN_FLIGHT, add_timeout_s=10)
    w = client.create_ledger(int(ensemble), int(write_quorum), int(ack_quorum), digest=digest,
                             password=password.encode())
    say(f"ledger {int(w.ledger_id)}")
    say("ensemble " + ",".join(w.metadata.fragments[0][1]))
    for i in range(LIMIT):          # append_async blocks while IN_FLIGHT adds are out
        w.append_async(payload(i)).add_done_callback(acked)


if __name__ == "__main__":
    main(*sys.argv[1:])
