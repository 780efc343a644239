"""The batch bound: the most rows a step should hold for work that is not urgent. Pure.

A decode step of ``r`` rows costs about ``a + m * r`` seconds (``policies.step_cost``: ``a``
the fixed cost, ``m`` what one more row adds: per row, its token and its KV read), and yields
``r`` tokens, so throughput is ``r / (a + m * r)``: it rises steeply while ``a`` dominates and
flattens towards ``1 / m`` beyond the "knee". Past the knee more rows add step time (every
running request's TPOT, every newcomer's TTFT) and almost no tokens/s. Admitting overload
there only turns a queue (in Redis, where the fair pick and shedding work) into a bigger
batch (where neither does).

``knee_rows`` is the smallest row count whose modelled throughput reaches ``fraction`` of the
asymptote: ``r * m / (a + m * r) >= f``  <=>  ``r >= f * a / ((1 - f) * m)``.
``row_limit`` adds the floor and, when a tier has a TTFT target, the rows whose step leaves
room for a newcomer's first token within it.
"""

from __future__ import annotations

import math

from policies.step_cost import StepCost

# 90 % of the asymptotic tokens/s: the last 10 % would take about as many rows again as the
# whole knee (the curve is hyperbolic: 95 % needs ~2.1x the rows of 90 %, i.e. ~2.1x the
# step time, for 5 % more tokens/s).
THROUGHPUT_FRACTION = 0.9
# Never bound below this: a fit from few or odd steps (a ~ 0) must not throttle a server to a
# handful of rows (the default interactive small batch is 4; a few times that).
MIN_ROW_LIMIT = 16
# A first token waits for the step in progress, then its own (prefill) step: a TTFT target
# of T allows steps of about T / 2.
STEPS_PER_FIRST_TOKEN = 2


def decode_marginal(cost: StepCost, kv_per_row: float) -> float:
    """Seconds one more decode row adds to a step: its row, its token, its context's KV."""
    return cost.per_row + cost.per_token + cost.per_kv_token * kv_per_row


def knee_rows(base_s: float, marginal_s: float,
              fraction: float = THROUGHPUT_FRACTION) -> int | None:
    """The smallest row count reaching ``fraction`` of the asymptotic throughput of a step
    costing ``base_s + marginal_s * rows``; None when there is no knee (``marginal_s <= 0``:
    throughput grows without bound, so no row count is past it)."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    if marginal_s <= 0:
        return None
    rows = fraction * max(0.0, base_s) / ((1 - fraction) * marginal_s)
    # the quotient in floats may land a hair above an exact integer (0.9 / 0.1 is 9.000...02)
    return max(1, math.ceil(rows - 1e-9))


def rows_within_step(cost: StepCost, kv_per_row: float, step_s: float) -> int:
    """The most decode rows whose predicted step takes at most ``step_s`` (>= 0)."""
    marginal = decode_marginal(cost, kv_per_row)
    spare = step_s - cost.base
    if spare < 0:
        return 0
    return math.floor(spare / marginal) if marginal > 0 else 1 << 20


def row_limit(cost: StepCost, kv_per_row: float, max_rows: int,
              ttft_target_s: float | None = None,
              fraction: float = THROUGHPUT_FRACTION) -> int | None:
    """The bound for non-urgent rows: the knee, or fewer when the tightest TTFT target
    (``ttft_target_s``) needs shorter steps, never below ``MIN_ROW_LIMIT``; None when it
    would allow ``max_rows`` or more (no bound)."""
    knee = knee_rows(cost.base, decode_marginal(cost, kv_per_row), fraction)
    limit = max_rows if knee is None else knee
    if ttft_target_s is not None:
        limit = min(limit, rows_within_step(cost, kv_per_row,
                                            ttft_target_s / STEPS_PER_FIRST_TOKEN))
    limit = max(MIN_ROW_LIMIT, limit)
    return None if limit >= max_rows else limit
