"""Fair queuing inside a tier on the echo gateway: a light tenant's requests are not stuck
behind a heavy tenant's backlog in the same tier, and backlogged tenants' shares follow their
weights. Requests are queued with the drainer held, then released; the order the engine
started them in is read from their first outputs (the echo engine steps requests in the
order they were added)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from engine.core.outputs import RequestOutput
from gateway.bus.keys import RedisKeys
from gateway.tenancy.tenants import Tenant
from policies.tiers import TIERS
from tests.gateway.harness import redis_sync, store_for
from tests.gateway.queue_helpers import queued
from tests.gateway.worker.drainer_hold import drainer_held, start_drainer

pytestmark = pytest.mark.timeout(90)

TIER = "batch"


def tenant_key(redis_url: str, namespace: str, tenant_id: str, weight: float = 1.0) -> str:
    async def go() -> str:
        client, store = store_for(redis_url, namespace)
        try:
            await store.put(Tenant(tenant_id, tenant_id, weight=weight))
            return (await store.issue_key(tenant_id))[0]
        finally:
            await client.aclose()

    return asyncio.run(go())


def backlog(redis_url: str, ns: str) -> int:
    r = redis_sync(redis_url)
    try:
        return sum(queued(r, RedisKeys(ns), t) for t in TIERS)
    finally:
        r.close()


def start_order(gw: Any, redis_url: str, waves: list[tuple[str, int]]) -> list[str]:
    """Queue each wave (an API key, a number of requests) in turn with the drainer held,
    then release it; the tenant of each request in the order the engine started them."""
    started: list[str] = []

    def record(outputs: list[RequestOutput]) -> None:
        started.extend(o.request_id for o in outputs if o.new_token_ids)

    gw.engine.add_step_callback(record)
    body = {"model": "echo", "prompt": "x", "max_tokens": 1, "service_tier": TIER}

    async def go() -> dict[str, str]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60,
                                     limits=httpx.Limits(max_connections=200)) as c:
            tasks: list[tuple[str, asyncio.Task[httpx.Response]]] = []
            for key, n in waves:  # each wave fully queued before the next: arrival order
                auth = {"Authorization": f"Bearer {key}"}
                tasks += [(key, asyncio.create_task(c.post("/v1/completions", json=body,
                                                           headers=auth))) for _ in range(n)]
                deadline = time.monotonic() + 30
                while backlog(redis_url, gw.config.namespace) < len(tasks):
                    done = [t.result() for _, t in tasks if t.done()]
                    assert not done, [(r.status_code, r.text[:200]) for r in done]
                    assert time.monotonic() < deadline, "requests did not all reach the queue"
                    await asyncio.sleep(0.02)
            start_drainer(gw)
            res = [(key, await t) for key, t in tasks]
        assert all(r.status_code == 200 for _, r in res)
        return {r.json()["id"]: key for key, r in res}

    with drainer_held(gw):
        key_by_id = asyncio.run(go())
    order = [key_by_id[rid] for rid in started if rid in key_by_id]
    assert len(order) == len(key_by_id)
    return order


def test_a_light_tenant_is_not_queued_behind_a_heavy_backlog(backlog_gateway: Any,
                                                             redis_url: str) -> None:
    ns = backlog_gateway.config.namespace
    heavy, light = tenant_key(redis_url, ns, "fq-heavy"), tenant_key(redis_url, ns, "fq-light")
    order = start_order(backlog_gateway, redis_url, [(heavy, 40), (light, 4)])
    positions = [i for i, key in enumerate(order) if key == light]
    # first come, first served would start them 41st to 44th; the fair pick alternates the
    # two tenants (equal costs): the light ones go within the first picks
    assert positions and max(positions) <= 10, positions


def test_backlogged_tenants_share_by_weight(backlog_gateway: Any, redis_url: str) -> None:
    ns = backlog_gateway.config.namespace
    big = tenant_key(redis_url, ns, "fq-w3", weight=3.0)
    small = tenant_key(redis_url, ns, "fq-w1", weight=1.0)
    order = start_order(backlog_gateway, redis_url, [(small, 40), (big, 40)])
    first = order[:40]
    assert abs(first.count(big) / 40 - 3 / 4) <= 0.1, first.count(big)
