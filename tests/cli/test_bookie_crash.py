"""Issue 27 item 3: a bookie that dies is visible from the command line. `cluster up` says
when one of its bookies exits unasked (signal, log tail) and keeps the others running;
`bookie list` keeps a vanished bookie listed as down, from its cookie."""
from __future__ import annotations

import os
import signal

from support.cliutil import cli, cli_json, start, wait_until
from embedlog.harness import LocalCluster
from embedlog.meta import open_metadata_store


def bookie_pids(uri: str) -> dict:
    """bookie id -> pid, from the bookies' registrations."""
    with open_metadata_store(uri) as store:
        return {r.bookie_id: r.info["pid"] for r in store.registration_client.get_all_bookies()}


def test_cluster_up_says_when_a_bookie_dies_and_keeps_the_others(tmp_path):
    proc = start("cluster", "up", "--bookies", 2, "--dir", tmp_path / "c")
    try:
        lines = [proc.expect(lambda l: l.startswith("bookie 1:"), 60)]
        uri = proc.expect(lambda l: l.startswith("export EMBEDLOG_METADATA=")).strip().split("=", 1)[1]
        victim = lines[0].split()[2]                          # "bookie 1: ID at ..."
        os.kill(bookie_pids(uri)[victim], signal.SIGSEGV)
        said = proc.expect(lambda l: l.startswith("bookie 1 "), 30)
        assert said.startswith(f"bookie 1 ({victim}) exited: killed by SIGSEGV; 1 of 2 bookies still run")
        assert "listening on" in proc.expect(lambda l: l.startswith("    "))   # its log's last lines
        made = cli_json("ledger", "create", "--metadata", uri, "-e", 1, "-w", 1, "-a", 1, "--entries", 3)
        assert made["state"] == "CLOSED"                      # the other bookie still serves
        proc.send_signal(signal.SIGINT)
        out, err = proc.finish(180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.count("exited: killed by SIGSEGV") == 1        # said once


def test_bookie_list_keeps_a_vanished_bookie_as_down(tmp_path):
    with LocalCluster(bookies=2, base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False) as cluster:
        md = ("--metadata", cluster.metadata_uri)
        victim = cluster.bookie_id(1)
        os.kill(cluster.pid(1), signal.SIGKILL)

        def state():
            return {r["bookie_id"]: r["state"] for r in cli_json("bookie", "list", *md)}

        # unreachable while its registration lasts, then down (not dropped)
        wait_until(lambda: state().get(victim) == "down", 30, f"{victim} listed as down")
        assert state() == {cluster.bookie_id(0): "writable", victim: "down"}
        text = cli("bookie", "list", *md).stdout
        assert "1 bookies registered, 1 down" in text
        assert [c["bookie_id"] for c in cluster.crashed_bookies()] == [victim]
        r = cli("bookie", "decommission", victim, "--yes", *md)  # the operator is done with it
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert state() == {cluster.bookie_id(0): "writable"}
