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
