"""The status page in a real headless browser (Debian's chromium) against a live local
cluster: it renders the bookies in each state and the ledgers, its script draws the live
chart, and a screenshot is saved (build/test-artifacts/status-page.png, or
$EMBEDLOG_ARTIFACTS/status-page.png)."""
import os
import re
import shutil
import subprocess
import threading

import pytest

from support.cliutil import ROOT, admin_addresses
from embedlog.harness import LocalCluster

BROWSER_TIMEOUT_S = 90


def chromium() -> str:
    """Debian's chromium, installed here if missing (as `make servers` does); never a skip."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.geteuid() != 0:
        pytest.fail("chromium is not installed and this is not root; run `make servers` "
                    "(apt-get install chromium)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=600", "chromium"]
    r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:                  # an old package list: refresh it once
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=1200)
    path = shutil.which("chromium")
    if not path:
        pytest.fail(f"could not install chromium: {r.stderr[-2000:]}")
    return path


def browse(browser: str, url: str, profile: str, *extra) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
           "--window-size=1280,1700", "--virtual-time-budget=6000", *extra, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)


@pytest.fixture(scope="module")
def browser():
    return chromium()


def test_status_page_in_headless_chromium(browser, tmp_path):
    with LocalCluster(bookies=4, base_dir=str(tmp_path / "cluster"), autorecovery=False,
                      bookie_config={"http_server_enabled": True, "http_server_port": 0}) as lc:
        c = lc.client()
        ids = [lc.bookie_id(i) for i in range(4)]
        # bookie 3 holds a ledger, then stops: the page must call it down
        old = c.create_ledger(4, 2, 2, scope_id=5)
        old.append_many([b"old"] * 20)
        old.close()
        lc.stop_bookie(3)
        lc.set_read_only(2, True)
        admin = admin_addresses(c)
        page = f"http://{admin[ids[0]]}/status"
        w = c.create_ledger(2, 2, 2)
        stream_name = None
        if hasattr(c, "open_stream"):
            stream_name = "status-page-stream"
            s = c.open_stream(stream_name, ensemble_size=2, write_quorum=2, ack_quorum=2)
            s.append_many([b"s"] * 5)
            s.close()

        stop = threading.Event()
        failures = []

        def traffic():            # adds and reads flow while the browser watches
            try:
                n = 0
                while not stop.is_set():
                    w.append_many([b"t" * 50] * 50)
                    n += 50
                    c.open_ledger(old.ledger_id).read_batch(0, 19)
                    stop.wait(0.02)
            except Exception as exc:
                failures.append(exc)

        t = threading.Thread(target=traffic, daemon=True)
        t.start()
        try:
            dom = browse(browser, page, str(tmp_path / "profile"), "--dump-dom")
            assert dom.returncode == 0, dom.stderr[-3000:]
            html = dom.stdout
            out_dir = os.environ.get("EMBEDLOG_ARTIFACTS") or os.path.join(ROOT, "build", "test-artifacts")
            os.makedirs(out_dir, exist_ok=True)
            shot = os.path.join(out_dir, "status-page.png")
            if os.path.exists(shot):
                os.unlink(shot)
            r = browse(browser, page, str(tmp_path / "profile"), f"--screenshot={shot}")
            assert r.returncode == 0, r.stderr[-3000:]
        finally:
            stop.set()
            t.join(30)
        assert not failures, failures
        w.close()

    # the bookies, each in its state
    for bid, state in ((ids[0], "writable"), (ids[1], "writable"), (ids[2], "read_only"), (ids[3], "down")):
        row = re.search(r"<tr data-bookie=\"%s\">(.*?)</tr>" % re.escape(bid), html, re.S)
        assert row, f"bookie {bid} is not on the page"
        assert f">{state}<" in row.group(1), (bid, state, row.group(1))
    # the ledgers with their fragments
    assert old.ledger_id.qualified_name in html and w.ledger_id.qualified_name in html
    assert "scope 5" in html and ids[3] in html.split(old.ledger_id.qualified_name, 1)[1]
    if stream_name:
        assert stream_name in html
    # the script ran: the live chart has points, and the page says when it last updated
    cluster_chart = re.search(r'<svg id="cluster-rates".*?</svg>', html, re.S).group(0)
    counts = [int(n) for n in re.findall(r'data-points="(\d+)"', cluster_chart)]
    assert counts and min(counts) >= 2, cluster_chart
    assert re.search(r'<span id="updated">[^<-][^<]*</span>', html), "the live figures never updated"
    # and the picture
    with open(shot, "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    print(f"status page screenshot: {shot}")
