"""The key layout is one Redis Cluster accepts (``bus/keys.py``, docs/architecture.md): the
shards' tags spread over three masters' default slot ranges, and every script call of a
request's life (admission with ledger and budget, backlog read, pick, claim, step writes,
cancel, settle, a dropped entry, the pending index's prune, a departure) names keys of one hash slot only. The slots are computed by
redis-py's own CRC16 (``redis.crc.key_slot``), which a cluster client routes by."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from engine.core.finish import FinishReason
from gateway.bus import resp
from gateway.bus.keys import SHARD_TAGS, RedisKeys
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg
from gateway.bus.queues import Envelope, QueueEntries, TierQueues
from gateway.tenancy.quota import QuotaEnforcer
from gateway.tenancy.tenants import Tenant, TenantQuota
from policies.tiers import TIERS

pytestmark = pytest.mark.timeout(60)

# a three-master cluster's default slot ranges (valkey-cli --cluster create)
MASTERS = ((0, 5460), (5461, 10922), (10923, 16383))


def test_the_shard_tags_spread_evenly_over_three_masters() -> None:
    per_master: Counter[int] = Counter()
    for i, tag in enumerate(SHARD_TAGS):
        slot = key_slot(f"carpool:{{{tag}}}:qa:batch".encode())
        master = next(m for m, (lo, hi) in enumerate(MASTERS) if lo <= slot <= hi)
        assert master == i % 3, (tag, slot)
        per_master[master] += 1
    assert sorted(per_master.values()) == [5, 5, 6]  # at most 6/16 of the shards on one
    assert len({key_slot(t.encode()) for t in SHARD_TAGS}) == len(SHARD_TAGS)
    # the wake lists sit on a master with 5 shards
    wake = key_slot(RedisKeys("carpool").wake("batch").encode())
    assert next(m for m, (lo, hi) in enumerate(MASTERS) if lo <= wake <= hi) != 0


def test_a_tenants_keys_and_its_requests_share_its_shards_slot() -> None:
    keys = RedisKeys("ns")
    for tenant in ("t", "acme", "u-17", "x" * 40):
        slot = key_slot(keys.tag(keys.shard_of(tenant)).encode())
        for key in (keys.queue("batch", tenant), keys.req("r1", tenant), keys.out("r1", tenant),
                    keys.bucket(tenant, "tpm"), keys.concurrency(tenant),
                    keys.budget(tenant, "d20261207"), keys.usage(tenant, "2026120703"),
                    keys.tenant_stats(tenant)):
            assert key_slot(key.encode()) == slot, key
    tenants = [f"tenant{i}" for i in range(1600)]
    spread = Counter(keys.shard_of(t) for t in tenants)
    assert len(spread) == 16 and min(spread.values()) > 50  # every shard gets tenants


async def test_every_script_call_names_keys_of_one_slot(redis_url: str, monkeypatch: Any) -> None:
    calls: list[tuple[str, list[str]]] = []
    real_call = resp.LuaScript.__call__

    async def recording(self: resp.LuaScript, keys: list[Any], args: list[Any]) -> Any:
        calls.append((self.sha, [k if isinstance(k, str) else k.decode() for k in keys]))
        return await real_call(self, keys, args)

    monkeypatch.setattr(resp.LuaScript, "__call__", recording)
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"kl{uuid.uuid4().hex[:8]}")
    queues, quota = TierQueues(client, keys, TIERS), QuotaEnforcer(
        client, keys, queue_max_len=100, lease_ms=60_000, req_ttl_s=60, ledger_retention_s=3600)
    entries = QueueEntries(client, keys, None)
    tier = TIERS[1]
    tenants = [Tenant(n, n, TenantQuota(tpm=10_000, rpm=100, max_concurrency=10))
               for n in ("t", "u", "acme", "zeta")]
    try:
        msgs = [SubmitMsg(f"r{i}", t.id, tier, 1, [1, 2, 3], 4, ledger_hour="2026120703",
                          ledger_prefix="k|b|m|") for i, t in enumerate(tenants)]
        for t, m in zip(tenants, msgs):
            assert (await quota.admit(t, m, 7)).ok
        got = await queues.pick(tier, "w1", 4)
        assert sorted(e.tenant for e in got) == sorted(t.id for t in tenants)
        assert await queues.claim_many([(e.msg.request_id, e.tenant) for e in got if e.msg],
                                       "w1", reclaim=False) == ["run"] * 4
        step = entries.step(60, ledger_ttl_s=3600)
        for e in got:
            assert e.msg is not None
            step.add(e.msg.request_id, tier, e.entry_id, False, TokenMsg([5], "x"),
                     FinishMsg(FinishReason.STOP, 3, 1) if e.tenant != "t" else None,
                     tenant=e.tenant, charge=1.0, ledger=("2026120703", "k|b|m|"))
        await entries.write_step(step)
        # a script call per shard where a request finishes; the rest plain commands, each
        # naming one key ("t" finishes nothing)
        finishing = {keys.shard_of(t.id) for t in tenants if t.id != "t"}
        assert len(step.calls()) == len(finishing)
        plain = [c[1] for c in step.commands()]
        assert all(key_slot(k.encode()) == key_slot(keys.tag(keys.shard_of("t")).encode())
                   for k in plain)
        assert bool(plain) == (keys.shard_of("t") not in finishing)
        assert await entries.cancel("r0", "t", tier, False, "test", 60) == "running"
        for t, m in zip(tenants, msgs):
            await quota.settle(t, m.request_id, 7, 4, "settled:completed",
                               delete_key=keys.out(m.request_id, t.id))
        done = queues.done_commands(Envelope(tier, got[0].entry_id, None, got[0].tenant))
        await queues.execute(done)
        assert done[0][0] == "EVAL"
        calls.append(("done", [str(k) for k in done[0][3:3 + done[0][2]]]))
        # the pending index's prune and a departure (``bus/pending.py``)
        n = len(calls)
        await queues.pending_consumers()
        await queues.pending.depart("w1")  # r0 is still pending: it stays there
        assert len(calls) > n
    finally:
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()
    assert len(calls) > 10
    for sha, named in calls:
        assert len({key_slot(k.encode()) for k in named}) == 1, (sha, named)
