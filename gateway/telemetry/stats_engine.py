"""The engine part of the live stats (``stats_snapshot.build_stats``): what the workers'
engines do over the window, summed over workers, and the doctor's ``EngineWindow``. Pure.

Distributions are the step histograms' bucket counts over the window (rows per step, tokens
per step); gauges are now and their averages over the window's 1 s samples; the idle stretch
is the trailing run of samples in which the engines held no request at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.telemetry.stats_publish import Samples
from gateway.telemetry.stats_window import (
    GaugePoint,
    by_label,
    distribution,
    histogram_summary,
    rate,
    served_by_label,
    total,
)
from policies.doctor import EngineWindow

STATES = ("running", "waiting", "swapped")


def _avg(points: Sequence[GaugePoint], key: str) -> float:
    return sum(p.values.get(key, 0.0) for p in points) / len(points) if points else 0.0


def idle_stretch(series: Sequence[GaugePoint]) -> tuple[float, int]:
    """(seconds the engines have held no request, fewest KV blocks used meanwhile)."""
    idle: list[GaugePoint] = []
    for p in reversed(series):
        if any(p.values.get(s, 0.0) for s in STATES):
            break
        idle.append(p)
    if len(idle) < 2:
        return 0.0, 0
    return idle[0].t - idle[-1].t, int(min(p.values.get("kv_used", 0.0) for p in idle))


def _dist(d: Samples, name: str) -> dict[str, Any]:
    return {**histogram_summary(d, name),
            "buckets": [["+Inf" if b == float("inf") else b, n]
                        for b, n in distribution(d, name)]}


def engine_section(d: Samples, cur: Samples, seconds: float, in_window: Sequence[GaugePoint],
                   series: Sequence[GaugePoint], now: float,
                   ) -> tuple[dict[str, Any] | None, EngineWindow | None]:
    seats = int(total(cur, "carpool_engine_max_num_seqs"))
    kv = by_label(cur, "carpool_kv_blocks", "state")
    if not seats and not kv:  # no worker published an engine
        return None, None
    states = by_label(cur, "carpool_engine_requests", "state")
    batch = _dist(d, "carpool_engine_batch_size")
    step_tokens = _dist(d, "carpool_engine_step_tokens")
    preempt = by_label(d, "carpool_preemptions_total", "mode")
    swap = by_label(d, "carpool_swap_blocks_total", "direction")
    kv_total = int(kv.get("used", 0.0) + kv.get("free", 0.0))
    idle_s, idle_kv = idle_stretch(series)
    window = EngineWindow(
        max_num_seqs=seats, running_avg=_avg(in_window, "running"),
        waiting_avg=_avg(in_window, "waiting"), swapped_avg=_avg(in_window, "swapped"),
        kv_total=kv_total, kv_used_avg=_avg(in_window, "kv_used"),
        batch_p99=batch["p99"], step_tokens_p99=step_tokens["p99"],
        preempt_recompute=preempt.get("recompute", 0.0), preempt_swap=preempt.get("swap", 0.0),
        swap_in_blocks=swap.get("in", 0.0), swap_out_blocks=swap.get("out", 0.0),
        finished=sum(served_by_label(d, "tier").values()), aborts=total(d, "carpool_aborts_total"),
        idle_s=idle_s, idle_kv_used=idle_kv)
    section = {
        **{s: states.get(s, 0.0) for s in STATES}, "max_num_seqs": seats,
        "kv_used": kv.get("used", 0.0), "kv_free": kv.get("free", 0.0), "kv_total": kv_total,
        "batch_size": batch, "step_tokens": step_tokens,
        "step_seconds": histogram_summary(d, "carpool_engine_step_seconds"),
        "steps_per_s": rate(batch["count"] or 0.0, seconds),
        "tokens_per_s": rate(total(d, "carpool_tokens_total", type="completion"), seconds),
        "preemptions_per_s": {m: rate(preempt.get(m, 0.0), seconds) for m in ("recompute", "swap")},
        "preemptions": {m: preempt.get(m, 0.0) for m in ("recompute", "swap")},
        "swap_blocks_per_s": {k: rate(swap.get(k, 0.0), seconds) for k in ("in", "out")},
        "series": {k: [[round(p.t - now, 1), p.values.get(k, 0.0)] for p in series]
                   for k in (*STATES, "kv_used")},
    }
    return section, window
