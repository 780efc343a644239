"""The audit trail's pure parts and its bounded stream against a real Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.bus.keys import RedisKeys
from gateway.tenancy.audit import AuditEntry, AuditLog, changed_only, tenant_action
from gateway.tenancy.keys import generate_key

pytestmark = pytest.mark.timeout(30)


def test_tenant_actions_and_changes() -> None:
    t = {"id": "a", "rpm": 1, "budget_tokens": 0, "budget_period": "monthly"}
    assert tenant_action(None, t) == "tenant.create"
    assert tenant_action(t, None) == "tenant.delete"
    assert tenant_action(t, {**t, "budget_tokens": 9}) == "budget.update"
    assert tenant_action(t, {**t, "budget_tokens": 9, "rpm": 2}) == "tenant.update"
    assert tenant_action(t, t) == "tenant.update"
    assert changed_only(t, {**t, "rpm": 5}) == ({"rpm": 1}, {"rpm": 5})
    assert changed_only(None, t) == (None, t)


def test_an_entry_never_holds_a_key() -> None:
    with pytest.raises(ValueError, match="must not contain a key"):
        AuditEntry("key.issue", "a/1", "k", "127.0.0.1", None, {"key": generate_key()})


async def _bounded(redis_url: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"aud{uuid.uuid4().hex[:8]}")
    log = AuditLog(client, keys, max_len=100)
    try:
        for i in range(600):
            await log.append(AuditEntry("tenant.update", f"t{i}", "kid", "10.0.0.1",
                                        {"rpm": i}, {"rpm": i + 1}))
        assert 100 <= await client.xlen(keys.audit) < 300  # trimmed (MAXLEN ~)
        newest = await log.read(3)
        assert [e.target for e in newest] == ["t599", "t598", "t597"]
        assert newest[0].before == {"rpm": 599} and newest[0].admin_key_id == "kid"
        older = await log.read(2, before=newest[-1].id)
        assert [e.target for e in older] == ["t596", "t595"]
    finally:
        await client.aclose()


def test_stream_is_bounded_and_read_newest_first(redis_url: str) -> None:
    asyncio.run(_bounded(redis_url))
