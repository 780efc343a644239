"""The step-cost frontier of ``carpool bench sla`` against a brute-force reference: operating
points made from a known law give that law back, and the reachable bulk goodput / needed TPOT
equal a scan over row counts."""

from __future__ import annotations

import math

import pytest

from gateway.bench.sla_frontier import Point, bulk_reach, fit, light_reach, ttft_growth_s


def point_of(a: float, b: float, rows: float) -> Point:
    step = a + b * rows
    return Point(step, rows / step)  # each row one token a step


def scan_tokens(a: float, b: float, max_step: float) -> float:
    """The most tokens/s of any batch (rows in 0.001 steps) whose step stays within."""
    best, rows = 0.0, 0.0
    while a + b * rows <= max_step:
        best = max(best, rows / (a + b * rows))
        rows += 0.001
    return best


def scan_step_for(a: float, b: float, tokens_s: float) -> float:
    rows = 0.0
    while rows / (a + b * rows) < tokens_s:
        rows += 0.001
    return a + b * rows


@pytest.mark.parametrize(("a", "b"), [(0.100, 0.011), (0.120, 0.0044), (0.05, 0.002)])
def test_fit_gives_the_law_back_and_the_reach_equals_a_scan(a: float, b: float) -> None:
    alone, fcfs = point_of(a, b, 6), point_of(a, b, 60)
    law = fit(alone, fcfs)
    assert law is not None
    assert law.base_s == pytest.approx(a) and law.per_row_s == pytest.approx(b)
    inter = 0.5 * alone.tokens_s
    fcfs_bulk = fcfs.tokens_s - inter
    reach = bulk_reach(alone, fcfs, inter, fcfs_bulk)
    assert reach is not None
    want = scan_tokens(a, b, 1.3 * alone.step_s) - inter
    assert reach.bulk_tokens_s == pytest.approx(want, rel=1e-3)
    assert reach.of_fcfs == pytest.approx(want / fcfs_bulk, rel=1e-3)
    need = scan_step_for(a, b, 0.8 * fcfs_bulk + inter) / alone.step_s
    assert reach.tpot_ratio_needed == pytest.approx(need, rel=1e-3)
    light, heavy = point_of(a, b, 3), point_of(a, b, 80)
    fair = light_reach(light, heavy)
    assert fair is not None
    assert fair.tokens_s == pytest.approx(scan_tokens(a, b, 1.2 * light.step_s), rel=1e-3)
    assert fair.of_heavy == pytest.approx(fair.tokens_s / heavy.tokens_s)
    assert a + b * fair.rows == pytest.approx(1.2 * light.step_s)
    assert fair.heavy_rows == pytest.approx(80)
    # the heavy batch's tokens/s over what a batch of a billion rows would yield
    huge = point_of(a, b, 1e9)
    assert fair.heavy_of_asymptote == pytest.approx(heavy.tokens_s / huge.tokens_s, rel=1e-6)
    assert ttft_growth_s(light, heavy) == pytest.approx(2 * b * (80 - 3))


def test_no_law_from_points_that_do_not_rise() -> None:
    assert fit(Point(0.2, 50), Point(0.2, 80)) is None  # same step, more rows
    assert fit(Point(0.3, 50), Point(0.2, 40)) is None  # fewer rows in the larger row
    alone, fcfs = point_of(0.1, 0.01, 5), point_of(0.1, 0.01, 50)
    assert bulk_reach(alone, fcfs, 10, 0.0) is None
    assert light_reach(Point(0.3, 50), Point(0.2, 40)) is None


def test_tokens_past_the_law_s_ceiling_need_an_endless_step() -> None:
    law = fit(point_of(0.1, 0.01, 5), point_of(0.1, 0.01, 50))
    assert law is not None
    assert math.isinf(law.step_for_tokens(1.01 / 0.01))
    assert not math.isinf(law.step_for_tokens(0.99 / 0.01))
