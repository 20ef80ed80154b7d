"""The admin HTTP server of real bookie processes: every endpoint, BP-35's ledger_scope_id,
bad parameters answered 4xx with a JSON error, and metrics that move with traffic."""
import json
import re
import os
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.cliutil import admin_addresses, admin_auth, http, http_json, wait_until
from embedlog import LedgerId
from embedlog.harness import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # autorecovery off: an under-replicated mark made by a test must stay until it is read
    with LocalCluster(bookies=3, base_dir=str(tmp_path_factory.mktemp("admin") / "cluster"),
                      autorecovery=False,
                      bookie_config={"http_server_enabled": True, "http_server_port": 0}) as lc:
        yield lc


@pytest.fixture(scope="module")
def client(cluster):
    return cluster.client()


@pytest.fixture(scope="module")
def admin(client):
    addrs = admin_addresses(client)
    assert len(addrs) == 3 and all(addrs.values())
    return addrs


@pytest.fixture(scope="module")
def one(admin):
    return sorted(admin.values())[0]


@pytest.fixture(scope="module")
def ledgers(client):
    """Two scope-0 ledgers and one in scope 9, closed with entries."""
    out = {}
    for name, scope in (("a", 0), ("b", 0), ("s9", 9)):
        w = client.create_ledger(3, 3, 2, scope_id=scope)
        w.append_many([b"%s-%d" % (name.encode(), i) for i in range(10)])
        w.close()
        out[name] = w.ledger_id
    return out


def error_of(address, path, status, method="GET", headers=None):
    code, headers, body = http(address, path, method, headers=headers)
    assert code == status, (path, code, body)
    assert headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert doc["status"] == status and doc["error"]
    return doc


def test_health_state_and_info(admin, one):
    assert http(one, "/heartbeat")[0] == 200 and http(one, "/heartbeat")[2] == b"OK\n"
    assert http_json(one, "/api/v1/bookie/is_ready") == {"ready": True, "state": "writable"}
    for bookie_id, address in admin.items():
        st = http_json(address, "/api/v1/bookie/state")
        assert st["bookie_id"] == bookie_id and st["running"] and not st["read_only"]
        info = http_json(address, "/api/v1/bookie/info")
        assert info["bookie_id"] == bookie_id and info["http"] == address
        assert info["state"] == "writable" and info["disk"]["total_bytes"] > 0
        assert 0 <= info["disk"]["usage_ratio"] <= 1 and info["disk"]["journal_files"] >= 1
        assert {"entry_logs", "memtable", "compaction", "journal"} <= set(info)
        assert info["compaction"]["progress"] == 0.0
    bookies = http_json(one, "/api/v1/bookie/list_bookies")
    assert {b["bookie_id"] for b in bookies["writable"]} == set(admin)
    assert bookies["read_only"] == [] and all(b["http"] for b in bookies["writable"])
    assert set(http_json(one, "/api/v1/bookie/list_bookies?type=ro")) == {"read_only"}
    error_of(one, "/api/v1/bookie/list_bookies?type=xx", 400)
    # BookKeeper's list_bookie_info: free and total disk of each bookie, and the sums
    disks = http_json(one, "/api/v1/bookie/list_bookie_info")
    assert set(disks) == set(admin) | {"ClusterInfo: "}, disks
    assert all(re.fullmatch(r": \{Free: \d+(\(\d+(\.\d+)?[KMGT]B\))?, Total: \d+(\(\S+\))?\},", v)
               for k, v in disks.items() if k != "ClusterInfo: "), disks
    total = sum(int(re.search(r"Total: (\d+)", v).group(1)) for k, v in disks.items()
                if k != "ClusterInfo: ")
    assert f"Total: {total}" in disks["ClusterInfo: "] and total > 0
    cfg = http_json(one, "/api/v1/config/server_config")
    assert cfg["http_server_enabled"] is True and cfg["journal_max_group_wait_ms"] == 2.0
    code, headers, _ = http(one, "/")
    assert code == 302 and headers["location"] == "/status"


def test_read_only_bookie_is_reported(cluster, admin):
    bid = cluster.bookie_id(2)
    cluster.set_read_only(2, True)
    try:
        st = http_json(admin[bid], "/api/v1/bookie/state")
        assert st["read_only"] and st["state"] == "read_only"
        listed = http_json(admin[bid], "/api/v1/bookie/list_bookies")
        assert [b["bookie_id"] for b in listed["read_only"]] == [bid]
    finally:
        cluster.set_read_only(2, False)


def test_ledger_list_per_scope(one, ledgers):
    scope0 = http_json(one, "/api/v1/ledger/list")
    names0 = [r["ledger_qualified_name"] for r in scope0["ledgers"]]
    assert ledgers["a"].qualified_name in names0 and ledgers["b"].qualified_name in names0
    assert ledgers["s9"].qualified_name not in names0 and scope0["ledger_scope_id"] == 0
    scope9 = http_json(one, "/api/v1/ledger/list?ledger_scope_id=9&print_metadata=true")
    assert [r["ledger_qualified_name"] for r in scope9["ledgers"]] == [ledgers["s9"].qualified_name]
    row = scope9["ledgers"][0]
    assert row["state"] == "CLOSED" and row["last_entry_id"] == 9 and row["ledger_scope_id"] == 9
    assert row["write_quorum"] == 3 and len(row["fragments"][0]["ensemble"]) == 3
    assert http_json(one, "/api/v1/ledger/list?ledger_scope_id=12345")["ledgers"] == []
    limited = http_json(one, "/api/v1/ledger/list?limit=1")
    assert limited["count"] == 1 and limited["truncated"] is True


def test_ledger_metadata_by_scope_or_qualified_name(one, ledgers):
    s9 = ledgers["s9"]
    by_id = http_json(one, f"/api/v1/ledger/metadata?ledger_id={s9.ledger_id}&ledger_scope_id=9")
    by_name = http_json(one, f"/api/v1/ledger/metadata?ledger_qualified_name={s9.qualified_name}")
    assert by_id == by_name and by_id["ledger_scope_id"] == 9 and by_id["state"] == "CLOSED"
    both = http_json(one, f"/api/v1/ledger/metadata?ledger_qualified_name={s9.qualified_name}"
                          f"&ledger_scope_id=9")
    assert both == by_id
    # the same ledger id in scope 0 is another ledger (absent here, or not this one)
    code, _, body = http(one, f"/api/v1/ledger/metadata?ledger_id={s9.ledger_id}")
    assert code == 404 or json.loads(body)["ledger_scope_id"] == 0
    a = ledgers["a"]
    assert http_json(one, f"/api/v1/ledger/metadata?ledger_id={a.ledger_id}")["ledger_id"] == a.ledger_id


@pytest.mark.parametrize("query, status, words", [
    ("ledger_id=abc", 400, "ledger_id must be an integer"),
    ("ledger_id=1&ledger_scope_id=-1", 400, "ledger_scope_id must be in"),
    (f"ledger_id=1&ledger_scope_id={1 << 64}", 400, "ledger_scope_id must be in"),
    (f"ledger_id={1 << 63}", 400, "below 2^63"),
    ("ledger_qualified_name=xyz", 400, "32 hex digits"),
    (f"ledger_qualified_name={LedgerId(9, 1).qualified_name}&ledger_scope_id=8", 400, "disagrees"),
    (f"ledger_qualified_name={LedgerId(9, 1).qualified_name}&ledger_id=1", 400, "not both"),
    ("ledger_scope_id=9", 400, "is required"),
    ("", 400, "is required"),
    ("ledger_id=1&ledger_scope=9", 400, "unknown parameter 'ledger_scope'"),
    ("ledger_id=1&ledger_id=2", 400, "given 2 times"),
    ("ledger_id=987654321&ledger_scope_id=77", 404, LedgerId(77, 987654321).qualified_name),
])
def test_bad_ledger_parameters_are_4xx_json(one, query, status, words):
    doc = error_of(one, f"/api/v1/ledger/metadata?{query}", status)
    assert words in doc["error"], doc


def test_other_bad_requests(one):
    error_of(one, "/api/v1/no/such/thing", 404)
    doc = error_of(one, "/api/v1/ledger/delete?ledger_id=1", 405)
    assert "DELETE" in doc["error"]
    assert http(one, "/api/v1/ledger/delete?ledger_id=1")[1]["allow"] == "DELETE"
    error_of(one, "/heartbeat", 405, method="POST")
    error_of(one, "/api/v1/ledger/list?ledger_scope_id=zz", 400)
    error_of(one, "/api/v1/ledger/list?limit=0", 400)
    error_of(one, "/api/v1/ledger/list?print_metadata=maybe", 400)
    error_of(one, "/metrics?x=1", 400)
    many = "&".join(f"p{i}=1" for i in range(40))                 # the bound on parameters
    assert "bad query string" in error_of(one, f"/api/v1/ledger/list?{many}", 400)["error"]
    host, _, port = one.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:        # not HTTP at all
        s.sendall(b"GARBAGE\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):                # HTTP/1.0: the server closes when done
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 400") and b'"status": 400' in reply


def test_ledger_delete_takes_scope(one, client):
    w = client.create_ledger(3, 2, 2, scope_id=5)
    w.append(b"x")
    w.close()
    lid = w.ledger_id
    auth = admin_auth(client, one)
    error_of(one, f"/api/v1/ledger/delete?ledger_id={lid.ledger_id}&ledger_scope_id=6", 404, "DELETE", auth)
    out = http_json(one, f"/api/v1/ledger/delete?ledger_id={lid.ledger_id}&ledger_scope_id=5", "DELETE",
                    headers=auth)
    assert out == {"ledger_qualified_name": lid.qualified_name, "ledger_scope_id": 5,
                   "ledger_id": lid.ledger_id, "deleted": True}
    error_of(one, f"/api/v1/ledger/metadata?ledger_qualified_name={lid.qualified_name}", 404)
    error_of(one, f"/api/v1/ledger/delete?ledger_qualified_name={lid.qualified_name}", 404, "DELETE", auth)
    assert lid not in client.list_ledgers(5)


def test_bookie_local_ledgers(admin, ledgers, client):
    s9 = ledgers["s9"]
    ens = client.ledger_metadata(s9).fragments[0][1]
    for bid in ens:
        local = http_json(admin[bid], "/api/v1/bookie/ledgers?ledger_scope_id=9")
        rows = [r for r in local["ledgers"] if r["ledger_qualified_name"] == s9.qualified_name]
        assert rows and rows[0]["last_entry_id"] == 9


def test_autorecovery_status_and_underreplicated(one, ledgers, client):
    st = http_json(one, "/api/v1/autorecovery/status")
    assert st["enabled"] is False and st["underreplicated_ledgers"] == 0
    assert http_json(one, "/api/v1/autorecovery/list_under_replicated_ledger") == {"ledgers": [], "count": 0}
    s9 = ledgers["s9"]
    ur = client.metadata.underreplication
    ur.mark_ledger_underreplicated(s9, ["bookie-lost"])
    try:
        listed = http_json(one, "/api/v1/autorecovery/list_under_replicated_ledger")
        assert listed["count"] == 1
        assert listed["ledgers"][0] == {"ledger_qualified_name": s9.qualified_name, "ledger_scope_id": 9,
                                        "ledger_id": s9.ledger_id, "missing_bookies": ["bookie-lost"]}
        assert http_json(one, "/api/v1/autorecovery/status")["underreplicated_ledgers"] == 1
        wait_until(lambda: metric(one, "embedlog_underreplicated_ledgers") == 1, 15,
                   "the under-replicated gauge (cached for 5 s) at 1")
        page = http(one, "/status")[2].decode()
        assert "bookie-lost" in page
    finally:
        ur.mark_ledger_replicated(s9)


def scrape(address) -> dict:
    """{(sample name, frozenset of labels): value} of one /metrics answer."""
    code, headers, body = http(address, "/metrics")
    assert code == 200 and headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(address, name, **labels) -> float:
    return scrape(address).get((name, frozenset(labels.items())))


def total(scrapes, name, **labels) -> float:
    return sum(s.get((name, frozenset(labels.items())), 0.0) for s in scrapes)


def test_metrics_move_with_traffic(admin, client):
    addrs = list(admin.values())
    before = [scrape(a) for a in addrs]
    for name in ("embedlog_bookie_add_entries_total", "embedlog_journal_fsync_latency_seconds_count",
                 "embedlog_memtable_bytes", "embedlog_disk_usage_ratio", "embedlog_compaction_progress_ratio",
                 "embedlog_underreplicated_ledgers", "embedlog_index_bytes"):
        assert (name, frozenset()) in before[0], name
    assert ("embedlog_journal_group_entries_count", frozenset({("trigger", "queue_empty")})) in before[0]
    assert ("embedlog_compactions_total", frozenset({("kind", "major")})) in before[0]
    # Qa = 3: every bookie has synced batch k before k + 1 is sent, so each does >= 20 fsyncs
    # and has counted every add when the scrape comes (with Qa = 2 one may lag behind)
    w = client.create_ledger(3, 3, 3, scope_id=3)
    for i in range(20):
        w.append_many([b"m" * 100] * 10)
    w.close()
    r = client.open_ledger(w.ledger_id)
    assert len(r.read_batch(0, 199)) == 200
    after = [scrape(a) for a in addrs]
    added = total(after, "embedlog_bookie_add_entries_total") - total(before, "embedlog_bookie_add_entries_total")
    assert added >= 3 * 200                    # Qw = 3: every bookie stores every entry
    assert total(after, "embedlog_bookie_add_bytes_total") - total(before, "embedlog_bookie_add_bytes_total") \
        >= 3 * 200 * 100
    assert total(after, "embedlog_bookie_read_entries_total") - total(before, "embedlog_bookie_read_entries_total") >= 200
    lat = "embedlog_bookie_request_latency_seconds_count"
    assert total(after, lat, op="add") - total(before, lat, op="add") >= 3 * 20
    assert total(after, lat, op="read") - total(before, lat, op="read") >= 1    # ranged reads: 1 request can carry 200
    assert total(after, "embedlog_bookie_requests_total", op="add", status="0") > \
        total(before, "embedlog_bookie_requests_total", op="add", status="0")
    fsyncs = "embedlog_journal_fsync_latency_seconds_count"
    assert total(after, fsyncs) - total(before, fsyncs) >= 3 * 20
    groups = sum(total(after, "embedlog_journal_group_entries_count", trigger=t)
                 - total(before, "embedlog_journal_group_entries_count", trigger=t)
                 for t in ("queue_empty", "time", "bytes", "entries"))
    assert groups >= 3 * 20
    assert total(after, "embedlog_journal_groups_total", trigger="queue_empty") > \
        total(before, "embedlog_journal_groups_total", trigger="queue_empty")
    assert all(a[("embedlog_memtable_bytes", frozenset())] > 0 for a in after)
    assert all(0 < a[("embedlog_disk_usage_ratio", frozenset())] < 1 for a in after)


def test_status_data_endpoints(admin, one, client):
    rates = http_json(one, "/api/v1/status/rates")
    rows = {b["bookie_id"]: b for b in rates["bookies"]}
    assert set(rows) == set(admin)
    assert all(b["reachable"] and b["add_entries"] is not None and b["state"] == "writable"
               for b in rows.values())


def test_cluster_write_rate_counts_entries_not_replicas(one, client):
    """Issue 17: the status page's cluster rate summed every bookie's adds, about Qw times
    what clients wrote. Each bookie's written_entries counts an add as 1/Qw: the sum moves
    by exactly the entries written, whatever the quorums and striping."""
    def sums():
        bookies = http_json(one, "/api/v1/status/rates")["bookies"]
        return (sum(b["written_entries"] for b in bookies), sum(b["add_entries"] for b in bookies))

    written0, adds0 = sums()
    for e, qw in ((3, 2), (3, 3), (2, 1)):
        w = client.create_ledger(e, qw, 1)
        w.append_many([b"w"] * 60)
        w.close()
    # counted as the write quorums are learnt: the first sum to reach 180 must be 180 (a
    # count per replica would pass it)
    written, adds = wait_until(lambda: (lambda s: s if round(s[0] - written0, 6) >= 180 else None)(sums()),
                               15, "the written entries counted")
    assert round(written - written0, 6) == 180
    assert adds - adds0 == 60 * (2 + 3 + 1)           # what the bookies stored: every replica
    assert metric_sum(one, "embedlog_bookie_written_entries_total") > 0


def metric_sum(address, name) -> float:
    return sum(v for (n, _labels), v in scrape(address).items() if n == name)
    wait_until(lambda: len(http_json(one, "/api/v1/status/history")["points"]) >= 2, 10,
               "two rate samples")
    point = http_json(one, "/api/v1/status/history")["points"][-1]
    assert set(point) == {"t", "add_per_s", "read_per_s"}


def test_status_page_is_self_contained(one, admin, ledgers, client):
    s = client.open_stream("page-stream", ensemble_size=3, write_quorum=3, ack_quorum=2)
    s.append(b"x")
    s.close()
    code, headers, body = http(one, "/status")
    assert code == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    # the counters at rendering time seed the live chart (its first poll draws a point)
    import re
    seed = re.search(r"var prev=(\{.*?\}),cAdds", page).group(1)
    assert set(json.loads(seed)["counts"]) == set(admin)
    # streams: named, without their internal scope number; one time format on the page
    streams = page.split("<table class='streams'>", 1)[1].split("</table>", 1)[0]
    assert "page-stream" in streams and str(0x53545245414D0001) not in streams
    assert re.search(r"rendered \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page)
    for bid in admin:
        assert bid in page
    for lid in ledgers.values():
        assert lid.qualified_name in page
    assert "scope 9" in page and "<svg" in page and "<script>" in page
    # nothing is fetched from elsewhere: no external scripts, styles, fonts or images
    import re
    for attr in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert attr.startswith("/") or attr.startswith("http://127.0.0.1:"), attr
    assert "<link" not in page and "@import" not in page and "url(" not in page


def test_changes_need_a_token_even_when_the_bookie_has_none(cluster, client, one):
    """Issue 13.14: without a wire token, the admin server makes its own (0600, in the
    bookie's directory, named in its registration); changing requests without it get 401."""
    w = client.create_ledger(3, 3, 2)
    w.append(b"keep me")
    w.close()
    path = f"/api/v1/ledger/delete?ledger_qualified_name={w.ledger_id.qualified_name}"
    for headers in ({}, {"Authorization": "Bearer not-the-token-at-all-0123456789"}):
        code, got, body = http(one, path, "DELETE", headers=headers)
        assert code == 401 and got["www-authenticate"].startswith("Bearer"), body
    assert client.ledger_metadata(w.ledger_id).last_entry_id == 0          # nothing changed
    token_files = {(r.info or {}).get("admin_token_file")
                   for r in client.metadata.registration_client.get_all_bookies()}
    assert len(token_files) == 3 and all(f and os.stat(f).st_mode & 0o777 == 0o600 for f in token_files)
    assert http_json(one, path, "DELETE", headers=admin_auth(client, one))["deleted"] is True


def test_half_sent_requests_hold_no_worker(one):
    """Issue 13.14: 80 requests that never finish arriving do not make /heartbeat wait or
    answer 503; each is dropped with 408 once its deadline passes."""
    host, _, port = one.rpartition(":")
    slow = []
    try:
        for _ in range(80):
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(b"GET /heartbeat HTTP/1.0\r\nHost: x\r\n")          # no blank line: not done
            slow.append(s)
        for _ in range(5):
            code, _, body = http(one, "/heartbeat", timeout_s=30)
            assert code == 200, body
        reply = slow[0].recv(4096)                  # waits for the server's deadline
        assert reply.startswith(b"HTTP/1.0 408"), reply
    finally:
        for s in slow:
            s.close()


def test_a_body_sent_after_its_headers_is_read_whole(client, one):
    """The reader waits for Content-Length bytes after the headers (a client that sends the
    body in a second write, as urllib does, must not get 'not JSON')."""
    host, _, port = one.rpartition(":")
    body = b'{"readOnly": false}'
    auth = admin_auth(client, one)["Authorization"].encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"PUT /api/v1/bookie/state/readonly HTTP/1.0\r\nContent-Length: %d\r\n"
                  b"Host: x\r\nContent-Type: application/json\r\nAuthorization: %s\r\n\r\n"
                  % (len(body), auth))
        reply = b""
        s.settimeout(0.5)
        try:
            reply = s.recv(4096)              # nothing yet: the body is still to come
        except socket.timeout:
            pass
        assert reply == b""
        s.settimeout(30)
        s.sendall(body)
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 200") and b'"readOnly": false' in reply, reply
