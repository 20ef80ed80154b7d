"""benchmarks/disk_floor.py: the disk's floor that benchmarks/replication.py prints its served
rows against must measure every bookie, say when one fails, and leave nothing behind."""
import os
import sys

import pytest

# appended, not put first: benchmarks/ must not shadow a module of the tests' own
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "benchmarks"))
import disk_floor  # noqa: E402


def test_three_bookies_are_measured_and_their_files_removed(tmp_path):
    m = disk_floor.measure(str(tmp_path), 3, seconds=0.3, group=64 << 10)
    assert m["records_s"] > 0
    assert 0 < m["sync_p50_ms"] <= m["sync_p99_ms"]
    assert os.listdir(tmp_path) == []
    # a row puts Qw of every E adds on each journal
    assert disk_floor.row_floor(m, 3, 2) == pytest.approx(m["records_s"] * 1.5)
    assert disk_floor.row_floor(m, 3, 3) == pytest.approx(m["records_s"])


def test_a_bookie_that_cannot_write_fails_the_floor(tmp_path):
    with pytest.raises(RuntimeError, match="disk-floor bookie failed"):
        disk_floor.measure(str(tmp_path / "missing"), 2, seconds=0.1)
