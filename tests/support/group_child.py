"""A consumer group member in a process of its own, for tests/client/test_consumer_groups.py.

    python group_child.py METADATA_URI GROUP SESSION_MS HEARTBEAT_MS MODE STREAM...

MODE "loop": consume and print every message ("GOT stream position value"), and after each
batch commit, per stream, the position LAG messages behind what it consumed (env
COMMIT_LAG, default 0), printing "COMMIT stream position"; runs until killed.
MODE "manual": commands on stdin, one a line: "consume N SECONDS" (prints GOT lines, then
"DONE n"), "commit" ("COMMITTED s:p,..." or "REFUSED message"), "assignment"
("ASSIGNED a,b"), "quit".
"""
import collections
import os
import sys

import embedlog
from embedlog.errors import CommitFailedError


def main():
    uri, group_id, session_ms, hb_ms, mode, *streams = sys.argv[1:]
    lag = int(os.environ.get("COMMIT_LAG", "0"))
    c = embedlog.Consumer({"metadata.uri": uri, "group.id": group_id,
                           "auto.offset.reset": "earliest", "enable.auto.commit": False,
                           "session.timeout.ms": int(session_ms),
                           "heartbeat.interval.ms": int(hb_ms), "client.id": f"child-{os.getpid()}"})
    c.subscribe(streams)
    out = sys.stdout

    def say(line):
        out.write(line + "\n")
        out.flush()

    say(f"MEMBER {c.member_id}")
    if mode == "loop":
        seen = collections.defaultdict(list)
        while True:
            got = c.consume(20, 0.5)
            for m in got:
                say(f"GOT {m.topic()} {m.offset()} {m.value().decode()}")
                seen[m.topic()].append(m.offset())
            if not got:
                continue
            offsets = []
            for s, positions in seen.items():
                if s in {tp.topic for tp in c.assignment()} and len(positions) > lag:
                    offsets.append(embedlog.TopicPartition(s, 0, positions[-1 - lag] + 1))
            try:
                for tp in c.commit(offsets=offsets) if offsets else []:
                    say(f"COMMIT {tp.topic} {tp.offset}")
            except CommitFailedError as exc:
                say(f"REFUSED {exc}")
                seen.clear()
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "consume":
            got = c.consume(int(cmd[1]), float(cmd[2]))
            for m in got:
                say(f"GOT {m.topic()} {m.offset()} {m.value().decode()}")
            say(f"DONE {len(got)}")
        elif cmd[0] == "commit":
            try:
                tps = c.commit()
                say("COMMITTED " + ",".join(f"{tp.topic}:{tp.offset}" for tp in tps))
            except CommitFailedError as exc:
                say(f"REFUSED {exc}")
        elif cmd[0] == "assignment":
            say("ASSIGNED " + ",".join(tp.topic for tp in c.assignment()))
        elif cmd[0] == "quit":
            c.close()
            say("BYE")
            return


if __name__ == "__main__":
    main()
