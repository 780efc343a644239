"""The per-step writer against real embedded Redis: one call per step for every request, the
stream TTL set on first write and refreshed only when it ran low (also after a reader's DEL
recreated the stream), nothing written for a gone reader, and a finish that writes the last
tokens with the finish event, acks and deletes the queue entry and counts the outcome."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.outputs import RequestOutput
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import FinishMsg, TokenMsg, decode
from gateway.bus.queues import TierQueues
from gateway.worker.writer import Inflight
from policies.tiers import TIERS
from tests.gateway.queue_helpers import queue_keys
from tests.gateway.worker.writer_helpers import CountingWriter, flushed

pytestmark = pytest.mark.timeout(30)
TTL = 600


@pytest.fixture
async def setup(redis_url: str) -> AsyncIterator[tuple[Any, RedisKeys, CountingWriter]]:
    client = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"ow{uuid.uuid4().hex[:8]}")
    try:
        yield client, keys, CountingWriter(client, keys, stream_ttl_s=TTL)
    finally:
        await client.delete(keys.tenant_stats("t"), *queue_keys(keys))
        await client.aclose()


def tok(rid: str, token: int, text: str, n: int) -> RequestOutput:
    return RequestOutput(rid, [token], text, False, None, 3, n)


async def entries(client: Any, key: str) -> list[Any]:
    return [decode(fields) for _, fields in await client.xrange(key)]


async def test_one_call_per_step_and_ttl_set_once(setup: Any) -> None:
    client, keys, writer = setup
    a, b = Inflight("a", TIERS[0], "0-1", tenant="t"), Inflight("b", TIERS[0], "0-2", tenant="t")
    await writer._write([(a, tok("a", 7, "x", 1)), (b, tok("b", 8, "y", 1))])
    assert writer.writes == 1
    assert await entries(client, keys.out("a", "t")) == [TokenMsg([7], "x", offset=0)]
    assert await entries(client, keys.out("b", "t")) == [TokenMsg([8], "y", offset=0)]
    assert 0 < await client.ttl(keys.out("a", "t")) <= TTL
    assert await client.hget(keys.req("a", "t"), "sent") == b"1"
    await client.expire(keys.out("a", "t"), TTL - 100)  # set recently: not set by a write
    await client.expire(keys.out("b", "t"), 10)
    b.ttl_at -= TTL / 3 + 1  # a third of the TTL has passed since b's was set: set again
    await writer._write([(a, tok("a", 9, "z", 2)), (b, tok("b", 9, "z", 2))])
    assert writer.writes == 2
    assert await client.ttl(keys.out("a", "t")) <= TTL - 100
    assert await client.ttl(keys.out("b", "t")) > TTL - 10
    await client.delete(keys.out("a", "t"))  # a reader's DEL raced the write: recreated,
    await writer._write([(a, tok("a", 5, "w", 3))])  # with a TTL at the next refresh
    a.ttl_at = 0.0
    await writer._write([(a, tok("a", 6, "v", 4))])
    assert 0 < await client.ttl(keys.out("a", "t")) <= TTL
    await client.delete(keys.out("a", "t"), keys.out("b", "t"), keys.req("a", "t"),
                        keys.req("b", "t"))


async def test_gone_reader_gets_nothing_written(setup: Any) -> None:
    client, keys, writer = setup
    rec = Inflight("g", TIERS[0], "0-1", reader_gone=True, tenant="t")
    await writer._write([(rec, tok("g", 7, "x", 1))])
    assert writer.writes == 0  # nothing to do: no call at all
    assert not await client.exists(keys.out("g", "t"))


async def test_finish_writes_tokens_and_finish_and_acks(setup: Any) -> None:
    client, keys, writer = setup
    queue = keys.queue(TIERS[1], "t")
    await client.xgroup_create(queue, GROUP, id="0", mkstream=True)
    entry = (await client.xadd(queue, {"t": "submit", "d": "{}"})).decode()
    await client.xreadgroup(GROUP, "w1", {queue: ">"})  # pending for this worker
    await client.hset(keys.req("f", "t"), mapping={"state": "running"})
    rec = Inflight("f", TIERS[1], entry, queue_wait_s=0.25, tenant="t", weight=4.0)
    await writer._write([(rec, tok("f", 7, "x", 1)),
                         (rec, RequestOutput("f", [8], "y", True, "length", 3, 2))])
    assert writer.writes == 1
    assert await entries(client, keys.out("f", "t")) == [
        TokenMsg([7, 8], "xy", offset=0), FinishMsg("length", 3, 2, None, queue_wait_s=0.25,
                                          num_preemptions=0, cached_tokens=0)]
    assert 0 < await client.ttl(keys.out("f", "t")) <= TTL
    assert await client.hget(keys.req("f", "t"), "state") == b"finished"
    assert not await client.exists(queue)  # its last entry acked and deleted: the stream went
    assert await client.hget(keys.tenant_stats("t"), "completed") == b"1"
    # its 2 output tokens are charged to its tenant's fair-queue counter, / its weight
    assert float(await client.hget(keys.vtc(TIERS[1], keys.shard_of("t")), "t")) == 2 / 4.0
    await client.delete(keys.out("f", "t"), keys.req("f", "t"))


async def test_a_non_streaming_request_gets_its_first_tokens_then_the_rest_with_the_finish(
    setup: Any,
) -> None:
    client, keys, writer = setup
    task = asyncio.create_task(writer.run())
    rec = Inflight("n", TIERS[0], "0-1", final_only=True, tenant="t")
    streamed = Inflight("s", TIERS[0], "0-2", tenant="t")

    async def step(*items: tuple[Inflight, RequestOutput]) -> None:
        before = writer.writes
        writer.submit(list(items))
        async with asyncio.timeout(5):
            while writer.writes == before:
                await asyncio.sleep(0.005)

    try:
        for n, (token, text) in enumerate([(7, "a"), (8, "b"), (9, "c")], start=1):
            await step((rec, tok("n", token, text, n)), (streamed, tok("s", token, text, n)))
        assert await entries(client, keys.out("n", "t")) == [TokenMsg([7], "a", offset=0)]  # TTFT only
        assert len(await entries(client, keys.out("s", "t"))) == 3  # one message per step
        await step((rec, RequestOutput("n", [10], "d", True, "length", 3, 4)))
        got = await entries(client, keys.out("n", "t"))
        assert got[:2] == [TokenMsg([7], "a", offset=0), TokenMsg([8, 9, 10], "bcd", offset=1)]
        assert isinstance(got[2], FinishMsg) and got[2].completion_tokens == 4
    finally:
        task.cancel()
        await client.delete(keys.out("n", "t"), keys.out("s", "t"), keys.req("n", "t"))


async def run_steps(writer: CountingWriter, *batches: list[tuple[Inflight, RequestOutput]],
                    writes: int) -> None:
    """Submit ``batches`` (each written by ``submit`` itself when the writer is idle) and wait
    until the writer has made ``writes`` Redis calls in all."""
    for batch in batches:
        async with asyncio.timeout(5):
            while not writer._waiting:  # idle again: the next submit writes it right away
                await asyncio.sleep(0.002)
        writer.submit(batch)
    async with asyncio.timeout(5):
        while writer.writes < writes:
            await asyncio.sleep(0.005)


async def test_a_step_written_by_submit_survives_a_script_flush(
    setup: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    client, keys, writer = setup
    task = asyncio.create_task(writer.run())
    rec = Inflight("sf", TIERS[0], "0-1", tenant="t")
    # a request of another shard, not finishing: its write is a plain XADD beside the script
    other = next(f"u{i}" for i in range(100) if keys.shard_of(f"u{i}") != keys.shard_of("t"))
    rec2 = Inflight("sg", TIERS[0], "0-2", tenant=other)
    try:
        await run_steps(writer, [(rec, tok("sf", 7, "a", 1))], writes=1)  # connects
        assert writer._conn is not None
        sent_now: list[Any] = []
        real = writer._conn.send_now
        monkeypatch.setattr(writer._conn, "send_now",
                            lambda *args: sent_now.append(args[0]) or real(*args))
        await client.script_flush()  # a restarted Redis: the next EVALSHA gets NOSCRIPT
        finish = RequestOutput("sf", [8], "b", True, "stop", 3, 2)
        await run_steps(writer, [(rec, finish), (rec2, tok("sg", 9, "c", 1))], writes=2)
        # written by submit; the script call alone loaded and run again
        assert sent_now == ["EVALSHA", "XADD", "EXPIRE", "HSET"]  # sg: its first write
        got = await entries(client, keys.out("sf", "t"))
        assert got[:2] == [TokenMsg([7], "a", offset=0), TokenMsg([8], "b", offset=1)]
        assert isinstance(got[2], FinishMsg) and len(got) == 3
        assert await entries(client, keys.out("sg", other)) == [TokenMsg([9], "c", offset=0)]
        assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no failure path
    finally:
        task.cancel()
        await client.delete(keys.out("sf", "t"), keys.out("sg", other))


async def test_a_step_written_by_submit_is_written_again_when_its_reply_fails(
    setup: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, keys, writer = setup
    task = asyncio.create_task(writer.run())
    rec = Inflight("rf", TIERS[0], "0-1", tenant="t")
    try:
        await run_steps(writer, [(rec, tok("rf", 7, "a", 1))], writes=1)
        assert writer._conn is not None
        real, failed = writer._conn.send_now, []

        def lost_reply(*args: Any) -> Any:
            real(*args)  # applied by Redis, but the reply never came back
            failed.append(1)
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(ConnectionError("injected: connection reset"))
            return fut

        monkeypatch.setattr(writer._conn, "send_now", lost_reply)
        await run_steps(writer, [(rec, tok("rf", 8, "b", 2))], writes=2)
        assert failed == [1]
        # written again: a repeat is possible, a loss is not; the repeat carries the same
        # offset, so the relay drops it (``RelayResponse._fresh``)
        assert await entries(client, keys.out("rf", "t")) == [
            TokenMsg([7], "a", offset=0), TokenMsg([8], "b", offset=1),
            TokenMsg([8], "b", offset=1)]
    finally:
        task.cancel()
        await client.delete(keys.out("rf", "t"))


async def test_a_held_back_request_whose_stream_expired_is_still_lost_to_a_reclaim(
    setup: Any,
) -> None:
    client, keys, writer = setup
    queues = TierQueues(client, keys, TIERS)
    rec = Inflight("h", TIERS[0], "0-1", final_only=True, tenant="t")
    await client.hset(keys.req("h", "t"), mapping={"state": "running", "worker": "w1"})
    try:
        await writer._write([(rec, tok("h", 7, "a", 1))])  # the first tokens reach the reader
        await client.delete(keys.out("h", "t"))  # its TTL ran out while the rest was held back
        # the worker died: another one must not run it again behind what the reader has
        assert await queues.claim_many([("h", "t")], "w2", reclaim=True) == ["lost"]
    finally:
        await client.delete(keys.req("h", "t"))


async def test_a_finish_written_again_after_a_lost_reply_is_written_once(setup: Any) -> None:
    client, keys, writer = setup
    rec = Inflight("f2", TIERS[0], "0-1", tenant="t")
    await client.hset(keys.req("f2", "t"), mapping={"state": "running"})
    finish = [(rec, RequestOutput("f2", [8], "y", True, "length", 3, 1))]
    try:
        await writer._write(finish)
        await writer._write(finish)  # the retry of a write Redis had applied
        got = await entries(client, keys.out("f2", "t"))
        assert sum(isinstance(m, FinishMsg) for m in got) == 1
        assert await client.hget(keys.tenant_stats("t"), "completed") == b"1"
    finally:
        await client.delete(keys.out("f2", "t"), keys.req("f2", "t"))


def hold_replies(writer: CountingWriter, monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[Any, asyncio.Event]:
    """From now on the writer's commands are applied by Redis but their replies held back
    until the event is set; returns the real ``send_now`` (to put back) and the event."""
    assert writer._conn is not None
    real, held = writer._conn.send_now, asyncio.Event()

    def slow_reply(*args: Any) -> Any:
        reply = real(*args)
        out = asyncio.get_running_loop().create_future()

        async def later() -> None:
            await held.wait()
            out.set_result(await reply)

        asyncio.get_running_loop().create_task(later())
        return out

    monkeypatch.setattr(writer._conn, "send_now", slow_reply)
    return real, held


async def test_a_first_token_is_written_at_once_while_a_write_is_in_flight(
    setup: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first token does not wait for the write in flight to come back, nor joins the steps
    coalesced behind it; the others do, and every stream keeps its order."""
    client, keys, writer = setup
    task = asyncio.create_task(writer.run())
    old = Inflight("old", TIERS[0], "0-1", read_unix=1.0, tenant="t")
    new = Inflight("new", TIERS[0], "0-2", read_unix=2.0, tenant="t")
    try:
        await run_steps(writer, [(old, tok("old", 7, "a", 1))], writes=1)
        real, held = hold_replies(writer, monkeypatch)
        writer.submit([(old, tok("old", 8, "b", 2))])  # sent; its reply held
        await asyncio.sleep(0.05)
        monkeypatch.setattr(writer._conn, "send_now", real)
        assert not writer._waiting  # the writer waits for the held reply
        writer.submit([(old, tok("old", 9, "c", 3)), (new, tok("new", 5, "x", 1))])
        async with asyncio.timeout(5):
            while not await client.exists(keys.out("new", "t")):
                await asyncio.sleep(0.005)
        [first] = await entries(client, keys.out("new", "t"))
        assert first.token_ids == [5] and first.ttft_marks is not None
        assert [m.token_ids for m in await entries(client, keys.out("old", "t"))] == [[7], [8]]
        held.set()
        await flushed(writer)
        assert [m.token_ids for m in await entries(client, keys.out("old", "t"))] == [[7], [8], [9]]
        assert len(await entries(client, keys.out("new", "t"))) == 1  # written once
    finally:
        task.cancel()
        await client.delete(keys.out("old", "t"), keys.out("new", "t"))


async def test_a_parked_first_token_is_not_overtaken_by_the_second(
    setup: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request started before its claim answered: its first output parks; the claim
    answers while a write is in flight; its second output must not go first (its reader
    would see a gap and end the stream with ``output_lost``)."""
    client, keys, writer = setup
    task = asyncio.create_task(writer.run())
    old = Inflight("old2", TIERS[0], "0-1", read_unix=1.0, tenant="t")
    claim: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    late = Inflight("late", TIERS[0], "0-2", read_unix=2.0, tenant="t", claim=claim)
    try:
        await run_steps(writer, [(old, tok("old2", 7, "a", 1))], writes=1)
        writer.submit([(late, tok("late", 5, "x", 1))])  # parked: its claim is pending
        await asyncio.sleep(0.05)
        real, held = hold_replies(writer, monkeypatch)
        writer.submit([(old, tok("old2", 8, "b", 2))])  # sent; its reply held: in flight
        await asyncio.sleep(0.05)
        monkeypatch.setattr(writer._conn, "send_now", real)
        claim.set_result("run")
        writer.submit([(late, tok("late", 6, "y", 2))])
        held.set()
        await flushed(writer)
        msgs = await entries(client, keys.out("late", "t"))
        # in order, each message's offset where the tokens before it end
        assert [t for m in msgs for t in m.token_ids] == [5, 6]
        assert [m.offset for m in msgs] == [sum(len(p.token_ids) for p in msgs[:i])
                                            for i in range(len(msgs))]
    finally:
        task.cancel()
        await client.delete(keys.out("old2", "t"), keys.out("late", "t"))
