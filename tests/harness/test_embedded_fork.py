"""A forked child (os.fork, multiprocessing's fork start method) must not use the log or
client it inherited: its bookie, journal and threads are the parent's. Before, the child's
adds were acknowledged with entry ids the parent had used, over the parent's journal (a
crash then left a directory that would not open, or a hole in acknowledged entries), and
its close() hung."""
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import embedlog
from embedlog.errors import ForkedProcessError

from support.cliutil import SUPPORT
from support.fork_child import payload


def uses_in_child(log, w, r, stream=None) -> dict:
    """Every use of the inherited objects in a forked child: name -> what it raised."""
    uses = {
        "append": lambda: w.append(b"child"),
        "append_many": lambda: w.append_many([b"child"]),
        "append_async": lambda: w.append_async(b"child").result(5),
        "create_ledger": lambda: log.create_ledger(),
        "open_ledger": lambda: log.open_ledger(w.ledger_id),
        "list_ledgers": lambda: log.list_ledgers(),
        "ledger_metadata": lambda: log.ledger_metadata(w.ledger_id),
        "delete_ledger": lambda: log.delete_ledger(w.ledger_id),
        "statistics": lambda: log.statistics(),
        "read_entry": lambda: r.read_entry(0),
        "read_batch": lambda: r.read_batch(0, 1),
        "read_lac": lambda: r.read_lac(),
        "read_arrays": lambda: r.read_arrays(0, 1),
        "open_stream": lambda: log.open_stream("s"),
    }
    if stream is not None:
        uses["stream append"] = lambda: stream.append(b"child")
    got = {}
    for name, use in uses.items():
        try:
            use()
            got[name] = "accepted"
        except ForkedProcessError as exc:
            got[name] = "forked" if f"process {os.getppid()}" in str(exc) else f"unclear: {exc}"
        except BaseException as exc:
            got[name] = f"{type(exc).__name__}: {exc}"
    for name, close in (("close writer", w.close), ("close reader", r.close),
                        ("close log", log.close), ("close log again", log.close)):
        try:
            close()
            got[name] = "ok"
        except BaseException as exc:
            got[name] = f"{type(exc).__name__}: {exc}"
    return got


def expected(got: dict) -> dict:
    return {k: "ok" if k.startswith("close") else "forked" for k in got}


def wait_child(pid: int, deadline_s: float = 60) -> int:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child {pid} did not finish in {deadline_s} s")


def child_report(pid: int, rd: int, wr: int) -> dict:
    """What the child wrote to the pipe, once it exited (killed after a deadline: a close
    that hangs fails the test)."""
    os.close(wr)
    assert wait_child(pid) == 0
    with os.fdopen(rd, "rb") as f:
        return eval(f.read().decode() or "{}")


def check_all(path, lid, acked):
    with embedlog.open(path) as log:
        r = log.open_ledger(lid)
        assert r.last_add_confirmed >= acked
        assert r.read_batch(0, acked) == [payload(i) for i in range(acked + 1)]


def test_os_fork_child_is_refused_and_the_parent_goes_on(tmp_path):
    log = embedlog.open(tmp_path)
    w = log.create_ledger()
    acked = w.append_many([payload(i) for i in range(50)])
    r = log.open_ledger(w.ledger_id, recovery=False)
    stream = log.open_stream("events")
    stream.append(b"parent")
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:                                        # the child
        try:
            os.close(rd)
            os.write(wr, repr(uses_in_child(log, w, r, stream)).encode())
        finally:
            os._exit(0)
    got = child_report(pid, rd, wr)
    assert got and got == expected(got)
    for i in range(acked + 1, acked + 51):              # the parent goes on where it was
        assert w.append(payload(i)) == i
    stream.append(b"parent again")
    log.close()
    check_all(tmp_path, w.ledger_id, acked + 50)


def _mp_child(log, w, r, conn):
    conn.send(uses_in_child(log, w, r))


def test_multiprocessing_fork_child_is_refused_and_the_parent_goes_on(tmp_path):
    with embedlog.open(tmp_path) as log:
        w = log.create_ledger()
        last = w.append_many([payload(i) for i in range(50)])
        r = log.open_ledger(w.ledger_id, recovery=False)
        ctx = multiprocessing.get_context("fork")
        mine, theirs = ctx.Pipe()
        child = ctx.Process(target=_mp_child, args=(log, w, r, theirs))
        child.start()
        end = time.monotonic() + 60
        while not mine.poll(0.01):                      # the parent appends meanwhile
            if time.monotonic() > end or not (child.is_alive() or mine.poll()):
                child.kill()
                pytest.fail(f"the child gave no answer (exit code {child.exitcode})")
            last = w.append(payload(last + 1))
        got = mine.recv()
        child.join(60)
        assert child.exitcode == 0
        assert got == expected(got)
        for _ in range(20):
            last = w.append(payload(last + 1))
    check_all(tmp_path, w.ledger_id, last)


def test_a_client_in_a_forked_child_is_refused_and_its_close_returns(tmp_path):
    uri = "sqlite://" + str(tmp_path / "meta.db")
    client = embedlog.Client(uri, create_metadata=True)
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rd)
            got = {}
            for name, use in (("list_ledgers", client.list_ledgers),
                              ("bookies", client.bookies),
                              ("create_ledger", lambda: client.create_ledger(1, 1, 1)),
                              ("submit", lambda: client.context.run(_nothing(), 5))):
                try:
                    use()
                    got[name] = "accepted"
                except ForkedProcessError:
                    got[name] = "forked"
                except BaseException as exc:
                    got[name] = f"{type(exc).__name__}: {exc}"
            client.close()                              # returns at once, touches nothing
            got["close"] = "ok"
            os.write(wr, repr(got).encode())
        finally:
            os._exit(0)
    got = child_report(pid, rd, wr)
    assert got == {"list_ledgers": "forked", "bookies": "forked", "create_ledger": "forked",
                   "submit": "forked", "close": "ok"}
    assert client.list_ledgers() == []                  # the parent's client still works
    assert client.bookies() == ([], [])
    client.close()


async def _nothing():
    return None


def test_every_acknowledged_entry_survives_a_sigkill_after_a_fork(tmp_path):
    proc = subprocess.Popen([sys.executable, os.path.join(SUPPORT, "fork_child.py"), str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    acked, children, after = -1, [], 0
    watchdog = threading.Timer(180, proc.kill)         # a child that hangs fails, not hangs
    watchdog.start()
    try:
        for line in proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind == "ACK":
                acked = int(rest)
                after += len(children) == 2
            elif kind == "CHILD":
                children.append(rest)
            if after >= 100:
                break
        assert children == ["ok", "ok"]
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    assert after >= 100, (children, acked)
    check_all(tmp_path, _only_ledger(tmp_path), acked)


def _only_ledger(path):
    with embedlog.open(path) as log:
        (lid,) = log.list_ledgers()
        return lid


CLUSTER_CHILD = """
import os, sys
from embedlog.harness import LocalCluster
c = LocalCluster(bookies=1, proxies=False, autorecovery=False)   # no `with`: closed at exit
w = c.client().create_ledger(1, 1, 1)
w.append(b"before")
pid = os.fork()
if pid == 0:
    with c:                      # a child leaving a `with` block, then exiting normally
        pass
    sys.exit(0)                  # runs the atexit handlers it inherited
os.waitpid(pid, 0)
assert os.path.isdir(c.base_dir), "the child removed the parent's cluster directory"
assert w.append(b"after") == 1   # the bookie still serves
print("OK")
"""


def test_a_forked_child_leaves_the_parents_local_cluster_alone():
    from support.cliutil import ROOT, cli_env
    r = subprocess.run([sys.executable, "-c", CLUSTER_CHILD], capture_output=True, text=True,
                       env=cli_env(), cwd=ROOT, timeout=180)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stdout + r.stderr
