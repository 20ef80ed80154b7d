"""The distribution schedule (embedlog/client/schedule.py) against seed 004's tables."""
import pytest

from embedlog import LedgerId
from embedlog.client.schedule import (fragment_index, fragment_last, quorum_covered, slots, stripe,
                                      write_quorums, write_set)
from embedlog.meta.api import LedgerMetadata

B = ["b1", "b2", "b3", "b4"]


def md(e, qw, qa, fragments):
    return LedgerMetadata(LedgerId(0, 1), e, qw, qa, fragments=tuple((f, tuple(x)) for f, x in fragments))


def test_the_seeds_write_quorum_table():
    """Seed 004: E=4, Qw=3 over B1..B4."""
    table = {0: "b1 b2 b3", 1: "b2 b3 b4", 2: "b3 b4 b1", 3: "b4 b1 b2", 4: "b1 b2 b3", 5: "b2 b3 b4"}
    m = md(4, 3, 2, [(0, B)])
    for eid, want in table.items():
        assert write_set(m, eid) == want.split() == stripe(B, 3, eid)
        assert [B[i] for i in slots(4, 3, eid)] == want.split()
    assert len({tuple(q) for q in write_quorums(m, B)}) == 4       # E distinct write quorums


def test_fragments_choose_the_ensemble():
    """Seed 004's example: B1 replaced by B4 from entry 12."""
    m = md(3, 3, 2, [(0, ["B1", "B2", "B3"]), (12, ["B4", "B2", "B3"])])
    assert [fragment_index(m, e) for e in (0, 11, 12, 99)] == [0, 0, 1, 1]
    assert (fragment_last(m, 0), fragment_last(m, 1)) == (11, None)
    assert write_set(m, 11) == ["B3", "B1", "B2"] and write_set(m, 12) == ["B4", "B2", "B3"]


@pytest.mark.parametrize("e,qw,qa,answered,covered", [
    (3, 3, 2, {"b1", "b2"}, True),        # (Qw - Qa) + 1 = 2 of the one write quorum
    (3, 3, 2, {"b1"}, False),
    (3, 2, 2, {"b2", "b3"}, True),        # 1 of each of {b1,b2} {b2,b3} {b3,b1}
    (3, 2, 2, {"b2"}, False),             # {b3, b1} has nobody
    (4, 3, 2, {"b1", "b2", "b3"}, True),  # 2 of each of four quorums of three
    (4, 3, 2, {"b1", "b3"}, False),       # {b2, b3, b4} has one
    (4, 3, 2, {"b1", "b2"}, False),       # {b3, b4, b1} has one
    (3, 3, 3, {"b2"}, True),              # Qw = Qa: one answer fences everything
])
def test_quorum_coverage(e, qw, qa, answered, covered):
    m = md(e, qw, qa, [(0, B[:e])])
    assert quorum_covered(m, B[:e], answered) is covered
