"""Pacing on the echo gateway (``policies.tenant_pace``): while a light tenant of the tier holds
a row, a heavy tenant over its share starts about one request an engine step, the rest of its
burst stays queued in Redis, and a light request that arrives behind that backlog starts
before the heavy requests queued ahead of it.

Order, not time, is checked: each request's first output is recorded with the engine step it
came in (the echo engine steps every 50 ms here, so a burst paced at one a step takes ~0.7 s
to start, and a request posted meanwhile lands inside it). Why 50 ms: the heavy entries picked
while the late request is on its way count against it, and under load that trip took 3 steps
of 20 ms (a CI run: 8 of 11 behind it, against the 2 steps' slack)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from engine.core.outputs import RequestOutput
from policies.admission import EngineLoad
from tests.gateway.worker.test_fair_drain import tenant_key
from tests.gateway.worker.test_tenant_seats import TIER, not_picked, post

pytestmark = pytest.mark.timeout(90)

BOUND = 32  # heavy is over its share of it (beside light) from 10 rows: 11 > 32 / 3
HEAVY, HEAVY_TOKENS, LIGHT_TOKENS = 24, 30, 80  # heavy rows outlast the pacing (1.5 s)


@pytest.fixture
def slow_echo(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    from tests.gateway.harness import make_config, run_gateway

    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=50.0)
    with run_gateway(config, redis_url) as gw:
        drainer = gw.services.worker.drainer
        drainer.row_limit = lambda: BOUND
        yield gw


def test_a_heavy_burst_is_paced_and_a_light_request_starts_ahead_of_it(
        slow_echo: Any, redis_url: str) -> None:
    gw, ns = slow_echo, slow_echo.config.namespace
    heavy, light = tenant_key(redis_url, ns, "tp-heavy"), tenant_key(redis_url, ns, "tp-light")
    first_step: dict[str, int] = {}
    steps = [0]

    def record(outputs: list[RequestOutput]) -> None:
        steps[0] += 1
        for o in outputs:
            if o.new_token_ids:
                first_step.setdefault(o.request_id, steps[0])

    gw.engine.add_step_callback(record)

    async def go() -> tuple[str, list[str], str, int]:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60,
                                     limits=httpx.Limits(max_connections=100)) as c:
            holder = asyncio.create_task(post(c, light, LIGHT_TOKENS))  # light holds a row
            deadline = time.monotonic() + 30
            while gw.engine.load().num_running < 1:
                assert time.monotonic() < deadline, "the light request did not start"
                await asyncio.sleep(0.01)
            burst = [asyncio.create_task(post(c, heavy, HEAVY_TOKENS)) for _ in range(HEAVY)]
            # heavy past its share (10 rows of its own beside light's), the rest queued
            while gw.engine.load().num_running < 12 and not all(t.done() for t in burst):
                assert time.monotonic() < deadline, "the heavy burst did not start"
                await asyncio.sleep(0.005)
            queued_behind = not_picked(redis_url, ns)  # heavy entries queued ahead of it
            late = await post(c, light, 1)
            return await holder, list(await asyncio.gather(*burst)), late, queued_behind

    holder, heavy_ids, late, queued_behind = asyncio.run(go())
    # paced: a backlog formed in Redis instead of every heavy request starting at once
    assert queued_behind >= 5, queued_behind
    assert first_step[holder] < min(first_step[h] for h in heavy_ids)
    after = [h for h in heavy_ids if first_step[h] > first_step[late]]
    # the late light request went ahead of the heavy entries queued before it (one heavy
    # start may share its step, one more may have been picked while it was posted)
    assert len(after) >= queued_behind - 2, (len(after), queued_behind)
    starts = Counter(first_step[h] for h in heavy_ids)
    over_share_from = sorted(first_step[h] for h in heavy_ids)[10]  # its 11th start
    # about one a step once over its share (two when a pick straddles the step's start)
    assert max(n for s, n in starts.items() if s > over_share_from) <= 2, starts


def test_the_count_restarts_when_the_engine_steps() -> None:
    from gateway.worker.tenant_pace import TenantPace

    step = [7]
    pace = TenantPace(lambda: step[0])
    held = {"heavy": 20, "light": 2}
    assert pace.skip(TIER, held, {}, 32) == frozenset()
    pace.started([(TIER, "heavy"), ("best-effort", "heavy")])
    assert pace.skip(TIER, held, {}, 32) == {"heavy"}
    assert pace.skip("best-effort", {"heavy": 20, "other": 1}, {}, 32) == {"heavy"}
    assert pace.skip("interactive", held, {}, 32) == frozenset()  # counted per tier
    step[0] += 1  # the requests started joined a step: a new one may start
    assert pace.skip(TIER, held, {}, 32) == frozenset()


class _Engine:
    """Room for anything, a fixed step counter (one engine step for the whole test)."""

    class _Stats:
        class scheduler:  # mirrors EngineStats.scheduler
            num_steps = 1

    def has_capacity(self, priority: int) -> bool:
        return True

    def load(self) -> EngineLoad:
        return EngineLoad(0, 0, 0, 1000, 1000, 256, None)

    def stats(self) -> Any:
        return self._Stats()


async def test_a_light_admission_starts_while_only_paced_tenants_are_backlogged(
        redis_url: str) -> None:
    """The heavy tenant (over its share beside light's rows) started its one request of
    this step, and its backlog is all that is queued: the round must still start a light
    request admitted while it waits, not sit out the step until the next poll."""
    from gateway.bus.keys import RedisKeys
    from gateway.bus.messages import SubmitMsg
    from gateway.bus.queues import Envelope, QueueEntries, TierQueues
    from gateway.worker.drainer import Drainer
    from policies.tiers import DEFAULT_TIER_WEIGHTS, TIERS

    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"tp{uuid.uuid4().hex[:8]}")
    entries, queues = QueueEntries(client, keys, None), TierQueues(client, keys, TIERS)
    admit = {"rpm": 0, "tpm": 0, "max_concurrency": 0, "queue_max_len": 1000, "cost": 1,
             "lease_ms": 60_000, "req_ttl_s": 60}

    async def send(tenant: str, rid: str) -> None:
        msg = SubmitMsg(rid, tenant, TIER, 1, [7] * 8, 4)
        assert (await entries.admit(msg, tenant, **admit))[0] == "ok"

    started: list[str] = []

    async def start(envs: list[Envelope]) -> None:
        started.extend(e.msg.request_id for e in envs if e.msg)

    held = [(TIER, "heavy", 1.0)] * 20 + [(TIER, "light", 1.0)] * 2  # heavy over its share
    drainer = Drainer(queues, _Engine(), "w1", DEFAULT_TIER_WEIGHTS, start,  # type: ignore[arg-type]
                      row_limit=lambda: BOUND, held=lambda: held)
    real_wait = queues.wait

    async def wait(tiers: Any, timeout_s: float, consumer: str | None = None) -> str | None:
        await send("light", "l0")  # arrives while the drainer waits
        return await real_wait(tiers, timeout_s, consumer)

    try:
        for i in range(4):
            await send("heavy", f"h{i}")
        await drainer._step()
        assert started == ["h0"]  # its one start of this step
        queues.wait = wait  # type: ignore[method-assign]
        await drainer._step()
        assert started == ["h0", "l0"]
    finally:
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()
