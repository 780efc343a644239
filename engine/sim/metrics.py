"""What a run measured, the same for a simulated run and a real one (``engine.bench.
sim_vs_real`` fills these from the engine's outputs), so both are summarised by one code path.

Per request: TTFT = first token - arrival, latency = finish - arrival, TPOT = (finish - first
token) / (output tokens - 1). Per run: output tokens / makespan (first arrival to last
finish), and p50/p99 per tier. Percentiles interpolate linearly between order statistics
(numpy's default), on both sides.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestRecord:
    request_id: str
    tier: str
    tenant: str
    arrival: float
    first_token: float | None
    finished: float
    output_tokens: int
    finish_reason: str | None = None
    num_preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache when admitted

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def latency(self) -> float:
        return self.finished - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass(frozen=True)
class StepRecord:
    start: float
    seconds: float
    rows: int
    tokens: int
    kv_tokens: int
    running: int  # after schedule(): the batch size
    waiting: int  # after schedule(): the queue depth
    scheduled_ids: tuple[str, ...]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default); NaN when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class TierSummary:
    tier: str
    n: int
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    latency_mean: float
    latency_p50: float
    latency_p99: float


def summarize(tier: str, records: Sequence[RequestRecord]) -> TierSummary:
    ttft = [r.ttft for r in records if r.ttft is not None]
    tpot = [r.tpot for r in records if r.tpot is not None]
    lat = [r.latency for r in records]
    return TierSummary(tier, len(records), percentile(ttft, 50), percentile(ttft, 99),
                       percentile(tpot, 50), percentile(tpot, 99), mean(lat),
                       percentile(lat, 50), percentile(lat, 99))


@dataclass
class RunResult:
    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    end_time: float = 0.0
    preemptions: int = 0

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def makespan(self) -> float:
        if not self.requests:
            return 0.0
        return max(r.finished for r in self.requests) - min(r.arrival for r in self.requests)

    @property
    def throughput(self) -> float:
        """Output tokens per second over the makespan."""
        return self.output_tokens / self.makespan if self.makespan > 0 else math.nan

    def by_id(self) -> dict[str, RequestRecord]:
        return {r.request_id: r for r in self.requests}

    def tiers(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.requests:
            seen.setdefault(r.tier, None)
        return list(seen)

    def summary(self, tier: str | None = None) -> TierSummary:
        """One tier's figures, or all requests' (``tier=None``)."""
        records = [r for r in self.requests if tier is None or r.tier == tier]
        return summarize(tier or "all", records)

    def tier_summaries(self) -> list[TierSummary]:
        return [self.summary(t) for t in self.tiers()]


def ids_per_step(steps: Iterable[StepRecord]) -> list[tuple[str, ...]]:
    return [s.scheduled_ids for s in steps]
