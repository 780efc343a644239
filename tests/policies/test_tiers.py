"""Tier service objectives: validated once, defaults for every tier."""

from __future__ import annotations

import math

import pytest

from policies.tiers import (
    DEFAULT_TIER_SLOS,
    DERIVED_TPOT_HEADROOM,
    MIN_SMALL_STEPS,
    QUEUE,
    SHED,
    TIERS,
    TPOT_PROMISE,
    TierSLO,
    alone_step,
    derived_tpot_target,
    measured_small_step,
)


def test_every_tier_has_a_default_objective() -> None:
    assert set(DEFAULT_TIER_SLOS) == set(TIERS)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_targets_must_be_positive_seconds(bad: float) -> None:
    with pytest.raises(ValueError):
        TierSLO(ttft_p99_s=bad)
    with pytest.raises(ValueError):
        TierSLO(tpot_p99_s=bad)
    assert TierSLO(0.5, 0.1).tpot_p99_s == 0.1


def test_derived_target_is_the_headroom_over_the_small_batch_step() -> None:
    for step_s in (0.01, 0.27, 1.0):
        assert derived_tpot_target(step_s) == pytest.approx(step_s * DERIVED_TPOT_HEADROOM)
    assert derived_tpot_target(0.2) > 0.2


def test_derived_target_sits_under_the_promise_with_margin() -> None:
    """The budget steers the mean step to the target, so a target at the promise (1.3x the
    alone step) lands the measured ratio at it, and over it on the budget's error (bench sla:
    1.35 and 1.30 with a 27 ms predicted 4-row step, 27 ms alone TPOT)."""
    assert TPOT_PROMISE == 1.3
    assert derived_tpot_target(0.027) == pytest.approx(0.0324)  # 1.2 x, not 1.3 x
    assert derived_tpot_target(0.027) <= 0.95 * TPOT_PROMISE * 0.027


def test_overload_action_is_shed_or_queue() -> None:
    assert TierSLO().action == QUEUE
    assert TierSLO(2.0, None, SHED).action == SHED
    for bad in ("drop", "", "SHED"):
        with pytest.raises(ValueError):
            TierSLO(action=bad)
    with pytest.raises(ValueError):
        TierSLO(ttft_p99_s=True)  # type: ignore[arg-type]  (a bool is not seconds)


def test_the_measured_small_step_is_the_median_once_enough_were_seen() -> None:
    assert MIN_SMALL_STEPS == 16
    assert measured_small_step([0.03] * 15) is None
    # 16 steps, two stalls: the median ignores them (the mean would be 0.1)
    steps = [0.030, 0.031, 0.029, 0.032] * 3 + [0.028, 0.033, 0.5, 0.4]
    ordered = sorted(steps)
    assert measured_small_step(steps) == pytest.approx((ordered[7] + ordered[8]) / 2)
    assert measured_small_step(steps) == pytest.approx(0.031)


def simulated_alone_step(base: float, marginal: float, tokens_s: float, busy: float) -> float:
    """The reference: iterate step -> (base + marginal * rows) / (1 - busy) with rows =
    tokens_s * step (Little's law) until it settles."""
    step = base
    for _ in range(10_000):
        step = (base + marginal * tokens_s * step) / (1.0 - busy)
    return step


@pytest.mark.parametrize(("tokens_s", "busy"), [(0.0, 0.0), (60.0, 0.0), (92.0, 0.16),
                                                (30.0, 0.3)])
def test_the_alone_step_is_the_fixed_point_of_littles_law(tokens_s: float, busy: float) -> None:
    """bench sla's Xeon law (34 ms + 3.5 ms a row): interactive at 0.5x capacity (92 tokens/s,
    its prompts 0.16 of each second) runs ~7 rows in ~70 ms steps alone."""
    got = alone_step(0.034, 0.0035, tokens_s, busy, share=0.6)
    assert got == pytest.approx(simulated_alone_step(0.034, 0.0035, tokens_s, busy), rel=1e-9)
    if tokens_s == 92.0:
        assert 0.065 < got < 0.075 and 6 < tokens_s * got < 7


@pytest.mark.parametrize(("tokens_s", "busy", "share"), [(100.0, 0.3, 0.6), (200.0, 0.0, 0.6),
                                                         (100.0, 0.3, 1.0), (1.0, 1.0, 1.0)])
def test_no_alone_step_past_the_weight_share(tokens_s: float, busy: float, share: float) -> None:
    """A load taking its weight's share of the machine or more is backlogged (None), even when
    a fixed point exists below the whole machine."""
    used = busy + 0.0035 * tokens_s
    got = alone_step(0.034, 0.0035, tokens_s, busy, share)
    assert (got is None) is (used >= share)
