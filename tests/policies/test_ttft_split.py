"""The TTFT budget's arithmetic (``policies.ttft_split``) against a written-out reference."""

from __future__ import annotations

import random

import pytest

from policies.ttft_split import PARTS, WorkerMarks, largest_part, ttft_split


def _reference(stamps: list[float]) -> dict[str, float]:
    """Each part as the plain difference of consecutive stamps, a stamp earlier than the
    latest one before it counting as that one (clock skew between hosts)."""
    out, latest = {}, stamps[0]
    for part, stamp in zip(PARTS, stamps[1:], strict=True):
        start = latest
        latest = max(latest, stamp)
        out[part] = latest - start
    return out


def test_ordered_stamps_split_into_their_differences() -> None:
    marks = WorkerMarks(10.030, 10.032, 10.080, 10.140, steps=2, prefill_steps=1)
    split = ttft_split(10.000, 10.010, marks, 10.150)
    assert list(split) == list(PARTS)
    assert split == pytest.approx({"gateway_in": 0.010, "redis_queue": 0.020,
                                   "drainer_to_engine": 0.002, "step_wait": 0.048,
                                   "prefill": 0.060, "first_token_out": 0.010})
    assert sum(split.values()) == pytest.approx(0.150)
    assert largest_part(split) == "prefill"


def test_random_stamps_match_the_reference_and_sum_to_the_whole() -> None:
    rng = random.Random(7)
    for _ in range(500):
        stamps = [rng.uniform(0, 1) for _ in range(7)]  # any order: skewed clocks
        marks = WorkerMarks(*stamps[2:6], steps=3, prefill_steps=1)
        split = ttft_split(stamps[0], stamps[1], marks, stamps[6])
        assert split == pytest.approx(_reference(stamps))
        assert min(split.values()) >= 0
        assert sum(split.values()) == pytest.approx(max(stamps) - stamps[0])


def test_marks_cross_as_a_list_and_reject_what_they_do_not_know() -> None:
    marks = WorkerMarks(1.5, 2.5, 3.5, 4.5, steps=2, prefill_steps=1)
    assert WorkerMarks.of_list(marks.to_list()) == marks
    assert WorkerMarks.of_list(None) is None
    assert WorkerMarks.of_list([1.0, 2.0]) is None  # another version's layout
    assert WorkerMarks.of_list(["a", 1, 2, 3, 4, 5]) is None  # type: ignore[list-item]


def test_largest_part_breaks_ties_in_path_order_and_skips_unknowns() -> None:
    assert largest_part({"redis_queue": 0.02, "prefill": 0.02, "gateway_in": None}) == \
        "redis_queue"
    assert largest_part({"step_wait": None}) is None
    assert largest_part({}) is None
