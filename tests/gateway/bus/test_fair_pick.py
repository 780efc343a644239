"""The fair queue in Redis (``ADMIT_LUA``'s lift, ``PICK_LUA``'s pick and prompt charge,
``STEP_LUA``'s output charge, ``CANCEL_LUA``'s backlog count) against the pure functions of
``policies.fair_queue`` on random workloads: same picks in the same order, same counters. A
pick may skip tenants (over their seat share, ``policies.tenant_seats``): the model picks
among the others."""

from __future__ import annotations

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
        self.queued: dict[str, deque[tuple[str, int]]] = {t: deque() for t in WEIGHTS}
        self.last: str | None = None

    def backlogged(self) -> list[str]:
        return [t for t, q in self.queued.items() if q]

    def admit(self, tenant: str, rid: str, prompt: int) -> None:
        if not self.queued[tenant]:
            self.counters[tenant] = lift(self.counters, tenant, self.backlogged(), self.last)
        self.queued[tenant].append((rid, prompt))

    def pick(self, skip: frozenset[str] = frozenset()) -> str | None:
        tenant = pick(self.counters, [t for t in self.backlogged() if t not in skip])
        if tenant is None:
            return None
        rid, prompt = self.queued[tenant].popleft()
        self.counters = charge(self.counters, tenant, prompt, WEIGHTS[tenant])
        self.last = tenant
        return rid

    def cancel(self, rid: str) -> None:
        for q in self.queued.values():
            for item in list(q):
                if item[0] == rid:
                    q.remove(item)


async def counters(client: Any, keys: RedisKeys) -> dict[str, float]:
    raw = await client.hgetall(keys.vtc(TIER))
    return {k.decode(): float(v) for k, v in raw.items() if not k.startswith(b":")}


@pytest.mark.parametrize("seed", range(4))
async def test_the_scripts_pick_and_count_as_the_pure_functions(redis_url: str, seed: int) -> None:
    rng = random.Random(seed)
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"fq{uuid.uuid4().hex[:8]}")
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
                status, _ = await entries.admit(msg, tenant, weight=WEIGHTS[tenant], **ADMIT)
                assert status == "ok"
                model.admit(tenant, msg.request_id, prompt)
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
                model.counters = charge(model.counters, env.tenant, out, WEIGHTS[env.tenant])
                if not done:
                    running.append(env)
            elif model.backlogged():  # a queued request is cancelled
                tenant = rng.choice(model.backlogged())
                rid = rng.choice(model.queued[tenant])[0]
                assert await entries.cancel(rid, True, "test", 60) == "queued"
                model.cancel(rid)
            got_c = await counters(client, keys)
            assert {t: got_c.get(t, 0.0) for t in WEIGHTS} == {
                t: model.counters.get(t, 0.0) for t in WEIGHTS}
            backlog = sum(len(q) for q in model.queued.values())
            assert (await queues.backlogs())[TIER] == backlog
    finally:
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()
