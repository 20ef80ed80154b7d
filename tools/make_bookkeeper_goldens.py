"""Make the golden BookKeeper ledger metadata blobs under tests/fixtures/bookkeeper/<version>/.

For each served BookKeeper version: three Java bookies on a fresh root, then BookKeeper's
own client (embedlog/harness/peers/java/BkMeta.java ``goldens``) makes one ledger of each
kind (open with custom metadata, closed with entries, each digest, an id past 2^31, several segments,
IN_RECOVERY, a stored ctime, a version-2 text record); each is dumped with BookieShell
``ledgermetadata -l ID -dumptofile`` into ``<name>.bin``, which must equal the znode's bytes.
``manifest.json`` holds what BookKeeper's getters say of each, and its znode path.

    .venv/bin/python tools/make_bookkeeper_goldens.py [VERSION ...]

tests/interop/test_bookkeeper_metadata.py decodes every blob and re-encodes it byte for
byte. Run again only to add kinds; the blobs hold the ports and times of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from kazoo.client import KazooClient

from embedlog.harness.peers import bkmeta, jars
from embedlog.harness.peers.bookkeeper import BookKeeperCluster
from embedlog.meta.bookkeeper.layout import ledger_levels

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "tests", "fixtures", "bookkeeper")


def make(version: str) -> None:
    out = os.path.join(FIXTURES, version)
    os.makedirs(out, exist_ok=True)
    with BookKeeperCluster(version, bookies=3) as bk, tempfile.TemporaryDirectory() as tmp:
        bkmeta.goldens(version, bk.metadata_uri, tmp)
        with open(os.path.join(tmp, "manifest.json")) as f:
            manifest = json.load(f)
        zk = KazooClient(bk.zk_hosts)
        zk.start(timeout=30)
        try:
            for name, m in manifest.items():
                levels = ledger_levels("hierarchical", m["ledger_id"])
                raw, _stat = zk.get(bk.root + "/" + "/".join(levels))
                dumped = bk.dump_metadata(m["ledger_id"])
                if dumped != raw:
                    sys.exit(f"{version} {name}: BookieShell's dump differs from the znode:\n"
                             f"{dumped!r}\n{raw!r}")
                m["path"] = "/".join(levels)
                with open(os.path.join(out, name + ".bin"), "wb") as f:
                    f.write(dumped)
        finally:
            zk.stop()
            zk.close()
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{version}: {len(manifest)} goldens in {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", default=list(jars.BOOKKEEPER_VERSIONS))
    for version in ap.parse_args(argv).versions:
        make(version)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
