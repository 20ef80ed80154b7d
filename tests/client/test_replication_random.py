"""A seeded fault schedule (kill, suspend, stop, restart) against 5 bookies while a writer
and a reader run; afterwards nothing acknowledged is lost and readers agree."""
import os

from embedlog.harness import LocalCluster
from support.replication_chaos import Chaos


def test_random_faults_lose_nothing(tmp_path):
    seed = int(os.environ.get("EMBEDLOG_CHAOS_SEED", "5"))
    duration = float(os.environ.get("EMBEDLOG_CHAOS_SECONDS", "12"))
    with LocalCluster(bookies=5, base_dir=str(tmp_path / "c")) as lc:
        chaos = Chaos(lc, seed, duration_s=duration)
        chaos.run()
        violations = chaos.check()
        assert not violations, (seed, violations[:10], chaos.actions)
        assert chaos.total_acked > 100, (chaos.total_acked, chaos.actions)
        assert len(chaos.actions) >= 5
