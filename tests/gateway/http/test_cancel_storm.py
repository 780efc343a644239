"""Cancel storm: 40 concurrent streams on the real engine (tiny model, 64 KV blocks, so the
engine is also full and preempting), half disconnected at random points. Afterwards every KV
block is free, nothing is left in Redis, and the other half produced exactly the tokens of an
undisturbed run."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest

from tests.gateway.cancel_helpers import stat, wait_clean, wait_engine_idle
from tests.gateway.harness import make_tenant

pytestmark = pytest.mark.timeout(150)

N = 40
MAX_TOKENS = 40


def prompt(i: int) -> list[int]:
    return [100 + 7 * i + j for j in range(6)]


async def run_stream(client: httpx.AsyncClient, model: str, i: int, stop_after: int | None
                     ) -> tuple[str, bool]:
    """Stream request i; disconnect after ``stop_after`` chunks. Returns (text, finished)."""
    body = {"model": model, "prompt": prompt(i), "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": True}
    text, chunks = [], 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return "".join(text), True
            event = json.loads(line[6:])
            assert "error" not in event, event
            text.append(event["choices"][0]["text"])
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                return "".join(text), False  # closing the response drops the connection
    return "".join(text), False


async def many(url: str, key: str, model: str, plan: dict[int, int | None]) -> dict[int, Any]:
    limits = httpx.Limits(max_connections=N, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=60, limits=limits) as client:
        results = await asyncio.gather(*(run_stream(client, model, i, s) for i, s in plan.items()))
    return dict(zip(plan, results))


def test_cancel_storm(tiny_gateway: Any, redis_url: str) -> None:
    ns, model = tiny_gateway.config.namespace, tiny_gateway.engine.model_name
    key = make_tenant(redis_url, ns, "storm")
    rng = random.Random(4)
    cancelled = set(rng.sample(range(N), N // 2))
    keepers = [i for i in range(N) if i not in cancelled]

    reference = asyncio.run(many(tiny_gateway.url, key, model, {i: None for i in keepers}))
    assert all(done for _, done in reference.values())
    wait_engine_idle(tiny_gateway)
    aborted_before = stat(redis_url, ns, "aborted")

    plan = {i: (rng.randint(1, MAX_TOKENS - 5) if i in cancelled else None) for i in range(N)}
    storm = asyncio.run(many(tiny_gateway.url, key, model, plan))

    load = wait_engine_idle(tiny_gateway, timeout=60)
    assert load.num_free_blocks == load.num_total_blocks == 64
    wait_clean(redis_url, ns, timeout=20)
    for i in keepers:
        assert storm[i] == reference[i], f"request {i} differs from the undisturbed run"
    aborted = stat(redis_url, ns, "aborted") - aborted_before
    assert len(cancelled) // 2 <= aborted <= len(cancelled)
    assert stat(redis_url, ns, "errored") == 0
