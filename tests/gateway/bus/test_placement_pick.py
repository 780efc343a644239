"""Prefix-aware placement in Redis (``ADMIT_LUA``'s preferred worker, ``PICK_LUA``'s wait):
the preferred worker takes its entries first, another worker passes over them (and takes the
next tenant in fair order, as ``policies.fair_queue`` would without them) until the wait has
passed, then steals them. The waits are either far longer than the test (never reached) or
far shorter than a sleep that follows them (always passed): nothing depends on the machine's
speed. One shard: the fair order is exact within a shard (``test_fair_pick``), and that order is
what the passing-over is checked against."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.bus.keys import RedisKeys
from gateway.bus.messages import SubmitMsg
from gateway.bus.queues import QueueEntries, TierQueues
from tests.gateway.bus.test_fair_pick import ADMIT, TIER, WEIGHTS, Model

pytestmark = pytest.mark.timeout(60)

NEVER_MS = 600_000  # a wait no test run reaches


async def _setup(redis_url: str, wait_ms: float) -> tuple[Any, RedisKeys, QueueEntries,
                                                          dict[str, TierQueues]]:
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"pl{uuid.uuid4().hex[:8]}", shards=1)
    queues = {w: TierQueues(client, keys, (TIER,), placement_wait_ms=wait_ms)
              for w in ("w1", "w2")}
    return client, keys, QueueEntries(client, keys, None), queues


async def _admit(entries: QueueEntries, rid: str, tenant: str, prefer: str,
                 prompt: int = 4) -> str:
    msg = SubmitMsg(rid, tenant, TIER, 1, [7] * prompt, 4)
    status, entry_id, *_ = await entries.admit(msg, tenant, weight=WEIGHTS[tenant],
                                               prefer=prefer, **ADMIT)
    assert status == "ok"
    return entry_id


@pytest.mark.parametrize("seed", range(3))
async def test_a_pick_passes_over_entries_held_for_another_worker(redis_url: str,
                                                                   seed: int) -> None:
    rng = random.Random(seed)
    client, _, entries, queues = await _setup(redis_url, NEVER_MS)
    model = Model()
    prefer: dict[str, str] = {}
    try:
        for n in range(200):
            if rng.random() < 0.5:
                tenant, rid = rng.choice(list(WEIGHTS)), f"r{n}"
                prompt = rng.randint(1, 40)
                prefer[rid] = rng.choice(["", "w1", "w2"])
                model.admit(tenant, rid, prompt, await _admit(entries, rid, tenant, prefer[rid],
                                                              prompt))
                continue
            worker = rng.choice(["w1", "w2"])
            # the model: tenants whose next entry prefers the other worker are passed over
            held = frozenset(t for t, q in model.queued.items()
                             if q and prefer[q[0][0]] not in ("", worker))
            want = model.pick(held)
            got = await queues[worker].pick(TIER, worker, 1)
            assert [e.msg.request_id for e in got if e.msg] == ([want] if want else [])
            # a pass-over says when its entry may be stolen: within the wait, never at once
            if want is None and held:
                assert queues[worker].held_s is not None
                assert 0 < queues[worker].held_s <= NEVER_MS / 1000
    finally:
        for q in queues.values():
            await q.close()
        await client.aclose()


async def test_the_preferred_worker_takes_first_and_another_steals_after_the_wait(
        redis_url: str) -> None:
    client, _, entries, queues = await _setup(redis_url, 1.0)
    try:
        await _admit(entries, "mine", "a", "w1")
        await _admit(entries, "stolen", "a", "w1")
        assert [e.msg.request_id for e in await queues["w1"].pick(TIER, "w1", 1)
                if e.msg] == ["mine"]
        await asyncio.sleep(0.05)  # 50x the 1 ms wait
        got = await queues["w2"].pick(TIER, "w2", 2)
        assert [e.msg.request_id for e in got if e.msg] == ["stolen"]
        assert queues["w2"].held_s is None
    finally:
        for q in queues.values():
            await q.close()
        await client.aclose()


async def test_an_admission_wakes_its_preferred_worker(redis_url: str) -> None:
    client, keys, entries, queues = await _setup(redis_url, NEVER_MS)
    try:
        await _admit(entries, "r1", "a", "w2")
        await client.delete(keys.wake(TIER))  # another worker took the tier's token
        assert await queues["w1"].wait((TIER,), 0.01, consumer="w1") is None
        assert await queues["w2"].wait((TIER,), 1.0, consumer="w2") == TIER
        # without placement, entries carry no preference and every pick may take them
        plain = TierQueues(client, keys, (TIER,))
        await _admit(entries, "r2", "b", "")
        got = await plain.pick(TIER, "w1", 2)
        assert [e.msg.request_id for e in got if e.msg] == ["r1", "r2"]
        await plain.close()
    finally:
        for q in queues.values():
            await q.close()
        await client.aclose()
