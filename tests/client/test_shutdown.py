"""Issue 17 item 8: normal runs end without shutdown warnings ("Task was destroyed but it is
pending!", "Exception in callback ... CancelledError", unclosed loops and files), whether a
program closes its client or leaves it to the interpreter's exit, and even while writers'
messages are still on their way (delayed by the fault proxies)."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from support.cliutil import ROOT, cli_env
from embedlog import aio
from embedlog.errors import ClientClosedError
from embedlog.harness import LocalCluster

CHILD = textwrap.dedent("""
    import sys, time
    import embedlog
    from embedlog.harness import LocalCluster

    def in_flight(w):
        # the writer's explicit LAC (WRITE_LAC) has left and its answers are delayed
        while w._lac_sent < w.last_add_confirmed:
            time.sleep(0.01)

    with LocalCluster(bookies=3, autorecovery=False) as cluster:
        closed = cluster.client("closed")
        w = closed.create_ledger(3, 3, 3)
        w.append_many([b"x"] * 10)
        s = closed.open_stream("s", ensemble_size=3, write_quorum=3, ack_quorum=3)
        s.append(b"y")
        left = embedlog.Client(cluster.metadata_uri)       # never closed by this program
        w2 = left.create_ledger(3, 3, 3)
        w2.append_many([b"z"] * 10)
        for i in range(3):
            cluster.proxy(i).delay(3)
        w3 = closed.create_ledger(3, 3, 3)
        f = w3.append_async(b"late")                      # an add still on its way at close
        in_flight(w)
        in_flight(w2)
    print("done", flush=True)
""")


def test_no_shutdown_warnings(tmp_path):
    r = subprocess.run([sys.executable, "-X", "dev", "-c", CHILD], capture_output=True, text=True,
                       env=cli_env(TMPDIR=str(tmp_path)), cwd=ROOT, timeout=240)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr[-3000:]
    for noise in ("Task was destroyed", "Exception in callback", "Exception ignored",
                  "ResourceWarning", "Traceback", "never awaited"):
        assert noise not in r.stderr, r.stderr[-3000:]



def delay_answers(cluster, seconds: float) -> None:
    """Every bookie's answers held ``seconds`` by its fault proxy (heal_answers ends it)."""
    for i in range(3):
        cluster.proxy(i).delay(seconds)


def heal_answers(cluster) -> None:
    for i in range(3):
        cluster.proxy(i).heal()


def test_a_closed_client_leaves_no_task_and_closes_its_loop(tmp_path):
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "c"), autorecovery=False) as cluster:
        client = cluster.client()
        w = client.create_ledger(3, 3, 3)
        w.append_many([b"x"] * 10)
        delay_answers(cluster, 3)
        ctx = client._ctx
        client.close()
        assert ctx.loop.is_closed() and not asyncio.all_tasks(ctx.loop)
        heal_answers(cluster)


def test_an_add_in_flight_at_close_fails_with_client_closed(tmp_path):
    """BookKeeper fails an add still in flight at the client's close with
    ClientClosedException; before, its future was left never completing."""
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "c"), autorecovery=False) as cluster:
        client = cluster.client()
        w = client.create_ledger(3, 3, 3)
        w.append_many([b"x"] * 10)
        delay_answers(cluster, 30)
        late = [w.append_async(b"late %d" % i) for i in range(5)]
        client.close()
        for f in late:
            with pytest.raises(ClientClosedError):
                f.result(timeout=10)
        heal_answers(cluster)
        # the 10 acknowledged entries are the ledger's, whatever became of the late ones
        with cluster.client() as reader:
            r = reader.open_ledger(w.ledger_id)
            assert r.last_add_confirmed in range(9, 15)
            assert [e.data for e in r.read(0, 9)] == [b"x"] * 10


def test_an_awaited_add_at_close_fails_with_client_closed(tmp_path):
    """The same through embedlog.aio: a task awaiting append() when another closes the
    client gets ClientClosedError instead of waiting for ever."""
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "c"), autorecovery=False) as cluster:
        async def main():
            client = aio.Client(cluster.metadata_uri)
            w = await client.create_ledger(3, 3, 3)
            assert await w.append(b"first") == 0
            delay_answers(cluster, 30)
            late = asyncio.ensure_future(w.append(b"late"))
            await asyncio.sleep(0)
            await client.close()
            with pytest.raises(ClientClosedError):
                await asyncio.wait_for(late, 10)

        asyncio.run(main())
        heal_answers(cluster)
