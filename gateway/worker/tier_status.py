"""Tier status: what a worker publishes every second about each tier, for the HTTP edge's early
shedding (``gateway/http/shedding.py``) and for operators (``GET /admin/tiers``,
``carpool tenants tiers``).

Each worker writes one field of the ``tier_status`` hash (``bus/keys.py``), its worker id, with
a JSON object::

    {"worker": id, "ts": unix seconds, "window_s": W, "weights": {tier: weight},
     "tiers": {tier: {"ttft_p99_s": s|null, "tpot_p99_s": s|null (configured, or derived by
                      the step budget), "tpot_source": "configured"|"derived"|null,
                      "tpot_budget_x": the TPOT budget in lone steps, null: the default 1.2,
                      "action": "shed"|"queue", "depth": entries waiting (not yet delivered
                      to any worker), "rate_rps": requests this worker started per second
                      over the last W s, "predicted_wait_s": depth / rate,
                      "tenants": {tenant: entries waiting}}},
     "step_cost": the step budget's fitted law (``StepBudget.law``) | null,
     "step_budget": what the step budget decided last (``StepBudget.state``: row cap, TPOT
                    target, gain, alone bias, backlogged) | null,
     "running": requests the worker runs, "draining": whether it is stopping (it takes no
                new work; ``Worker.drain``)}

A reader ignores a field older than ``STALE_AFTER_S`` (a dead worker's); each publish also
deletes the fields it has seen unchanged for ``2 * STALE_AFTER_S`` on its own monotonic clock
(``liveness.py``: never by comparing another host's stamp with its own clock, which would
delete live workers' statuses when its clock runs ahead), and the hash expires when no worker
publishes. Queue depth is the
queues' (shared by every worker), the rate this worker's own: readers add the workers' rates.
Per-tenant depth is the queues' index of backlogged tenants (``RedisKeys.backlogged``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import orjson

from gateway.bus.client import text
from gateway.bus.keys import RedisKeys
from gateway.bus.outage import UNREACHABLE, ErrorOnce, OutageLog
from gateway.bus.queues import TierQueues
from gateway.config import GatewayConfig
from gateway.worker.liveness import StatusAges
from policies.shedding import predicted_wait
from policies.tiers import INTERACTIVE

if TYPE_CHECKING:  # the HTTP edge and the CLI import this module's reader constants: no engine
    from gateway.worker.step_budget import StepBudget

log = logging.getLogger("carpool.worker")

STATUS_INTERVAL_S = 1.0
RATE_WINDOW_S = 10.0
STALE_AFTER_S = 5.0


class TierStatusPublisher:
    def __init__(self, redis: Any, keys: RedisKeys, queues: TierQueues, config: GatewayConfig,
                 worker_id: str, step_budget: StepBudget | None = None,
                 interval_s: float = STATUS_INTERVAL_S, window_s: float = RATE_WINDOW_S) -> None:
        self.redis = redis
        self.keys = keys
        self.queues = queues
        self.config = config
        self.worker_id = worker_id
        self.step_budget = step_budget
        self.interval_s = interval_s
        self.window_s = window_s
        self._starts: dict[str, deque[float]] = {t: deque() for t in queues.tiers}
        self._since = time.monotonic()
        self._ages = StatusAges()  # the other workers' fields, by when they last changed
        self.running: Callable[[], int] = lambda: 0  # set by the worker
        self.draining: Callable[[], bool] = lambda: False

    def record_start(self, tier: str, now: float | None = None) -> None:
        """A request of ``tier`` was handed to the engine (called by the worker)."""
        starts = self._starts.get(tier)
        if starts is not None:
            starts.append(time.monotonic() if now is None else now)

    def rate(self, tier: str, now: float | None = None) -> float:
        """Requests of ``tier`` started per second over the window (or since start-up)."""
        now = time.monotonic() if now is None else now
        starts = self._starts[tier]
        while starts and starts[0] < now - self.window_s:
            starts.popleft()
        return len(starts) / max(min(self.window_s, now - self._since), self.interval_s)

    async def run(self) -> None:
        """Publish every ``interval_s`` (a worker task); a failed round is logged, not fatal.
        The first publish comes one interval after start-up, once the drainer has had time to
        start what was queued: a rate measured before any start would predict a long wait."""
        errors = ErrorOnce(log)  # another error: its traceback once, not every second
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.publish()
            except UNREACHABLE as exc:  # Redis away: readers see the status go stale, never
                OutageLog.of(log).failed("tier status", exc)  # shed; said once per outage
            except Exception as exc:  # noqa: BLE001  (the publisher must go on)
                errors.failed("tier status publish", exc)
            else:
                errors.ok()

    async def publish(self, now: float | None = None) -> dict[str, Any]:
        """Write this worker's status (``now``: the monotonic clock, for the staleness of
        the other fields)."""
        status = await self.collect()
        raw = await self.redis.hgetall(self.keys.tier_status)
        now = time.monotonic() if now is None else now
        self._ages.observe(raw, now)
        stale = sorted(self._ages.unchanged(now, 2 * STALE_AFTER_S) - {self.worker_id})
        pipe = self.redis.pipeline(transaction=False)
        if stale:
            pipe.hdel(self.keys.tier_status, *stale)
        pipe.hset(self.keys.tier_status, self.worker_id, orjson.dumps(status))
        pipe.pexpire(self.keys.tier_status, int(STALE_AFTER_S * 2000))
        await pipe.execute()
        return status

    async def withdraw(self) -> None:
        """Remove this worker's status (at stop): readers no longer count its rate."""
        await self.redis.hdel(self.keys.tier_status, self.worker_id)

    async def collect(self) -> dict[str, Any]:
        depths = await self.queues.backlogs()
        # the shards holding each tier's entries at this count, taken before any other await:
        # a pick meanwhile may mark a shard empty whose entries it passed over
        busy = {tier: self.queues.view.busy_shards(tier) for tier in self.queues.tiers}
        tiers: dict[str, Any] = {}
        now = time.monotonic()
        for tier in self.queues.tiers:
            slo = self.config.tier_slos[tier]
            depth, rate = depths.get(tier, 0), self.rate(tier, now)
            tpot, source = self._tpot(tier)
            tiers[tier] = {
                "ttft_p99_s": slo.ttft_p99_s, "tpot_p99_s": tpot, "tpot_source": source,
                "tpot_budget_x": slo.tpot_budget_x, "action": slo.action, "depth": depth, "rate_rps": round(rate, 4),
                "predicted_wait_s": round(predicted_wait(depth, rate, self.window_s), 3),
                "tenants": await self.tenant_depths(tier, busy[tier]) if depth else {},
            }
        budget = self.step_budget
        return {"worker": self.worker_id, "ts": time.time(), "window_s": self.window_s,
                "weights": dict(self.config.tier_weights), "tiers": tiers,
                "step_cost": None if budget is None else budget.law,
                "step_budget": None if budget is None else budget.state,
                "running": self.running(), "draining": self.draining()}

    def _tpot(self, tier: str) -> tuple[float | None, str | None]:
        configured = self.config.tier_slos[tier].tpot_p99_s
        if configured is not None:
            return configured, "configured"
        budget = self.step_budget
        if tier == INTERACTIVE and budget is not None and budget.target_s is not None:
            return round(budget.target_s, 4), "derived"
        return None, None

    async def tenant_depths(self, tier: str, shards: Iterable[int]) -> dict[str, int]:
        """Waiting entries per tenant: the tier's index of backlogged tenants (kept by the
        queue scripts, ``bus/queues.py``), read on ``shards`` (those the count the depth comes
        from found with entries of ``tier``)."""
        got = await asyncio.gather(*(self.redis.hgetall(self.keys.backlogged(tier, s))
                                     for s in shards))
        return {text(k): n for raw in got for k, v in raw.items() if (n := int(v)) > 0}
