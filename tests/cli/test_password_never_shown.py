"""Issue 52, item 1: a ledger's password is stored and used, never shown. Not in the repr or
str of its metadata, not in what `embedlog` prints about it, not in the admin HTTP API or the
status page, not in any log line at DEBUG (this process's or the bookies'). Nor the master key
the password gives: it is what the wire needs to write, and a weak password is found from it
by trying a dictionary."""
from __future__ import annotations

import logging

import pytest

import embedlog
from embedlog._native.format import master_key
from embedlog.harness import LocalCluster

from support.cliutil import admin_addresses, cli, cli_env, http

PASSWORD = b"hunter2-secret"
SECRETS = (PASSWORD, PASSWORD.hex().encode(), PASSWORD.hex().upper().encode(),
           master_key(PASSWORD).hex().encode(), master_key(PASSWORD).hex().upper().encode())


def assert_no_secret(where: str, text) -> None:
    data = text if isinstance(text, bytes) else str(text).encode()
    for s in SECRETS:
        assert s not in data, f"{where} shows the password ({s!r}): {data[:2000]!r}"


@pytest.fixture
def debug_env(monkeypatch):
    # the bookie processes LocalCluster starts inherit it (`embedlog --log-level`'s variable)
    monkeypatch.setenv("EMBEDLOG_LOG_LEVEL", "debug")


def test_metadata_repr_and_str_hide_the_password_which_still_works(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="embedlog")
    with embedlog.open(tmp_path / "log") as log:
        w = log.create_ledger(password=PASSWORD)
        w.append(b"x")
        w.close()
        md = log.ledger_metadata(w.ledger_id)
        assert md.password == PASSWORD                       # stored unchanged...
        assert log.open_ledger(w.ledger_id, password=PASSWORD).read_entry(0) == b"x"
        with pytest.raises(embedlog.errors.UnauthorizedAccessError):
            log.open_ledger(w.ledger_id, password=b"hunter3")    # ...and checked
        versioned = log.metadata.ledger_manager.read_ledger_metadata(w.ledger_id)
        for what, text in (("repr", repr(md)), ("str", str(md)), ("f-string", f"{md}"),
                           ("Versioned", repr(versioned))):
            assert_no_secret(what, text)
        assert "ensemble_size=1" in repr(md)                  # the rest is still there
    assert_no_secret("this process's log at DEBUG", caplog.text)


def test_embedlog_shell_hides_the_password_and_master_key(tmp_path):
    d = tmp_path / "log"
    with embedlog.open(d) as log:
        w = log.create_ledger(password=PASSWORD, digest="mac")
        w.append(b"x")
        w.close()
        lid = w.ledger_id
        log.bookie.checkpoint()                    # the index file, with its header, on disk
    env = cli_env(EMBEDLOG_LOG_LEVEL="debug")
    for args in (("readledger", lid.ledger_id), ("ledgermetadata", lid.ledger_id),
                 ("listledgers",), ("listledgers", "--from-metadata"), ("readjournal",),
                 ("localconsistencycheck",), ("listfilesondisc",), ("lastmark",)):
        for fmt in ((), ("--json",)):
            r = cli("shell", *args, "--dir", d, *fmt, env=env)
            assert r.returncode == 0, (args, r.stderr)
            assert_no_secret(f"embedlog shell {' '.join(map(str, args + fmt))}", r.stdout + r.stderr)
    r = cli("shell", "readledger", lid.ledger_id, "--dir", d, "--json", env=env)
    assert '"has_master_key": true' in r.stdout


def test_cli_admin_api_status_page_and_logs_hide_the_password(tmp_path, caplog, debug_env):
    caplog.set_level(logging.DEBUG, logger="embedlog")
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "cluster"), autorecovery=False,
                      bookie_config={"http_server_enabled": True, "http_server_port": 0}) as lc:
        with lc.client() as client:
            w = client.create_ledger(3, 3, 2, password=PASSWORD)
            w.append_many([b"a", b"b"])
            w.close()
            lid = w.ledger_id
            held = client.create_ledger(3, 3, 2, password=PASSWORD)   # one left OPEN
            held.append(b"open")
            r = client.open_ledger(lid, PASSWORD)
            assert r.read_batch(0, 1) == [b"a", b"b"]
            assert_no_secret("the writer's metadata", repr(w.metadata))
            addresses = sorted(admin_addresses(client).values())
        md = ("--metadata", lc.metadata_uri)
        env = cli_env(EMBEDLOG_LOG_LEVEL="debug")
        for args in (("ledger", "metadata", lid.ledger_id, *md),
                     ("ledger", "list", "--print-metadata", *md),
                     ("ledger", "read", lid.ledger_id, "--password", PASSWORD.decode(), *md),
                     ("ledger", "recover", held.ledger_id, "--password", PASSWORD.decode(), *md),
                     ("ledger", "metadata", held.ledger_id, *md),
                     ("shell", "ledgermetadata", lid.ledger_id, "--dir", lc.bookie_dir(0), *md),
                     ("autorecovery", "status", *md), ("bookie", "list", *md)):
            for fmt in ((), ("--json",)):
                r = cli(*args, *fmt, env=env)
                assert r.returncode == 0, (args, r.stderr)
                assert_no_secret(f"embedlog {' '.join(map(str, args + fmt))}", r.stdout + r.stderr)
        q = f"ledger_id={lid.ledger_id}"
        for address in addresses:
            for path in (f"/api/v1/ledger/metadata?{q}", "/api/v1/ledger/list?print_metadata=true",
                         f"/api/v1/ledger/read?{q}", "/api/v1/bookie/ledgers", "/api/v1/bookie/info",
                         "/api/v1/bookie/state", "/api/v1/config/server_config",
                         "/api/v1/bookie/list_disk_file", "/api/v1/bookie/last_log_mark",
                         "/api/v1/bookie/cluster_info", "/api/v1/status/history", "/status", "/metrics"):
                code, headers, body = http(address, path)
                assert code == 200, (address, path, code, body)
                assert_no_secret(f"GET {path} on {address}", body)
        for i in range(3):
            with open(lc.bookie_dir(i) + "/bookie.log", "rb") as f:
                log_bytes = f.read()
            assert b"DEBUG" in log_bytes                  # the bookies did log at DEBUG
            assert_no_secret(f"bookie {i}'s log at DEBUG", log_bytes)
    assert_no_secret("this process's log at DEBUG", caplog.text)
