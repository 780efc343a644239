"""The test-side drainer hold (``drainer_hold.HeldWorker``) against real Redis and the echo
engine, as the tests that rely on it need it: once ``hold`` returns the drainer takes nothing
from the queues (a blocking read in flight when it was called has been handled, so an entry
queued right after stays queued and unread); ``release`` runs it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.frontend.echo import FakeEchoEngine
from engine.runner.loader import load_tokenizer
from gateway.bus.keys import GROUP
from gateway.bus.messages import FinishMsg, SubmitMsg, decode
from gateway.bus.queues import QueueEntries
from policies.tiers import TIERS
from tests.gateway.harness import make_config
from tests.gateway.worker.drainer_hold import HeldWorker

pytestmark = pytest.mark.timeout(30)


async def test_a_held_drainer_takes_nothing_until_released(
    redis_url: str, tiny_model_dir: Path
) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    engine = FakeEchoEngine(load_tokenizer(tiny_model_dir), step_ms=0.0)
    worker = HeldWorker(client, engine, make_config())
    keys, tier = worker.keys, TIERS[0]
    queue = keys.queue(tier, "t")
    entries = QueueEntries(client, keys, None)
    started: list[str] = []
    real_add = engine.add_request

    def add_request(request_id: str, *args: Any, **kwargs: Any) -> None:
        started.append(request_id)
        real_add(request_id, *args, **kwargs)

    engine.add_request = add_request  # type: ignore[method-assign]
    await worker.start()
    try:
        await asyncio.sleep(0.05)  # the idle drainer now waits in a blocking read
        await worker.drainer.hold()
        msg = SubmitMsg("p1", "t", tier, 0, [1, 2], 3)
        status, *_ = await entries.admit(msg, "t", rpm=0, tpm=0, max_concurrency=0,
                                        queue_max_len=10, cost=5, lease_ms=60_000, req_ttl_s=60)
        assert status == "ok"
        await asyncio.sleep(0.5)  # longer than a blocking read (200 ms)
        assert await client.xlen(queue) == 1
        assert (await client.xpending(queue, GROUP))["pending"] == 0  # delivered to nobody
        assert started == []

        worker.drainer.release()
        deadline = time.monotonic() + 10
        while await client.xlen(queue):  # acked and deleted once finished
            assert time.monotonic() < deadline, "the released drainer never started p1"
            await asyncio.sleep(0.02)
        assert started == ["p1"]
        out = [decode(f) for _, f in await client.xrange(keys.out("p1", "t"))]
        assert isinstance(out[-1], FinishMsg) and out[-1].completion_tokens == 3
    finally:
        await worker.stop()
        await engine.shutdown()
        await client.delete(queue, keys.req("p1", "t"), keys.out("p1", "t"), keys.tenant_stats("t"),
                            keys.concurrency("t"))
        await client.aclose()


async def test_holding_the_drainer_of_a_worker_not_started_returns_at_once(redis_url: str,
                                                                   tiny_model_dir: Path) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    engine = FakeEchoEngine(load_tokenizer(tiny_model_dir), step_ms=0.0)
    worker = HeldWorker(client, engine, make_config())
    try:
        async with asyncio.timeout(1):
            await worker.drainer.hold()
        worker.drainer.release()
    finally:
        await worker.stop()
        await client.aclose()
