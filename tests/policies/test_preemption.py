from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.preemption import VictimCandidate, choose_victim, may_preempt_for


def test_no_candidates_no_victim() -> None:
    assert choose_victim([]) is None


def test_lowest_priority_first_then_latest_arrival() -> None:
    cands = [
        VictimCandidate("urgent-late", 0, 9.0),
        VictimCandidate("batch-early", 2, 1.0),
        VictimCandidate("batch-late", 2, 5.0),
        VictimCandidate("mid", 1, 7.0),
    ]
    assert choose_victim(cands) == "batch-late"
    assert choose_victim(cands[:2] + cands[3:]) == "batch-early"
    assert choose_victim([cands[0], cands[3]]) == "mid"


def test_full_tie_goes_to_last_listed() -> None:
    cands = [VictimCandidate("a", 1, 3.0), VictimCandidate("b", 1, 3.0)]
    assert choose_victim(cands) == "b"


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20)), min_size=1, max_size=30))
def test_matches_sorted_reference(rows: list[tuple[int, int]]) -> None:
    cands = [VictimCandidate(f"r{i}", p, float(a)) for i, (p, a) in enumerate(rows)]
    # Independent reference: stable sort by (priority, arrival); the last is the victim.
    expected = sorted(cands, key=lambda c: (c.priority, c.arrival_time))[-1]  # noqa: FURB192 (ties: last)
    assert choose_victim(cands) == expected.request_id


def test_may_preempt_only_for_strictly_higher_priority() -> None:
    assert may_preempt_for(0, 1)
    assert not may_preempt_for(1, 1)
    assert not may_preempt_for(2, 1)
