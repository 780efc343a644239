"""Early shedding: whether a new request is answered at once instead of queued. Pure functions.

A tier's predicted wait is its queue depth over its recent service rate (requests started per
second), the time the queue ahead of a new request takes to start at that rate. A tier that
started nothing in the rate's window is assumed to start one request per window, so a stalled
tier predicts a long wait rather than none.

The rule (``decide``), for a request of ``tenant`` in a tier whose published load is known:
  1. predicted wait > the request's deadline: 503 ``tier_saturated``, whatever the tier's
     action (the system knows the request would time out before it starts);
  2. the tier sheds (``TierSLO.action == SHED``), has a TTFT target, and its predicted wait is
     already above it: 429 ``tenant_over_share`` when the tenant holds more than its fair
     share of the tier's queue (depth / number of tenants with queued work), else 503
     ``tier_saturated``;
  3. otherwise the request is queued (None).
No published load (a fresh start, no worker) never sheds. ``Retry-After`` is the time the
prediction says the excess takes to drain (``drain_time``: until the wait is within the
target, or the deadline for rule 1), and for an over-share tenant the time its own queued requests take at its fair share
of the service rate; at least 1 s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.tiers import SHED, TierSLO

TIER_SATURATED = "tier_saturated"
TENANT_OVER_SHARE = "tenant_over_share"


@dataclass(frozen=True)
class TierLoad:
    """A tier's load as the workers publish it: entries waiting, requests started per second
    recently, and the waiting entries per tenant (tenants with none left out)."""

    depth: int
    rate_rps: float
    window_s: float
    tenant_depth: Mapping[str, int] = field(default_factory=dict)

    @property
    def predicted_wait_s(self) -> float:
        return predicted_wait(self.depth, self.rate_rps, self.window_s)

    @property
    def start_rate(self) -> float:
        return start_rate(self.rate_rps, self.window_s)

    @property
    def active_tenants(self) -> int:
        """Tenants with queued work."""
        return sum(1 for n in self.tenant_depth.values() if n > 0)


@dataclass(frozen=True)
class Shed:
    """A refusal: HTTP status, error code, Retry-After seconds and what to tell the client."""

    status: int
    code: str
    retry_after_s: int
    message: str


def start_rate(rate_rps: float, window_s: float) -> float:
    """The starts per second the predictions assume: ``rate_rps``, at least one per window."""
    return max(rate_rps, 1.0 / window_s)


def predicted_wait(depth: int, rate_rps: float, window_s: float) -> float:
    """Seconds until ``depth`` queued requests have started, at ``rate_rps`` (at least one
    start per ``window_s``)."""
    if depth <= 0:
        return 0.0
    return depth / start_rate(rate_rps, window_s)


def fair_share(load: TierLoad) -> float:
    """Entries each tenant with queued work would hold if the queue were split evenly."""
    active = load.active_tenants
    return load.depth / active if active else float(load.depth)


def _retry(seconds: float) -> int:
    return max(1, math.ceil(seconds - 1e-9))


def drain_time(load: TierLoad, target_s: float) -> float:
    """Seconds until the predicted wait is back within ``target_s``: the starts that leave at
    most ``target_s`` worth of queue, at the tier's rate (no new arrivals)."""
    rate = load.start_rate
    keep = math.floor(target_s * rate + 1e-9)
    return max(0, load.depth - keep) / rate


def decide(load: TierLoad | None, slo: TierSLO, tenant: str, deadline_s: float,
           tier: str = "") -> Shed | None:
    """The refusal for a new request of ``tenant``, or None to queue it (module docstring)."""
    if load is None or load.depth <= 0:
        return None
    wait, name = load.predicted_wait_s, f"the {tier} tier" if tier else "this tier"
    if wait > deadline_s:
        return Shed(503, TIER_SATURATED, _retry(drain_time(load, deadline_s)),
                    f"{name}'s predicted wait ({wait:.1f} s) exceeds the request "
                    f"deadline ({deadline_s:.0f} s): it would time out before it starts")
    target = slo.ttft_p99_s
    if slo.action != SHED or target is None or wait <= target:
        return None
    mine, share = load.tenant_depth.get(tenant, 0), fair_share(load)
    if mine > share:
        return Shed(429, TENANT_OVER_SHARE,
                    _retry(mine / (load.start_rate / load.active_tenants)),
                    f"this tenant holds {mine} of the {load.depth} requests queued in "
                    f"{name}, more than its fair share ({share:.1f}), while the tier's "
                    f"predicted wait ({wait:.1f} s) exceeds its TTFT target ({target:g} s)")
    return Shed(503, TIER_SATURATED, _retry(drain_time(load, target)),
                f"{name} is saturated: its predicted wait ({wait:.1f} s) exceeds its "
                f"TTFT target ({target:g} s)")
