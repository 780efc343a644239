"""The admission/settle Lua scripts against a real Redis, compared with policies.rate_limit."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.bus.keys import RedisKeys
from gateway.bus.messages import SubmitMsg
from gateway.tenancy.quota import QuotaEnforcer
from gateway.tenancy.tenants import Tenant, TenantQuota
from policies.rate_limit import refill

pytestmark = pytest.mark.timeout(30)


def submit(tier: str = "interactive") -> SubmitMsg:
    return SubmitMsg(request_id=uuid.uuid4().hex, tenant_id="t", tier=tier, priority=0,
                     prompt_token_ids=[1, 2, 3], max_tokens=10)


async def _scenario(redis_url: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"lua{uuid.uuid4().hex[:8]}")
    quota = QuotaEnforcer(client, keys, queue_max_len=100, lease_ms=60_000, req_ttl_s=60)
    tenant = Tenant("t", "t", TenantQuota(tpm=100, max_concurrency=50))
    try:
        msgs = [submit() for _ in range(12)]
        results = [await quota.admit(tenant, m, 13) for m in msgs]
        admitted = [m for m, a in zip(msgs, results) if a.ok]
        assert len(admitted) == 100 // 13  # 7 reservations of 13 fit in a bucket of 100
        assert {a.reason for a in results if not a.ok} == {"tpm"}
        assert all(a.retry_after_s >= 1 for a in results if not a.ok)
        level_key = keys.bucket("t", "tpm")
        before = await client.hgetall(level_key)
        b_level, b_ts = float(before[b"level"]), int(before[b"ts"])
        # settle one request that used 4 of its 13 tokens: 9 come back (plus refill)
        assert await quota.settle(tenant, admitted[0].request_id, 13, 4, "settled:completed")
        after = await client.hgetall(level_key)
        expected = min(100.0, refill(b_level, b_ts, int(after[b"ts"]), 100) + 9)
        assert float(after[b"level"]) == pytest.approx(expected)
        # idempotent: a second settle neither refunds nor counts
        assert not await quota.settle(tenant, admitted[0].request_id, 13, 4, "settled:completed")
        assert float((await client.hgetall(level_key))[b"level"]) == pytest.approx(
            expected, abs=0.01)
        assert await client.zcard(keys.concurrency("t")) == len(admitted) - 1
        assert await client.xlen(keys.queue("interactive", "t")) == len(admitted)
        owner = await client.hgetall(keys.req(admitted[1].request_id, "t"))
        assert owner[b"tenant"] == b"t" and owner[b"state"] == b"queued"
        assert int(await client.hget(keys.tenant_stats("t"), "rejected:tpm")) == 12 - len(admitted)
    finally:
        await client.aclose()


def test_admit_and_settle_in_lua(redis_url: str) -> None:
    asyncio.run(_scenario(redis_url))
