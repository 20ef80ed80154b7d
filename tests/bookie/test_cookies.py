"""Cookies: a bookie refuses to start on a missing, extra or foreign directory, or against
another metadata store, and says which and how to fix it."""
import os
import shutil
import subprocess
import sys

import pytest

from support.cliutil import ROOT
import embedlog
from embedlog.bookie.cookies import Cookie, check_and_stamp, read_dir_cookie, write_dir_cookie
from embedlog.errors import InvalidCookieError
from embedlog.meta.sqlite import SqliteMetadataStore



def dirs_config(tmp_path, *names, **extra):
    return dict(ledger_directories=",".join(str(tmp_path / n) for n in names),
                journal_directory=str(tmp_path / "journal"), **extra)


def write_some(log, n=3):
    w = log.create_ledger()
    for i in range(n):
        w.append(b"entry %d" % i)
    w.close()
    return w.ledger_id


def test_a_new_bookie_stamps_every_directory_and_the_store(tmp_path):
    cfg = dirs_config(tmp_path, "a", "b")
    with embedlog.open(tmp_path / "home", **cfg) as log:
        lid = write_some(log)
        b = log.bookie
        stored = Cookie.from_bytes(log.metadata.cookies.read_cookie(b.bookie_id).value, "store")
        for d in ("a", "b"):
            assert read_dir_cookie(str(tmp_path / d), False) == stored
        assert read_dir_cookie(str(tmp_path / "journal"), True) == stored
        assert stored.bookie_id == b.bookie_id
        assert stored.instance_id == log.metadata.instance_id
        assert sorted(stored.ledger_dirs) == sorted(str(tmp_path / d) for d in ("a", "b"))
    with embedlog.open(tmp_path / "home", **cfg) as log:      # the same again: fine
        assert log.open_ledger(lid).read_entry(2) == b"entry 2"


def test_missing_directory_is_refused(tmp_path):
    with embedlog.open(tmp_path / "home", **dirs_config(tmp_path, "a", "b")) as log:
        write_some(log)
    with pytest.raises(InvalidCookieError) as e:
        embedlog.open(tmp_path / "home", **dirs_config(tmp_path, "a"))
    assert "missing" in str(e.value) and str(tmp_path / "b") in str(e.value)
    assert "ledger_directories" in str(e.value)
    # a listed directory that lost its cookie (a wiped or swapped disk)
    shutil.rmtree(tmp_path / "b")
    os.makedirs(tmp_path / "b")
    with pytest.raises(InvalidCookieError) as e:
        embedlog.open(tmp_path / "home", **dirs_config(tmp_path, "a", "b"))
    assert "lost its cookie" in str(e.value) and str(tmp_path / "b") in str(e.value)


def test_extra_directory_is_refused_unless_expansion_is_allowed(tmp_path):
    with embedlog.open(tmp_path / "home", **dirs_config(tmp_path, "a")) as log:
        lid = write_some(log)
    with pytest.raises(InvalidCookieError) as e:
        embedlog.open(tmp_path / "home", **dirs_config(tmp_path, "a", "c"))
    assert "not in bookie" in str(e.value) and "allow_storage_expansion" in str(e.value)
    (tmp_path / "d" / "current").mkdir(parents=True)
    (tmp_path / "d" / "current" / "1.log").write_bytes(b"x")
    with pytest.raises(InvalidCookieError) as e:                # only empty ones
        embedlog.open(tmp_path / "home", **dirs_config(tmp_path, "a", "d", allow_storage_expansion=True))
    assert "not empty" in str(e.value)
    with embedlog.open(tmp_path / "home", **dirs_config(tmp_path, "a", "c",
                                                        allow_storage_expansion=True)) as log:
        assert log.open_ledger(lid).read_entry(0) == b"entry 0"
        write_some(log, 100)
    # the expanded set is now the bookie's: the new directory is required from now on
    with pytest.raises(InvalidCookieError):
        embedlog.open(tmp_path / "home", **dirs_config(tmp_path, "a"))


def test_foreign_directory_is_refused(tmp_path):
    with embedlog.open(tmp_path / "one", **dirs_config(tmp_path, "a")) as log:
        write_some(log)
        owner = log.bookie.bookie_id
    cfg = dict(ledger_directories=str(tmp_path / "a"), journal_directory=str(tmp_path / "j2"))
    with pytest.raises(InvalidCookieError) as e:
        embedlog.open(tmp_path / "two", **cfg)
    assert f"belongs to bookie {owner}" in str(e.value)


def test_another_metadata_store_is_refused(tmp_path):
    path = tmp_path / "log"
    with embedlog.open(path) as log:
        write_some(log)
        instance = log.metadata.instance_id
    other = "sqlite://" + str(tmp_path / "other.db")
    with pytest.raises(InvalidCookieError) as e:
        embedlog.open(path, metadata_uri=other)
    msg = str(e.value)
    assert instance in msg and "would see every ledger as deleted" in msg and "--metadata" in msg
    # the bookie process says so too, and exits without serving
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "embedlog.cli", "bookie", "serve", "--dir", str(path),
                        "--listen", "127.0.0.1:0", "--metadata", other],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0 and "would see every ledger as deleted" in r.stderr, r.stderr
    # a lost meta.db is another store as well: GC there would delete everything
    os.unlink(path / "meta.db")
    with pytest.raises(InvalidCookieError):
        embedlog.open(path)


def test_lost_metadata_is_refused_with_advice_an_operator_can_follow(tmp_path):
    # the advice was "start it with --metadata <the URI it was started with>" (issue 26 item 8)
    path = tmp_path / "log"
    with embedlog.open(path) as log:
        lid = write_some(log)
        instance = log.metadata.instance_id
    shutil.copy(path / "meta.db", tmp_path / "backup.db")
    os.unlink(path / "meta.db")
    uri = "sqlite://" + str(path / "meta.db")
    for _ in range(2):                   # the second open meets the store the first one made
        with pytest.raises(InvalidCookieError) as e:
            embedlog.open(path)
        msg = str(e.value)
        assert "--metadata" not in msg and "would see every ledger as deleted" in msg
        assert f"restore its backup (instance {instance}) to {uri}, over the new one" in msg
        assert f"embedlog shell listledgers --dir {path}" in msg
    # what it names works: the shell lists the ledger from the files, the backup restores it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "embedlog.cli", "shell", "listledgers", "--dir",
                        str(path), "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and lid.qualified_name in r.stdout, r.stdout + r.stderr
    shutil.copy(tmp_path / "backup.db", path / "meta.db")
    with embedlog.open(path) as log:
        assert log.open_ledger(lid).read_batch(0, 2) == [b"entry %d" % i for i in range(3)]


def test_a_bookie_directory_moved_whole_still_opens(tmp_path):
    with embedlog.open(tmp_path / "old") as log:
        lid = write_some(log)
    shutil.move(tmp_path / "old", tmp_path / "new")
    with embedlog.open(tmp_path / "new") as log:
        assert log.open_ledger(lid).read_entry(1) == b"entry 1"
        assert read_dir_cookie(str(tmp_path / "new"), False).ledger_dirs == (".",)


def test_a_directory_from_before_cookies_is_adopted(tmp_path):
    with embedlog.open(tmp_path / "log") as log:
        lid = write_some(log)
        bookie_id = log.bookie.bookie_id
        log.metadata.cookies.remove_cookie(bookie_id)
    for p in (tmp_path / "log" / "current" / "VERSION", tmp_path / "log" / "journal" / "VERSION"):
        os.unlink(p)
    with embedlog.open(tmp_path / "log") as log:
        assert log.open_ledger(lid).read_entry(0) == b"entry 0"
        assert log.metadata.cookies.read_cookie(bookie_id) is not None


def test_a_decommissioned_bookie_stays_out_until_its_cookie_is_written_again(tmp_path):
    """BookKeeper's bookie refuses to start when its cookie is gone from the store but its
    directories hold its data ("Cookie for this bookie is not stored in metadata store");
    an embedlog bookie wrote a new cookie and came back. `embedlog cookie create` brings
    it back on purpose. A new bookie that crashed between stamping its directories and the
    store (no data yet) still starts."""
    path = tmp_path / "log"
    with embedlog.open(path) as log:
        lid = write_some(log)
        bookie_id = log.bookie.bookie_id
        cookies = log.metadata.cookies
        cookies.remove_cookie(bookie_id, cookies.read_cookie(bookie_id).version)
    with pytest.raises(InvalidCookieError) as e:
        embedlog.open(path)
    assert "was decommissioned" in str(e.value) and "embedlog cookie create" in str(e.value)
    uri = "sqlite://" + str(path / "meta.db")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    run = [sys.executable, "-m", "embedlog.cli"]
    r = subprocess.run(run + ["bookie", "serve", "--dir", str(path), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "was decommissioned" in r.stderr, r.stderr
    r = subprocess.run(run + ["cookie", "create", "nosuch", "--dir", str(path), "--metadata", uri],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 4 and "belongs to bookie" in r.stderr, r.stderr
    r = subprocess.run(run + ["cookie", "create", bookie_id, "--dir", str(path), "--metadata", uri],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(run + ["cookie", "create", bookie_id, "--dir", str(path), "--metadata", uri],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 4 and "has a cookie" in r.stderr, r.stderr
    with embedlog.open(path) as log:
        assert log.open_ledger(lid).read_batch(0, 2) == [b"entry %d" % i for i in range(3)]
    # stamped directories without data and no cookie in the store: a crash mid-stamp
    with SqliteMetadataStore(str(tmp_path / "other.db")) as store:
        journal, ledgers = str(tmp_path / "j"), str(tmp_path / "l")
        stamped = Cookie("bookie-new", store.instance_id, journal, (ledgers,))
        write_dir_cookie(journal, True, stamped)
        write_dir_cookie(ledgers, False, stamped)
        check_and_stamp("bookie-new", [ledgers], journal, store)
        assert store.cookies.read_cookie("bookie-new") is not None
