"""Issue 17, items 4 and 6: one error path for every command (the exit codes of
docs/OPERATIONS.md, one line on stderr, never a traceback) and logging to stderr at a
chosen level."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from kazoo.client import KazooClient

import embedlog
from embedlog.harness import LocalCluster
from support.cliutil import ROOT, cli, cli_env, start, wait_until


def no_traceback(r) -> None:
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


# -- bookie serve ---------------------------------------------------------------------------------

def test_bookie_serve_port_in_use_is_a_start_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("bookie", "serve", "--dir", tmp_path / "b", "--listen", f"127.0.0.1:{port}")
    assert r.returncode == 2 and "address already in use" in r.stderr.lower(), r.stderr
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    no_traceback(r)


def test_bookie_serve_impossible_dir_is_a_start_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = cli("bookie", "serve", "--dir", blocker / "bookie", "--listen", "127.0.0.1:0")
    assert r.returncode == 2 and str(blocker) in r.stderr, r.stderr
    no_traceback(r)


def test_bookie_serve_joins_a_zookeeper_cluster_and_never_makes_one(tmp_path, own_zookeeper):
    """A mistyped root (`/ledger` for `/ledgers`) made a new embedlog cluster of one bookie in
    the operator's ZooKeeper and printed "listening"; BookKeeper's bookie exits on it. Now
    the bookie exits 5 naming the root and how a cluster is made, and writes nothing; on the
    right root it serves."""
    zk = own_zookeeper
    r = cli("metadata", "format", "--metadata", f"zk+hierarchical://{zk.hosts}/ledgers")
    assert r.returncode == 0, r.stderr
    r = cli("bookie", "serve", "--dir", tmp_path / "b", "--listen", "127.0.0.1:0",
            "--metadata", f"zk+hierarchical://{zk.hosts}/ledger")
    assert r.returncode == 5 and "/ledger/INSTANCEID does not exist" in r.stderr, r.stderr
    assert "embedlog metadata format" in r.stderr and "listening" not in r.stdout
    no_traceback(r)
    raw = KazooClient(zk.hosts)
    raw.start(timeout=10)
    try:
        assert raw.exists("/ledger") is None
    finally:
        raw.stop()
        raw.close()
    proc = start("bookie", "serve", "--dir", tmp_path / "b", "--listen", "127.0.0.1:0",
                 "--metadata", f"zk+hierarchical://{zk.hosts}/ledgers")
    proc.expect(lambda line: " listening on " in line, 60)
    proc.send_signal(signal.SIGTERM)
    proc.finish(60)


def test_directories_below_a_file_are_start_errors_naming_the_file(tmp_path):
    """Issue 52, item 2: a journal or ledger directory below a regular file, and `cluster up
    --dir` or LocalCluster below one (a bare NotADirectoryError with its traceback): one line
    naming the file in the way, exit 2, and no claim that data was kept there."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for key in ("journal_directory", "ledger_directories"):
        r = cli("bookie", "serve", "--dir", tmp_path / "b", "--listen", "127.0.0.1:0",
                "--set", f"{key}={blocker / 'sub'}")
        assert r.returncode == 2 and f"a file is in the way of a directory ({blocker})" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        no_traceback(r)
    r = cli("cluster", "up", "--bookies", 1, "--dir", blocker / "sub" / "c")
    assert r.returncode == 2 and f"{blocker} is a file" in r.stderr, r.stderr
    assert "its data is in" not in r.stderr
    no_traceback(r)
    with pytest.raises(embedlog.errors.ConfigError, match=f"{blocker} is a file"):
        LocalCluster(bookies=1, base_dir=str(blocker / "sub"))
    assert blocker.read_text() == "not a directory"


def test_bookie_serve_creates_a_missing_dir(tmp_path):
    """Its help says it creates --dir: with no --metadata too (the store lives in it)."""
    d = tmp_path / "new" / "deeper" / "bookie"
    ready = tmp_path / "ready"
    proc = start("bookie", "serve", "--dir", d, "--listen", "127.0.0.1:0", "--ready-file", ready)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 60, "the bookie starting")
        assert ready.exists(), proc.finish(1)
        assert (d / "meta.db").exists() and oct(os.stat(d).st_mode & 0o777) == "0o700"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.finish(30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err


def test_config_show_refuses_what_bookie_serve_refuses(tmp_path):
    bad = ("--set", "disk_usage_threshold=0.9", "--set", "disk_usage_lwm_threshold=0.95")
    r = cli("config", "show", *bad)
    assert r.returncode == 2 and "disk_usage_lwm_threshold" in r.stderr
    r = cli("bookie", "serve", "--dir", tmp_path / "b", "--listen", "127.0.0.1:0", *bad)
    assert r.returncode == 2 and "disk_usage_lwm_threshold" in r.stderr
    no_traceback(r)


# -- shell -------------------------------------------------------------------------------------------

def _bookie_with_entries(path, n=6000):
    with embedlog.open(path) as log:
        w = log.create_ledger()
        w.append_many([b"x" * 40] * n)
        w.close()
        return w.ledger_id


def test_shell_exit_codes_follow_the_table(tmp_path):
    lid = _bookie_with_entries(tmp_path / "b")
    r = cli("shell", "listledgers", "--dir", tmp_path)                   # not a bookie
    assert r.returncode == 2 and "not a bookie directory" in r.stderr
    r = cli("shell", "listledgers", "--dir", tmp_path / "nowhere")
    assert r.returncode == 2
    r = cli("shell", "readledger", "--dir", tmp_path / "b", lid.ledger_id + 1000)
    assert r.returncode == 3 and "no index file" in r.stderr
    r = cli("shell", "readledger", "--dir", tmp_path / "b", lid.ledger_id + 1000, "--json")
    assert r.returncode == 3 and json.loads(r.stderr)["exit_code"] == 3
    r = cli("shell", "readjournal", "--dir", tmp_path / "b", "ffff")
    assert r.returncode == 2 and "no journal ffff" in r.stderr
    r = cli("shell", "readlog", "--dir", tmp_path / "b", "zz")
    assert r.returncode == 2
    for r in (cli("shell", "listledgers", "--dir", tmp_path / "b"),
              cli("shell", "ledgermetadata", "--dir", tmp_path / "b", lid.ledger_id)):
        assert r.returncode == 0, r.stderr
        no_traceback(r)


def test_shell_into_head_stops_quietly(tmp_path):
    _bookie_with_entries(tmp_path / "b")
    cmd = (f"{sys.executable} -m embedlog.cli shell readjournal --dir {tmp_path / 'b'} | head -n 2; "
           f"exit ${{PIPESTATUS[0]}}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=cli_env(),
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, (r.returncode, r.stderr)
    assert r.stderr == ""


# -- every command, one error path ------------------------------------------------------------------

def test_every_client_command_reports_a_missing_store_the_same_way(tmp_path):
    typo = f"sqlite://{tmp_path}/typo.db"
    commands = [("ledger", "list"), ("ledger", "metadata", "1"), ("ledger", "read", "1"),
                ("ledger", "tail", "1"), ("ledger", "delete", "1", "--yes"), ("ledger", "recover", "1"),
                ("ledger", "create"), ("stream", "list"), ("stream", "read", "s"),
                ("stream", "append", "s", "x"), ("stream", "create", "s"),
                ("bookie", "list"), ("autorecovery", "status"), ("cookie", "show", "b")]
    for args in commands:
        r = cli(*args, "--metadata", typo, "--json")
        assert r.returncode == 5, (args, r.returncode, r.stderr)
        err = json.loads(r.stderr)
        assert err["exit_code"] == 5 and typo in err["error"] and err["type"] == "MetadataError"
    assert not (tmp_path / "typo.db").exists()


# -- logging --------------------------------------------------------------------------------------------

def test_log_level_shows_the_background_work(tmp_path):
    """With --log-level info a bookie says what its autorecovery does (on stderr); by
    default (warning) it does not."""
    runs = []

    def serve(*extra, env=None):
        runs.append(extra)
        ready = tmp_path / f"ready{len(runs)}"
        proc = start(*extra, "bookie", "serve", "--dir", tmp_path / "b", "--listen", "127.0.0.1:0",
                     "--ready-file", ready, "--autorecovery", "--autorecovery-interval", "0.1",
                     env=env)
        try:
            wait_until(lambda: ready.exists() or proc.poll() is not None, 60, "the bookie starting")
            if "--log-level" in extra or env is not None:
                wait_until(lambda: "is the auditor now" in "".join(proc._err), 30, "the auditor log")
            proc.send_signal(signal.SIGTERM)
            out, err = proc.finish(30)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        return err

    err = serve("--log-level", "info")
    assert "INFO embedlog.autorecovery" in err and "is the auditor now" in err
    assert "INFO embedlog.serve" in err            # where it listens, its directory and store
    err = serve(env=cli_env(EMBEDLOG_LOG_LEVEL="info"))
    assert "is the auditor now" in err
    err = serve()
    assert "INFO" not in err
    r = cli("ledger", "list", "--log-level", "loud")
    assert r.returncode == 2 and "--log-level" in r.stderr


def test_bookie_serve_on_every_interface_needs_an_advertised_address(tmp_path):
    """Issue 13.15: --listen 0.0.0.0 would register 0.0.0.0 as the address clients dial."""
    r = cli("bookie", "serve", "--dir", tmp_path / "b", "--listen", "0.0.0.0:0")
    assert r.returncode == 2 and "--advertised-address" in r.stderr, r.stderr
    no_traceback(r)
    assert not (tmp_path / "b").exists()              # refused before anything was made


# -- issue 27 item 4: what the commands say while a bookie is lost ------------------------------------

def test_messages_while_a_bookie_of_the_ensemble_is_unreachable(tmp_path):
    from embedlog.harness import LocalCluster
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "c"), autorecovery=False) as cluster:
        md = ("--metadata", cluster.metadata_uri)
        assert cli("stream", "create", "s", *md, "-e", "3", "-w", "3", "-a", "3").returncode == 0
        victim = cluster.bookie_id(0)
        cluster.proxy(0).cut()                # unreachable, still registered: no spare left
        r = cli("ledger", "create", *md, "-e", "3", "-w", "3", "-a", "3", "--entries", "10")
        no_traceback(r)
        assert r.returncode == 1, r.stderr
        assert f"cannot replace unreachable bookie {victim}" in r.stderr, r.stderr
        assert "outside the ensemble" in r.stderr and "no spare" in r.stderr, r.stderr
        assert "the empty ledger was deleted" in r.stderr, r.stderr
        assert json.loads(cli("ledger", "list", *md, "--json").stdout) == []
        r = cli("stream", "append", "s", "x", *md)
        no_traceback(r)
        assert r.returncode == 1, r.stderr
        assert "outcome of the 1 under way is unknown" in r.stderr, r.stderr


def test_an_unreachable_metadata_service_is_said_once_and_truly(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli("ledger", "list", "--metadata", f"zk+hierarchical://127.0.0.1:{port}/ledgers")
    assert r.returncode == 5 and r.stderr.count("\n") == 1, r.stderr      # no kazoo warnings
    assert "kazoo" not in r.stderr and r.stderr.startswith("error: "), r.stderr
    r = cli("ledger", "list", "--metadata", f"etcd://127.0.0.1:{port}/ledgers")
    assert r.returncode == 5, r.stderr
    assert "no answer within" not in r.stderr and "cannot reach it (after" in r.stderr, r.stderr
