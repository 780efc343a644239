"""The pending index (``bus/pending.py``) on a real server of its own (its command counts are
this module's alone): a reclaim round costs a number of commands that does not grow with
backlogged tenants; the index always covers the streams that hold pending entries (checked
against a scan of every tenant stream, the straightforward model, through a random run of
admissions, picks, finishes and cancels), and a round prunes it to exactly them; a dead
worker's entries are reclaimed through it; a departed worker leaves the groups only where
it holds nothing."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.finish import FinishReason
from gateway.bus.client import text
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg
from gateway.bus.pending import FANOUT, PendingIndex
from gateway.bus.queues import Envelope, QueueEntries, TierQueues
from policies.tiers import TIERS

pytestmark = pytest.mark.timeout(60)
TIER = TIERS[2]
ADMIT = {"rpm": 0, "tpm": 0, "max_concurrency": 0, "queue_max_len": 100_000, "cost": 1,
         "lease_ms": 60_000, "req_ttl_s": 600}


@pytest.fixture
async def bus(own_url: str) -> Any:
    client: Any = aioredis.Redis.from_url(own_url)
    keys = RedisKeys(f"pi{uuid.uuid4().hex[:8]}")
    queues, entries = TierQueues(client, keys, TIERS), QueueEntries(client, keys, None)
    yield client, keys, queues, entries
    await queues.close()
    await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
    await client.aclose()


async def admit(entries: QueueEntries, rid: str, tenant: str) -> None:
    msg = SubmitMsg(rid, tenant, TIER, 0, [1, 2], 4)
    assert (await entries.admit(msg, tenant, **ADMIT))[0] == "ok"


async def finish(entries: QueueEntries, env: Envelope) -> None:
    step = entries.step(600)
    assert env.msg is not None
    step.add(env.msg.request_id, env.tier, env.entry_id, False, None,
             FinishMsg(FinishReason.STOP, 2, 1), tenant=env.tenant)
    await entries.write_step(step)


async def calls(client: Any) -> int:
    return sum(int(v["calls"]) for v in (await client.info("commandstats")).values())


async def round_cost(client: Any, queues: TierQueues) -> int:
    """Commands one dead-worker check and one reclaim round send (the INFO itself is one)."""
    before = await calls(client)
    await queues.pending_consumers()
    await queues.autoclaim(None, "alive", 60_000)
    return await calls(client) - before - 1


async def test_a_round_costs_the_same_with_10_or_400_backlogged_tenants(bus: Any) -> None:
    client, _, queues, entries = bus
    for i in range(10):
        await admit(entries, f"a{i}", f"t{i}")
    few = await round_cost(client, queues)
    for i in range(10, 400):
        await admit(entries, f"a{i}", f"t{i}")
    assert await round_cost(client, queues) == few == 2 * 16  # one index read per shard, each
    # a picked entry costs its stream: the dead-worker check's XPENDING, the reclaim's
    # XAUTOCLAIM
    await queues.pick(TIER, "w1", 2)
    assert await round_cost(client, queues) == few + 2 * 2


async def pending_streams(client: Any, keys: RedisKeys) -> set[str]:
    """The model: every tenant stream of every shard scanned for pending entries."""
    out = set()
    for s in keys.shard_range():
        for t in TIERS:
            for raw in await client.smembers(keys.queue_tenants(t, s)):
                key = keys.queue(t, text(raw))
                if await client.exists(key) and (await client.xpending(key, GROUP))["pending"]:
                    out.add(key)
    return out


async def indexed(client: Any, keys: RedisKeys) -> set[str]:
    out = set()
    for s in keys.shard_range():
        for raw in await client.smembers(keys.pending(s)):
            tier, tenant = text(raw).split(":", 1)
            out.add(keys.queue(tier, tenant))
    return out


async def test_the_index_covers_every_pending_stream_through_a_random_run(bus: Any) -> None:
    client, keys, queues, entries = bus
    rng = random.Random(7)
    held: list[Envelope] = []
    queued: list[tuple[str, str]] = []
    for step in range(160):
        op = rng.random()
        if op < 0.4:
            rid, tenant = f"r{step}", f"t{rng.randrange(12)}"
            await admit(entries, rid, tenant)
            queued.append((rid, tenant))
        elif op < 0.65:
            held += await queues.pick(TIER, rng.choice(["w1", "w2"]), rng.randint(1, 3))
        elif op < 0.85 and held:
            await finish(entries, held.pop(rng.randrange(len(held))))
        elif queued:
            rid, tenant = queued.pop(rng.randrange(len(queued)))
            await entries.cancel(rid, tenant, TIER, True, "test", 60)
        model = await pending_streams(client, keys)
        assert model <= await indexed(client, keys), step  # never a pending stream missing
        if step % 20 == 19:
            await queues.pending_consumers()  # a round prunes the stale members
            assert await indexed(client, keys) == model, step
    assert held and await pending_streams(client, keys)  # the run left work to check


async def test_a_dead_workers_entries_are_reclaimed_through_the_index(bus: Any) -> None:
    _, _, queues, entries = bus
    for i in range(40):
        await admit(entries, f"d{i}", f"t{i % 20}")
    got = await queues.pick(TIER, "dead", 6)
    assert await queues.pending_consumers() == {"dead"}
    taken = await queues.claim_from(TIER, "dead", "alive", 0)
    assert sorted(e.entry_id for e in taken) == sorted(e.entry_id for e in got)
    assert await queues.pending_consumers() == {"alive"}
    # the visibility timeout's path finds them too
    again = await queues.autoclaim(TIER, "third", 0)
    assert sorted(e.entry_id for e in again) == sorted(e.entry_id for e in got)


async def consumers(client: Any, key: str) -> set[str]:
    return {text(c["name"]) for c in await client.xinfo_consumers(key, GROUP)}


async def test_a_departed_worker_leaves_the_groups_where_it_holds_nothing(bus: Any) -> None:
    client, keys, queues, entries = bus
    for i in range(4):
        await admit(entries, f"e{i}", "acme")
        await admit(entries, f"f{i}", "beta")
    mine = await queues.pick(TIER, "w1", 4)
    assert {e.tenant for e in mine} == {"acme", "beta"}
    await queues.pick(TIER, "w2", 1)
    for env in mine:
        if env.tenant == "acme":
            await finish(entries, env)
    acme, beta = keys.queue(TIER, "acme"), keys.queue(TIER, "beta")
    assert "w1" in await consumers(client, acme)
    # it still holds beta's entries: it stays there (they are for a reclaim to take)
    assert await queues.pending.depart("w1") == 1
    assert "w1" not in await consumers(client, acme)
    assert "w1" in await consumers(client, beta)
    await queues.claim_from(TIER, "w1", "w2", 0)
    assert await queues.pending.depart("w1") == 0
    assert "w1" not in await consumers(client, beta)
    assert not [s for s in keys.shard_range() if await client.exists(keys.consumed("w1", s))]


async def connections(client: Any) -> int:
    return int((await client.info("stats"))["total_connections_received"])


async def test_a_round_and_a_departure_over_many_streams_open_few_connections(
        bus: Any, own_url: str) -> None:
    """redis-py opens a connection for each call in flight: a round or a departure over 60
    streams holds at most ``FANOUT`` calls at once, so a new client's pool grows by no more
    (it opened one a stream when it gathered them all)."""
    client, keys, queues, entries = bus
    for i in range(60):
        await admit(entries, f"c{i}", f"t{i}")
    assert len(await queues.pick(TIER, "w1", 60)) == 60
    fresh: Any = aioredis.Redis.from_url(own_url)
    index = PendingIndex(fresh, keys, TIERS)
    try:
        before = await connections(client)
        assert await index.holders() == {"w1"}
        assert await index.depart("w1") == 60  # it holds them all: it stays in every group
        assert await connections(client) - before <= FANOUT
    finally:
        await fresh.aclose()


async def test_an_output_stream_is_bounded_by_its_steps_and_expires(bus: Any) -> None:
    """The out stream's bound (``keys.py``): one entry per step written (each has >= 1
    token), plus the finish, so at most max_tokens + 1; never trimmed (a resumed request reads
    it back whole), with a TTL from its first write."""
    client, keys, queues, entries = bus
    await admit(entries, "o1", "acme")
    (env,) = await queues.pick(TIER, "w1", 1)
    assert env.msg is not None
    steps = 5
    for i in range(steps):
        step = entries.step(600)
        step.add("o1", TIER, env.entry_id, False, TokenMsg([i, i + 1], "xy", offset=2 * i),
                 None, tenant="acme", refresh=i == 0)
        await entries.write_step(step)
    await finish(entries, env)
    out = keys.out("o1", "acme")
    assert await client.xlen(out) == steps + 1 <= 2 * steps + 1  # steps + finish <= tokens + 1
    assert 0 < await client.ttl(out) <= 600


async def test_the_seed_indexes_streams_picked_without_the_index(bus: Any) -> None:
    client, keys, queues, entries = bus
    for i in range(6):
        await admit(entries, f"s{i}", f"t{i}")
    await queues.pick(TIER, "old", 3)
    for s in keys.shard_range():  # as a version without the index left them
        await client.delete(keys.pending(s))
    assert await queues.pending_consumers() == set()
    assert await queues.pending.seed() == 3
    assert await indexed(client, keys) == await pending_streams(client, keys)
    assert await queues.pending_consumers() == {"old"}
