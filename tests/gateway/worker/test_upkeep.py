"""A worker declared dead (``recovery.DeadWorkers``, through ``upkeep.Upkeep.claim_dead``) has
its entries taken over and departs: it is gone from the group's consumers of every stream it
read and from the tier status hash (real Redis; the clock is this test's)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.bus.client import text
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import SubmitMsg
from gateway.bus.queues import Envelope, QueueEntries, TierQueues
from gateway.worker import upkeep
from gateway.worker.recovery import DeadWorkers
from policies.tiers import TIERS

pytestmark = pytest.mark.timeout(30)
TIER = TIERS[0]


async def test_a_dead_worker_is_taken_over_and_departs(redis_url: str, monkeypatch: Any) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"up{uuid.uuid4().hex[:8]}")
    queues, entries = TierQueues(client, keys, TIERS), QueueEntries(client, keys, None)
    started: list[Envelope] = []

    async def start(envs: list[Envelope], reclaim: bool) -> None:
        assert reclaim
        started.extend(envs)

    clock = [100.0]
    monkeypatch.setattr(upkeep.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(upkeep, "STALE_AFTER_S", 0.0)  # the entries' idle time, not the status
    keeper = upkeep.Upkeep(client, keys, queues, "alive", DeadWorkers("alive"), start,
                           list, lambda: False)
    try:
        for i, tenant in enumerate(("acme", "beta", "acme")):
            msg = SubmitMsg(f"r{i}", tenant, TIER, 0, [1], 4)
            assert (await entries.admit(msg, tenant, rpm=0, tpm=0, max_concurrency=0,
                                        queue_max_len=100, cost=1, lease_ms=60_000,
                                        req_ttl_s=60))[0] == "ok"
        picked = await queues.pick(TIER, "dead", 3)
        assert len(picked) == 3
        await client.hset(keys.tier_status, "dead", "frozen")
        for beat in range(4):  # the dead worker's status stays, ours changes
            await client.hset(keys.tier_status, "alive", str(beat))
            await keeper.claim_dead()
            clock[0] += 6.0
        assert sorted(e.entry_id for e in started) == sorted(e.entry_id for e in picked)
        for tenant in ("acme", "beta"):
            names = {text(c["name"]) for c in
                     await client.xinfo_consumers(keys.queue(TIER, tenant), GROUP)}
            assert names == {"alive"}, tenant
        assert [text(k) for k in await client.hkeys(keys.tier_status)] == ["alive"]
    finally:
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()


async def test_only_the_fleets_checker_scans_for_dead_workers(redis_url: str,
                                                              monkeypatch: Any) -> None:
    """Two live workers: the lesser id scans the pending index each round, the other reads
    only the tier status (``recovery.checker``), once it has seen the lesser one's change."""
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"up{uuid.uuid4().hex[:8]}")
    queues = TierQueues(client, keys, TIERS)
    clock = [100.0]
    monkeypatch.setattr(upkeep.time, "monotonic", lambda: clock[0])
    scans: list[str] = []

    async def no_start(envs: list[Envelope], reclaim: bool) -> None:
        raise AssertionError("nothing to take over")

    keepers = {}
    for name in ("alpha", "zeta"):
        keepers[name] = upkeep.Upkeep(client, keys, queues, name, DeadWorkers(name), no_start,
                                      list, lambda: False)
    real = queues.pending_consumers

    async def recording(tier: str | None = None, who: str = "") -> set[str]:
        scans.append(who)
        return await real(tier)

    try:
        for beat in range(3):
            for name, keeper in keepers.items():
                await client.hset(keys.tier_status, name, f'{{"ts": {beat}}}')
                monkeypatch.setattr(queues, "pending_consumers",
                                    lambda tier=None, n=name: recording(tier, n))
                await keeper.claim_dead()
            clock[0] += 2.0
        # first round: neither has seen the other change, so both scan; then alpha alone
        assert scans == ["alpha", "zeta", "alpha", "alpha"]
    finally:
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()
