"""Issue 48 item 4: `embedlog cluster up` serves clients directly; a fault proxy stands in
front of each bookie only with --fault-proxies, and the command says so."""
from __future__ import annotations

import json
import signal

from support.cliutil import cli_json, start
from embedlog.meta import open_metadata_store


def _up(tmp_path, *flags):
    proc = start("cluster", "up", "--bookies", 1, "--dir", tmp_path / "c", *flags)
    try:
        return proc, [proc.expect(lambda l: l.startswith("{") or l.startswith("metadata:"), 60)]
    except BaseException:
        proc.kill()
        raise


def _stop(proc):
    try:
        proc.send_signal(signal.SIGINT)
        proc.finish(180)
    finally:
        proc.kill()
    assert proc.returncode == 0


def test_cluster_up_serves_directly(tmp_path):
    proc, said = _up(tmp_path, "--json")
    try:
        up = json.loads(said[0])
        assert up["fault_proxies"] is False
        with open_metadata_store(up["metadata_uri"]) as store:
            regs = store.registration_client.get_all_bookies()
        # the address printed is the one the bookie listens on and registered: no hop between
        assert [r.bookie_id for r in regs] == [up["bookies"][0]["bookie_id"]]
        assert regs[0].info["address"] == up["bookies"][0]["address"]
        made = cli_json("ledger", "create", "--metadata", up["metadata_uri"], "-e", 1, "-w", 1,
                        "-a", 1, "--entries", 3)
        assert made["state"] == "CLOSED"
    finally:
        _stop(proc)


def test_fault_proxies_only_when_asked_and_said(tmp_path):
    proc, said = _up(tmp_path, "--fault-proxies")
    try:
        line = proc.expect(lambda l: "fault proxy" in l or l.startswith("bookie 0:"), 30)
        assert "fault proxy" in line
    finally:
        _stop(proc)
