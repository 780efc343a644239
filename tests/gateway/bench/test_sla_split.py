"""``carpool bench sla``'s TTFT budget read from the server's own ``/metrics`` text: step
quantiles exact (nearest rank over the values observed), part quantiles inside the bucket
that holds the exact one, and only what a row added counts."""

from __future__ import annotations

import random

from prometheus_client import generate_latest

from gateway.bench.sla_client import parse_metrics
from gateway.bench.sla_report import pct
from gateway.bench.sla_split import budget_table, gained, tier_budget
from gateway.telemetry.metrics import PART_BUCKETS, Metrics
from policies.ttft_split import PARTS


def _observe(m: Metrics, tier: str, steps: list[int], parts: dict[str, list[float]]) -> None:
    for n in steps:
        m.ttft_steps.labels(tier, "all").observe(n)
        m.ttft_steps.labels(tier, "prefill").observe(1)
    for part, values in parts.items():
        for v in values:
            m.ttft_part.labels(tier, part).observe(v)


def _scrape(m: Metrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    return parse_metrics(generate_latest(m.registry).decode())


def _bucket_of(x: float) -> tuple[float, float]:
    lower = 0.0
    for bound in PART_BUCKETS:
        if x <= bound:
            return lower, bound
        lower = bound
    raise AssertionError(x)


def test_budget_of_a_row_counts_only_what_it_added() -> None:
    rng = random.Random(3)
    m = Metrics()
    # an earlier row: slow, many steps; it must not leak into the next row's figures
    _observe(m, "interactive", [9] * 50, {p: [2.0] * 50 for p in PARTS})
    before = _scrape(m)
    steps = [rng.choice((1, 2, 2, 2, 3)) for _ in range(300)]
    parts = {p: [rng.uniform(0.001, 0.2) for _ in range(300)] for p in PARTS}
    _observe(m, "interactive", steps, parts)
    _observe(m, "batch", [4] * 10, {p: [0.5] * 10 for p in PARTS})
    budget = tier_budget(gained(before, _scrape(m)), "interactive")
    assert budget is not None and budget.count == 300
    assert budget.steps_p50 == pct(steps, 0.5) and budget.steps_p99 == pct(steps, 0.99)
    assert budget.prefill_steps_p99 == 1
    for part in PARTS:
        p50, p99 = budget.parts[part]
        for q, got in ((0.5, p50), (0.99, p99)):
            lower, upper = _bucket_of(pct(parts[part], q))
            assert got is not None and lower <= got <= upper
    assert tier_budget(gained(before, _scrape(m)), "best-effort") is None


def test_budget_table_has_a_line_per_row_and_tier_with_the_largest_part() -> None:
    m = Metrics()
    _observe(m, "interactive", [2, 2, 1], {"step_wait": [0.03] * 3, "prefill": [0.06] * 3,
                                           "redis_queue": [0.001] * 3})
    budget = tier_budget(gained({}, _scrape(m)), "interactive")
    assert budget is not None and budget.largest_p99() == "prefill"
    text = budget_table([("overload", {"interactive": budget})])
    lines = text.splitlines()
    assert len(lines) == 3 and lines[2].startswith("| overload | interactive | 3 |")
    assert "prefill steps |" in lines[2] and "| 2 / 2 |" in lines[2]


def test_steps_past_the_last_bucket_read_as_its_bound_not_infinity() -> None:
    m = Metrics()
    _observe(m, "batch", [500, 500, 1], {})
    budget = tier_budget(gained({}, _scrape(m)), "batch")
    assert budget is not None and budget.steps_p99 == 100 and budget.steps_p50 == 100
    assert "| >= 100 / >= 100 |" in budget_table([("backlog", {"batch": budget})])
