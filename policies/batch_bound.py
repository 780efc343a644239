"""The batch bound: the most rows a step should hold for work that is not urgent. Pure.

A step of ``r`` rows takes about ``a + m * r`` seconds (``a`` the fixed cost, ``m`` what one
more row adds) and yields ``r`` tokens, so throughput is ``r / (a + m * r)``: it rises steeply while ``a`` dominates and
flattens towards ``1 / m`` beyond the "knee". Past the knee more rows add step time (every
running request's TPOT, every newcomer's TTFT) and almost no tokens/s. Admitting overload
there only turns a queue (in Redis, where the fair pick and shedding work) into a bigger
batch (where neither does).

``knee_rows`` is the smallest row count whose modelled throughput reaches ``fraction`` of the
asymptote: ``r * m / (a + m * r) >= f``  <=>  ``r >= f * a / ((1 - f) * m)``.
``row_limit`` adds the floor and, when a tier has a TTFT target, the rows whose step leaves
room for a newcomer's first token within it.

``a`` and ``m`` come from ``rows_law``: least squares of the observed steps' seconds on their
row counts alone, the law a running request lives with (its steps carry the newcomers'
prefills too). The step-cost model's decode cost per row (``policies.step_cost``, four
coefficients) was no substitute: rows and tokens move together in decode steps, the fit
split them differently every refit (3 to 8 ms a row on one machine), and the knee swung from
60 rows to "none".
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# 80 % of the asymptotic tokens/s. The step at the knee is a / (1 - f): five fixed costs at
# 80 %, ten at 90 %, and every first token waits for about two steps. On the 2-core machine
# (a ~ 80-100 ms) the 90 % knee was 120-250 rows, past what a 2x overload reached in 25 s,
# so it never bound; at 80 % it held the batch to ~80 rows and the light tenant's TTFT p99
# beside a heavy one went from 7.8x to 5.7x alone (bench sla), for 0.80 of the ceiling
# against the unbounded batch's 0.86.
THROUGHPUT_FRACTION = 0.8
# Never bound below this: a fit from few or odd steps (a ~ 0) must not throttle a server to a
# handful of rows (the default interactive small batch is 4; a few times that).
MIN_ROW_LIMIT = 16
# A first token waits for the step in progress, then its own (prefill) step: a TTFT target
# of T allows steps of about T / 2.
STEPS_PER_FIRST_TOKEN = 2


def rows_law(steps: Iterable[tuple[int, float]]) -> tuple[float, float] | None:
    """``(a, m)``, both >= 0, of ``seconds ~ a + m * rows`` over ``(rows, seconds)`` steps by
    least squares (with ``a`` clipped at 0, ``m`` refit through the origin); None without
    two distinct row counts."""
    data = list(steps)
    n = len(data)
    if n < 2:
        return None
    mean_r = sum(r for r, _ in data) / n
    mean_s = sum(s for _, s in data) / n
    var = sum((r - mean_r) ** 2 for r, _ in data)
    if var <= 0:
        return None
    m = max(0.0, sum((r - mean_r) * (s - mean_s) for r, s in data) / var)
    a = mean_s - m * mean_r
    if a < 0:  # the best law with no fixed cost: through the origin
        a, m = 0.0, sum(r * s for r, s in data) / sum(r * r for r, _ in data)
    return a, m


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


def rows_within_step(base_s: float, marginal_s: float, step_s: float) -> int:
    """The most rows whose step, ``base_s + marginal_s * rows``, takes at most ``step_s``."""
    spare = step_s - base_s
    if spare < 0:
        return 0
    return math.floor(spare / marginal_s + 1e-9) if marginal_s > 0 else 1 << 20


def row_limit(base_s: float, marginal_s: float, max_rows: int,
              ttft_target_s: float | None = None,
              fraction: float = THROUGHPUT_FRACTION) -> int | None:
    """The bound for non-urgent rows under the law ``base_s + marginal_s * rows``: the knee,
    or fewer when the tightest TTFT target (``ttft_target_s``) needs shorter steps, never
    below ``MIN_ROW_LIMIT``; None when it would allow ``max_rows`` or more (no bound)."""
    knee = knee_rows(base_s, marginal_s, fraction)
    limit = max_rows if knee is None else knee
    if ttft_target_s is not None:
        limit = min(limit, rows_within_step(base_s, marginal_s,
                                            ttft_target_s / STEPS_PER_FIRST_TOKEN))
    limit = max(MIN_ROW_LIMIT, limit)
    return None if limit >= max_rows else limit
