"""Running `embedlog` as a subprocess, and small HTTP helpers, for the CLI and admin tests."""
from __future__ import annotations

import http.client as httpclient
import json
import os
import queue
import subprocess
import sys
import threading
import time

SUPPORT = os.path.dirname(os.path.abspath(__file__))     # the helpers and child scripts
TESTS = os.path.dirname(SUPPORT)
ROOT = os.path.dirname(TESTS)


def cli_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDLOG_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "200"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def cli(*args, env=None, input=None, timeout=90, cwd=None) -> subprocess.CompletedProcess:
    """Run `python -m embedlog.cli ARGS` to completion; text output."""
    return subprocess.run([sys.executable, "-m", "embedlog.cli", *map(str, args)],
                          capture_output=True, text=True, env=env or cli_env(), input=input,
                          timeout=timeout, cwd=cwd or ROOT)


def cli_json(*args, **kw):
    r = cli(*args, "--json", **kw)
    assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout)


class Proc:
    """A long-running `embedlog` command; its output is read by threads, so a test can wait
    for a line and still get the whole output at the end."""

    def __init__(self, args, env=None):
        self.popen = subprocess.Popen([sys.executable, "-m", "embedlog.cli", *map(str, args)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env or cli_env(), cwd=ROOT)
        self.pid = self.popen.pid
        self._lines: queue.Queue = queue.Queue()
        self._out: list = []
        self._err: list = []
        self._threads = [threading.Thread(target=self._pump, args=(self.popen.stdout, self._out, True)),
                         threading.Thread(target=self._pump, args=(self.popen.stderr, self._err, False))]
        for t in self._threads:
            t.daemon = True
            t.start()

    def _pump(self, stream, sink, lines):
        for line in stream:
            sink.append(line)
            if lines:
                self._lines.put(line)
        if lines:
            self._lines.put(None)

    def expect(self, predicate, timeout_s: float = 30.0) -> str:
        """The next stdout line for which predicate(line) holds; fails after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no matching line in {timeout_s} s; stdout {''.join(self._out)!r}; "
                                     f"stderr {''.join(self._err)!r}; exit code {self.popen.poll()}")
            if predicate(line):
                return line

    def send_signal(self, sig) -> None:
        self.popen.send_signal(sig)

    def poll(self):
        return self.popen.poll()

    @property
    def returncode(self):
        return self.popen.returncode

    def finish(self, timeout_s: float = 30.0) -> tuple:
        """Wait for the exit (kill after timeout_s); (whole stdout, whole stderr)."""
        try:
            self.popen.wait(timeout_s)
        finally:
            self.kill()
            for t in self._threads:
                t.join(10)
        return "".join(self._out), "".join(self._err)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


def start(*args, env=None) -> Proc:
    """Start a long-running `embedlog` command (the caller stops it)."""
    return Proc(args, env)


def wait_until(predicate, timeout_s: float = 20.0, what: str = "condition", interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s} s")
        time.sleep(interval_s)


def http(address: str, path: str, method: str = "GET", timeout_s: float = 10.0,
         headers: dict | None = None):
    """(status, headers dict, body bytes) of one request to HOST:PORT."""
    host, _, port = address.rpartition(":")
    conn = httpclient.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def http_json(address: str, path: str, method: str = "GET", status: int = 200,
              headers: dict | None = None):
    code, headers, body = http(address, path, method, headers=headers)
    assert code == status, (path, code, body)
    assert headers["content-type"].startswith("application/json"), headers
    return json.loads(body)


def admin_auth(client, address: str) -> dict:
    """The Authorization header for changing requests to the admin server at ``address``:
    its bookie registers where its admin token is (tests run as the bookies' user)."""
    for r in client.metadata.registration_client.get_all_bookies():
        info = r.info or {}
        if info.get("http") == address:
            with open(info["admin_token_file"]) as f:
                return {"Authorization": "Bearer " + f.read().strip()}
    raise AssertionError(f"no bookie registered admin address {address}")


def admin_addresses(client) -> dict:
    """bookie id -> admin HTTP address, from the bookies' registrations."""
    rc = client.metadata.registration_client
    return {r.bookie_id: (r.info or {}).get("http")
            for r in rc.get_all_bookies()}
