"""The worker's tier status publisher against real Redis: the start rate over its window (vs
counting the starts in the window), what one publish writes (objectives as configured, the
TPOT target the step budget derived, depth 0 on empty queues), dead workers' statuses
(unchanged for long, whatever their clocks) removed, its own withdrawn at stop; the HTTP edge's reader merges live statuses."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from engine.frontend.echo import FakeEchoEngine
from engine.runner.loader import load_tokenizer
from gateway.bus.keys import RedisKeys
from gateway.bus.queues import TierQueues
from gateway.http.shedding import live_statuses, merge_loads, step_costs
from gateway.worker.step_budget import StepBudget
from gateway.worker.tier_status import STALE_AFTER_S, TierStatusPublisher
from policies.tiers import BATCH, INTERACTIVE, TIERS, TierSLO
from tests.gateway.harness import make_config

pytestmark = pytest.mark.timeout(30)


def publisher(client: Any, budget: StepBudget | None = None, **config: Any
              ) -> TierStatusPublisher:
    cfg = make_config(**config)
    keys = RedisKeys(cfg.namespace)
    return TierStatusPublisher(client, keys, TierQueues(client, keys, TIERS), cfg, "w1",
                               budget, window_s=10.0)


async def test_rate_counts_the_starts_inside_the_window(redis_url: str) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    pub = publisher(client)
    t0 = time.monotonic()
    pub._since = t0 - 100  # up long enough for a full window
    rng = random.Random(4)
    starts = sorted(t0 + rng.uniform(0, 30) for _ in range(60))
    recorded: list[float] = []
    for now in (t0 + 5, t0 + 12, t0 + 20.5, t0 + 31, t0 + 45):
        for s in [s for s in starts if s <= now and s not in recorded]:
            pub.record_start(BATCH, s)
            recorded.append(s)
        expected = sum(1 for s in recorded if now - 10.0 <= s <= now) / 10.0
        assert pub.rate(BATCH, now) == pytest.approx(expected)
    assert pub.rate(INTERACTIVE, t0 + 45) == 0.0
    await client.aclose()


async def test_publish_writes_objectives_and_drops_dead_workers(
        redis_url: str, tiny_model_dir: Path) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    budget = StepBudget(FakeEchoEngine(load_tokenizer(tiny_model_dir)))
    budget.target_s = 0.123  # as the step budget derives it once it has steps
    budget.law = {"base_s": 0.02, "per_row_s": 0.003, "steps": 64.0}  # and fits its law
    budget.gain, budget.cap_target_s = 0.8, 0.0984  # and what it decided, applied
    budget._set(7, None)
    pub = publisher(client, budget, tier_slos={INTERACTIVE: TierSLO(2.0, None, "shed"),
                                               BATCH: TierSLO(60.0, 0.5)})
    key = pub.keys.tier_status
    # "dead" stops changing; "ahead" keeps republishing with a clock a minute ahead (the
    # old wall-clock check deleted what looked stale: neither, or a live worker's status)
    dead = {"worker": "dead", "ts": time.time(), "tiers": {}}
    await client.hset(key, "dead", orjson.dumps(dead))
    for t in (0.0, STALE_AFTER_S, 2 * STALE_AFTER_S + 1):
        ahead = {"worker": "ahead", "ts": time.time() + 60 + t, "tiers": {}}
        await client.hset(key, "ahead", orjson.dumps(ahead))
        status = await pub.publish(now=t)
        stored = await client.hgetall(key)
        kept = {b"w1", b"ahead"} | ({b"dead"} if t <= 2 * STALE_AFTER_S else set())
        assert set(stored) == kept, t
    assert orjson.loads(stored[b"w1"]) == status
    await client.hdel(key, "ahead")
    inter, batch = status["tiers"][INTERACTIVE], status["tiers"][BATCH]
    assert (inter["ttft_p99_s"], inter["tpot_p99_s"], inter["tpot_source"], inter["action"]) \
        == (2.0, 0.123, "derived", "shed")
    assert (batch["ttft_p99_s"], batch["tpot_p99_s"], batch["tpot_source"], batch["action"]) \
        == (60.0, 0.5, "configured", "queue")
    assert all(t["depth"] == 0 and t["tenants"] == {} for t in status["tiers"].values())
    assert status["step_cost"] == budget.law
    assert status["step_budget"] == {
        "cap": 7, "target_s": 0.123, "gain": 0.8, "cap_target_s": 0.0984, "alone_bias": None,
        "backlogged": False, "lower_prefill_tokens": None, "row_limit": None}
    assert step_costs(live_statuses(await client.hgetall(key), time.time())) == {
        "w1": budget.law}
    assert 0 < await client.pttl(key) <= STALE_AFTER_S * 2000
    await pub.withdraw()
    assert await client.hgetall(key) == {}
    await client.aclose()


def test_reader_adds_live_rates_and_takes_the_freshest_depth() -> None:
    now = time.time()

    def status(worker: str, age: float, depth: int, rate: float) -> bytes:
        return orjson.dumps({"worker": worker, "ts": now - age, "window_s": 10.0, "tiers": {
            BATCH: {"depth": depth, "rate_rps": rate, "tenants": {"a": depth}}}})

    raw = {b"w1": status("w1", 0.5, 7, 1.0), b"w2": status("w2", 0.1, 6, 2.0),
           b"old": status("old", STALE_AFTER_S + 1, 99, 50.0), b"bad": b"{"}
    live = live_statuses(raw, now)
    assert [s["worker"] for s in live] == ["w2", "w1"]
    load = merge_loads(live)[BATCH]
    assert (load.depth, load.rate_rps, dict(load.tenant_depth)) == (6, 3.0, {"a": 6})
    assert load.predicted_wait_s == pytest.approx(6 / 3.0)
    assert merge_loads(live_statuses({b"old": raw[b"old"]}, now)) == {}


async def test_a_publish_that_keeps_failing_logs_its_traceback_once(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Not an outage (the status hash has the wrong type): the loop goes on, and says so once
    with its traceback, not every second."""
    client: Any = aioredis.Redis.from_url(redis_url)
    pub = publisher(client)
    pub.interval_s = 0.01
    tries = 0
    real_publish = pub.publish

    async def counted() -> dict[str, Any]:
        nonlocal tries
        tries += 1
        return await real_publish()

    pub.publish = counted  # type: ignore[method-assign]
    await client.set(pub.keys.tier_status, "not a hash")
    task = asyncio.create_task(pub.run())
    try:
        while tries < 5 and not task.done():
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await client.delete(pub.keys.tier_status)
        await client.aclose()
    tracebacks = [r for r in caplog.records if r.name == "carpool.worker" and r.exc_info]
    assert tries >= 5 and len(tracebacks) == 1 and "WRONGTYPE" in tracebacks[0].getMessage()
