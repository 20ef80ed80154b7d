"""Every `embedlog` subcommand run as a subprocess against a real local cluster: output,
exit codes (docs/OPERATIONS.md), the BP-35 ledger options, configuration sources, and
Ctrl-C in the middle of long commands."""
import json
import os
import signal

import pytest

from support.cliutil import ROOT, cli, cli_env, cli_json, http, http_json, start, wait_until
from embedlog import LedgerId
from embedlog.cli.ledger import generated_entry
from embedlog.client import Client
from embedlog.errors import EmbedlogError
from embedlog.harness import LocalCluster
from embedlog.meta.api import LedgerState


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, base_dir=str(tmp_path_factory.mktemp("cli") / "cluster"),
                      autorecovery=False) as lc:
        yield lc


@pytest.fixture(scope="module")
def md(cluster):
    return ["--metadata", cluster.metadata_uri]


@pytest.fixture(scope="module")
def client(cluster):
    return cluster.client()


# -- every command has help; the groups are all there ---------------------------------------

def test_every_command_has_help():
    import click

    from embedlog.cli import main

    def walk(cmd, path):
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + [name])

    commands = list(walk(main, []))
    names = {" ".join(p) for p, _ in commands}
    for want in ("bookie serve", "cluster up", "demo", "bench", "config show", "config keys",
                 "ledger create", "ledger list", "ledger metadata", "ledger read", "ledger tail",
                 "ledger delete", "ledger recover", "stream create", "stream list", "stream delete",
                 "stream append", "stream read", "stream tail", "stream take-over"):
        assert want in names
    from click.testing import CliRunner
    runner = CliRunner()
    for path, cmd in commands:
        assert cmd.help, f"`embedlog {' '.join(path)}` has no help text"
        r = runner.invoke(main, path + ["--help"])
        assert r.exit_code == 0 and "Usage:" in r.output, (path, r.output)
    r = cli("--help")          # and the real entry point, as a process
    assert r.returncode == 0 and "ledger" in r.stdout and "stream" in r.stdout


# -- ledgers -------------------------------------------------------------------------------------

def test_ledger_lifecycle(md):
    made = cli_json("ledger", "create", *md, "--entries", 50, "--entry-size", 32)
    assert made["state"] == "CLOSED" and made["entries"] == 50 and made["last_entry_id"] == 49
    assert made["ledger_scope_id"] == 0 and not made["interrupted"]
    lid = made["ledger_id"]
    assert made["ledger_qualified_name"] == LedgerId(0, lid).qualified_name

    listed = cli_json("ledger", "list", *md)
    assert made["ledger_qualified_name"] in [r["ledger_qualified_name"] for r in listed]
    r = cli("ledger", "list", *md, "-m")
    row = next(l for l in r.stdout.splitlines() if l.startswith(made["ledger_qualified_name"]))
    assert r.returncode == 0 and row.split()[2:4] == [str(lid), "CLOSED"]     # a table row

    meta = cli_json("ledger", "metadata", *md, lid)
    assert meta["state"] == "CLOSED" and meta["last_entry_id"] == 49
    assert meta["ensemble_size"] == 3 and len(meta["fragments"][0]["ensemble"]) == 3
    assert "password" not in meta and meta["has_password"] is False
    r = cli("ledger", "metadata", *md, lid)
    assert r.returncode == 0 and "state: CLOSED" in r.stdout and "from entry 0:" in r.stdout

    r = cli("ledger", "read", *md, lid, "--first", 10, "--last", 12)
    assert r.returncode == 0
    assert r.stdout.splitlines() == [f"{e}\t{generated_entry(e, 32).decode()}" for e in (10, 11, 12)]
    lines = [json.loads(x) for x in cli("ledger", "read", *md, lid, "--json").stdout.splitlines()]
    assert [x["entry_id"] for x in lines] == list(range(50))
    assert lines[7]["data"] == generated_entry(7, 32).decode()
    r = cli("ledger", "read", *md, lid, "--first", 49, "--format", "hex")
    assert r.stdout.strip() == f"49\t{generated_entry(49, 32).hex()}"

    r = cli("ledger", "read", *md, lid, "--first", 40, "--last", 60)
    assert r.returncode == 3 and "past the LAC" in r.stderr          # no such entry

    r = cli("ledger", "delete", *md, lid)
    assert r.returncode == 2 and "--yes" in r.stderr                  # no terminal to ask
    out = cli_json("ledger", "delete", *md, lid, "--yes")
    assert out["deleted"] and out["ledger_id"] == lid
    r = cli("ledger", "metadata", *md, lid)
    assert r.returncode == 3 and r.stderr.startswith("error:")
    r = cli("ledger", "metadata", *md, lid, "--json")
    err = json.loads(r.stderr)
    assert r.returncode == 3 and err["type"] == "NoSuchLedgerError" and err["exit_code"] == 3


def test_scope_and_qualified_name_options(md, client):
    scoped = cli_json("ledger", "create", *md, "--ledger-scope-id", 7, "--entries", 5)
    assert scoped["ledger_scope_id"] == 7
    q, lid = scoped["ledger_qualified_name"], scoped["ledger_id"]
    assert LedgerId.parse(q) == LedgerId(7, lid)

    assert q not in [r["ledger_qualified_name"] for r in cli_json("ledger", "list", *md)]
    assert q in [r["ledger_qualified_name"] for r in cli_json("ledger", "list", *md, "--ledger-scope-id", 7)]
    assert q in [r["ledger_qualified_name"] for r in cli_json("ledger", "list", *md, "--all-scopes")]

    by_name = cli_json("ledger", "metadata", *md, "--ledger-qualified-name", q)
    by_id = cli_json("ledger", "metadata", *md, lid, "--ledger-scope-id", 7)
    assert by_name == by_id and by_name["ledger_scope_id"] == 7
    r = cli("ledger", "read", *md, "--ledger-qualified-name", q.upper(), "--last", 1)
    assert r.returncode == 0 and r.stdout.splitlines()[1].startswith("1\t000000000001")
    assert cli("ledger", "metadata", *md, lid).returncode == 3          # scope 0 has no such ledger

    # disagreeing or malformed ledger options are usage errors (2), before any work
    for bad in (["--ledger-qualified-name", q, "--ledger-scope-id", 8],
                ["--ledger-qualified-name", q, lid],
                ["--ledger-qualified-name", "xyz"],
                [str(1 << 63)],                          # scope 0 stays below 2^63
                [str(1 << 64)],
                ["--ledger-scope-id", "-1", lid],
                []):
        r = cli("ledger", "metadata", *md, *bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)

    # a scope != 0 ledger id may use all 64 bits
    big = cli_json("ledger", "create", *md, "--ledger-scope-id", 9, "--ledger-id", (1 << 64) - 2)
    assert big["ledger_id"] == (1 << 64) - 2 and big["state"] == "CLOSED"
    explicit = LedgerId(11, 5).qualified_name
    made = cli_json("ledger", "create", *md, "--ledger-qualified-name", explicit, "--entries", 1)
    assert made["ledger_qualified_name"] == explicit
    r = cli("ledger", "create", *md, "--ledger-qualified-name", explicit)
    assert r.returncode == 4                                 # exists
    u = cli_json("ledger", "create", *md, "--uuid")
    assert u["ledger_scope_id"] != 0
    assert client.ledger_metadata(LedgerId.parse(u["ledger_qualified_name"])).state == LedgerState.CLOSED
    r = cli("ledger", "create", *md, "--uuid", "--ledger-id", 3)
    assert r.returncode == 2


def test_password_input_and_custom_metadata(md):
    made = cli_json("ledger", "create", *md, "--password", "s3cret", "--input", "-",
                    "--custom", "owner=ops", input="alpha\nbeta\n\ngamma\n")
    lid = made["ledger_id"]
    assert made["entries"] == 4
    r = cli("ledger", "read", *md, lid)
    assert r.returncode == 4 and "password" in r.stderr                 # refused
    r = cli("ledger", "read", *md, lid, "--password", "s3cret")
    assert r.returncode == 0 and r.stdout.splitlines() == ["0\talpha", "1\tbeta", "2\t", "3\tgamma"]
    r = cli("ledger", "read", *md, lid, env=cli_env(EMBEDLOG_LEDGER_PASSWORD="s3cret"))
    assert r.returncode == 0
    meta = cli_json("ledger", "metadata", *md, lid)
    assert meta["custom_metadata"] == {"owner": "ops"} and meta["has_password"]


def test_metadata_uri_from_environment_and_errors(cluster, tmp_path):
    env = cli_env(EMBEDLOG_METADATA=cluster.metadata_uri)
    r = cli("ledger", "list", "--json", env=env)
    assert r.returncode == 0 and isinstance(json.loads(r.stdout), list)
    r = cli("ledger", "list")
    assert r.returncode == 2 and "EMBEDLOG_METADATA" in r.stderr
    r = cli("ledger", "list", "--metadata", f"sqlite://{tmp_path}/no/such/dir/meta.db")
    assert r.returncode == 5 and "does not exist" in r.stderr         # metadata unreachable
    # a URI that names no initialised store: exit 5 naming it, and no store is made there
    typo = f"sqlite://{tmp_path}/typo.db"
    for args in (("ledger", "list"), ("ledger", "read", "0"), ("stream", "list")):
        r = cli(*args, "--metadata", typo)
        assert r.returncode == 5 and typo in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not (tmp_path / "typo.db").exists()
    # a malformed URI is bad usage (2), not an unreachable store (5)
    for uri in ("nosuch://x", "zk+hierarchical://127.0.0.1:notaport/ledgers", "sqlite://host/x.db",
                "meta.db"):
        r = cli("ledger", "list", "--metadata", uri)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (uri, r.stderr)
    r = cli("ledger", "list", "--metadata", "nosuch://x", "--json")
    err = json.loads(r.stderr)
    assert err["exit_code"] == 2 and err["type"] == "MetadataUriError"
    r = cli("ledger", "create", "--metadata", cluster.metadata_uri, "-e", 5, "-w", 5, "-a", 5)
    assert r.returncode == 1 and "writable bookies" in r.stderr         # not enough bookies
    r = cli("ledger", "create", "--metadata", cluster.metadata_uri, "-e", 2, "-w", 3)
    assert r.returncode == 2


def test_tail_follows_a_writer_and_recover_closes(md, client):
    w = client.create_ledger(3, 2, 2)
    w.append_many([b"e%d" % i for i in range(3)])
    tail = start("ledger", "tail", *md, w.ledger_id.ledger_id, "--count", 8, "--json")
    try:
        first = json.loads(tail.expect(lambda line: line.strip()))
        assert first["entry_id"] == 0 and first["data"] == "e0"
        for i in range(3, 8):
            w.append(b"e%d" % i)
        out, err = tail.finish(30)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    assert [json.loads(x)["data"] for x in out.splitlines()] == [f"e{i}" for i in range(8)]

    r = cli("ledger", "recover", *md, w.ledger_id.ledger_id)
    assert r.returncode == 0 and "recovered and closed: last entry id 7" in r.stdout
    with pytest.raises(EmbedlogError):          # the writer was fenced out
        w.append(b"late")
    again = cli_json("ledger", "recover", *md, w.ledger_id.ledger_id)
    assert again["recovered"] is False and again["state"] == "CLOSED" and again["last_entry_id"] == 7
    r = cli("ledger", "tail", *md, w.ledger_id.ledger_id, "--from", 6)     # closed: reads to the end
    assert r.returncode == 0 and r.stdout.splitlines() == ["6\te6", "7\te7"]


def test_ctrl_c_in_the_middle_of_a_long_write_closes_the_ledger(md, client):
    total = 5_000_000
    proc = start("ledger", "create", *md, "--entries", total, "--entry-size", 64, "--progress")
    try:
        line = proc.expect(lambda l: l.startswith("created ledger"))
        lid = LedgerId.parse(line.split()[2])
        reader = client.open_ledger(lid, recovery=False)
        wait_until(lambda: reader.read_lac() >= 3000, 30, "3000 entries written")
        proc.send_signal(signal.SIGINT)
        out, err = proc.finish(60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted: closing the ledger" in err
    summary = out.strip().splitlines()[-1]
    written = int(summary.split(": ")[1].split()[0])
    assert 3000 <= written < total and summary.endswith("CLOSED")
    md_ = client.ledger_metadata(lid)
    assert md_.state == LedgerState.CLOSED and md_.last_entry_id == written - 1   # nothing half-done
    r = client.open_ledger(lid)
    assert r.read_entry(written - 1) == generated_entry(written - 1, 64)
    assert r.read_batch(0, 2) == [generated_entry(e, 64) for e in range(3)]


def test_ctrl_c_stops_a_tail(md, client):
    w = client.create_ledger(3, 2, 2)
    w.append(b"only")
    proc = start("ledger", "tail", *md, w.ledger_id.ledger_id)
    try:
        assert proc.expect(lambda l: l.strip()) == "0\tonly\n"
        proc.send_signal(signal.SIGINT)
        proc.finish(20)
    finally:
        proc.kill()
    assert proc.returncode == 130
    w.close()


# -- configuration --------------------------------------------------------------------------------

def test_config_show_names_each_source(tmp_path):
    conf = tmp_path / "bookie.toml"
    conf.write_text('journal_max_group_wait_ms = 3\nhttp_server_enabled = true\n'
                    'journal_max_backups = 2\n')
    env = cli_env(EMBEDLOG_JOURNAL_MAX_BACKUPS="7", EMBEDLOG_METADATA="sqlite:///tmp/x/meta.db",
                  EMBEDLOG_NOT_A_KEY="1")
    r = cli("config", "show", "--conf", conf, "--set", "page_limit=100", "--http-port", "0",
            "--listen", "0.0.0.0:4000", "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {row["key"]: row for row in doc["keys"]}
    assert rows["journal_max_group_wait_ms"] == {"key": "journal_max_group_wait_ms", "value": 3.0,
                                                 "source": f"file {conf}"}
    assert rows["journal_max_backups"]["value"] == 7                         # env beats file
    assert rows["journal_max_backups"]["source"] == "env EMBEDLOG_JOURNAL_MAX_BACKUPS"
    assert rows["metadata_service_uri"]["source"] == "env EMBEDLOG_METADATA"
    assert rows["page_limit"] == {"key": "page_limit", "value": 100, "source": "option --set"}
    assert rows["http_server_port"]["value"] == 0 and rows["http_server_port"]["source"] == "option --http-port"
    assert rows["http_server_enabled"]["source"] == "option --http-port"       # option beats file
    assert rows["bookie_port"]["value"] == 4000 and rows["listening_interface"]["value"] == "0.0.0.0"
    assert rows["entry_log_size_limit"]["source"] == "default"
    assert doc["unknown_env"] == ["EMBEDLOG_NOT_A_KEY"]
    # the same through EMBEDLOG_CONF, as text for a person
    r = cli("config", "show", env=cli_env(EMBEDLOG_CONF=str(conf)))
    assert r.returncode == 0
    line = next(l for l in r.stdout.splitlines() if l.startswith("journal_max_group_wait_ms"))
    assert line.split()[1:] == ["3.0", "file", str(conf)]                   # key, value, source
    assert next(l for l in r.stdout.splitlines() if l.startswith("page_limit")).split()[-1] == "default"


@pytest.mark.parametrize("conf_text, args, env, message", [
    ("journal_max_backups = -1\n", [], {}, "journal_max_backups=-1 is outside"),
    ("journal_max_backup = 3\n", [], {}, "unknown configuration key 'journal_max_backup'"),
    ("journal_sync_data = 'no'\n", [], {}, "journal_sync_data must be true or false"),
    ("[bookie]\npage_limit = 10\n", [], {}, "put keys at the top level"),
    ("page_limit = \n", [], {}, "not valid TOML"),
    ("", ["--set", "page_limit=lots"], {}, "page_limit (from option --set) must be an integer"),
    ("", ["--set", "no_such_key=1"], {}, "unknown configuration key 'no_such_key'"),
    ("", [], {"EMBEDLOG_JOURNAL_SYNC_DATA": "maybe"}, "env EMBEDLOG_JOURNAL_SYNC_DATA"),
    ("", ["--listen", "nohostport"], {}, "--listen wants HOST:PORT"),
])
def test_config_errors_name_the_key(tmp_path, conf_text, args, env, message):
    conf = tmp_path / "c.toml"
    conf.write_text(conf_text)
    r = cli("config", "show", "--conf", conf, *args, env=cli_env(**env))
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
    # and `bookie serve` refuses the same configuration before it starts
    r = cli("bookie", "serve", "--dir", tmp_path / "b", "--conf", conf, *args, env=cli_env(**env))
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)


def test_config_file_size_is_bounded(tmp_path):
    conf = tmp_path / "huge.toml"
    conf.write_text("# " + "x" * (1 << 20) + "\n")
    r = cli("config", "show", "--conf", conf)
    assert r.returncode == 2 and "larger than" in r.stderr


def test_config_keys_are_documented():
    from embedlog.config import BookieConfig
    keys = cli_json("config", "keys")
    assert {k["key"] for k in keys} == set(BookieConfig.keys())
    table = cli("config", "keys", "--markdown").stdout
    doc = open(os.path.join(ROOT, "docs", "CONFIGURATION.md")).read()
    for line in table.splitlines()[2:]:
        assert line in doc, f"docs/CONFIGURATION.md is out of date (regenerate with " \
                            f"`embedlog config keys --markdown`): {line}"


# -- processes: bookie serve, cluster up ------------------------------------------------------------

def test_bookie_serve_from_a_config_file(tmp_path):
    meta = tmp_path / "meta.db"
    conf = tmp_path / "bookie.toml"
    conf.write_text(f'metadata_service_uri = "sqlite://{meta}"\nbookie_port = 0\n'
                    'http_server_enabled = true\nhttp_server_port = 0\n'
                    'auto_recovery_daemon_enabled = true\n')
    proc = start("bookie", "serve", "--dir", tmp_path / "bookie", "--conf", conf,
                 "--autorecovery-interval", "0.2")
    try:
        line = proc.expect(lambda l: l.startswith("admin http://"))
        address = line.split("//")[1].split("/")[0]
        assert http(address, "/heartbeat")[:1] == (200,)
        wait_until(lambda: http(address, "/api/v1/bookie/is_ready")[0] == 200, 15, "ready")
        status = wait_until(lambda: (lambda s: s if s.get("is_auditor") else None)(
            http_json(address, "/api/v1/autorecovery/status")), 15, "this bookie elected auditor")
        assert status["enabled"] is True
        with Client(f"sqlite://{meta}") as c:
            regs = c.metadata.registration_client.get_writable_bookies()
            assert len(regs) == 1 and regs[0].info["http"] == address
        proc.send_signal(signal.SIGINT)
        out, err = proc.finish(30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "stopped" in err
    with Client(f"sqlite://{meta}") as c:          # it left the metadata store
        assert c.metadata.registration_client.get_writable_bookies() == []
    import fcntl
    with open(tmp_path / "bookie" / "LOCK") as f:   # and released its directory
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_admin_server_is_off_by_default(cluster, client):
    rc = client.metadata.registration_client
    regs = rc.get_writable_bookies()
    assert len(regs) == 3 and all("http" not in (r.info or {}) for r in regs)


def test_cluster_up_and_ctrl_c(tmp_path):
    proc = start("cluster", "up", "--bookies", 1, "--dir", tmp_path / "c", "--http", "--json")
    try:
        up = json.loads(proc.expect(lambda l: l.startswith("{"), 60))
        uri, address = up["metadata_uri"], up["bookies"][0]["http"]
        assert up["bookies"][0]["dir"] == str(tmp_path / "c" / "bookie-0")
        assert http_json(address, "/api/v1/bookie/state")["state"] == "writable"
        made = cli_json("ledger", "create", "--metadata", uri, "-e", 1, "-w", 1, "-a", 1, "--entries", 3)
        assert made["state"] == "CLOSED"
        proc.send_signal(signal.SIGINT)
        proc.finish(180)   # the bookies close first: slow at load
    finally:
        proc.kill()
    assert proc.returncode == 0
    lock = tmp_path / "c" / "bookie-0" / "LOCK"
    import fcntl
    with open(lock) as f:                   # the bookie process is gone: its lock is free
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_cluster_up_says_where_its_data_is_and_removes_or_keeps_it(tmp_path):
    """Issue 17 item 5: the export line the next shell needs; a temporary directory removed
    at Ctrl-C, saying so, or kept with --keep."""
    for keep in (False, True):
        tmp = tmp_path / f"tmp-{keep}"
        tmp.mkdir()
        proc = start("cluster", "up", "--bookies", 1, *(["--keep"] if keep else []),
                     env=cli_env(TMPDIR=str(tmp)))
        try:
            export = proc.expect(lambda l: l.startswith("export EMBEDLOG_METADATA="), 60)
            uri = export.strip().split("=", 1)[1]
            assert uri.startswith(f"sqlite://{tmp}/embedlog-cluster-")
            assert cli_json("ledger", "list", "--metadata", uri) == []
            proc.send_signal(signal.SIGINT)
            out, err = proc.finish(180)   # the bookies close first: slow at load
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        data = next(tmp.glob("embedlog-cluster-*"), None)
        if keep:
            assert data is not None and f"its data is in {data}" in err
            assert (data / "meta.db").exists() and (data / "bookie-0").is_dir()
        else:
            assert data is None and "removed" in err and "is removed when it stops" in err


# -- long commands with size flags -------------------------------------------------------------------

def test_demo_small(tmp_path):
    r = cli("demo", "--entries", 3000, "--ledgers", 2, "--dir", tmp_path / "demo", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "verified entries" in r.stdout and "3,000 of 3,000" in r.stdout
    r = cli("demo", "--entries", 10, "--dir", tmp_path / "demo")         # not a fresh directory
    assert r.returncode == 2 and "not empty" in r.stderr
    figures = cli_json("demo", "--entries", 500, "--ledgers", 1, "--dir", tmp_path / "demo2")
    assert figures["verified"] == 500 and figures["append_per_s"] > 0


def test_ctrl_c_stops_the_demo_and_removes_its_directory(tmp_path):
    proc = start("demo", "--entries", 20_000_000, env=cli_env(TMPDIR=str(tmp_path)))
    try:
        journal = wait_until(lambda: next(iter(tmp_path.glob("embedlog-demo-*/journal/*")), None),
                             30, "the demo writing its journal")
        proc.send_signal(signal.SIGINT)
        out, err = proc.finish(180)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in err, (out, err)
    assert not journal.exists() and not list(tmp_path.glob("embedlog-demo-*"))


def test_bench_one_quick_item(tmp_path):
    out = tmp_path / "bench.md"
    r = cli("bench", "--quick", "--only", "append_sync_100B", "--out", out, timeout=120)
    assert r.returncode == 0, r.stderr
    table = out.read_text()
    assert "| append_sync_100B | entries/s |" in table
    r = cli("bench", "--suite", "ingest", "--quick")
    assert r.returncode == 2


# -- streams (unbounded ledgers) ---------------------------------------------------------------------

streams_missing = pytest.mark.xfail(not hasattr(Client, "open_stream"), strict=True,
                                    reason="the stream API (Client.open_stream) has not landed yet")


@streams_missing
def test_stream_commands(md, client):
    name = f"orders-{os.getpid()}"
    made = cli_json("stream", "create", *md, name, "--rollover-entries", 100)
    assert made["name"] == name and made["term"] == 0
    r = cli("stream", "create", *md, name)
    assert r.returncode == 4 and "exists" in r.stderr
    assert name in [s["name"] for s in cli_json("stream", "list", *md)]
    assert cli_json("stream", "list", *md, "orders-*", "-m")[0]["ledger_qualified_name"] == \
        made["ledger_qualified_name"]
    assert cli_json("stream", "list", *md, "nomatch-*") == []

    a = cli_json("stream", "append", *md, name, "one", "two")
    assert a["appended"] == 2
    b = cli_json("stream", "append", *md, name, "--input", "-", input="three\nfour\n")
    # the first append released the stream: the second goes on without a take-over's gap
    assert b["appended"] == 2 and b["first_position"] == a["last_position"] + 1
    r = cli("stream", "read", *md, name)
    assert r.returncode == 0
    assert [l.split("\t")[1] for l in r.stdout.splitlines()] == ["one", "two", "three", "four"]

    tail = start("stream", "tail", *md, name, "--from", b["last_position"] + 1, "--count", 2, "--json")
    try:
        c = cli_json("stream", "append", *md, name, "five", "six")
        out, err = tail.finish(30)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    got = [json.loads(l) for l in out.splitlines()]
    assert [g["data"] for g in got] == ["five", "six"] and got[-1]["position"] == c["last_position"]

    t = cli_json("stream", "take-over", *md, name)
    assert t["term"] > t["previous_term"] and t["next_position"] > c["last_position"]
    assert cli("stream", "delete", *md, name).returncode == 2          # needs --yes
    assert cli_json("stream", "delete", *md, name, "--yes")["deleted"]
    assert cli("stream", "read", *md, name).returncode == 3
    assert name not in [s["name"] for s in cli_json("stream", "list", *md)]


def test_the_ready_file_is_0644_under_umask_000(tmp_path):
    # was 0666: created with open(), so the umask alone decided (issue 26 item 8)
    import stat
    import subprocess
    import sys
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "embedlog.cli", "bookie", "serve", "--dir",
                             str(tmp_path / "b"), "--listen", "127.0.0.1:0", "--metadata",
                             f"sqlite://{tmp_path / 'meta.db'}", "--ready-file", str(ready)],
                            env=cli_env(), cwd=ROOT, umask=0, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 60, "the ready file")
        assert ready.exists(), proc.stderr.read()
        assert stat.S_IMODE(ready.stat().st_mode) == 0o644
    finally:
        proc.kill()
        proc.wait()
