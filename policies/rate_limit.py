"""Per-minute limits as token buckets. Pure functions; the quota Lua (gateway/bus/scripts.py)
mirrors them exactly.

A limit of L per minute is a bucket of capacity L refilled at L/60 000 per millisecond, so a
tenant may burst a full minute's worth and then proceeds at the steady rate. A request costing
c is admitted only if the bucket holds c; it is then deducted at once (tokens: prompt +
max_tokens reserved) and the unused part is refunded when the request ends (settle).
A limit of 0 means unlimited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MS_PER_MINUTE = 60_000


@dataclass(frozen=True)
class BucketDecision:
    allowed: bool
    level: float  # bucket level after the decision (deducted when allowed)
    retry_after_s: int  # 0 when allowed; else whole seconds until c is available


def refill(level: float, last_ms: int, now_ms: int, per_minute: int) -> float:
    """Level at ``now_ms`` for a bucket last at ``level`` at ``last_ms``."""
    elapsed = max(0, now_ms - last_ms)
    return min(float(per_minute), level + elapsed * per_minute / MS_PER_MINUTE)


def try_take(
    level: float | None, last_ms: int, now_ms: int, per_minute: int, cost: int
) -> BucketDecision:
    """Take ``cost`` from the bucket if it holds that much (``level`` None = new, full)."""
    if per_minute <= 0:
        return BucketDecision(True, 0.0, 0)
    current = float(per_minute) if level is None else refill(level, last_ms, now_ms, per_minute)
    if cost <= current:
        return BucketDecision(True, current - cost, 0)
    return BucketDecision(False, current, retry_after_seconds(current, cost, per_minute))


def retry_after_seconds(level: float, cost: int, per_minute: int) -> int:
    """Whole seconds (>= 1) until a bucket at ``level`` holds ``cost``; a cost above the
    capacity can never fit, reported as the time to refill completely."""
    missing = min(float(cost), float(per_minute)) - level
    return max(1, math.ceil(missing * MS_PER_MINUTE / per_minute / 1000))


def settle(level: float, reserved: int, actual: int, per_minute: int) -> float:
    """Refund the unused part of a reservation (never above capacity, never a charge)."""
    if per_minute <= 0:
        return level
    return min(float(per_minute), level + max(0, reserved - actual))


def reset_duration(level: float, per_minute: int) -> str:
    """Time until a bucket at ``level`` is full again, as OpenAI writes it: ``1s``,
    ``6m0s``, ``250ms``."""
    ms = max(0, math.ceil((per_minute - level) * MS_PER_MINUTE / per_minute))
    if ms < 1000:
        return f"{ms}ms"
    s = math.ceil(ms / 1000)
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


def ratelimit_headers(rpm: int, rpm_level: float, tpm: int, tpm_level: float
                      ) -> list[tuple[str, str]]:
    """OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for buckets at
    these levels (after the admission's charge); a limit of 0 (unlimited) sends none."""
    out = []
    for kind, limit, level in (("requests", rpm, rpm_level), ("tokens", tpm, tpm_level)):
        if limit > 0:
            level = max(0.0, min(float(limit), level))
            out += [(f"x-ratelimit-limit-{kind}", str(limit)),
                    (f"x-ratelimit-remaining-{kind}", str(math.floor(level))),
                    (f"x-ratelimit-reset-{kind}", reset_duration(level, limit))]
    return out
