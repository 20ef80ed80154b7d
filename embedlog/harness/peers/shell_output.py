"""BookieShell's output parsed (BookKeeperCluster's oracles, bookkeeper.py):
``ledgermetadata``'s LedgerMetadata{...} fields and ``readledger -m``'s two hex dumps."""

from __future__ import annotations

import re

from embedlog.harness.peers.bkdriver import BookKeeperToolError


def field(meta: str, name: str) -> str:
    """One ``name=value`` of BookKeeper's LedgerMetadata{...} rendering."""
    m = re.search(rf"\b{name}=([^,}}]*)", meta)
    if m is None:
        raise BookKeeperToolError(f"no {name} in {meta!r}", meta)
    return m.group(1)


_BLOCK = re.compile(r"^--------- Lid=\d+, Eid=(\d+)")


def parse_hexdump_entries(out: str) -> list[tuple[int, bytes]]:
    """readledger -m with HexDumpEntryFormatter (commons-io HexDump): a block header line,
    then lines "OOOOOOOO XX XX ... ascii", 16 bytes a line, the bytes in columns 9..56."""
    entries: list[tuple[int, bytes]] = []
    for line in out.splitlines():
        m = _BLOCK.match(line)
        if m:
            entries.append((int(m.group(1)), b""))
        elif entries and re.match(r"^[0-9A-Fa-f]{8} ", line):
            eid, data = entries[-1]
            entries[-1] = (eid, data + bytes.fromhex(line[9:57]))
    return entries


def parse_boxed_entries(out: str) -> list[tuple[int, bytes]]:
    """readledger -b: Netty's prettyHexDump, rows "|OOOOOOOO| XX XX ... |ascii|"."""
    entries: list[tuple[int, bytes]] = []
    for line in out.splitlines():
        m = _BLOCK.match(line)
        if m:
            entries.append((int(m.group(1)), b""))
        elif entries and re.match(r"^\|[0-9a-f]{8}\|", line):
            eid, data = entries[-1]
            entries[-1] = (eid, data + bytes.fromhex(line[10:].split("|", 1)[0]))
    return entries
