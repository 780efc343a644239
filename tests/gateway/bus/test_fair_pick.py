"""The fair queue in Redis (``ADMIT_LUA``'s lift, ``PICK_LUA``'s pick and prompt charge,
``STEP_LUA``'s output charge, ``CANCEL_LUA``'s backlog count) against the pure functions of
``policies.fair_queue`` on random workloads: same picks in the same order, same counters and
services (the tie-break: least served, then the oldest next entry, then the id), inside one
shard (``keys.py``: the layout of one shard is exact; across shards the worker's view plans). A pick may
skip tenants (over their seat share, ``policies.tenant_seats``): the model picks among the
others. Then ties made on purpose: a tenant lifted to another's counter, fresh tenants."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import deque
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.finish import FinishReason
from gateway.bus.keys import RedisKeys
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg
from gateway.bus.queues import Envelope, QueueEntries, TierQueues
from policies.fair_queue import charge, lift, pick
from policies.tiers import TIERS

pytestmark = pytest.mark.timeout(60)

TIER = TIERS[1]
# powers of two: token / weight is exact in both Lua's and Python's doubles
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 0.5, "d": 4.0}
ADMIT = {"rpm": 0, "tpm": 0, "max_concurrency": 0, "queue_max_len": 10_000, "cost": 1,
         "lease_ms": 60_000, "req_ttl_s": 60}


class Model:
    """The pure functions' view of one tier: counters, each tenant's queued prompt sizes."""

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.served: dict[str, float] = {}  # tokens / weight, never lifted
        # (request id, prompt tokens, stream entry id as (ms, seq)) per queued request
        self.queued: dict[str, deque[tuple[str, int, tuple[int, int]]]] = {
            t: deque() for t in WEIGHTS}
        self.last: str | None = None

    def backlogged(self) -> list[str]:
        return [t for t, q in self.queued.items() if q]

    def admit(self, tenant: str, rid: str, prompt: int, entry_id: str) -> None:
        if not self.queued[tenant]:
            self.counters[tenant] = lift(self.counters, tenant, self.backlogged(), self.last)
        ms, seq = entry_id.split("-")
        self.queued[tenant].append((rid, prompt, (int(ms), int(seq))))

    def pick(self, skip: frozenset[str] = frozenset()) -> str | None:
        heads = {t: q[0][2] for t, q in self.queued.items() if q}
        tenant = pick(self.counters, [t for t in self.backlogged() if t not in skip],
                      self.served, heads)
        if tenant is None:
            return None
        rid, prompt, _ = self.queued[tenant].popleft()
        self.serve(tenant, prompt)
        self.last = tenant
        return rid

    def serve(self, tenant: str, tokens: int) -> None:
        self.counters = charge(self.counters, tenant, tokens, WEIGHTS[tenant])
        self.served = charge(self.served, tenant, tokens, WEIGHTS[tenant])

    def cancel(self, rid: str) -> None:
        for q in self.queued.values():
            for item in list(q):
                if item[0] == rid:
                    q.remove(item)


async def counters(client: Any, keys: RedisKeys) -> dict[str, float]:
    raw = await client.hgetall(keys.vtc(TIER, 0))
    return {k.decode(): float(v) for k, v in raw.items() if not k.startswith(b":")}


async def services(client: Any, keys: RedisKeys) -> dict[str, float]:
    raw = await client.hgetall(keys.vtc(TIER, 0))
    return {k.decode()[3:]: float(v) for k, v in raw.items() if k.startswith(b":s:")}


@pytest.mark.parametrize("seed", range(4))
async def test_the_scripts_pick_and_count_as_the_pure_functions(redis_url: str, seed: int) -> None:
    rng = random.Random(seed)
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"fq{uuid.uuid4().hex[:8]}", shards=1)
    entries, queues = QueueEntries(client, keys, None), TierQueues(client, keys, TIERS)
    model = Model()
    running: list[Envelope] = []
    n = 0
    try:
        for _ in range(300):
            op = rng.random()
            if op < 0.45:  # a tenant sends a request
                tenant, n = rng.choice(list(WEIGHTS)), n + 1
                prompt = rng.randint(1, 40)
                msg = SubmitMsg(f"r{n}", tenant, TIER, 1, [7] * prompt, 4)
                status, entry_id, *_ = await entries.admit(msg, tenant, weight=WEIGHTS[tenant],
                                                       **ADMIT)
                assert status == "ok"
                model.admit(tenant, msg.request_id, prompt, entry_id)
            elif op < 0.75:  # a worker picks one to three, at times skipping some tenants
                count = rng.randint(1, 3)
                skip = frozenset(t for t in WEIGHTS if rng.random() < 0.25)
                got = await queues.pick(TIER, "w1", count, skip)
                want = [rid for _ in range(count) if (rid := model.pick(skip)) is not None]
                assert [e.msg.request_id for e in got if e.msg] == want
                running += got
            elif op < 0.9 and running:  # a running request writes tokens, maybe its finish
                env = running.pop(rng.randrange(len(running)))
                assert env.msg is not None and env.weight == WEIGHTS[env.tenant]
                out = rng.randint(1, 9)
                done = rng.random() < 0.5
                step = entries.step(60)
                step.add(env.msg.request_id, TIER, env.entry_id, False, TokenMsg([1] * out, ""),
                         FinishMsg(FinishReason.STOP, 1, out) if done else None,
                         tenant=env.tenant, charge=out / env.weight)
                await entries.write_step(step)
                model.serve(env.tenant, out)
                if not done:
                    running.append(env)
            elif model.backlogged():  # a queued request is cancelled
                tenant = rng.choice(model.backlogged())
                rid = rng.choice(model.queued[tenant])[0]
                assert await entries.cancel(rid, tenant, TIER, True, "test", 60) == "queued"
                model.cancel(rid)
            got_c, got_s = await counters(client, keys), await services(client, keys)
            assert {t: got_c.get(t, 0.0) for t in WEIGHTS} == {
                t: model.counters.get(t, 0.0) for t in WEIGHTS}
            assert {t: got_s.get(t, 0.0) for t in WEIGHTS} == {
                t: model.served.get(t, 0.0) for t in WEIGHTS}
            backlog = sum(len(q) for q in model.queued.values())
            assert (await queues.backlogs())[TIER] == backlog
    finally:
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()


async def _admit(entries: QueueEntries, tenant: str, rid: str, prompt: int = 8) -> None:
    msg = SubmitMsg(rid, tenant, TIER, 1, [7] * prompt, 4)
    assert (await entries.admit(msg, tenant, weight=1.0, **ADMIT))[0] == "ok"


async def test_ties_go_to_the_least_served_then_the_oldest_entry_not_the_id(
        redis_url: str) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"fq{uuid.uuid4().hex[:8]}", shards=1)
    entries, queues = QueueEntries(client, keys, None), TierQueues(client, keys, TIERS)

    async def picks(n: int) -> list[str]:
        got = await queues.pick(TIER, "w1", n)
        return [e.msg.request_id for e in got if e.msg]

    try:
        # fresh tenants (equal counters and services): first come, first served, though
        # "zz" sorts after "aa"
        await _admit(entries, "zz", "z1")
        await asyncio.sleep(0.005)  # entry ids order by the millisecond across streams
        await _admit(entries, "aa", "a1")
        assert await picks(2) == ["z1", "a1"]
        # "heavy" (the smaller id) was served and keeps a backlog; "light" becomes
        # backlogged and is lifted to exactly heavy's counter: the tie goes to the tenant
        # that received less, ahead of the heavy entries queued before it
        for i in range(4):
            await _admit(entries, "heavy", f"h{i}", prompt=30)
        assert await picks(1) == ["h0"]
        await _admit(entries, "light", "l0")
        vtc = await counters(client, keys)
        assert vtc["light"] == vtc["heavy"]
        assert await picks(2) == ["l0", "h1"]
    finally:
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()
