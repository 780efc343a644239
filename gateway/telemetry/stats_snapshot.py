"""The live stats behind ``GET /admin/stats``, the console and ``carpool doctor``: the whole
deployment's metrics (every process's published samples, ``stats_publish.py``) over a rolling
window, as JSON, with the doctor's findings (``policies/doctor.py``).

A ``StatsHistory`` in each HTTP process reads the published samples once a second and keeps
the last ``WINDOW_S`` of them (rates and percentiles are differences of cumulative counters and
histogram buckets across the window, as Prometheus's ``rate``/``histogram_quantile`` would
compute them) and ``SERIES_S`` of a few gauges (queue depth, engine state) for the time series.

Processes publish only while someone reads (``stats_publish.watch``): a first read finds
little, the next second has it all.

The JSON (``build_stats``): ``ts``, ``window_s`` (the seconds the rates and quantiles cover:
up to ``WINDOW_S``, less on a deployment younger than that or a history shorter than that;
0 with nothing published yet, then rates are null), ``processes`` (id -> role), ``tiers`` (per
tier: queue depth now and its series, TTFT/TPOT/queue-wait p50/p99, the TTFT budget
(``ttft_split``: each part's p50/p99, ``policies.ttft_split``; ``ttft_steps``: engine steps to
the first token, p50/p99; ``ttft_target_s``: its objective), admitted/rejected by
reason/cancelled/timed-out/completed per second), ``rejected_before_tier`` (auth and such, by
reason, per second), ``engine`` (null without a worker: state, KV blocks, batch size and
tokens per step distributions, preemptions and swap traffic per second, tokens per second,
series), ``tenants`` (top ``TOP_TENANTS``: requests, tokens, share of completion tokens, 429s,
TTFT p99) and ``doctor`` (``healthy``, ``findings``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.finish import COMPLETED
from gateway.bus.keys import RedisKeys
from gateway.telemetry.stats_engine import engine_section
from gateway.telemetry.stats_publish import Samples, read_published, watch
from gateway.telemetry.stats_window import (
    GaugePoint,
    buckets,
    by_label,
    delta,
    histogram_summary,
    merge,
    rank_quantile,
    rate,
    served_by_label,
    total,
)
from policies.doctor import DoctorSnapshot, TierWindow, diagnose
from policies.ttft_split import PARTS

log = logging.getLogger("carpool.telemetry")

WINDOW_S = 60.0
SERIES_S = 300.0
SAMPLE_INTERVAL_S = 1.0
TOP_TENANTS = 10
# the gauges kept for the series (and the window averages the doctor reads)
SERIES_GAUGES = ("carpool_queue_depth", "carpool_engine_requests", "carpool_kv_blocks")


@dataclass(frozen=True)
class Point:
    t: float  # unix seconds
    procs: dict[str, Samples]
    roles: dict[str, str]
    starts: dict[str, float]  # when each process's counters were zero

    def covers(self, now: Point) -> bool:
        """Every process of ``now`` is in this point, or started after it: a delta from here
        counts nothing twice and misses nothing."""
        return all(p in self.procs or start >= self.t for p, start in now.starts.items())


def gauge_point(t: float, procs: dict[str, Samples], tiers: Sequence[str]) -> GaugePoint:
    cur = merge({n: s[n] for n in SERIES_GAUGES if n in s} for s in procs.values())
    values = {f"depth:{tier}": total(cur, "carpool_queue_depth", tier=tier) for tier in tiers}
    for state in ("running", "waiting", "swapped"):
        values[state] = total(cur, "carpool_engine_requests", state=state)
    values["kv_used"] = total(cur, "carpool_kv_blocks", state="used")
    values["kv_free"] = total(cur, "carpool_kv_blocks", state="free")
    return GaugePoint(t, values)


class StatsHistory:
    """The last minutes of the deployment's published metrics, sampled every ``interval_s``."""

    def __init__(self, redis: Any, keys: RedisKeys, tiers: Sequence[str],
                 window_s: float = WINDOW_S, series_s: float = SERIES_S,
                 interval_s: float = SAMPLE_INTERVAL_S,
                 ttft_targets: Mapping[str, float | None] | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.tiers = tuple(tiers)
        self.ttft_targets = dict(ttft_targets or {})  # tier -> TTFT objective, for the doctor
        self.window_s = window_s
        self.interval_s = interval_s
        self.points: deque[Point] = deque(maxlen=int(window_s / interval_s) + 2)
        self.series: deque[GaugePoint] = deque(maxlen=int(series_s / interval_s) + 2)

    async def sample(self) -> None:
        published = await read_published(self.redis, self.keys)
        if not published:  # nobody watched for a while: nothing published, nothing to keep
            self.points.clear()
            return
        t = time.time()
        procs = {p: pub.samples for p, pub in published.items()}
        self.points.append(Point(t, procs, {p: pub.role for p, pub in published.items()},
                                 {p: pub.start for p, pub in published.items()}))
        self.series.append(gauge_point(t, procs, self.tiers))

    async def run(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # Redis away: the page shows the last picture, then stale
                log.debug("stats sampling failed", exc_info=True)
            await asyncio.sleep(self.interval_s)

    def window(self) -> tuple[Point | None, Point | None, float]:
        """(now, then, seconds). Every process started within ``window_s``: then is None and
        the window runs from the first start (counters were zero then: exact at once, even
        on a first read). Otherwise the oldest point at most ``window_s`` back that covers
        every process now (``Point.covers``); none: no window yet (seconds 0)."""
        if not self.points:
            return None, None, 0.0
        now = self.points[-1]
        first = min(now.starts.values(), default=now.t)
        if first >= now.t - self.window_s:
            return now, None, now.t - first
        then = next((p for p in self.points
                     if p.t >= now.t - self.window_s - 0.5 and p.covers(now)), None)
        if then is None or then is now:
            return now, None, 0.0
        return now, then, now.t - then.t

    async def snapshot(self) -> dict[str, Any]:
        """The stats JSON; the read also keeps every process publishing (``watch``)."""
        await watch(self.redis, self.keys)
        if not self.points:  # nobody watched until now: read what there is at once
            await self.sample()
        now, then, seconds = self.window()
        if now is None:
            now = Point(time.time(), {}, {}, {})
        # ~10 ms of Python for a busy deployment: off the event loop
        return await asyncio.to_thread(build_stats, now, then, seconds, list(self.series),
                                       self.tiers, self.ttft_targets)


def _rates(counts: dict[str, float], seconds: float) -> dict[str, float | None]:
    return {k: rate(v, seconds) for k, v in sorted(counts.items()) if v > 0}


def _tier_section(d: Samples, tier: str, seconds: float, series: Sequence[GaugePoint],
                  now: float, ttft_target: float | None = None
                  ) -> tuple[dict[str, Any], TierWindow]:
    ttft = histogram_summary(d, "gen_ai_server_time_to_first_token_seconds", tier=tier)
    split = {part: histogram_summary(d, "carpool_ttft_part_seconds", tier=tier, part=part)
             for part in PARTS}
    steps = buckets(d, "carpool_ttft_steps", tier=tier, kind="all")
    tpot = histogram_summary(d, "gen_ai_server_time_per_output_token_seconds", tier=tier)
    wait = histogram_summary(d, "carpool_queue_wait_seconds", tier=tier)
    finished = served_by_label(d, "finish_reason", tier=tier)
    aborts = by_label(d, "carpool_aborts_total", "cause", tier=tier)
    completed = sum(finished.get(r, 0.0) for r in sorted(COMPLETED))
    timed_out = aborts.get("timeout", 0.0)
    key = f"depth:{tier}"
    section = {
        "queue_depth": series[-1].values.get(key, 0.0) if series else 0.0,
        "queue_series": [[round(p.t - now, 1), p.values.get(key, 0.0)] for p in series],
        "ttft_s": ttft, "tpot_s": tpot, "queue_wait_s": wait,
        "ttft_split": {part: {"p50": v["p50"], "p99": v["p99"]} for part, v in split.items()},
        "ttft_steps": {"p50": rank_quantile(steps, 0.5), "p99": rank_quantile(steps, 0.99)},
        "ttft_target_s": ttft_target,
        "admitted_per_s": rate(total(d, "carpool_admissions_total", tier=tier), seconds),
        "rejected_per_s": _rates(
            by_label(d, "carpool_request_rejections_total", "reason", tier=tier), seconds),
        "cancelled_per_s": rate(sum(aborts.values()) - timed_out, seconds),
        "timed_out_per_s": rate(timed_out, seconds),
        "completed_per_s": rate(completed, seconds),
        "tokens_per_s": rate(total(d, "carpool_tokens_total", tier=tier, type="completion"),
                              seconds),
        "counts": {"admitted": total(d, "carpool_admissions_total", tier=tier),
                   "completed": completed, "finished": sum(finished.values())},
    }
    window = TierWindow(ttft_p50_s=ttft["p50"], ttft_p99_s=ttft["p99"], tpot_p50_s=tpot["p50"],
                        tpot_p99_s=tpot["p99"], queue_wait_p99_s=wait["p99"],
                        completed=completed, ttft_target_s=ttft_target,
                        ttft_parts_p99_s={part: v["p99"] for part, v in split.items()},
                        ttft_steps_p99=rank_quantile(steps, 0.99))
    return section, window


def _tenants_section(d: Samples, seconds: float) -> list[dict[str, Any]]:
    requests = served_by_label(d, "tenant")
    completion = by_label(d, "carpool_tenant_tokens_total", "tenant", type="completion")
    tokens = by_label(d, "carpool_tenant_tokens_total", "tenant")
    rejected = by_label(d, "carpool_request_rejections_total", "tenant", status="429")
    all_completion = sum(completion.values())
    names = (set(requests) | set(rejected)) - {"-"} or set(requests) | set(rejected)
    rows: list[dict[str, Any]] = []
    for tenant in names:
        ttft = histogram_summary(d, "carpool_tenant_time_to_first_token_seconds", tenant=tenant)
        rows.append({
            "tenant": tenant, "requests": requests.get(tenant, 0.0),
            "requests_per_s": rate(requests.get(tenant, 0.0), seconds),
            "tokens": tokens.get(tenant, 0.0),
            "share": round(completion.get(tenant, 0.0) / all_completion, 4)
            if all_completion else 0.0,
            "rejected_429": rejected.get(tenant, 0.0), "ttft_p99_s": ttft["p99"]})
    rows.sort(key=lambda r: (-(r["requests"] + r["rejected_429"]), r["tenant"]))
    return rows[:TOP_TENANTS]


def build_stats(now: Point, then: Point | None, seconds: float,
                series: Sequence[GaugePoint], tiers: Sequence[str],
                ttft_targets: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """The JSON (module docstring) for the ``seconds`` up to ``now``, counted from ``then``
    (None: from each process's start). Pure."""
    d = delta(now.procs, then.procs if then is not None else None)
    cur = merge(now.procs.values())
    in_window = [p for p in series if p.t >= now.t - seconds]
    tier_json, tier_windows = {}, {}
    for tier in tiers:
        tier_json[tier], tier_windows[tier] = _tier_section(
            d, tier, seconds, series, now.t, (ttft_targets or {}).get(tier))
    engine_json, engine_window = engine_section(d, cur, seconds, in_window, series, now.t)
    doctor = DoctorSnapshot(window_s=seconds, tiers=tier_windows, engine=engine_window)
    findings = diagnose(doctor)
    return {
        "ts": now.t, "window_s": round(seconds, 3), "processes": dict(sorted(now.roles.items())),
        "tiers": tier_json,
        "rejected_before_tier": _rates(
            by_label(d, "carpool_request_rejections_total", "reason", tier="-"), seconds),
        "engine": engine_json,
        "tenants": _tenants_section(d, seconds),
        "doctor": {"healthy": not findings,
                   "findings": [dataclasses.asdict(f) for f in findings],
                   "input": dataclasses.asdict(doctor)},
    }
