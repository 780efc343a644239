"""Tier service objectives: validated once, defaults for every tier."""

from __future__ import annotations

import math

import pytest

from policies.tiers import (
    DEFAULT_TIER_SLOS,
    DERIVED_TPOT_HEADROOM,
    QUEUE,
    SHED,
    TIERS,
    TierSLO,
    derived_tpot_target,
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


def test_overload_action_is_shed_or_queue() -> None:
    assert TierSLO().action == QUEUE
    assert TierSLO(2.0, None, SHED).action == SHED
    for bad in ("drop", "", "SHED"):
        with pytest.raises(ValueError):
            TierSLO(action=bad)
    with pytest.raises(ValueError):
        TierSLO(ttft_p99_s=True)  # type: ignore[arg-type]  (a bool is not seconds)
