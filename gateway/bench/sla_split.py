"""The TTFT budget of ``carpool bench sla``'s rows: where each tier's time to first token went
(``policies.ttft_split``'s six parts) and how many engine steps it took, read from what the
server's ``/metrics`` histograms gained during a row (pure functions, no I/O).

Part quantiles interpolate inside the histogram's buckets (as Prometheus does); step counts
are whole numbers with a bucket each, so their quantile is read as the bucket's bound: exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.telemetry.metrics import STEP_BUCKETS
from gateway.telemetry.stats_publish import Samples
from gateway.telemetry.stats_window import buckets, delta, quantile, rank_quantile, total
from policies.ttft_split import LABELS, PARTS

Metrics = Mapping[str, list[tuple[dict[str, str], float]]]  # ``sla_client.parse_metrics``
PART_HISTOGRAM = "carpool_ttft_part_seconds"
STEPS_HISTOGRAM = "carpool_ttft_steps"
PREEMPTIONS = "carpool_preemptions_total"


@dataclass(frozen=True)
class TierBudget:
    """One tier's TTFT budget over a row: per part (p50, p99) in seconds, steps."""

    count: float  # first tokens with marks
    parts: dict[str, tuple[float | None, float | None]]
    steps_p50: float | None
    steps_p99: float | None
    prefill_steps_p99: float | None

    def largest_p99(self) -> str | None:
        known = [(p99, part) for part, (_, p99) in self.parts.items() if p99 is not None]
        return max(known)[1] if known else None


def samples(metrics: Metrics) -> Samples:
    """``parse_metrics`` output as the telemetry's ``Samples`` (label tuples, sorted)."""
    return {name: {tuple(sorted(labels.items())): value for labels, value in series}
            for name, series in metrics.items()}


def gained(before: Metrics, after: Metrics) -> Samples:
    """What one server's counters and histograms gained from ``before`` to ``after``."""
    return delta({"server": samples(after)}, {"server": samples(before)})


def tier_budget(d: Samples, tier: str) -> TierBudget | None:
    """``tier``'s budget from a row's gains ``d``; None when no first token carried marks."""
    count = total(d, f"{STEPS_HISTOGRAM}_count", tier=tier, kind="all")
    if count <= 0:
        return None
    parts = {}
    for part in PARTS:
        cum = buckets(d, PART_HISTOGRAM, tier=tier, part=part)
        parts[part] = (quantile(cum, 0.5), quantile(cum, 0.99))
    steps = buckets(d, STEPS_HISTOGRAM, tier=tier, kind="all")
    prefill = buckets(d, STEPS_HISTOGRAM, tier=tier, kind="prefill")
    return TierBudget(count, parts, rank_quantile(steps, 0.5), rank_quantile(steps, 0.99),
                      rank_quantile(prefill, 0.99))


def preemptions(d: Samples) -> float:
    return total(d, PREEMPTIONS)


def budget_table(rows: Sequence[tuple[str, Mapping[str, TierBudget]]]) -> str:
    """One line per row and tier: each part's p50 / p99 in ms, steps p50 / p99."""
    head = ["row", "tier", "n", *(f"{LABELS[p]} p50 / p99 ms" for p in PARTS),
            "steps p50 / p99", "prefill steps p99", "largest p99"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, tiers in rows:
        for tier, b in tiers.items():
            cells = [name, tier, f"{b.count:.0f}"]
            cells += [f"{_ms(p50)} / {_ms(p99)}" for p50, p99 in b.parts.values()]
            cells += [f"{_n(b.steps_p50)} / {_n(b.steps_p99)}", _n(b.prefill_steps_p99),
                      LABELS.get(b.largest_p99() or "", "-")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def _n(x: float | None) -> str:
    if x is not None and x >= STEP_BUCKETS[-1]:
        return f">= {STEP_BUCKETS[-1]}"  # the histogram's last bucket, or past it
    return "-" if x is None else f"{x:g}"
