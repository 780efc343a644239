"""Arithmetic on published samples (``stats_publish.Samples``): merge several processes into one
picture, take what changed over a window, read a histogram's quantiles. Pure functions.

Merging sums a sample over processes (counters, histogram buckets, engine gauges: two workers
have twice the seats) except for the gauges in ``SHARED_GAUGES``, which every process samples
from the same shared state (the Redis queues) and are taken once (max). A window's delta is
per process (``now - then``; a process that restarted, or appeared, counts from zero), summed.
Quantiles interpolate inside the bucket as Prometheus's ``histogram_quantile`` does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.telemetry.stats_publish import LabelKey, Samples

SHARED_GAUGES = frozenset({"carpool_queue_depth"})
REJECTED = "rejected"  # the finish reason RequestRecorder gives a request refused at admission


@dataclass(frozen=True)
class GaugePoint:
    """One sample of the gauges' series (``stats_snapshot.gauge_point``), merged over processes."""

    t: float
    values: dict[str, float]  # "depth:<tier>", "running", "waiting", "swapped", "kv_used"...


def merge(procs: Iterable[Samples]) -> Samples:
    out: Samples = {}
    for samples in procs:
        for name, series in samples.items():
            into = out.setdefault(name, {})
            take_max = name in SHARED_GAUGES
            for key, value in series.items():
                before = into.get(key)
                if before is None:
                    into[key] = value
                else:
                    into[key] = max(before, value) if take_max else before + value
    return out


def delta(now: Mapping[str, Samples], then: Mapping[str, Samples] | None) -> Samples:
    """What each process's cumulative samples gained since ``then`` (None: since its start),
    summed over processes."""
    out: Samples = {}
    for proc, samples in now.items():
        before = (then or {}).get(proc, {})
        for name, series in samples.items():
            old = before.get(name, {})
            into = out.setdefault(name, {})
            for key, value in series.items():
                d = value - old.get(key, 0.0)
                into[key] = into.get(key, 0.0) + (value if d < 0 else d)  # < 0: restarted
    return out


def _matches(key: LabelKey, match: Mapping[str, str]) -> bool:
    if not match:
        return True
    labels = dict(key)
    return all(labels.get(k) == v for k, v in match.items())


def total(s: Samples, name: str, **match: str) -> float:
    return sum(v for k, v in s.get(name, {}).items() if _matches(k, match))


def by_label(s: Samples, name: str, label: str, *, unless: tuple[str, str] | None = None,
             **match: str) -> dict[str, float]:
    """Sums of ``name`` by the value of ``label``, over samples matching ``match`` and, with
    ``unless=(label, value)``, not carrying that label value."""
    out: dict[str, float] = {}
    for key, value in s.get(name, {}).items():
        if _matches(key, match):
            labels = dict(key)
            if unless is not None and labels.get(unless[0]) == unless[1]:
                continue
            lv = labels.get(label, "")
            out[lv] = out.get(lv, 0.0) + value
    return out


def served_by_label(d: Samples, label: str, **match: str) -> dict[str, float]:
    """Requests that reached a queue, by ``label`` (``carpool_requests`` also records the
    requests refused at admission, as finish reason ``rejected``)."""
    return by_label(d, "carpool_requests_total", label, unless=("finish_reason", REJECTED),
                    **match)


def buckets(s: Samples, histogram: str, **match: str) -> list[tuple[float, float]]:
    """``(upper bound, cumulative count)`` ascending, summed over the other labels."""
    acc: dict[float, float] = {}
    for key, value in s.get(f"{histogram}_bucket", {}).items():
        if _matches(key, match):
            le = float(dict(key)["le"])
            acc[le] = acc.get(le, 0.0) + value
    return sorted(acc.items())


def quantile(cumulative: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative bucket list; None with no observation. A rank in the
    +Inf bucket answers the largest finite bound (as Prometheus does)."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def histogram_summary(s: Samples, histogram: str, **match: str) -> dict[str, float | None]:
    """count, mean, p50, p99 of a histogram (in its unit)."""
    cum = buckets(s, histogram, **match)
    count = total(s, f"{histogram}_count", **match)
    total_sum = total(s, f"{histogram}_sum", **match)
    return {"count": count, "mean": total_sum / count if count else None,
            "p50": quantile(cum, 0.5), "p99": quantile(cum, 0.99)}


def distribution(s: Samples, histogram: str, **match: str) -> list[tuple[float, float]]:
    """Observations per bucket (not cumulative): ``(upper bound, count)``, +Inf as ``inf``."""
    out, prev = [], 0.0
    for bound, count in buckets(s, histogram, **match):
        out.append((bound, count - prev))
        prev = count
    return out


def rate(count: float, seconds: float) -> float | None:
    """``count`` per second over a window of ``seconds``; None without a window yet."""
    return round(count / seconds, 4) if seconds > 0 else None


def rank_quantile(cumulative: list[tuple[float, float]], q: float) -> float | None:
    """Nearest-rank ``q`` quantile of a histogram of whole numbers with a bucket each (engine
    steps): the bound of the first bucket holding the rank, exact; None with no observation.
    A rank in the +Inf bucket answers the largest finite bound, as ``quantile`` does (JSON
    has no infinity)."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = max(1.0, math.ceil(q * cumulative[-1][1]))
    bound = next(bound for bound, count in cumulative if count >= rank)
    return max((b for b, _ in cumulative if not math.isinf(b)), default=None) \
        if math.isinf(bound) else bound
