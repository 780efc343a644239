"""The measured TPOT loop: the gain moves only where the cap can act, within its bounds, and in
closed loop with a cost law the model gets wrong it holds the mean interactive step at the
target."""

from __future__ import annotations

import pytest

from policies.tpot_loop import (
    BIAS_MAX,
    BIAS_MIN,
    GAIN_EXPONENT,
    GAIN_MAX,
    GAIN_MIN,
    GAIN_UP_EXPONENT,
    MIN_ALONE_STEPS,
    MIN_LOOP_STEPS,
    LoopStep,
    alone_bias,
    enough,
    next_gain,
)

TARGET = 0.1


def window(seconds: float, rows: int = 10, urgent: int = 4, n: int = 10) -> list[LoopStep]:
    return [LoopStep(seconds, rows, urgent) for _ in range(n)]


def test_long_steps_with_lower_rows_lower_the_gain_by_the_root_of_the_error() -> None:
    gain = next_gain(1.0, window(0.2), TARGET, 10, True)
    assert gain == pytest.approx(0.5 ** GAIN_EXPONENT)


def test_long_steps_of_interactive_alone_leave_it() -> None:
    """No lower row to take away: lowering the price would only wind the loop up."""
    assert next_gain(1.0, window(0.2, rows=4, urgent=4), TARGET, 10, True) == 1.0


@pytest.mark.parametrize("rows, urgent, cap, waiting, moves", [
    (10, 4, 10, True, True),
    (4, 4, 0, True, True),  # a cap under interactive's rows let no lower row in
    (8, 4, 10, True, False),  # under the cap: it held nothing back
    (10, 4, None, True, False),
    (10, 4, 10, False, False),  # nothing of the lower tiers waited
])
def test_short_steps_raise_it_only_where_the_cap_held_lower_work_back(
        rows: int, urgent: int, cap: int | None, waiting: bool, moves: bool) -> None:
    gain = next_gain(1.0, window(0.05, rows=rows, urgent=urgent), TARGET, cap, waiting)
    assert gain == (pytest.approx(2.0 ** GAIN_UP_EXPONENT) if moves else 1.0)


def test_steps_without_interactive_rows_and_short_windows_are_no_evidence() -> None:
    lower_only = window(0.5, urgent=0)
    assert not enough(lower_only) and next_gain(1.0, lower_only, TARGET, 10, True) == 1.0
    short = window(0.5, n=MIN_LOOP_STEPS - 1)
    assert not enough(short) and next_gain(1.0, short, TARGET, 10, True) == 1.0
    # only the interactive steps are averaged: the lower-only ones would double the mean
    mixed = window(0.1, n=MIN_LOOP_STEPS) + lower_only
    assert enough(mixed) and next_gain(1.0, mixed, TARGET, 10, True) == 1.0


def test_the_gain_stays_within_its_bounds() -> None:
    assert next_gain(GAIN_MIN, window(10.0), TARGET, 10, True) == GAIN_MIN
    assert next_gain(GAIN_MAX, window(0.001), TARGET, 10, True) == GAIN_MAX


def test_the_bias_is_measured_over_predicted_without_the_stalls_within_its_bounds() -> None:
    steps = [(0.06 + 0.01 * (i % 4), 0.05) for i in range(198)]  # 1.2-1.8x the law
    stalls = [(5.0, 0.05), (3.0, 0.05)]  # 2 of 200: ceil(200 x 1 %) = 2 left out, these
    assert alone_bias(steps[:MIN_ALONE_STEPS - 1]) is None
    assert alone_bias(steps + stalls) == pytest.approx(sum(s for s, _ in steps) / (198 * 0.05))
    # a regular tail (one step in 20 waits 1.5x longer) is the machine's TPOT: only the
    # slowest 1 % of it is left out
    tail = [(0.06, 0.05)] * 190 + [(0.09, 0.05)] * 10
    assert alone_bias(tail) == pytest.approx((190 * 0.06 + 8 * 0.09) / (198 * 0.05))
    # one stall among the first steps is left out too
    first = [(0.06, 0.05)] * (MIN_ALONE_STEPS - 1) + [(1.0, 0.05)]
    assert alone_bias(first) == pytest.approx(0.06 / 0.05)
    assert alone_bias([(0.04, 0.05)] * MIN_ALONE_STEPS) == pytest.approx(0.8)  # overpriced
    assert alone_bias([(0.01, 0.05)] * MIN_ALONE_STEPS) == BIAS_MIN
    assert alone_bias([(0.5, 0.05)] * MIN_ALONE_STEPS) == BIAS_MAX


@pytest.mark.parametrize("lower_cost_error", [0.5, 1.0, 1.8])
def test_in_closed_loop_the_mean_interactive_step_settles_at_the_target(
        lower_cost_error: float) -> None:
    """A plant written out plainly: 4 interactive rows, lower rows up to the cap. The model
    the cap is priced with says a step is 30 ms + 5 ms a row; the true step prices each lower
    row ``lower_cost_error`` times that (their prompts, the KV they read). Whatever the
    error, the steps settle within 5 % of the target, where the uncorrected cap misses by
    up to 50 %."""
    base, per_row, urgent, target = 0.030, 0.005, 4, 0.100

    def cap_for(priced: float) -> int:  # the model's largest row count within the price
        return int((priced - base) / per_row + 1e-9)

    def true_step(rows: int) -> float:
        return base + per_row * urgent + per_row * lower_cost_error * (rows - urgent)

    gain, cap = 1.0, cap_for(target)
    for _ in range(40):
        gain = next_gain(gain, window(true_step(cap), rows=cap, urgent=urgent), target, cap,
                         True)
        cap = cap_for(target * gain)
    assert true_step(cap) == pytest.approx(target, rel=0.05)
    if lower_cost_error != 1.0:
        assert abs(true_step(cap_for(target)) / target - 1.0) > 0.2


def test_lower_rows_owed_past_the_cap_are_not_the_loops_to_take() -> None:
    """10 interactive rows past a cap of 8: the 4 lower rows beside them are seats owed to the
    lower tiers, which a lower cap only adds to."""
    assert next_gain(1.0, window(0.5, rows=14, urgent=10), TARGET, 8, True) == 1.0
    assert next_gain(1.0, window(0.5, rows=14, urgent=10), TARGET, 12, True) < 1.0
