"""A client process for crash tests: it does one protocol operation and is killed at a
named client failure point (EMBEDLOG_FAILPOINTS). Each acknowledgement it was given is
written to ``acks`` (one line, flushed) before it goes on, so the parent knows a subset of
what was acknowledged whatever moment the kill comes.

    python client_child.py SCENARIO METADATA_URI ACKS [LEDGER_OR_STREAM] [BOOKIE]
"""
import sys

from embedlog import Client
from embedlog.harness.faults import Faults


def record(f, *fields):
    f.write(" ".join(str(x) for x in fields) + "\n")
    f.flush()


def main(scenario, uri, acks_path, target=None, bookie=None):
    faults = Faults()
    client = Client(uri, faults=faults, explicit_lac_interval_ms=10 ** 9)
    with open(acks_path, "w") as acks:
        if scenario in ("close", "ensemble_change"):
            w = client.create_ledger(3, 3, 2)
            record(acks, "ledger", w.ledger_id.ledger_id)
            for i in range(20):
                record(acks, "ack", w.append(b"c%d" % i))
            if scenario == "ensemble_change":
                faults.fail("EIO", bookie=w.metadata.fragments[0][1][0], op="add")
                for i in range(20, 40):
                    record(acks, "ack", w.append(b"c%d" % i))
            w.close()
        elif scenario == "recovery":
            client.open_ledger(int(target))
        elif scenario == "take_over":
            client.open_stream(target).take_over()
    record(open(acks_path, "a"), "done")


if __name__ == "__main__":
    main(*sys.argv[1:])
