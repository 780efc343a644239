"""Seats owed to the lower tiers beside urgent rows past the cap, against a straightforward
reference in exact fractions."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from policies.owed_seats import counted_rows, owed_seats, urgent_backlogged

WEIGHTS = {0: 6, 1: 3, 2: 1}  # interactive, batch, best-effort (the default drain weights)


def reference_counted(urgent: int, cap: int, backlogged: bool = False) -> int:
    """Piece by piece: every row while the urgent tier is backlogged; else none within the
    cap, the rows past it up to two caps, every row from three caps on, and the straight
    line between (2u - 3c) in between."""
    if backlogged:
        return urgent
    if urgent <= cap:
        return 0
    if urgent <= 2 * cap:
        return urgent - cap
    if urgent >= 3 * cap:
        return urgent
    return 2 * urgent - 3 * cap


def reference_owed(urgent: int, cap: int, weights: dict[int, int],
                   demand: dict[int, int], backlogged: bool = False) -> int:
    counted = reference_counted(urgent, cap, backlogged)
    total = Fraction(0)
    for p, n in demand.items():
        if p > 0 and n > 0:
            total += min(Fraction(n), Fraction(counted * weights.get(p, 1), weights[0]))
    return math.floor(total)


def test_counted_rows_is_the_piecewise_line() -> None:
    for cap in range(30):
        for urgent in range(120):
            assert counted_rows(urgent, cap) == reference_counted(urgent, cap)


def test_counted_rows_is_continuous_and_never_shrinks() -> None:
    for cap in range(30):
        steps = [counted_rows(u + 1, cap) - counted_rows(u, cap) for u in range(120)]
        assert all(0 <= s <= 2 for s in steps)


@pytest.mark.parametrize("seed", range(5))
def test_owed_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        weights = {0: rng.randint(1, 8), 1: rng.randint(0, 5), 2: rng.randint(0, 3)}
        demand = {p: rng.randint(0, 40) for p in (1, 2) if rng.random() < 0.8}
        urgent, cap = rng.randint(0, 80), rng.randint(0, 20)
        backlogged = rng.random() < 0.5
        assert owed_seats(urgent, cap, 0, weights, demand, backlogged) == reference_owed(
            urgent, cap, weights, demand, backlogged)


def test_a_backlogged_urgent_tier_owes_for_every_row_within_the_cap() -> None:
    """The backlog row's regime (2): 13 interactive rows beside a cap of 12 owed nothing
    (counted 1, 4/6 floored); backlogged, the lower tiers get their weights' share of all
    13 (8.67, floored: 8), and within the cap too."""
    assert owed_seats(13, 12, 0, WEIGHTS, {1: 50, 2: 50}) == 0
    assert owed_seats(13, 12, 0, WEIGHTS, {1: 50, 2: 50}, backlogged=True) == 13 * 4 // 6
    assert owed_seats(6, 12, 0, WEIGHTS, {1: 50, 2: 50}, backlogged=True) == 4
    assert owed_seats(6, 12, 0, WEIGHTS, {2: 50}, backlogged=True) == 1  # its own 1/6 only
    assert owed_seats(13, 12, 0, {1: 3, 2: 1}, backlogged=True) == 0  # no urgent weight


def test_the_total_is_floored_once_not_per_tier() -> None:
    """Three urgent rows past the cap owe batch 1.5 and best-effort 0.5 seats: 2 in all (per
    tier floors gave 1, and best-effort nothing until six rows past the cap)."""
    assert owed_seats(8, 5, 0, WEIGHTS, {1: 10, 2: 10}) == 2
    assert owed_seats(8, 5, 0, WEIGHTS, {2: 10}) == 0  # best-effort alone: 0.5, floored
    assert owed_seats(11, 5, 0, WEIGHTS, {2: 10}) == 1


def test_no_seats_owed_within_the_cap_or_without_an_urgent_weight() -> None:
    assert owed_seats(5, 5, 0, WEIGHTS, {1: 10, 2: 10}) == 0
    assert owed_seats(30, 5, 0, {1: 3, 2: 1}, {1: 10, 2: 10}) == 0


def test_without_demand_every_weighted_lower_tier_counts() -> None:
    """The drainer's count: every lower tier may have rows (none bounded by its demand)."""
    for urgent in range(60):
        want = reference_owed(urgent, 7, WEIGHTS, {1: 10**6, 2: 10**6})
        assert owed_seats(urgent, 7, 0, WEIGHTS) == want


def test_far_past_the_cap_the_rows_follow_the_weights() -> None:
    """Every tier backlogged: from three caps on the urgent rows and the owed seats split the
    step 6 : 4, best-effort's share of the rows within one seat of its weight's."""
    for urgent in range(21, 200):
        owed = owed_seats(urgent, 7, 0, WEIGHTS, {1: 10**6, 2: 10**6})
        assert owed == urgent * 4 // 6
        best_effort = owed / 4  # its part of the seats by smooth WRR over time (3:1)
        assert best_effort / (urgent + owed) == pytest.approx(0.1, abs=1 / (urgent + owed))


def test_backlogged_when_the_demand_would_keep_more_rows_than_the_cap() -> None:
    """Little's law against the cap, on the backlog and overload rows' traced figures: 129
    decode tokens/s asked beside a cap of 9 in 85 ms steps keeps ~11 rows (backlogged); 77
    beside a cap of 15 in 120 ms steps ~9 (not); unknown demand or no cap: never."""
    assert urgent_backlogged(129.0, 9, 0.085)
    assert not urgent_backlogged(77.0, 15, 0.12)
    assert not urgent_backlogged(100.0, 10, 0.1)  # exactly the cap's rows: within it
    assert not urgent_backlogged(None, 9, 0.085)
    assert not urgent_backlogged(1e6, None, 0.085)
    rng = random.Random(7)
    for _ in range(1000):
        rate, cap, step = rng.uniform(0, 300), rng.randint(0, 40), rng.uniform(0.01, 0.5)
        assert urgent_backlogged(rate, cap, step) == (rate * step > cap)


def test_the_margin_scales_the_rows_the_demand_must_pass() -> None:
    """With a margin m the demand must keep more than m x the cap's rows running."""
    assert not urgent_backlogged(120.0, 10, 0.1, margin=1.25)  # 12 rows of 12.5
    assert urgent_backlogged(130.0, 10, 0.1, margin=1.25)  # 13 rows
    rng = random.Random(5)
    for _ in range(1000):
        rate, cap, step = rng.uniform(0, 300), rng.randint(0, 40), rng.uniform(0.01, 0.5)
        margin = rng.uniform(1.0, 1.5)
        assert urgent_backlogged(rate, cap, step, margin=margin) == (rate * step > cap * margin)


def reference_backlogged(rate: float, rows: int, decode_s: float, prompt_s: float,
                         per_token: float) -> bool:
    """Iterate the step to its fixed point: a step of t carries prompt_s * t prompt tokens
    at per_token each beside the decode step (no fixed point: the prompts fill every step)."""
    t = decode_s
    for _ in range(10_000):
        nxt = decode_s + per_token * prompt_s * t
        if nxt > 1e6:
            return rate > 0
        if abs(nxt - t) < 1e-12:
            break
        t = nxt
    return rate * t > rows


def test_the_urgent_prompts_lengthen_the_step() -> None:
    """0.7x per tier in bench sla: 160 decode tokens/s beside 10 rows in modelled 51 ms
    decode steps keeps 8.2 rows (not backlogged), but its ~150 prompt tokens/s at 2 ms each
    stretch the step to 73 ms: 11.7 rows, backlogged (10-13 were running)."""
    assert not urgent_backlogged(160.0, 10, 0.051)
    assert urgent_backlogged(160.0, 10, 0.051, 150.0, 0.002)
    assert urgent_backlogged(1.0, 10, 0.05, 600.0, 0.002)  # the prompts alone fill the steps
    rng = random.Random(11)
    for _ in range(2000):
        rate, rows, step = rng.uniform(0, 300), rng.randint(1, 40), rng.uniform(0.01, 0.3)
        prompt, per_token = rng.uniform(0, 400), rng.uniform(0, 0.003)
        if abs(1 - prompt * per_token) < 0.02:
            continue  # the fixed point's iteration converges too slowly to compare there
        want = reference_backlogged(rate, rows, step, prompt, per_token)
        assert urgent_backlogged(rate, rows, step, prompt, per_token) == want
