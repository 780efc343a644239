"""Early shedding at the HTTP edge: before admission, a request of a tier whose published load
(``gateway/worker/tier_status.py``) says it would wait past its tier's TTFT target, or past
its own deadline, is answered at once (``policies.shedding.decide``: 429
``tenant_over_share`` or 503 ``tier_saturated``, with ``Retry-After``).

The workers' statuses are read from Redis at most once per ``refresh_s`` (like the auth cache:
the hot path costs no round trip otherwise) and merged: a tier's depth and per-tenant depths
from the freshest status, its rate the sum of every live worker's. No live status (a fresh
start, no worker, Redis away) means no shedding. The objectives are this gateway's own
configuration (``GatewayConfig.tier_slos``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from gateway.bus.keys import RedisKeys
from gateway.bus.single_flight import SingleFlight
from gateway.config import GatewayConfig
from gateway.http.errors import APIError
from gateway.worker.tier_status import STALE_AFTER_S
from policies.shedding import TierLoad, decide
from policies.tiers import TIERS, tier_priority

log = logging.getLogger("carpool.gateway")

REFRESH_S = 1.0


def live_statuses(raw: dict[Any, Any], now: float) -> list[dict[str, Any]]:
    """The workers' published statuses younger than ``STALE_AFTER_S``, freshest first."""
    out = []
    for value in raw.values():
        try:
            status = orjson.loads(value)
        except orjson.JSONDecodeError:
            continue
        if isinstance(status, dict) and status.get("ts", 0.0) >= now - STALE_AFTER_S:
            out.append(status)
    return sorted(out, key=lambda s: -float(s["ts"]))


async def read_statuses(redis: Any, keys: RedisKeys) -> list[dict[str, Any]]:
    """The live workers' statuses, read from Redis now (freshest first)."""
    return live_statuses(await redis.hgetall(keys.tier_status), time.time())


def merge_loads(statuses: list[dict[str, Any]]) -> dict[str, TierLoad]:
    """Per tier, one load from the workers' statuses (freshest first)."""
    loads: dict[str, TierLoad] = {}
    if not statuses:
        return loads
    for tier, fresh in statuses[0].get("tiers", {}).items():
        rate = sum(float(s.get("tiers", {}).get(tier, {}).get("rate_rps", 0.0)) for s in statuses)
        window = max(float(s.get("window_s", 1.0)) for s in statuses)
        loads[tier] = TierLoad(int(fresh.get("depth", 0)), rate, window,
                               {str(k): int(v) for k, v in fresh.get("tenants", {}).items()})
    return loads


class TierShedder:
    def __init__(self, redis: Any, keys: RedisKeys, config: GatewayConfig,
                 refresh_s: float = REFRESH_S) -> None:
        self.redis = redis
        self.keys = keys
        self.config = config
        self.refresh_s = refresh_s
        self._loads: dict[str, TierLoad] = {}
        # the live workers that take new work (not draining), as of the last read: prefix-aware
        # placement hashes over them (``gateway/http/placement.py``)
        self.workers: tuple[str, ...] = ()
        self._expires = 0.0
        self._refresh = SingleFlight(self._read)

    async def statuses(self) -> list[dict[str, Any]]:
        """The live workers' statuses, read now (for the admin API)."""
        return await read_statuses(self.redis, self.keys)

    async def loads(self) -> dict[str, TierLoad]:
        """The merged loads, re-read at most once per ``refresh_s``; concurrent callers
        share one read."""
        if time.monotonic() >= self._expires:
            await self._refresh()
        return self._loads

    async def _read(self) -> None:
        try:
            statuses = await self.statuses()
            self._loads = merge_loads(statuses)
            self.workers = tuple(sorted(str(s["worker"]) for s in statuses
                                        if s.get("worker") and not s.get("draining")))
        except Exception as exc:  # noqa: BLE001  (no status: never shed)
            log.warning("tier status unreadable, not shedding: %r", exc)
            self._loads, self.workers = {}, ()
        self._expires = time.monotonic() + self.refresh_s

    async def check(self, tenant_id: str, tier: str) -> APIError | None:
        """The error to answer a new request with at once, or None to admit it."""
        load = (await self.loads()).get(tier)
        shed = decide(load, self.config.tier_slos[tier], tenant_id,
                      self.config.request_timeout_s, tier)
        if shed is None:
            return None
        return APIError(shed.status, shed.message, code=shed.code, retry_after=shed.retry_after_s)


def tier_table(config: GatewayConfig, statuses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tier, for operators: weight, objective and live status (None when no worker
    publishes). Weights and objectives are the workers' as published (``config``'s when none
    is), the TPOT target the one in force (configured, or derived by the step budget)."""
    loads = merge_loads(statuses)
    fresh = statuses[0] if statuses else {}
    rows = []
    for tier in TIERS:
        slo, pub = config.tier_slos[tier], fresh.get("tiers", {}).get(tier, {})
        load = loads.get(tier)
        rows.append({
            "tier": tier, "priority": tier_priority(tier),
            "weight": fresh.get("weights", config.tier_weights).get(tier, 0),
            "ttft_p99_s": pub.get("ttft_p99_s", slo.ttft_p99_s),
            "tpot_p99_s": pub.get("tpot_p99_s", slo.tpot_p99_s),
            "tpot_source": pub.get("tpot_source", "configured" if slo.tpot_p99_s else None),
            "action": pub.get("action", slo.action),
            "status": None if load is None else {
                "depth": load.depth, "rate_rps": round(load.rate_rps, 3),
                "predicted_wait_s": round(load.predicted_wait_s, 3),
                "tenants": dict(load.tenant_depth), "workers": len(statuses)},
        })
    return rows


def step_costs(statuses: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per live worker, the step-cost law its step budget runs on (``StepBudget.law``);
    a worker whose model is still cold has none."""
    return {str(s.get("worker")): law for s in statuses
            if isinstance(law := s.get("step_cost"), dict)}


def step_budgets(statuses: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per live worker, what its step budget decided last (``StepBudget.state``)."""
    return {str(s.get("worker")): state for s in statuses
            if isinstance(state := s.get("step_budget"), dict)}


def law_line(worker: str, law: dict[str, float]) -> str:
    """One worker's step-cost law in words, for ``carpool tenants tiers``."""
    return (f"worker {worker}: step ~ {law['base_s'] * 1e3:.1f} ms + "
            f"{law['per_row_s'] * 1e3:.2f} ms/row + {law['per_token_s'] * 1e3:.2f} ms/token + "
            f"{law['per_kv_token_s'] * 1e6:.2f} us/context token + "
            f"{law['per_prefill_row_s'] * 1e3:.1f} ms/prompt row ({law['steps']:.0f} steps, "
            f"{law['kv_per_row']:.0f} context tokens a row)")


def budget_line(worker: str, state: dict[str, Any]) -> str:
    """One worker's step budget in words, for ``carpool tenants tiers`` (the cap, target, gain,
    alone bias and backlog of ``StepBudget.state``; not its lower-tier allowances)."""
    def ms(key: str) -> str:
        value = state.get(key)
        return "-" if value is None else f"{value * 1e3:.0f} ms"

    cap = state.get("cap")
    bias = state.get("alone_bias")
    return (f"worker {worker}: interactive TPOT target {ms('target_s')}, cap priced at "
            f"x{state.get('gain', 1.0):.2f} = {ms('cap_target_s')}: "
            + ("no row cap" if cap is None else f"row cap {cap}")
            + ", alone bias " + ("-" if bias is None else f"x{bias:.2f}")
            + (", interactive backlogged (seats owed for every row)"
               if state.get("backlogged") else ""))
