"""SIGTERM stops `embedlog bookie serve` cleanly: exit 0, one line saying so, no traceback,
whatever connections are open then."""
from __future__ import annotations

import signal
import socket

from support.cliutil import start
from embedlog.client import Client


def test_sigterm_with_connections_open_stops_cleanly(tmp_path):
    """At shutdown asyncio cancels each open connection's task and Python 3.11's streams
    logged a CancelledError traceback for every one ('Exception in callback
    StreamReaderProtocol.connection_made')."""
    meta = f"sqlite://{tmp_path / 'meta.db'}"
    proc = start("bookie", "serve", "--dir", tmp_path / "bookie", "--listen", "127.0.0.1:0",
                 "--metadata", meta)
    idle = []
    try:
        line = proc.expect(lambda l: " listening on " in l)
        host, port = line.split(" listening on ")[1].split()[0].rsplit(":", 1)
        with Client(meta) as c:
            w = c.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
            assert w.append(b"one") == 0
            for _ in range(3):                       # connections that never said a word
                idle.append(socket.create_connection((host, int(port)), timeout=10))
            proc.send_signal(signal.SIGTERM)         # while the client's connection is open
            out, err = proc.finish(60)
    finally:
        proc.kill()
        for s in idle:
            s.close()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Exception in callback" not in err, err
    assert "stopped (SIGTERM)" in err, err


def _opened_a_journal(pid: int) -> bool:
    import os
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return True                                  # gone: the assertions below say why
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith(".txn"):
                return True
        except OSError:
            pass
    return False


def test_sigterm_while_replaying_stops_cleanly(tmp_path):
    """SIGTERM during the start (here a replay of ~100 MiB of journal) killed the process
    at once (exit -15, nothing said); it now stops as Ctrl-C does, closing what it opened."""
    import embedlog
    from support.cliutil import wait_until
    from support.crashutil import abandon
    directory = tmp_path / "bookie"
    log = embedlog.open(directory, flush_interval_ms=0, skip_list_size_limit=1 << 30)
    w = log.create_ledger()
    for _ in range(100):
        w.append_many([bytes(4096)] * 256)
    abandon(log)                                     # all of it is replayed at the next start
    proc = start("bookie", "serve", "--dir", directory, "--listen", "127.0.0.1:0")
    try:
        wait_until(lambda: _opened_a_journal(proc.pid), 30, "a journal opened",
                   interval_s=0.005)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.finish(60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    # the signal may find the start just over (a fast machine): then it stops as served
    assert "interrupted while starting" in err or "stopped (SIGTERM)" in err, err
    with embedlog.open(directory) as log:            # nothing lost, the directory released
        assert log.open_ledger(w.ledger_id).last_add_confirmed == 100 * 256 - 1
