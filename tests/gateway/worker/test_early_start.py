"""Early start (``Worker._start_early``): fresh entries go into the engine before their claim
answers. Whatever happens to the claim, no request's outputs are held for good, and other
requests' outputs are never held behind it (real embedded Redis; a stub engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.outputs import RequestOutput
from gateway.bus.messages import SubmitMsg
from gateway.bus.queues import Envelope
from gateway.worker.worker import Worker
from gateway.worker.writer import Inflight
from policies.tiers import TIERS
from tests.gateway.harness import make_config
from tests.gateway.queue_helpers import queue_keys
from tests.gateway.worker.writer_helpers import flushed

pytestmark = pytest.mark.timeout(30)
TIER = TIERS[0]


class StubEngine:
    def __init__(self, explode_on: str | None = None) -> None:
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.explode_on = explode_on

    def add_request(self, request_id: str, *args: Any, **kwargs: Any) -> None:
        if request_id == self.explode_on:
            raise RuntimeError("engine hiccup")
        if request_id in self.added:
            raise ValueError(f"duplicate request id {request_id!r}")
        self.added.append(request_id)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def load(self) -> Any:
        return None


def out(rid: str, finished: bool) -> RequestOutput:
    return RequestOutput(rid, [5], "x", finished, "length" if finished else None, 2, 1)


def envelopes(*ids: str) -> list[Envelope]:
    return [Envelope(TIER, f"{i + 1}-1", SubmitMsg(rid, "t", TIER, 0, [1, 2], 4), "t")
            for i, rid in enumerate(ids)]


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Any]:
    c = aioredis.Redis.from_url(redis_url)
    try:
        yield c
    finally:
        await c.aclose()


async def make_worker(client: Any, engine: StubEngine, *queued: str) -> Worker:
    worker = Worker(client, engine, make_config())  # type: ignore[arg-type]
    for rid in queued:
        await client.hset(worker.keys.req(rid, "t"), mapping={"state": "queued", "tenant": "t"})
    return worker


async def written(client: Any, key: str) -> None:
    async with asyncio.timeout(5):
        while not await client.exists(key):
            await asyncio.sleep(0.01)


async def cleanup(client: Any, worker: Worker, *ids: str) -> None:
    keys = worker.keys
    await client.delete(*(keys.req(r, "t") for r in ids), *(keys.out(r, "t") for r in ids),
                        *queue_keys(keys, ("t", "")), keys.tenant_stats("t"))


async def test_an_engine_failure_while_starting_early_leaves_no_claim_open(client: Any) -> None:
    engine = StubEngine(explode_on="r-2")
    worker = await make_worker(client, engine, "r-1", "r-2", "other")
    worker.inflight["other"] = Inflight("other", TIER, "9-1", tenant="t")  # claimed long ago
    writer = asyncio.create_task(worker.writer.run())
    try:
        with pytest.raises(RuntimeError):
            await worker._start(envelopes("r-1", "r-2"))
        assert engine.aborted == ["r-1"]  # started early, then left for a reclaim
        assert set(worker.inflight) == {"r-1", "other"}  # r-2 never reached the engine
        worker._on_step([out("r-1", True), out("other", True)])
        await written(client, worker.keys.out("other", "t"))
        await flushed(worker.writer)
        assert not await client.exists(worker.keys.out("r-1", "t"))
    finally:
        writer.cancel()
        await cleanup(client, worker, "r-1", "r-2", "other")


async def test_a_pending_claim_holds_only_its_own_outputs(client: Any) -> None:
    worker = await make_worker(client, StubEngine(), "r-new", "other")
    worker.inflight["other"] = Inflight("other", TIER, "9-1", tenant="t")
    answer = asyncio.Event()
    real_claim = worker.queues.claim_many

    async def held_claim(*args: Any, **kwargs: Any) -> list[str]:
        await answer.wait()  # a Redis latency spike on the drainer's connection
        return await real_claim(*args, **kwargs)

    worker.queues.claim_many = held_claim  # type: ignore[method-assign]
    writer = asyncio.create_task(worker.writer.run())
    try:
        start = asyncio.create_task(worker._start(envelopes("r-new")))
        await asyncio.sleep(0.01)
        worker._on_step([out("r-new", False), out("other", False)])
        await written(client, worker.keys.out("other", "t"))  # not held behind r-new's claim
        assert not await client.exists(worker.keys.out("r-new", "t"))
        answer.set()
        await start
        await written(client, worker.keys.out("r-new", "t"))  # parked, then written
    finally:
        writer.cancel()
        await cleanup(client, worker, "r-new", "other")


async def test_outputs_arriving_while_a_claim_is_pending_are_never_dropped(client: Any) -> None:
    worker = await make_worker(client, StubEngine())
    writer, loop = worker.writer, asyncio.get_running_loop()
    a = Inflight("a", TIER, "1-1", claim=loop.create_future(), tenant="t")
    b = Inflight("b", TIER, "2-1", claim=loop.create_future(), tenant="t")
    for rid in ("a", "b"):
        await client.hset(worker.keys.req(rid, "t"), mapping={"state": "running"})
    task = asyncio.create_task(writer.run())
    try:
        writer.submit([(a, out("a", False))])
        await asyncio.sleep(0.02)
        writer.submit([(b, out("b", True))])
        a.claim.set_result("run")  # type: ignore[union-attr]
        await asyncio.sleep(0.02)
        b.claim.set_result("run")  # type: ignore[union-attr]
        await written(client, worker.keys.out("b", "t"))
        await written(client, worker.keys.out("a", "t"))
    finally:
        task.cancel()
        await cleanup(client, worker, "a", "b")


async def test_a_second_entry_of_one_request_leaves_the_first_running(client: Any) -> None:
    engine = StubEngine()
    worker = await make_worker(client, engine, "dup")
    try:
        await worker._start(envelopes("dup", "dup"))
        assert engine.added == ["dup"] and engine.aborted == []
        assert "dup" in worker.inflight and worker.inflight["dup"].owned
    finally:
        await cleanup(client, worker, "dup")


async def test_a_reclaimed_request_with_two_entries_runs_once(client: Any) -> None:
    engine = StubEngine()
    worker = await make_worker(client, engine, "dup")
    try:
        await worker._start(envelopes("dup", "dup"), reclaim=True)
        assert engine.added == ["dup"] and engine.aborted == []
        assert "dup" in worker.inflight
    finally:
        await cleanup(client, worker, "dup")
