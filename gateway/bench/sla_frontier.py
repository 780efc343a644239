"""What the machine's step-cost law lets ``carpool bench sla``'s targets reach (pure functions).

A decode step costs about ``a + b * rows`` seconds (on a CPU b is large next to a: every row
slows every other one), and each running row yields one token a step, so a row's measured
TPOT p50 is the step time and tokens/s times it is the rows a step held (Little's law). Two
rows of the run give the law: ``alone`` (interactive only, a small batch) and ``fcfs`` (the
whole offered load in one batch). From it:

- the bulk goodput reachable while interactive's TPOT stays within ``limit`` x alone: a step
  may then hold ``(limit * s_alone - a) / b`` rows, which yield that many tokens a step; what
  interactive takes (its tokens/s in the overload row) is not bulk's;
- the interactive TPOT ratio that bulk goodput >= ``share`` x FCFS's would need;
- for a tier with a heavy tenant, from that tier's own two rows (``light`` alone, ``heavy``
  beside it): the tier's tokens/s if its batch were held to the step that keeps the light
  tenant's TTFT within ``limit`` x alone (a first token waits for at least one step of the
  batch it joins, so the TTFT ratio is at least the step ratio); and what the heavy row's
  batch (held to the worker's batch bound, ``policies.batch_bound``) yields of the law's
  asymptote ``1 / b``: what the bound gives up.
- the floor under the light tenant's TTFT beside the heavy one: its first token waits for the
  step in progress, then its own step, and both grew from the light row's step to the heavy
  row's: at least ``2 * (heavy step - light step)`` more than alone (``ttft_growth_s``; the
  report takes the heavy row's longest steps, its TPOT p99, for the p99 first token).

Estimates from two points of a noisy machine, printed beside the measured figures, not targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One row's operating point: the step time (TPOT p50, s) and output tokens/s."""

    step_s: float
    tokens_s: float

    @property
    def rows(self) -> float:
        return self.step_s * self.tokens_s


@dataclass(frozen=True)
class CostLaw:
    base_s: float  # a
    per_row_s: float  # b

    def step(self, rows: float) -> float:
        return self.base_s + self.per_row_s * rows

    def rows_within(self, step_s: float) -> float:
        return max(0.0, (step_s - self.base_s) / self.per_row_s)

    def tokens_s(self, step_s: float) -> float:
        """Tokens/s of a batch whose step takes ``step_s``."""
        return self.rows_within(step_s) / step_s

    def step_for_tokens(self, tokens_s: float) -> float:
        """The step time of the batch that yields ``tokens_s`` (inf: beyond 1 / b)."""
        if tokens_s * self.per_row_s >= 1:
            return math.inf
        rows = tokens_s * self.base_s / (1 - tokens_s * self.per_row_s)
        return self.step(rows)


def fit(small: Point, large: Point) -> CostLaw | None:
    """The law through two operating points (None when they cannot give a rising one)."""
    d_rows = large.rows - small.rows
    if not (d_rows > 0 and large.step_s > small.step_s):
        return None
    b = (large.step_s - small.step_s) / d_rows
    return CostLaw(max(0.0, small.step_s - b * small.rows), b)


@dataclass(frozen=True)
class BulkReach:
    law: CostLaw
    bulk_tokens_s: float  # the most bulk goodput within the TPOT limit
    of_fcfs: float  # that, over the FCFS row's bulk goodput
    tpot_ratio_needed: float  # interactive TPOT / alone that bulk >= share x FCFS needs


def bulk_reach(alone: Point, fcfs: Point, interactive_tokens_s: float, fcfs_bulk_s: float,
               tpot_limit: float = 1.3, share: float = 0.8) -> BulkReach | None:
    law = fit(alone, fcfs)
    if law is None or fcfs_bulk_s <= 0:
        return None
    bulk = max(0.0, law.tokens_s(tpot_limit * alone.step_s) - interactive_tokens_s)
    need = law.step_for_tokens(share * fcfs_bulk_s + interactive_tokens_s) / alone.step_s
    return BulkReach(law, bulk, bulk / fcfs_bulk_s, need)


@dataclass(frozen=True)
class LightReach:
    law: CostLaw
    rows: float  # the tier's rows a step within ``ttft_limit`` x light's alone step
    tokens_s: float  # what such a batch yields
    of_heavy: float  # that, over the heavy row's measured tokens/s
    heavy_rows: float  # the rows a step held in the heavy row (Little's law)
    heavy_of_asymptote: float  # the heavy row's tokens/s over the law's ceiling 1 / b


def light_reach(light: Point, heavy: Point, ttft_limit: float = 1.2) -> LightReach | None:
    law = fit(light, heavy)
    if law is None or heavy.tokens_s <= 0:
        return None
    step = ttft_limit * light.step_s
    tokens = law.tokens_s(step)
    return LightReach(law, law.rows_within(step), tokens, tokens / heavy.tokens_s,
                      heavy.rows, heavy.tokens_s * law.per_row_s)


def ttft_growth_s(light: Point, heavy: Point) -> float:
    """The least a first token beside the heavy batch waits more than alone: the step in
    progress and its own step, each longer by the step's growth."""
    return 2 * max(0.0, heavy.step_s - light.step_s)
