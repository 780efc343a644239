"""The batch bound against brute-force references: scan row counts, compute tokens/s of the
law directly, take the first that reaches the fraction of the asymptote; the law's fit
against numpy's least squares."""

from __future__ import annotations

import random

import numpy as np
import pytest

from policies.batch_bound import (
    MIN_ROW_LIMIT,
    STEPS_PER_FIRST_TOKEN,
    THROUGHPUT_FRACTION,
    knee_rows,
    row_limit,
    rows_law,
)


def brute_knee(base: float, marginal: float, fraction: float, scan: int = 100_000) -> int:
    asymptote = 1 / marginal
    for r in range(1, scan):
        if r / (base + marginal * r) >= fraction * asymptote * (1 - 1e-12):
            return r
    raise AssertionError("no knee within the scan")


def brute_within(base: float, marginal: float, step_s: float, scan: int = 100_000) -> int:
    return max([0] + [r for r in range(1, scan) if base + marginal * r <= step_s * (1 + 1e-9)])


@pytest.mark.parametrize("seed", range(6))
def test_knee_is_the_first_row_count_reaching_the_fraction(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        base, marginal = rng.uniform(0, 0.2), rng.uniform(1e-4, 0.02)
        fraction = rng.choice([0.5, 0.8, THROUGHPUT_FRACTION, 0.95])
        assert knee_rows(base, marginal, fraction) == brute_knee(base, marginal, fraction)


def test_no_knee_without_a_marginal_cost_and_bad_fractions_refused() -> None:
    assert knee_rows(0.05, 0.0) is None
    with pytest.raises(ValueError):
        knee_rows(0.05, 0.001, 1.0)


@pytest.mark.parametrize("seed", range(4))
def test_row_limit_is_the_knee_or_the_ttft_rows_floored_and_lifted_at_max(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        base, marginal = rng.uniform(0, 0.1), rng.choice([0.0, rng.uniform(1e-4, 0.012)])
        max_rows = rng.choice([32, 64, 256])
        ttft = rng.choice([None, rng.uniform(0.05, 3.0)])
        want = max_rows if marginal <= 0 else brute_knee(base, marginal, THROUGHPUT_FRACTION)
        if ttft is not None:
            want = min(want, brute_within(base, marginal, ttft / STEPS_PER_FIRST_TOKEN,
                                          2 * max_rows))
        want = max(MIN_ROW_LIMIT, want)
        assert row_limit(base, marginal, max_rows, ttft) == (None if want >= max_rows else want)


def test_the_figures_of_the_issue() -> None:
    # ~50 ms a step + 8 ms a row (bench sla on the 2-core machine): the fraction of 125 tok/s
    limit = row_limit(0.05, 0.008, 256)
    assert limit is not None
    f = THROUGHPUT_FRACTION
    assert limit / (0.05 + 0.008 * limit) >= f / 0.008 > (limit - 1) / (
        0.05 + 0.008 * (limit - 1))


@pytest.mark.parametrize("seed", range(4))
def test_rows_law_is_least_squares(seed: int) -> None:
    rng = random.Random(seed)
    a, m = rng.uniform(0.02, 0.1), rng.uniform(0.001, 0.01)
    steps = [(r, a + m * r + rng.gauss(0, 0.01)) for r in (rng.randint(1, 120) for _ in range(300))]
    got = rows_law(steps)
    assert got is not None
    m_ref, a_ref = np.polyfit([r for r, _ in steps], [s for _, s in steps], 1)
    assert got == pytest.approx((a_ref, m_ref), rel=1e-9)


def test_rows_law_edges() -> None:
    assert rows_law([]) is None and rows_law([(4, 0.1), (4, 0.2)]) is None  # one row count
    # a falling law is no law: the slope is clipped, the fixed cost is the mean
    assert rows_law([(1, 0.3), (9, 0.1)]) == pytest.approx((0.2, 0.0))
    # a negative fixed cost: refit through the origin
    a, m = rows_law([(1, 0.0), (2, 0.1), (3, 0.2)]) or (None, None)
    assert a == 0.0 and m == pytest.approx((0.1 * 2 + 0.2 * 3) / (1 + 4 + 9))
