"""Volume on striped ensembles (issue 25): with E > Qw every bookie receives entry ids with
gaps, batch after batch. A 3/2/2 ledger of 100,000 entries once crashed every bookie (the
memtable reserved room for a batch's count, not for the id span it touched). These write
ledgers longer than that through the public client, read every byte back, and require
every bookie process to be alive at the end."""
import os

import pytest

from embedlog.errors import EmbedlogError
from embedlog.harness import LocalCluster

BATCH = 1000


def payload(tag: int, i: int) -> bytes:
    """100 bytes that name their ledger and entry."""
    return ((b"%d:%09d;" % (tag, i)) * 10)[:100]


def layouts(cluster) -> list[str]:
    """Each bookie's storage layout, as its current/LAYOUT says (none: layout 1)."""
    out = []
    for i in range(len(cluster)):
        try:
            with open(f"{cluster.bookie_dir(i)}/current/LAYOUT") as f:
                out.append(f.read().strip())
        except FileNotFoundError:
            out.append("1")
    return out


def dead_bookies(cluster) -> str:
    """Each bookie process that is no longer running, with the end of its log."""
    out = []
    for i in range(len(cluster)):
        if not cluster.is_running(i):
            with open(f"{cluster.bookie_dir(i)}/bookie.log", errors="replace") as f:
                tail = "".join(f.readlines()[-15:])
            out.append(f"bookie {i} exited:\n{tail}")
    return "\n".join(out)


@pytest.mark.parametrize("ensemble, entries", [((3, 2, 2), 150_000), ((5, 3, 2), 60_000)],
                         ids=["3-2-2", "5-3-2"])
def test_striped_ledger_of_many_entries_reads_back_and_every_bookie_lives(tmp_path, ensemble, entries):
    with LocalCluster(bookies=ensemble[0], base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False) as cluster:
        assert layouts(cluster) == ["2"] * len(cluster)       # the default for new directories
        c = cluster.client()
        tag = ensemble[1]
        w = c.create_ledger(ensemble_size=ensemble[0], write_quorum=ensemble[1], ack_quorum=ensemble[2])
        try:
            for first in range(0, entries, BATCH):
                last = w.append_many([payload(tag, i) for i in range(first, first + BATCH)])
                assert last == first + BATCH - 1
            w.close()
        except EmbedlogError as exc:
            raise AssertionError(f"failed near entry {w.last_add_confirmed + 1}: {exc!r}\n"
                                 f"{dead_bookies(cluster)}") from exc
        assert len(w.metadata.fragments) == 1, w.metadata.fragments    # no bookie was replaced

        r = c.open_ledger(w.ledger_id)
        assert r.last_add_confirmed == entries - 1
        for first in range(0, entries, 10 * BATCH):
            got = r.read_batch(first, first + 10 * BATCH - 1)
            want = [payload(tag, i) for i in range(first, first + 10 * BATCH)]
            bad = [first + k for k, (g, e) in enumerate(zip(got, want)) if g != e]
            assert len(got) == len(want) and not bad, (first, len(got), bad[:10])
        assert r.metadata.length == 100 * entries
        assert all(cluster.is_running(i) for i in range(len(cluster))), dead_bookies(cluster)


LEDGERS = 8
PER_LEDGER = 25_000              # 200,000 entries in all
LAYOUT2 = {"storage_layout": 2, "journal_max_size_mb": 4, "journal_pre_alloc_size_mb": 1,
           "skip_list_size_limit": 4 << 20, "flush_interval_ms": 200}


def test_striped_ledgers_interleaved_over_layout_2_read_back_before_and_after_restarts(tmp_path):
    """Layout 2 at volume: 8 ledgers on 3/2/2 ensembles written side by side (each bookie's
    journal interleaves them, every one with gaps in its ids) on 4 MiB journals, so most
    entries end up in segments below the mark. One ledger reads back while the bookies run,
    every ledger once each bookie has restarted (index into the segments, replay of the
    rest). A striped fragment is read entry by entry (about 12,000 a second here), so the
    reads, not the writes, are this test's time."""
    with LocalCluster(bookies=3, base_dir=str(tmp_path / "c"), proxies=False,
                      autorecovery=False, bookie_config=LAYOUT2) as cluster:
        assert layouts(cluster) == ["2"] * len(cluster)
        c = cluster.client()
        ws = [c.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2) for _ in range(LEDGERS)]
        try:
            for first in range(0, PER_LEDGER, BATCH):
                futs = [w.append_many_async([payload(k, i) for i in range(first, first + BATCH)])
                        for k, w in enumerate(ws)]
                assert [f[-1].result(timeout=120) for f in futs] == [first + BATCH - 1] * LEDGERS
            for w in ws:
                w.close()
        except EmbedlogError as exc:
            raise AssertionError(f"{exc!r}\n{dead_bookies(cluster)}") from exc
        assert all(len(w.metadata.fragments) == 1 for w in ws)          # no bookie was replaced

        def read_back(client, ks):
            for k in ks:
                r = client.open_ledger(ws[k].ledger_id)
                assert r.last_add_confirmed == PER_LEDGER - 1
                for first in range(0, PER_LEDGER, 5 * BATCH):
                    got = r.read_batch(first, first + 5 * BATCH - 1)
                    want = [payload(k, i) for i in range(first, first + 5 * BATCH)]
                    bad = [first + j for j, (g, e) in enumerate(zip(got, want)) if g != e]
                    assert len(got) == len(want) and not bad, (k, first, len(got), bad[:10])
        read_back(c, [LEDGERS - 1])
        segments = [sum(n.endswith(".seg") for n in os.listdir(f"{cluster.bookie_dir(i)}/journal"))
                    for i in range(len(cluster))]
        assert all(segments), segments            # the reads went into segments, not only journals
        for i in range(len(cluster)):
            cluster.restart_bookie(i)
        read_back(cluster.client("after-restart"), range(LEDGERS))
        assert all(cluster.is_running(i) for i in range(len(cluster))), dead_bookies(cluster)
