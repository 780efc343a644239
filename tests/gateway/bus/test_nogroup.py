"""A Redis that came back without a queue's consumer group (restored partly, or a stream
recreated by hand): the fair pick makes the group again and delivers the entry, a reclaim
round makes it again and takes nothing, and a heartbeat for entries whose stream is gone is
a no-op, so no worker loop fails on NOGROUP for ever (real Redis)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import SubmitMsg, encode
from gateway.bus.queues import TierQueues
from policies.tiers import TIERS

pytestmark = pytest.mark.timeout(30)
TIER = TIERS[0]


@pytest.fixture
async def setup(redis_url: str) -> Any:
    client = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"ng{uuid.uuid4().hex[:8]}")
    queues = TierQueues(client, keys, TIERS)
    yield client, keys, queues
    await queues.close()
    await client.aclose()


async def groups(client: Any, key: str) -> list[str]:
    return [g["name"].decode() for g in await client.xinfo_groups(key)]


async def test_the_pick_recreates_a_missing_group(setup: Any) -> None:
    client, keys, queues = setup
    key = keys.queue(TIER, "acme")
    msg = SubmitMsg("r1", "acme", TIER, 0, [1, 2, 3], max_tokens=4)
    await client.xadd(key, {**encode(msg), "n": "3", "w": "1"})  # a stream without its group
    await client.hset(keys.backlogged(TIER, keys.shard_of("acme")), "acme", 1)
    await client.hset(keys.depth(keys.shard_of("acme")), f"b:{TIER}", 1)  # the shard's count
    got = await queues.pick(TIER, "w1")
    assert [e.msg.request_id for e in got if e.msg] == ["r1"]
    assert await groups(client, key) == [GROUP]
    assert (await client.xpending(key, GROUP))["pending"] == 1  # delivered to w1


async def test_a_reclaim_round_and_a_heartbeat_survive_nogroup(setup: Any) -> None:
    client, keys, queues = setup
    key = keys.queue(TIER, "acme")
    await client.xadd(key, {"t": "submit", "d": "{}"})
    await client.sadd(keys.pending(keys.shard_of("acme")), f"{TIER}:acme")  # in the index
    assert await queues.autoclaim(TIER, "w1", 0) == []
    assert await groups(client, key) == [GROUP]
    await queues.heartbeat(TIER, "gone", "w1", ["1-0"])  # its stream is gone: no error
