"""The drainer with every tier backlogged admits in the WRR mix (6:3:1 by default), and an
empty tier's share goes to the others (real Redis streams, fake echo engine)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from engine.core.outputs import RequestOutput
from gateway.bus.keys import RedisKeys
from policies.tiers import DEFAULT_TIER_WEIGHTS, TIERS
from tests.gateway.harness import make_tenant, redis_sync
from tests.gateway.queue_helpers import queued
from tests.gateway.worker.drainer_hold import drainer_held, start_drainer

pytestmark = pytest.mark.timeout(90)


def backlog(redis_url: str, ns: str) -> int:
    r = redis_sync(redis_url)
    try:
        return sum(queued(r, RedisKeys(ns), t) for t in TIERS)
    finally:
        r.close()


def admitted_mix(gw: Any, redis_url: str, key: str, per_tier: dict[str, int],
                 window: int) -> Counter[str]:
    """Queue ``per_tier`` requests with the drainer held, release it, and count the tiers of
    the first ``window`` requests the engine received (the order of their first outputs: the
    echo engine steps requests in the order they were added)."""
    started: list[str] = []
    recording = True

    def record(outputs: list[RequestOutput]) -> None:
        if recording:
            started.extend(o.request_id for o in outputs if o.new_token_ids)

    gw.engine.add_step_callback(record)
    bodies = [(tier, {"model": "echo", "prompt": "x", "max_tokens": 1, "service_tier": tier})
              for tier, n in per_tier.items() for _ in range(n)]

    async def go() -> dict[str, str]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60,
                                     limits=httpx.Limits(max_connections=len(bodies)),
                                     headers={"Authorization": f"Bearer {key}"}) as c:
            tasks = [asyncio.create_task(c.post("/v1/completions", json=b)) for _, b in bodies]
            deadline = time.monotonic() + 30
            while backlog(redis_url, gw.config.namespace) < len(bodies):
                done = [t.result() for t in tasks if t.done()]
                assert not done, [(r.status_code, r.text[:200]) for r in done]
                assert time.monotonic() < deadline, "requests did not all reach the queues"
                await asyncio.sleep(0.02)
            start_drainer(gw)
            res = await asyncio.gather(*tasks)
        assert all(r.status_code == 200 for r in res)
        return {r.json()["id"]: r.json()["service_tier"] for r in res}

    try:
        with drainer_held(gw):
            tiers_by_id = asyncio.run(go())
    finally:
        recording = False
    order = [rid for rid in started if rid in tiers_by_id]
    assert len(order) == len(bodies)
    return Counter(tiers_by_id[rid] for rid in order[:window])


def test_all_tiers_backlogged_follow_weights(backlog_gateway: Any, redis_url: str) -> None:
    key = make_tenant(redis_url, backlog_gateway.config.namespace, "wrr-all")
    mix = admitted_mix(backlog_gateway, redis_url, key, {t: 40 for t in TIERS}, window=50)
    total = sum(DEFAULT_TIER_WEIGHTS.values())
    for tier, weight in DEFAULT_TIER_WEIGHTS.items():
        assert abs(mix[tier] / 50 - weight / total) <= 0.10, mix


def test_empty_tier_share_goes_to_the_others(backlog_gateway: Any, redis_url: str) -> None:
    key = make_tenant(redis_url, backlog_gateway.config.namespace, "wrr-two")
    mix = admitted_mix(backlog_gateway, redis_url, key, {"batch": 30, "best-effort": 30}, window=40)
    assert abs(mix["batch"] / 40 - 3 / 4) <= 0.10, mix  # 3:1 once interactive is empty
    assert abs(mix["best-effort"] / 40 - 1 / 4) <= 0.10, mix
