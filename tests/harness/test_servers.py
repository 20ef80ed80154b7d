"""The real servers' fixtures (embedlog/harness/servers.py): a server is ready only when it is
the process answering on its port."""
from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys

from embedlog.harness import servers
from support.servers import ServerMissing, skip_unless_ci


def test_listens_on_names_the_process_holding_a_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert servers.listens_on(os.getpid(), port)
        assert not servers.listens_on(os.getpid() + 10_000_000, port)     # no such process
    assert not servers.listens_on(os.getpid(), port)                       # closed


def test_a_zookeeper_whose_port_another_zookeeper_answers_starts_again_elsewhere(monkeypatch):
    """The port free_ports() gave is bound by another ZooKeeper first: its `ruok` answers,
    but the new server is not the one listening (it exits), so it is started again on a new
    port, and stopping it by its PID stops the server its clients talk to."""
    try:
        first = servers.ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    try:
        ports = iter([first.port])
        real = servers.free_port
        monkeypatch.setattr(servers, "free_port", lambda: next(ports, None) or real())
        second = servers.ZooKeeperServer()
        try:
            assert second.port != first.port and second.proc.poll() is None
            assert servers.listens_on(second.pid, second.port)
            assert second._ruok()
        finally:
            second.stop()
    finally:
        first.stop()


def test_suspend_returns_once_the_server_no_longer_answers():
    """SIGSTOP takes effect when the thread the kernel picked for it next runs; suspend()
    waits for every thread, so nothing is served after it returns."""
    try:
        zk = servers.ZooKeeperServer()
    except ServerMissing as exc:
        skip_unless_ci(str(exc))
    try:
        for _ in range(3):
            servers.suspend(zk.pid)
            try:
                assert servers._stopped(zk.pid) and not zk._ruok()
            finally:
                os.kill(zk.pid, signal.SIGCONT)
            assert zk._ruok()
    finally:
        zk.stop()


def test_suspend_with_a_sqlite_store_stops_the_process_outside_its_writes(tmp_path):
    """A process that holds SQLite's write lock most of the time (300 of every 340 ms) is
    stopped at a moment it holds none, so the store's other writers go on. The first stop
    is tried while it holds the lock."""
    path = tmp_path / "meta.db"
    sqlite3.connect(path, isolation_level=None).execute("PRAGMA journal_mode=WAL").close()
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys, time\n"
         "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
         "while True:\n"
         "    c.execute('BEGIN IMMEDIATE'); print('held', flush=True)\n"
         "    time.sleep(0.3); c.execute('COMMIT'); time.sleep(0.04)\n",
         str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "held"
        servers.suspend(writer.pid, sqlite_uri=f"sqlite://{path}")
        try:
            probe = sqlite3.connect(path, timeout=0, isolation_level=None)
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            probe.close()
        finally:
            os.kill(writer.pid, signal.SIGCONT)
    finally:
        writer.kill()
        writer.wait(30)
