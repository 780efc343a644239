"""``Worker.stop`` with requests in flight whose engine outputs have not come back yet (real
Redis; an echo engine that steps only when the test lets it, so the race is pinned down):
  a cancelled request (its cancel mark is in Redis, the engine's abort output never came) is
  finished as an abort, counted aborted, its entry acked;
  one that streamed output and was not cancelled is finished with a worker-lost error;
  one that did neither is left pending, and another worker reclaims it and runs it whole.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.finish import FinishReason
from engine.frontend.echo import FakeEchoEngine
from engine.runner.loader import load_tokenizer
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg, decode
from gateway.bus.queues import QueueEntries
from gateway.http.cancel import Canceller
from gateway.worker.worker import STOPPED_ERROR, Worker
from policies.tiers import TIERS
from tests.gateway.harness import make_config
from tests.gateway.queue_helpers import queue_keys

pytestmark = pytest.mark.timeout(60)
TIER = TIERS[0]
PROMPT = [5, 6, 7]


class SteppedEcho(FakeEchoEngine):
    """The echo engine, taking a step only when the test allows one (``allow``)."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, step_ms=0.0)
        self._allowed = threading.Semaphore(0)

    def allow(self, steps: int = 1) -> None:
        self._allowed.release(steps)

    def _step(self, active: Any, seconds: float) -> None:  # on the step thread
        while not self._allowed.acquire(timeout=0.05):
            if self._stop.is_set():
                return
        super()._step(active, seconds)


@pytest.fixture
async def env(redis_url: str, tiny_model_dir: Path) -> AsyncIterator[dict[str, Any]]:
    client: Any = aioredis.Redis.from_url(redis_url)
    config = make_config()
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = SteppedEcho(tokenizer)
    worker = Worker(client, engine, config)
    stopped: list[Any] = []
    try:
        yield {"client": client, "config": config, "tokenizer": tokenizer, "engine": engine,
               "worker": worker, "keys": RedisKeys(config.namespace), "stopped": stopped}
    finally:
        for w in [worker, *stopped]:
            await w.stop()
            await w.engine.shutdown()
        keys = RedisKeys(config.namespace)
        await client.delete(keys.tenant_stats("t"), keys.concurrency("t"), *queue_keys(keys))
        await client.aclose()


async def submit(env: dict[str, Any], rid: str, max_tokens: int) -> None:
    entries = QueueEntries(env["client"], env["keys"], None)
    status, *_ = await entries.admit(SubmitMsg(rid, "t", TIER, 0, PROMPT, max_tokens), "t",
                                    rpm=0, tpm=0, max_concurrency=0, queue_max_len=10, cost=5,
                                    lease_ms=60_000, req_ttl_s=60)
    assert status == "ok"


async def until(predicate: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def running(env: dict[str, Any], rid: str) -> None:
    """Until the worker runs ``rid`` (in the engine, its claim answered)."""
    worker = env["worker"]

    async def owned() -> bool:
        rec = worker.inflight.get(rid)
        return rec is not None and rec.owned

    await until(owned, f"{rid} never started")


async def output(env: dict[str, Any], rid: str) -> list[Any]:
    return [decode(f) for _, f in await env["client"].xrange(env["keys"].out(rid, "t"))]


async def stat(env: dict[str, Any], name: str) -> int:
    return int(await env["client"].hget(env["keys"].tenant_stats("t"), name) or 0)


async def test_a_cancelled_request_whose_abort_output_has_not_come_is_finished_aborted(
        env: dict[str, Any]) -> None:
    client, keys, engine = env["client"], env["keys"], env["engine"]
    await env["worker"].start()
    await submit(env, "c1", 10)
    await running(env, "c1")
    engine.allow(1)  # one token streamed: 'sent' is set

    async def sent() -> bool:
        return await client.hget(keys.req("c1", "t"), "sent") is not None

    await until(sent, "the first token was never written")
    canceller = Canceller(client, keys, 60)
    assert await canceller.cancel("c1", "t", reader_gone=False, reason="explicit") == "running"
    await env["worker"].stop()  # the engine never steps again: no abort output comes
    got = await output(env, "c1")
    assert isinstance(got[0], TokenMsg)
    assert isinstance(got[-1], FinishMsg) and got[-1].finish_reason == FinishReason.ABORT
    assert await stat(env, "aborted") == 1 and await stat(env, "errored") == 0
    assert await client.xlen(keys.queue(TIER, "t")) == 0  # acked, not left for a reclaim


async def test_a_cancelled_request_that_streamed_nothing_is_finished_at_stop(
        env: dict[str, Any]) -> None:
    """Its reader is gone: nothing is written for it, yet it is acked and counted at once
    instead of staying in the queue until some worker reclaims it."""
    client, keys = env["client"], env["keys"]
    await env["worker"].start()
    await submit(env, "c2", 10)
    await running(env, "c2")
    assert await Canceller(client, keys, 60).cancel("c2", "t", True, "disconnect") == "running"
    await env["worker"].stop()
    assert await client.xlen(keys.queue(TIER, "t")) == 0
    assert not await client.exists(keys.out("c2", "t"))
    assert await stat(env, "aborted") == 1


async def test_a_request_that_streamed_output_is_finished_with_a_worker_lost_error(
        env: dict[str, Any]) -> None:
    client, keys, engine = env["client"], env["keys"], env["engine"]
    await env["worker"].start()
    await submit(env, "s1", 10)
    await running(env, "s1")
    engine.allow(1)

    async def sent() -> bool:
        return await client.hget(keys.req("s1", "t"), "sent") is not None

    await until(sent, "the first token was never written")
    await env["worker"].stop()
    got = await output(env, "s1")
    assert isinstance(got[-1], FinishMsg) and got[-1].finish_reason == FinishReason.ERROR
    assert got[-1].error == STOPPED_ERROR
    assert await stat(env, "errored") == 1
    assert await client.xlen(keys.queue(TIER, "t")) == 0


async def test_a_request_that_streamed_nothing_is_left_pending_and_another_worker_runs_it(
        env: dict[str, Any]) -> None:
    client, keys = env["client"], env["keys"]
    await env["worker"].start()
    await submit(env, "p1", 4)
    await running(env, "p1")
    await env["worker"].stop()
    queue = keys.queue(TIER, "t")
    assert await client.xlen(queue) == 1
    assert (await client.xpending(queue, GROUP))["pending"] == 1  # the stopped worker's
    assert not await client.exists(keys.out("p1", "t"))
    # Another worker, whose maintenance reclaims entries idle for 0.3 s (every 0.1 s).
    config = make_config(namespace=env["config"].namespace, visibility_timeout_s=0.3)
    other = Worker(client, FakeEchoEngine(env["tokenizer"], step_ms=0.0), config)
    env["stopped"].append(other)
    await other.start()

    async def acked() -> bool:
        return await client.xlen(queue) == 0

    await until(acked, "no worker ran the pending request")
    got = await output(env, "p1")
    tokens = [t for m in got if isinstance(m, TokenMsg) for t in m.token_ids]
    assert tokens == [PROMPT[i % len(PROMPT)] for i in range(4)]  # run once, from the start
    assert isinstance(got[-1], FinishMsg) and got[-1].finish_reason == FinishReason.LENGTH
    assert await stat(env, "completed") == 1

