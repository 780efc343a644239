"""The usage ledger's pure parts (rows, groups, ranges, CSV) and its write in the settle
script against a real Redis: once per request, atomic with the quota refund."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.bus.keys import RedisKeys
from gateway.bus.messages import SubmitMsg
from gateway.tenancy.ledger import (
    LedgerEntry,
    UsageLedger,
    UsageRow,
    field_prefix,
    group_rows,
    hour_of,
    hours_between,
    ledger_ttl,
    model_id,
    parse_range,
    rows_from_hash,
    to_csv,
)
from gateway.tenancy.quota import QuotaEnforcer
from gateway.tenancy.tenants import Tenant, TenantQuota

pytestmark = pytest.mark.timeout(30)

T0 = datetime(2026, 12, 1, 10, 30, tzinfo=UTC).timestamp()


def row(hour: str = "2026120110", key: str = "k1", tier: str = "interactive",
        model: str = "m", **metrics: int) -> UsageRow:
    return UsageRow("acme", hour, key, tier, model, **metrics)


def test_hour_and_prefix() -> None:
    assert hour_of(T0) == "2026120110"
    assert field_prefix("abc", "batch", "org|model") == f"abc|b|{model_id('org|model')}|"
    assert field_prefix("", "best-effort", "m") == f"-|e|{model_id('m')}|"
    # every field fits Redis's compact hash encoding (64 bytes), whatever the model's name
    longest = field_prefix("0" * 12, "interactive", "x" * 200) + "e:cancelled_by_client"
    assert len(longest) <= 64


def test_rows_from_hash_reads_every_metric() -> None:
    p = field_prefix("k1", "interactive", "m")
    h = {(p + "r").encode(): b"3", (p + "p").encode(): b"30", (p + "c").encode(): b"8",
         (p + "d").encode(): b"12", (p + "x").encode(): b"20", (p + "$").encode(): b"7",
         (p + "e:timeout").encode(): b"1", b"not-a-ledger-field": b"9"}
    (r,) = rows_from_hash("acme", "2026120110", h, {model_id("m"): "m"})
    assert (r.key_id, r.tier, r.model, r.cost_micro) == ("k1", "interactive", "m", 7)
    assert rows_from_hash("acme", "2026120110", h)[0].model == model_id("m")
    assert (r.requests, r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (3, 30, 8, 12)
    assert r.undelivered_tokens == 8 and r.errors == {"timeout": 1}


def test_group_rows_sums_per_group() -> None:
    rows = [row(requests=1, completion_tokens=5, errors={"timeout": 1}),
            row(hour="2026120111", key="k2", requests=2, completion_tokens=7),
            row(hour="2026120210", tier="batch", requests=4, completion_tokens=1,
                errors={"timeout": 2, "cancelled": 1})]
    by_day = group_rows(rows, "day")
    assert [(r.hour, r.requests, r.completion_tokens) for r in by_day] == [
        ("20261201", 3, 12), ("20261202", 4, 1)]
    (total,) = {r.tier: r for r in group_rows(rows, "tier") if r.tier == "interactive"}.values()
    assert total.requests == 3
    assert group_rows(rows, "tier")[0].errors == {"timeout": 2, "cancelled": 1}
    assert sum(r.requests for r in group_rows(rows, "key")) == 7
    assert len(group_rows(rows, "hour")) == 3 and len(group_rows(rows, "model")) == 1
    with pytest.raises(ValueError, match="group_by"):
        group_rows(rows, "week")


def test_parse_range_and_hours() -> None:
    t0, t1 = parse_range("2026-12-01", "2026-12-02", now=0)
    assert len(hours_between(t0, t1)) == 24
    assert hours_between(t0, t1)[0] == "2026120100"
    t0, t1 = parse_range(None, None, now=T0)
    assert (t1 - t0).days == 30 and hours_between(t0, t1)[-1] == "2026120110"
    assert parse_range("1764583200", "2026-12-01T11:00:00+01:00", now=0)[1].hour == 10
    for start, end, words in (("2026-13-01", None, "not a date"),
                              ("2026-12-02", "2026-12-01", "after"),
                              ("2020-01-01", "2026-01-01", "more than")):
        with pytest.raises(ValueError, match=words):
            parse_range(start, end, now=T0)


def test_csv_has_a_header_and_a_line_per_row() -> None:
    text = to_csv([row(requests=1, completion_tokens=5, computed_tokens=9,
                       errors={"timeout": 1})])
    head, line = text.strip().split("\n")
    assert head.startswith("tenant,hour,key_id") and line.endswith(",5,9,4,0.0,timeout=1")


def ledger_quota(redis_url: str) -> tuple[Any, RedisKeys, QuotaEnforcer]:
    """A client, a fresh namespace and a quota enforcer with the ledger on (an hour kept)."""
    import redis.asyncio as aioredis

    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"led{uuid.uuid4().hex[:8]}")
    return client, keys, QuotaEnforcer(client, keys, queue_max_len=100, lease_ms=60_000,
                                       req_ttl_s=60, ledger_retention_s=3600)


async def _settle_writes_once(redis_url: str) -> None:
    client, keys, quota = ledger_quota(redis_url)
    tenant = Tenant("t", "t", TenantQuota(tpm=1000))
    entry = LedgerEntry(hour_of(T0), field_prefix("k1", "interactive", "m"), 3, 1, 4,
                        "timeout")
    try:
        msg = SubmitMsg(request_id="r1", tenant_id="t", tier="interactive", priority=0,
                        prompt_token_ids=[1, 2, 3], max_tokens=10)
        assert (await quota.admit(tenant, msg, 13)).ok
        for _ in range(3):  # every exit path may settle: counted once
            await quota.settle(tenant, "r1", 13, 7, "settled:aborted", usage=entry)
        ledger = UsageLedger(client, keys)
        await ledger.register_model("m")
        assert await ledger.tenants() == ["t"]
        t0, t1 = parse_range("2026-12-01", "2026-12-02", now=0)
        (r,) = await ledger.read(["t"], t0, t1)
        assert (r.requests, r.prompt_tokens, r.cached_tokens, r.completion_tokens,
                r.errors, r.model) == (1, 3, 1, 4, {"timeout": 1}, "m")
        # set by the row's first write: the retention past the hour and a request's length
        assert 3600 < await client.ttl(keys.usage("t", entry.hour)) <= ledger_ttl(3600)
        # a settle with the ledger off writes no row
        off = QuotaEnforcer(client, keys, queue_max_len=100, lease_ms=60_000, req_ttl_s=60)
        msg2 = SubmitMsg(request_id="r2", tenant_id="t", tier="interactive", priority=0,
                         prompt_token_ids=[1], max_tokens=1)
        assert (await off.admit(tenant, msg2, 2)).ok
        assert await off.settle(tenant, "r2", 2, 2, "settled:completed", usage=entry)
        assert (await ledger.read(["t"], t0, t1))[0].requests == 1
    finally:
        await client.aclose()


def test_settle_writes_the_ledger_row_once(redis_url: str) -> None:
    asyncio.run(_settle_writes_once(redis_url))


async def _ttl_per_row(redis_url: str) -> None:
    client, keys, quota = ledger_quota(redis_url)
    tenant = Tenant("t", "t", TenantQuota())
    usage_key = keys.usage("t", hour_of(T0))

    async def one(rid: str, key_id: str) -> None:
        msg = SubmitMsg(request_id=rid, tenant_id="t", tier="batch", priority=0,
                        prompt_token_ids=[1], max_tokens=2)
        assert (await quota.admit(tenant, msg, 3)).ok
        entry = LedgerEntry(hour_of(T0), field_prefix(key_id, "batch", "m"), 1, 0, 2)
        assert await quota.settle(tenant, rid, 3, 3, "settled:completed", usage=entry)

    try:
        await one("r1", "k1")
        assert 3600 < await client.ttl(usage_key) <= ledger_ttl(3600)
        await client.expire(usage_key, 100)
        await one("r2", "k1")  # the same row: its TTL stands
        assert await client.ttl(usage_key) <= 100
        await one("r3", "k2")  # a new row (another key): the TTL is set again
        assert await client.ttl(usage_key) > 3600
        t0, t1 = parse_range("2026-12-01", "2026-12-02", now=0)
        rows = await UsageLedger(client, keys).read(["t"], t0, t1)
        assert sorted((r.key_id, r.requests) for r in rows) == [("k1", 2), ("k2", 1)]
    finally:
        await quota.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()


def test_a_ledger_rows_first_request_sets_its_ttl_and_later_ones_leave_it(
        redis_url: str) -> None:
    asyncio.run(_ttl_per_row(redis_url))


async def _settle_retried(redis_url: str) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    client, keys, quota = ledger_quota(redis_url)
    tenant = Tenant("t", "t", TenantQuota())
    entry = LedgerEntry(hour_of(T0), field_prefix("k1", "batch", "m"), 2, 0, 5)
    real, calls = quota._settle, []

    async def flaky(**kw: object) -> object:  # Redis away for the first call
        calls.append(kw)
        if len(calls) == 1:
            raise RedisConnectionError("Connection refused")
        return await real(**kw)

    quota._settle = flaky  # type: ignore[assignment]
    try:
        msg = SubmitMsg(request_id="r1", tenant_id="t", tier="batch", priority=0,
                        prompt_token_ids=[1, 2], max_tokens=5)
        assert (await quota.admit(tenant, msg, 7)).ok
        with pytest.raises(RedisConnectionError):
            await quota.settle(tenant, "r1", 7, 7, "settled:completed", usage=entry)
        t0, t1 = parse_range("2026-12-01", "2026-12-02", now=0)
        ledger = UsageLedger(client, keys)
        for _ in range(100):  # the retry runs in the background, after its backoff
            if await ledger.read(["t"], t0, t1):
                break
            await asyncio.sleep(0.05)
        (r,) = await ledger.read(["t"], t0, t1)
        assert (r.requests, r.completion_tokens) == (1, 5) and len(calls) == 2
        assert await client.zcard(keys.concurrency("t")) == 0  # the lease went back too
    finally:
        await quota.close()
        await client.aclose()


def test_a_settle_redis_did_not_answer_is_retried(redis_url: str) -> None:
    asyncio.run(_settle_retried(redis_url))
