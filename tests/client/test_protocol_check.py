"""A short run of the seeded protocol checker (tools/protocol_check.py runs it for hours):
random schedules of writers, readers, recoveries and take-overs under message faults,
metadata gates and bookie kills; then every invariant of embedlog/harness/checker.py.
Seed 28 is a long one (checker.LONG_EVERY): striped ledgers (E > Qw) and bulk appends of
thousands of entries; it took the place of seed 18, to keep the run as short. Seed 46
deletes a ledger and gives its id to a new one while the bookies still hold the old one
(a "reuse" step): its writer, a zombie, goes on, and a reader of the new one comes first;
seed 39's new writer met only bookies that refuse the id (it went round them for ever)."""
import os

from embedlog.harness import LocalCluster
from embedlog.harness.checker import BOOKIE_CONFIG, LONG_EVERY, make_schedule, Run

SEEDS = [int(s) for s in os.environ.get("EMBEDLOG_CHECK_SEEDS", "1,2,9,28,39,46").split(",")]


def test_schedules_are_made_from_the_seed_alone():
    assert [str(s) for s in make_schedule(7, 30)] == [str(s) for s in make_schedule(7, 30)]
    assert [str(s) for s in make_schedule(7, 30)] != [str(s) for s in make_schedule(8, 30)]


def test_long_seeds_write_striped_ledgers_in_bulk():
    for seed in range(1, 200):
        steps = make_schedule(seed, 50, 5)
        ensembles = [s.args["ensemble"] for s in steps if s.kind == "create"]
        bulk = [s.args["n"] for s in steps if s.kind == "bulk"]
        if seed % LONG_EVERY:
            assert not bulk
        else:
            assert all(e > qw for e, qw, _qa in ensembles), (seed, ensembles)
    assert sum(s.args["n"] for s in make_schedule(28, 50, 5) if s.kind == "bulk") >= 5_000


def test_reuse_steps_give_a_deleted_ledgers_id_to_a_new_one():
    reused = 0
    for seed in range(1, 60):
        steps = make_schedule(seed, 50, 5)
        deleted = set()
        for s in steps:
            if s.kind == "delete":
                deleted.add(s.args["ledger"])
            elif s.kind == "reuse":
                assert s.args["of"] in deleted, (seed, str(s))
                reused += 1
    assert reused >= 10
    assert [s.kind for s in make_schedule(46, 50, 5)].count("reuse") == 1


def test_seeded_schedules_keep_every_invariant(tmp_path):
    with LocalCluster(bookies=5, base_dir=str(tmp_path / "c"), autorecovery=False,
                      bookie_config=BOOKIE_CONFIG) as cluster:
        acks = faults = 0
        for seed in SEEDS:
            report = Run(cluster, seed, make_schedule(seed, 50, 5)).run()
            assert not report.violations, str(report)
            acks += report.counts["acks"]
            faults += report.counts["faults"]
        assert acks > 100 and faults > 20, (acks, faults)     # the schedules did write under faults
