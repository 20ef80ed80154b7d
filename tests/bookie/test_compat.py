"""On-disk compatibility: a directory written by embedlog 0.1 must open and read identically."""
import hashlib
import json
import os
import tarfile

from support.cliutil import TESTS
import embedlog
from embedlog import LedgerId

FIXTURES = os.path.join(TESTS, "fixtures")


def test_version_1_directory_reads_identically(tmp_path):
    with tarfile.open(os.path.join(FIXTURES, "embedded-v1.tar.gz")) as tar:
        tar.extractall(tmp_path)
    expected = json.load(open(os.path.join(FIXTURES, "embedded-v1.json")))
    with embedlog.open(tmp_path / "data") as log:
        for spec in expected["ledgers"]:
            lid = LedgerId.parse(spec["qualified_name"])
            r = log.open_ledger(lid, password=bytes.fromhex(spec["password"]))
            got = r.read_batch(0, r.last_add_confirmed)
            assert [hashlib.sha256(p).hexdigest() for p in got] == spec["sha256"]
        assert LedgerId.parse(expected["deleted"]) not in log.list_ledgers()
        # and it stays writable
        w = log.create_ledger()
        w.append(b"new")
        w.close()
