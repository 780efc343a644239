"""The worker's start round trip finds each started request's cancel mark by its position in
the pipeline, whatever the other replies (acks, deletes) are and whether the client decodes
replies to str (real embedded Redis; a recording stub engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.async_engine import AsyncEngine
from gateway.messages import SubmitMsg
from gateway.queues import Envelope
from gateway.worker import Worker
from policies.tiers import TIERS
from tests.gateway.harness import make_config

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
        await client.hset(keys.req(rid), mapping={"state": "queued", "tenant": "t"})
    real_claim = worker.queues.claim_many

    async def claim_then_cancel(*args: Any, **kwargs: Any) -> list[str]:
        res = await real_claim(*args, **kwargs)
        # cancels landing between our claim and the mark lookup
        await client.hset(keys.req("r-gone"), "cancel", "gone")
        await client.hset(keys.req("r-live"), "cancel", "live")
        return res

    worker.queues.claim_many = claim_then_cancel  # type: ignore[method-assign]
    envs = [Envelope(tier, "1-1", None)]  # a deleted entry: acked in the same pipeline
    envs += [Envelope(tier, f"{i + 2}-1", SubmitMsg(rid, "t", tier, 0, [1, 2], 4))
             for i, rid in enumerate(ids)]
    try:
        await worker._start(envs)
        assert engine.added == ids
        assert engine.aborted == ["r-gone", "r-live"]
        assert worker.inflight["r-gone"].reader_gone
        assert not worker.inflight["r-live"].reader_gone
        assert not worker.inflight["r-plain"].reader_gone
    finally:
        await client.delete(*(keys.req(rid) for rid in ids), keys.queue(tier))
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
        await client.hset(keys.req(rid), mapping={"state": "queued", "tenant": "t"})
    envs = [Envelope(tier, "1-1", SubmitMsg("r-bad", "t", tier, 0, [1, 10**6], 4)),
            Envelope(tier, "2-1", SubmitMsg("r-ok", "t", tier, 0, [1, 2], 4))]
    try:
        await worker._start(envs)
        assert list(worker.inflight) == ["r-ok"]
        ((rec, out),) = finished
        assert rec.request_id == "r-bad" and out.finished and out.finish_reason == "error"
        assert "prompt token ids" in (out.error or "")
    finally:
        await client.delete(keys.req("r-bad"), keys.req("r-ok"), keys.queue(tier))
        await client.aclose()
