"""Tenant seats on the echo gateway: with a batch bound, a heavy tenant's overload stays
queued in Redis (the engine holds at most the bound minus the tenant reserve of its rows),
and a light tenant of the same tier that arrives while the heavy requests fill the batch
starts at once, on a reserved seat, not after a heavy request finishes.

Order, not time, is checked: the engine's step outputs are recorded in order, and each light
request must finish before the first heavy request does (the heavy ones run 600 steps each)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.core.outputs import RequestOutput
from gateway.bus.keys import RedisKeys
from policies.tenant_seats import tenant_reserve
from tests.gateway.harness import redis_sync
from tests.gateway.queue_helpers import pending, queued
from tests.gateway.worker.test_fair_drain import tenant_key

pytestmark = pytest.mark.timeout(90)

TIER = "batch"
BOUND = 8
HEAVY, HEAVY_TOKENS, LIGHT = 12, 600, 3


def not_picked(redis_url: str, ns: str) -> int:
    """Entries of the tier no worker has taken yet."""
    r = redis_sync(redis_url)
    try:
        return queued(r, RedisKeys(ns), TIER) - pending(r, RedisKeys(ns), TIER)
    finally:
        r.close()


async def post(c: httpx.AsyncClient, key: str, tokens: int, tier: str = TIER) -> str:
    """One completion of ``tier`` for the tenant of ``key``; its id."""
    r = await c.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                     json={"model": "echo", "prompt": "x y z", "max_tokens": tokens,
                           "service_tier": tier})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def finish_order(gw: Any) -> list[str]:
    """The ids of the gateway's requests in the order the engine finishes them."""
    finished: list[str] = []

    def record(outputs: list[RequestOutput]) -> None:
        finished.extend(o.request_id for o in outputs if o.finished)

    gw.engine.add_step_callback(record)
    return finished


async def start_heavy(c: httpx.AsyncClient, gw: Any, key: str, held: int
                      ) -> list[asyncio.Task[str]]:
    """HEAVY long requests of the tenant of ``key``, once ``held`` of them run."""
    calls = [asyncio.create_task(post(c, key, HEAVY_TOKENS)) for _ in range(HEAVY)]
    deadline = time.monotonic() + 30
    while gw.engine.load().num_running < held:
        assert time.monotonic() < deadline, "heavy requests did not start"
        await asyncio.sleep(0.01)
    return calls


def assert_light_first(finished: list[str], light_ids: list[str], heavy_ids: list[str]) -> None:
    first_heavy = min(finished.index(h) for h in heavy_ids)
    assert all(finished.index(rid) < first_heavy for rid in light_ids), (
        "a light request waited for a heavy one to finish")


@pytest.fixture
def bounded(echo_gateway: Any) -> Iterator[Any]:
    drainer = echo_gateway.services.worker.drainer
    plain = drainer.row_limit
    drainer.row_limit = lambda: BOUND
    try:
        yield echo_gateway
    finally:
        drainer.row_limit = plain


def test_a_light_tenant_gets_a_reserved_seat_beside_a_heavy_one(bounded: Any,
                                                               redis_url: str) -> None:
    gw, ns = bounded, bounded.config.namespace
    heavy, light = tenant_key(redis_url, ns, "ts-heavy"), tenant_key(redis_url, ns, "ts-light")
    finished = finish_order(gw)
    held = BOUND - tenant_reserve(BOUND)

    async def go() -> tuple[list[str], list[str], list[int]]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
            heavy_calls = await start_heavy(c, gw, heavy, held)
            running = []
            for _ in range(5):  # the rest of heavy's overload waits in Redis
                running.append(gw.engine.load().num_running)
                assert not_picked(redis_url, ns) == HEAVY - held
                await asyncio.sleep(0.02)
            light_ids = [await post(c, light, 1) for _ in range(LIGHT)]
            return light_ids, list(await asyncio.gather(*heavy_calls)), running

    light_ids, heavy_ids, running = asyncio.run(go())
    assert running == [held] * 5  # the bound minus the reserve, not every free seat
    assert_light_first(finished, light_ids, heavy_ids)


def test_a_light_tenant_starts_when_the_bound_falls_under_the_heavy_rows(
        bounded: Any, redis_url: str) -> None:
    """The bound is refitted from the steps and can fall under the rows held; the heavy
    tenant's rows leave only as they finish (600 steps each). The light tenant, under its
    share, still starts at once: before, a limit at or under the rows held closed the tier
    to everyone until heavy requests finished."""
    gw, ns = bounded, bounded.config.namespace
    heavy, light = tenant_key(redis_url, ns, "tb-heavy"), tenant_key(redis_url, ns, "tb-light")
    finished = finish_order(gw)
    held = BOUND - tenant_reserve(BOUND)
    drainer = gw.services.worker.drainer

    async def go() -> tuple[list[str], list[str], int]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
            heavy_calls = await start_heavy(c, gw, heavy, held)
            drainer.row_limit = lambda: held // 2  # the bound falls under heavy's rows
            light_ids = [await post(c, light, 1) for _ in range(LIGHT)]
            left = not_picked(redis_url, ns)  # heavy's overload, still queued
            return light_ids, list(await asyncio.gather(*heavy_calls)), left

    light_ids, heavy_ids, left = asyncio.run(go())
    assert left == HEAVY - held  # heavy started nothing past the fallen bound
    assert_light_first(finished, light_ids, heavy_ids)


def test_the_light_tenants_requests_start_with_their_first_token_urgent(
        bounded: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker marks for the engine a request of a tenant under its share while another
    tenant of its tier is over it (``policies.tenant_seats.first_token_urgent``): every light
    request beside the heavy batch, no heavy one."""
    gw, ns = bounded, bounded.config.namespace
    heavy, light = tenant_key(redis_url, ns, "tf-heavy"), tenant_key(redis_url, ns, "tf-light")
    marks: dict[str, bool] = {}
    add = gw.engine.add_request

    def recording(request_id: str, *args: Any, first_token_urgent: bool = False,
                  **kwargs: Any) -> None:
        marks[request_id] = first_token_urgent
        add(request_id, *args, first_token_urgent=first_token_urgent, **kwargs)

    monkeypatch.setattr(gw.engine, "add_request", recording)

    async def go() -> tuple[list[str], list[str]]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
            heavy_calls = await start_heavy(c, gw, heavy, BOUND - tenant_reserve(BOUND))
            light_ids = [await post(c, light, 1) for _ in range(LIGHT)]
            return light_ids, list(await asyncio.gather(*heavy_calls))

    light_ids, heavy_ids = asyncio.run(go())
    assert [marks[rid] for rid in light_ids] == [True] * LIGHT
    assert not any(marks[rid] for rid in heavy_ids)
