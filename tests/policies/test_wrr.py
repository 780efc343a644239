"""Smooth WRR: shares follow the weights over any full cycle, picks interleave, and an empty
(ineligible) tier's share goes to the others in proportion to their weights."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.tiers import DEFAULT_TIER_WEIGHTS, TIER_PRIORITY, TIERS, normalize_tier
from policies.wrr import smooth_wrr_pick, wrr_sequence


def test_default_weights_exact_per_cycle_and_interleaved() -> None:
    picks = wrr_sequence(DEFAULT_TIER_WEIGHTS, 10)
    assert Counter(picks) == {"interactive": 6, "batch": 3, "best-effort": 1}
    assert picks[:3] != ["interactive"] * 3  # smooth: not a block of six first
    longest = max(len(run) for run in "".join(p[0] for p in picks).split("b"))
    assert longest <= 3


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(TIERS), st.integers(1, 20), min_size=1),
       st.integers(1, 5))
def test_shares_exact_over_whole_cycles(weights: dict[str, int], cycles: int) -> None:
    total = sum(weights.values())
    picks = Counter(wrr_sequence(weights, total * cycles))
    assert picks == {t: w * cycles for t, w in weights.items()}


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(TIERS), st.integers(1, 20), min_size=1),
       st.integers(1, 300))
def test_any_prefix_within_one_pick_per_tier(weights: dict[str, int], n: int) -> None:
    """Smoothness: after any n picks each tier is within +-1 of its ideal count... per tier
    bounded by the number of tiers (the classical bound for smooth WRR)."""
    total = sum(weights.values())
    picks = Counter(wrr_sequence(weights, n))
    for tier, w in weights.items():
        assert abs(picks[tier] - n * w / total) <= len(weights)


def test_empty_tier_share_redistributed_in_proportion() -> None:
    picks = Counter(wrr_sequence(DEFAULT_TIER_WEIGHTS, 90, eligible=["interactive", "batch"]))
    assert picks == {"interactive": 60, "batch": 30}
    picks = Counter(wrr_sequence(DEFAULT_TIER_WEIGHTS, 40, eligible=["batch", "best-effort"]))
    assert picks == {"batch": 30, "best-effort": 10}


def test_tier_becoming_empty_midway_keeps_others_proportional() -> None:
    scores: dict[str, int] = {}
    counts: Counter[str] = Counter()
    for step in range(200):
        eligible = list(TIERS) if step < 100 else ["interactive", "best-effort"]
        tier, scores = smooth_wrr_pick(DEFAULT_TIER_WEIGHTS, scores, eligible)
        assert tier is not None and tier in eligible
        if step >= 100:
            counts[tier] += 1
    assert abs(counts["interactive"] / 100 - 6 / 7) < 0.05


def test_nothing_eligible_and_zero_weight() -> None:
    tier, scores = smooth_wrr_pick(DEFAULT_TIER_WEIGHTS, {"batch": 4}, [])
    assert tier is None and scores["batch"] == 4
    assert set(wrr_sequence({"interactive": 1, "batch": 0}, 5)) == {"interactive"}


def test_tiers_map_to_engine_priorities() -> None:
    assert TIER_PRIORITY == {"interactive": 0, "batch": 1, "best-effort": 2}
    assert normalize_tier("Batch") == "batch" and normalize_tier("default") == "interactive"
    assert normalize_tier("gold") is None
