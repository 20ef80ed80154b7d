#!/usr/bin/env python
"""Write the on-disk compatibility fixture: tests/fixtures/embedded-v1.tar.gz + .json.

Run once per on-disk format version; every later version must open the fixture
and read it identically (tests/bookie/test_compat.py). Do not regenerate an existing one.
"""
import hashlib
import json
import os
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import embedlog  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


def main(name="embedded-v1"):
    tmp = tempfile.mkdtemp()
    data = os.path.join(tmp, "data")
    cfg = dict(journal_pre_alloc_size_mb=1, entry_log_size_limit=1 << 20, skip_list_size_limit=1 << 16)
    expected = {"ledgers": []}
    with embedlog.open(data, **cfg) as log:
        specs = [("crc32c", b"", 0, True), ("crc32", b"", 0, True), ("mac", b"pw", 0, True),
                 ("dummy", b"", 0, False), ("crc32c", b"s", 42, True), ("mac", b"k", 1 << 40, False)]
        for i, (digest, pw, scope, close) in enumerate(specs):
            w = log.create_ledger(digest=digest, password=pw, scope_id=scope)
            payloads = [hashlib.sha256(b"%d/%d" % (i, e)).digest() * (1 + e % 7) for e in range(300)]
            for p in payloads[:50]:
                w.append(p)
            w.append_many(payloads[50:])
            if close:
                w.close()
            expected["ledgers"].append({
                "qualified_name": w.ledger_id.qualified_name, "digest": digest,
                "password": pw.hex(), "closed": close,
                "sha256": [hashlib.sha256(p).hexdigest() for p in payloads]})
        gone = log.create_ledger()
        gone.append(b"deleted")
        gone.close()
        log.delete_ledger(gone.ledger_id)
        expected["deleted"] = gone.ledger_id.qualified_name
    os.unlink(os.path.join(data, "LOCK"))
    with tarfile.open(os.path.join(OUT, name + ".tar.gz"), "w:gz") as tar:
        tar.add(data, arcname="data")
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
