"""TLS and the shared token on real bookie processes (docs/SECURITY.md): a client without
the CA, the client certificate or the token cannot add, read or fence, and nothing changes."""
import pytest

from embedlog._native.format import digest_code, encode_entry, master_key
from embedlog.errors import EmbedlogError, UnauthorizedAccessError
from embedlog.harness import LocalCluster
from embedlog.net import protocol as P
from embedlog.net.transport import BookieUnavailableError

PASSWORD = b"pw"


def _cluster(tmp_path, **kw):
    return LocalCluster(bookies=1, base_dir=str(tmp_path / "cluster"), proxies=False,
                        autorecovery=False, **kw)


def _write(cluster, n=10):
    good = cluster.client()
    w = good.create_ledger(1, 1, 1, password=PASSWORD)
    last = w.append_many([b"entry-%d" % i for i in range(n)])
    assert last == n - 1
    return good, w


def _attempts(lid, next_eid):
    """Builders of an add (a well-formed next entry, right key), a read and a fencing read."""
    key = master_key(PASSWORD)
    entry = encode_entry(lid.scope_id, lid.ledger_id, next_eid, next_eid - 1, 0,
                         digest_code("crc32c"), b"intruder")
    return {
        "add": lambda rid: P.add_request(rid, lid.scope_id, lid.ledger_id, key, [entry]),
        "read": lambda rid: P.read_request(rid, lid.scope_id, lid.ledger_id, 0),
        "fence": lambda rid: P.read_lac_request(rid, lid.scope_id, lid.ledger_id,
                                               flags=P.FLAG_FENCE, master_key=key),
    }


def _refused(client, bookie_id, lid, next_eid, expect=EmbedlogError):
    ctx = client._ctx
    for name, build in _attempts(lid, next_eid).items():
        with pytest.raises(expect):
            ctx.run(ctx.call(bookie_id, build, 5), timeout=15)


def _unchanged(good, w, n):
    """The ledger is not fenced, holds exactly what the writer wrote, and takes more."""
    assert w.append(b"after") == n
    w.close()
    r = good.open_ledger(w.ledger_id, password=PASSWORD, recovery=False)
    got = [e.data for e in r.read(0, n)]
    assert got == [b"entry-%d" % i for i in range(n)] + [b"after"]


def test_tls_with_client_certificates(tmp_path):
    import trustme
    with _cluster(tmp_path, tls=True, tls_client_auth=True) as cluster:
        good, w = _write(cluster)
        bid = cluster.bookie_id(0)
        other_ca = tmp_path / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(other_ca))
        files = cluster.tls_files
        bad_clients = [
            cluster.client(tls_ca_file=None, tls_cert_file=None),       # plain TCP to a TLS bookie
            cluster.client(tls_ca_file=str(other_ca),                   # does not trust the bookie
                           tls_cert_file=files["client.pem"]),
            cluster.client(tls_cert_file=None),                         # no client certificate
        ]
        for bad in bad_clients:
            _refused(bad, bid, w.ledger_id, 10, BookieUnavailableError)
        _unchanged(good, w, 10)


def test_tls_without_client_certificates(tmp_path):
    with _cluster(tmp_path, tls=True) as cluster:
        good, w = _write(cluster)
        assert "tls_cert_file" not in cluster.client_config
        _refused(cluster.client(tls_ca_file=None), cluster.bookie_id(0), w.ledger_id, 10,
                 BookieUnavailableError)
        _unchanged(good, w, 10)


def test_shared_token(tmp_path):
    with _cluster(tmp_path, auth_token="s3cret-token-0123456789-token") as cluster:
        good, w = _write(cluster)
        bid = cluster.bookie_id(0)
        wrong = tmp_path / "wrong-token"
        wrong.write_bytes(b"s3cret-token-0123456789-tokem")
        wrong.chmod(0o600)
        _refused(cluster.client(auth_token_file=None), bid, w.ledger_id, 10, UnauthorizedAccessError)
        _refused(cluster.client(auth_token_file=str(wrong)), bid, w.ledger_id, 10,
                 UnauthorizedAccessError)
        _unchanged(good, w, 10)
        ctx = good._ctx
        import json
        info = json.loads(bytes(ctx.run(ctx.call(bid, P.bookie_info_request, 5)).body))
        assert info["server"]["auth_failures"] >= 6


def test_token_guards_admin_http_changes(tmp_path):
    from support.cliutil import admin_addresses, http
    with _cluster(tmp_path, auth_token="s3cret-token-0123456789-token",
                  bookie_config={"http_server_enabled": True, "http_server_port": 0}) as cluster:
        good, w = _write(cluster)
        w.close()
        admin = next(iter(admin_addresses(good).values()))
        path = f"/api/v1/ledger/delete?ledger_qualified_name={w.ledger_id.qualified_name}"
        for headers in ({}, {"Authorization": "Bearer s3cret-token-0123456789-tokem"},
                        {"Authorization": "Basic s3cret-token-0123456789-token"}):
            code, got, body = http(admin, path, "DELETE", headers=headers)
            assert code == 401 and got["www-authenticate"].startswith("Bearer"), body
        assert good.ledger_metadata(w.ledger_id).last_entry_id == 9      # nothing changed
        code, _, body = http(admin, f"/api/v1/ledger/metadata?ledger_id={w.ledger_id.ledger_id}")
        assert code == 200, body                                          # reads stay open
        code, _, body = http(admin, path, "DELETE",
                             headers={"Authorization": "Bearer s3cret-token-0123456789-token"})
        assert code == 200, body
        assert w.ledger_id not in good.list_ledgers(0)
        # the other changing endpoints follow the same rule (issue 17)
        for method, changing in (("PUT", "/api/v1/bookie/state/readonly"), ("PUT", "/api/v1/bookie/gc"),
                                 ("PUT", "/api/v1/autorecovery/trigger_audit")):
            code, got, body = http(admin, changing, method)
            assert code == 401, (changing, body)
        assert http(admin, "/api/v1/bookie/state/readonly")[0] == 200      # reading stays open
        # `embedlog bookie readonly` carries the token from the bookies' token file
        from support.cliutil import cli, cli_env
        bid = cluster.bookie_id(0)
        md = ("--metadata", cluster.metadata_uri)
        r = cli("bookie", "readonly", "on", bid, *md, env=cli_env())
        assert r.returncode == 4 and "401" in r.stderr, r.stderr
        r = cli("bookie", "readonly", "on", bid, *md, "--auth-token-file", cluster.auth_token_file)
        assert r.returncode == 0, r.stderr
        assert bid in good.bookies()[1]
        r = cli("bookie", "readonly", "off", bid, *md, "--auth-token-file", cluster.auth_token_file)
        assert r.returncode == 0 and bid in good.bookies()[0], r.stderr


def test_tls_and_token_together_and_plain_still_works(tmp_path):
    with _cluster(tmp_path, tls=True, auth_token=b"t" * 16) as cluster:
        good, w = _write(cluster, 3)
        _refused(cluster.client(auth_token_file=None), cluster.bookie_id(0), w.ledger_id, 3,
                 UnauthorizedAccessError)
        _unchanged(good, w, 3)
    with LocalCluster(bookies=1, base_dir=str(tmp_path / "plain"), proxies=False,
                      autorecovery=False) as plain:
        assert plain.client_config == {}
        good, w = _write(plain, 3)
        _unchanged(good, w, 3)


def test_wrong_password_changes_nothing_on_any_bookie(tmp_path):
    """Every operation that needs the master key, sent with a wrong one to every bookie of
    the ensemble, is UnauthorizedAccess; then no bookie is fenced, at a higher term, trimmed
    or holding an extra entry: the writer (E=Qw=Qa=3, so every bookie must take its adds)
    goes on, and each bookie returns exactly what it was given."""
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False) as cluster:
        good = cluster.client()
        w = good.create_ledger(3, 3, 3, password=PASSWORD)
        w.append_many([b"entry-%d" % i for i in range(5)])
        lid, ctx = w.ledger_id, good._ctx
        wrong = master_key(b"not the password")
        intruder = encode_entry(lid.scope_id, lid.ledger_id, 5, 4, 0, digest_code("crc32c"), b"intruder")
        s, l = lid.scope_id, lid.ledger_id
        attempts = {
            "add": lambda rid: P.add_request(rid, s, l, wrong, [intruder]),
            "recovery add": lambda rid: P.add_request(rid, s, l, wrong, [intruder], P.FLAG_RECOVERY_ADD),
            "fence (read_lac)": lambda rid: P.read_lac_request(rid, s, l, P.FLAG_FENCE, wrong),
            "fence (read)": lambda rid: P.read_request(rid, s, l, 0, flags=P.FLAG_FENCE, master_key=wrong),
            "recovery read at term 99": lambda rid: P.read_request(
                rid, s, l, 0, flags=P.FLAG_RECOVERY_READ, master_key=wrong, term=99),
            "add at term 99": lambda rid: P.add_request(rid, s, l, wrong, [intruder], term=99),
            "write_lac": lambda rid: P.write_lac_request(rid, s, l, wrong, 4),
            "trim": lambda rid: P.trim_request(rid, s, l, wrong, 3),
        }
        bookies = [cluster.bookie_id(i) for i in range(3)]
        for b in bookies:
            for name, build in attempts.items():
                with pytest.raises(UnauthorizedAccessError):
                    ctx.run(ctx.call(b, build, 5), timeout=15)
        assert w.append(b"entry-5") == 5            # not fenced, term 0 still accepted, everywhere
        w.close()
        for b in bookies:
            resp = ctx.run(ctx.call(b, lambda rid: P.read_request(rid, s, l, 0, 10), 5), timeout=15)
            _lac, entries = P.parse_read_body(resp.body)
            assert [e for e, _ in entries] == list(range(6))      # nothing trimmed, nothing added
            assert b"intruder" not in b"".join(data for _, data in entries)


def test_token_files_must_be_private_and_long_enough(tmp_path):
    from embedlog.errors import ConfigError
    from embedlog.net.security import read_token
    f = tmp_path / "token"
    f.write_bytes(b"x" * 32)
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        read_token(str(f))
    f.chmod(0o600)
    assert read_token(str(f)) == b"x" * 32
    f.write_bytes(b"short")
    with pytest.raises(ConfigError, match="5 bytes"):
        read_token(str(f))
