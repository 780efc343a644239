"""The worker's start round trip finds each started request's cancel mark by its position in
the pipeline, whatever the other replies (acks, deletes) are and whether the client decodes
replies to str (real embedded Redis; a recording stub engine)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.sampling_params import SamplingParams
from engine.frontend.async_engine import AsyncEngine
from engine.frontend.echo import FakeEchoEngine
from engine.runner.loader import load_tokenizer
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg, decode
from gateway.bus.queues import Envelope
from gateway.worker.worker import Worker
from policies.tiers import TIERS
from tests.gateway.harness import make_config
from tests.gateway.queue_helpers import queue_keys
from tests.gateway.worker.writer_helpers import flushed

pytestmark = pytest.mark.timeout(30)


class RecordingEngine:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.aborted: list[str] = []

    def add_request(self, request_id: str, *args: Any, **kwargs: Any) -> None:
        self.added.append(request_id)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


@pytest.mark.parametrize("decode", [False, True])
async def test_cancel_mark_raced_with_claim_aborts(redis_url: str, decode: bool) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=decode)
    engine = RecordingEngine()
    worker = Worker(client, engine, make_config())  # type: ignore[arg-type]
    keys, tier = worker.keys, TIERS[0]
    ids = ["r-plain", "r-gone", "r-live"]
    for rid in ids:
        await client.hset(keys.req(rid, "t"), mapping={"state": "queued", "tenant": "t"})
    real_claim = worker.queues.claim_many

    async def claim_then_cancel(*args: Any, **kwargs: Any) -> list[str]:
        res = await real_claim(*args, **kwargs)
        # cancels landing between our claim and the mark lookup
        await client.hset(keys.req("r-gone", "t"), "cancel", "gone")
        await client.hset(keys.req("r-live", "t"), "cancel", "live")
        return res

    worker.queues.claim_many = claim_then_cancel  # type: ignore[method-assign]
    envs = [Envelope(tier, "1-1", None, "t")]  # a deleted entry: acked in the same pipeline
    envs += [Envelope(tier, f"{i + 2}-1", SubmitMsg(rid, "t", tier, 0, [1, 2], 4), "t")
             for i, rid in enumerate(ids)]
    try:
        # reclaimed entries go into the engine after their claim, so a cancel that landed in
        # between is found by the mark lookup (fresh ones are in ``inflight`` before it)
        await worker._start(envs, reclaim=True)
        assert engine.added == ids
        assert engine.aborted == ["r-gone", "r-live"]
        assert worker.inflight["r-gone"].reader_gone
        assert not worker.inflight["r-live"].reader_gone
        assert not worker.inflight["r-plain"].reader_gone
    finally:
        await client.delete(*(keys.req(rid, "t") for rid in ids), *queue_keys(keys, ("t", "")))
        await client.aclose()


async def test_a_prompt_the_engine_refuses_ends_in_error_and_the_batch_goes_on(
    redis_url: str, tiny_model_dir: Path
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    # the real engine, never started: add_request checks the prompt in the caller
    engine = AsyncEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=16)
    worker = Worker(client, engine, make_config())  # type: ignore[arg-type]
    finished: list[Any] = []
    worker.writer.submit = finished.extend  # type: ignore[method-assign]
    keys, tier = worker.keys, TIERS[0]
    for rid in ("r-bad", "r-ok"):
        await client.hset(keys.req(rid, "t"), mapping={"state": "queued", "tenant": "t"})
    envs = [Envelope(tier, "1-1", SubmitMsg("r-bad", "t", tier, 0, [1, 10**6], 4), "t"),
            Envelope(tier, "2-1", SubmitMsg("r-ok", "t", tier, 0, [1, 2], 4), "t")]
    try:
        await worker._start(envs)
        assert list(worker.inflight) == ["r-ok"]
        ((rec, out),) = finished
        assert rec.request_id == "r-bad" and out.finished and out.finish_reason == "error"
        assert "prompt token ids" in (out.error or "")
    finally:
        await client.delete(keys.req("r-bad", "t"), keys.req("r-ok", "t"), *queue_keys(keys, ("t", "")))
        await client.aclose()


class RecordingEcho(FakeEchoEngine):
    """The echo engine, recording the order requests were added in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started_ids: list[str] = []

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int = 0, first_token_urgent: bool = False) -> None:
        self.started_ids.append(request_id)
        super().add_request(request_id, prompt_token_ids, params, priority, first_token_urgent)


async def test_early_start_writes_nothing_for_a_request_its_claim_does_not_give_us(
    redis_url: str, tiny_model_dir: Path
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    engine = RecordingEcho(load_tokenizer(tiny_model_dir), step_ms=0.0)
    worker = Worker(client, engine, make_config())
    keys, tier = worker.keys, TIERS[0]
    # what the cancel script leaves of a request cancelled while queued (its reader gone)
    await client.hset(keys.req("r-cancelled", "t"),
                      mapping={"state": "cancelled", "tenant": "t", "cancel": "gone"})
    await client.hset(keys.req("r-ok", "t"), mapping={"state": "queued", "tenant": "t"})
    real_claim = worker.queues.claim_many

    async def slow_claim(*args: Any, **kwargs: Any) -> list[str]:
        await asyncio.sleep(0.1)  # the engine runs both requests to their end meanwhile
        return await real_claim(*args, **kwargs)

    worker.queues.claim_many = slow_claim  # type: ignore[method-assign]
    await engine.start()
    engine.add_step_callback(worker._on_step)
    writer = asyncio.create_task(worker.writer.run())
    envs = [Envelope(tier, f"{i + 1}-1", SubmitMsg(rid, "t", tier, 0, [1, 2], 4), "t")
            for i, rid in enumerate(("r-cancelled", "r-ok"))]
    try:
        await worker._start(envs)
        assert engine.started_ids == ["r-cancelled", "r-ok"]  # before the claim answered
        while worker.inflight or engine.load().num_running:
            await asyncio.sleep(0.01)
        await flushed(worker.writer)
        assert not await client.exists(keys.out("r-cancelled", "t"))
        entries: Any = await client.xrange(keys.out("r-ok", "t"))
        msgs = [decode({k.decode(): v for k, v in fields.items()}) for _, fields in entries]
        assert sum(len(m.token_ids) for m in msgs if isinstance(m, TokenMsg)) == 4
        assert isinstance(msgs[-1], FinishMsg) and msgs[-1].finish_reason == "length"
        assert await client.hget(keys.req("r-cancelled", "t"), "state") == b"cancelled"
    finally:
        writer.cancel()
        await engine.shutdown()
        await client.delete(keys.req("r-cancelled", "t"), keys.req("r-ok", "t"), keys.out("r-ok", "t"),
                            *queue_keys(keys), keys.tenant_stats("t"))
        await client.aclose()
