"""`embedlog shell`: inspection commands over a stopped or running bookie's directories."""
import json
import os

import pytest
from click.testing import CliRunner

import embedlog
from embedlog.cli.shell import shell

from support.crash_child import payload

# layout 1: readlog reads entry logs (layout 2's segments: tests/bookie/test_layout2.py)
CONFIG = dict(skip_list_size_limit=64 << 10, entry_log_size_limit=256 << 10, flush_interval_ms=100,
              storage_layout=1)


@pytest.fixture
def bookie_dir(tmp_path):
    path = tmp_path / "b"
    with embedlog.open(path, **CONFIG) as log:
        ledgers = []
        for scope in (0, 0, 21):
            w = log.create_ledger(scope_id=scope)
            for e in range(120):
                w.append(payload(w.ledger_id.qualified_name, e))
            w.close()
            ledgers.append(w.ledger_id)
    return path, ledgers


def run(*args, code=0):
    r = CliRunner().invoke(shell, [str(a) for a in args], catch_exceptions=False)
    assert r.exit_code == code, r.output
    return r.output


def js(*args, code=0):
    return json.loads(run(*args, "--json", code=code))


def test_listledgers_readledger_and_ledgermetadata(bookie_dir):
    path, ledgers = bookie_dir
    out = js("listledgers", "--dir", path)
    assert [(r["ledger_scope_id"], r["ledger_id"]) for r in out] == \
        sorted((l.scope_id, l.ledger_id) for l in ledgers)
    assert "3 ledgers" in run("listledgers", "--dir", path)
    assert len(js("listledgers", "--dir", path, "--from-metadata")) == 3
    scoped = ledgers[2]
    # by id and scope, and by qualified name: the same ledger
    a = js("readledger", "--dir", path, scoped.ledger_id, "--ledger-scope-id", scoped.scope_id)
    b = js("readledger", "--dir", path, "--ledger-qualified-name", scoped.qualified_name)
    assert a == b and a["qualified_name"] == scoped.qualified_name
    assert a["last_entry_id"] == 119 and len(a["entries"]) == 120 and not a["fenced"]
    text = run("readledger", "--dir", path, ledgers[0].ledger_id, "--limit", "2")
    assert "fenced False" in text and "entry log" in text
    md = js("ledgermetadata", "--dir", path, "--ledger-qualified-name", scoped.qualified_name)
    assert md["state"] == "CLOSED" and md["last_entry_id"] == 119 and md["digest_type"] == "CRC32C"
    assert "state: CLOSED" in run("ledgermetadata", "--dir", path, ledgers[1].ledger_id)
    # a ledger that is not there, and a bad name
    assert "no index file" in run("readledger", "--dir", path, 999, code=3)
    run("readledger", "--dir", path, "--ledger-qualified-name", "zz", code=2)


def test_readlog_readjournal_lastmark_listfilesondisc(bookie_dir):
    path, ledgers = bookie_dir
    files = js("listfilesondisc", "--dir", path)
    kinds = {f["kind"] for f in files}
    assert kinds == {"journal", "entrylog", "index"}
    logs = [f for f in files if f["kind"] == "entrylog"]
    first = os.path.basename(logs[0]["path"])[:-4]
    entries = js("readlog", "--dir", path, first)["entries"]
    assert entries and all(e["bytes"] > 0 for e in entries)
    one = entries[0]
    only = js("readlog", "--dir", path, first, "--ledger", one["ledger_id"],
              "--ledger-scope-id", one["ledger_scope_id"], "--entry-id", one["entry_id"])["entries"]
    assert only == [one]
    m = js("readlog", "--dir", path, first, "--map")
    assert m["sealed"] and m["map_source"] == "ledgers map"
    assert sum(r["bytes"] for r in m["ledgers"]) == sum(e["bytes"] + 4 for e in entries)
    assert "ledgers map" in run("readlog", "--dir", path, logs[0]["path"], "--map")
    marks = js("lastmark", "--dir", path)
    assert len(marks) == 1 and "journal_id" in marks[0]
    j = js("readjournal", "--dir", path, marks[0]["journal_id"])
    assert j["status"] == "clean"
    # the whole history is in older journals (kept as backups): find the entries there
    journals = [f for f in files if f["kind"] == "journal"]
    recs = js("readjournal", "--dir", path, journals[0]["path"], "--ledger", ledgers[0].ledger_id)
    assert any(r["type"] == "entry" and r["entry_id"] == 0 for r in recs["records"])
    assert "ledger_key" in run("readjournal", "--dir", path, journals[0]["path"], "--limit", 5)


def test_localconsistencycheck_finds_a_bad_entry(bookie_dir):
    path, ledgers = bookie_dir
    out = js("localconsistencycheck", "--dir", path)
    assert out["ok"] and out["entries"] == 360 and out["good"] == 360
    assert "OK" in run("localconsistencycheck", "--dir", path, "--ledger-qualified-name",
                       ledgers[2].qualified_name)
    # flip a payload byte of one entry in its entry log
    led = js("readledger", "--dir", path, ledgers[1].ledger_id)
    e = led["entries"][7]
    log_path = path / "current" / ("%s.log" % e["log_id"])
    with open(log_path, "r+b") as f:
        f.seek(e["offset"] + 60)
        b = f.read(1)
        f.seek(e["offset"] + 60)
        f.write(bytes([b[0] ^ 0x01]))
    bad = js("localconsistencycheck", "--dir", path, code=1)
    assert not bad["ok"] and len(bad["errors"]) == 1
    assert bad["errors"][0]["entry_id"] == 7 and bad["errors"][0]["ledger_id"] == ledgers[1].ledger_id
    assert "INCONSISTENT" in run("localconsistencycheck", "--dir", path, code=1)


def test_shell_reads_a_running_bookie(tmp_path):
    with embedlog.open(tmp_path, **CONFIG) as log:
        w = log.create_ledger()
        for e in range(50):
            w.append(payload(w.ledger_id.qualified_name, e))
        log.bookie.checkpoint()
        assert js("readledger", "--dir", tmp_path, w.ledger_id.ledger_id)["last_entry_id"] == 49
        assert js("localconsistencycheck", "--dir", tmp_path)["ok"]
        w.append(b"more")                  # the bookie goes on meanwhile


def test_shell_through_the_embedlog_command(bookie_dir):
    from embedlog.cli import main
    path, _ = bookie_dir
    r = CliRunner().invoke(main, ["shell", "lastmark", "--dir", str(path)])
    assert r.exit_code == 0 and "journal" in r.output
    r = CliRunner().invoke(main, ["shell", "--help"])
    for cmd in ("readjournal", "readlog", "readledger", "lastmark", "listledgers",
                "ledgermetadata", "listfilesondisc", "localconsistencycheck"):
        assert cmd in r.output
