"""``bus/queues.py`` owns the queue-entry protocol: no other gateway module runs the scripts
that add, delete or ack entries or issues those commands itself (the source is scanned), and
an entry's life through ``QueueEntries`` and ``TierQueues`` leaves the streams as Redis's own
commands say it should (admitted -> read -> finished: gone and acked; admitted -> cancelled:
gone)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.finish import FinishReason
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg, decode
from gateway.bus.queues import QueueEntries, TierQueues
from policies.tiers import TIERS
from tests.gateway.queue_helpers import queue_keys

pytestmark = pytest.mark.timeout(30)

GATEWAY = Path(__file__).resolve().parents[3] / "gateway"
# step_write.py builds the step script's call for queues.py, and beside it the plain XADDs of
# the shards where no request finishes (to output streams: a queue entry is acked and
# deleted only by the script)
OWNERS = {GATEWAY / "bus" / "queues.py", GATEWAY / "bus" / "scripts.py",
          GATEWAY / "bus" / "state_scripts.py", GATEWAY / "bus" / "step_write.py"}
# The scripts by name, a redis-py stream call (``.xadd(``) and a raw command (``"XACK"``);
# delivering (XREADGROUP) is the fair pick's, so it is the owner's too.
ENTRY_OPS = re.compile(r"\b(?:ADMIT|CANCEL|STEP|PICK)_LUA\b|\.x(?:add|ack|del|readgroup)\("
                       r"|[\"']x(?:add|ack|del|readgroup)[\"']", re.IGNORECASE)


def test_only_queues_module_adds_acks_or_deletes_entries() -> None:
    offenders = [f"{path.relative_to(GATEWAY)}: {m.group(0)}"
                 for path in sorted(GATEWAY.rglob("*.py")) if path not in OWNERS
                 for m in ENTRY_OPS.finditer(path.read_text())]
    assert not offenders, offenders


def test_the_scan_sees_what_it_looks_for() -> None:
    # the owners themselves would be flagged: the pattern matches the code as written
    for path in OWNERS:
        assert ENTRY_OPS.search(path.read_text()), path
    for line in ('await redis.xadd(key, fields)', 'conn.call("XDEL", key, eid)',
                 "pipe.execute_command('xack', key, GROUP, eid)", "LuaScript(r, c, STEP_LUA)",
                 'conn.call("XREADGROUP", "GROUP", g)', "LuaScript(r, c, PICK_LUA)"):
        assert ENTRY_OPS.search(line), line
    assert not ENTRY_OPS.search('"""Stream fields (``XADD key * t <type> d <json>``)."""')


def submit(request_id: str) -> SubmitMsg:
    return SubmitMsg(request_id=request_id, tenant_id="t", tier=TIERS[0], priority=0,
                     prompt_token_ids=[1, 2, 3], max_tokens=4)


def admit_args(cost: int = 7) -> dict[str, int]:
    return {"rpm": 0, "tpm": 0, "max_concurrency": 0, "queue_max_len": 100, "cost": cost,
            "lease_ms": 60_000, "req_ttl_s": 60}


async def test_an_entry_admitted_read_and_finished_is_acked_and_deleted(redis_url: str) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"qe{uuid.uuid4().hex[:8]}")
    queues, entries = TierQueues(client, keys, TIERS), QueueEntries(client, keys, None)
    queue = keys.queue(TIERS[0], "t")
    try:
        status, entry_id, *_ = await entries.admit(submit("a"), "t", **admit_args())
        assert status == "ok"
        assert [e[0].decode() for e in await client.xrange(queue)] == [entry_id]
        assert await client.hget(keys.req("a", "t"), "entry") == entry_id.encode()
        assert await queues.backlogs() == {t: int(t == TIERS[0]) for t in TIERS}
        [env] = await queues.pick(TIERS[0], "w1")
        assert (env.entry_id, env.msg, env.tenant) == (entry_id, submit("a"), "t")
        assert await queues.backlogs() == {t: 0 for t in TIERS}
        assert (await client.xpending(queue, GROUP))["pending"] == 1
        assert await queues.claim_many([("a", "t")], "w1", reclaim=False) == ["run"]

        step = entries.step(600)
        step.add("a", TIERS[0], entry_id, False, TokenMsg([5], "x"), None, tenant="t")
        await entries.write_step(step)
        assert (await client.xpending(queue, GROUP))["pending"] == 1  # not finished: kept

        finish = FinishMsg(FinishReason.LENGTH, 3, 2)
        step = entries.step(600)
        step.add("a", TIERS[0], entry_id, False, TokenMsg([6], "y"), finish, tenant="t")
        await entries.write_step(step)
        # its last entry gone, the stream goes and the tenant leaves the tier's set: an idle
        # tenant costs a reclaim round nothing
        assert not await client.exists(queue)
        assert not await client.smembers(keys.queue_tenants(TIERS[0], keys.shard_of("t")))
        out = [decode(f) for _, f in await client.xrange(keys.out("a", "t"))]
        assert out == [TokenMsg([5], "x"), TokenMsg([6], "y"), finish]
        assert await client.hget(keys.tenant_stats("t"), "completed") == b"1"
    finally:
        await queues.close()
        await client.delete(queue, keys.req("a", "t"), keys.out("a", "t"), keys.tenant_stats("t"),
                            keys.concurrency("t"), *tier_keys(keys))
        await client.aclose()


async def test_a_cancelled_queued_entry_is_deleted_and_refusals_enqueue_nothing(
        redis_url: str) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"qe{uuid.uuid4().hex[:8]}")
    entries = QueueEntries(client, keys, None)
    queues = TierQueues(client, keys, TIERS)
    queue = keys.queue(TIERS[0], "t")
    try:
        status, *_ = await entries.admit(submit("c"), "t", **admit_args())
        assert status == "ok" and await client.xlen(queue) == 1
        assert (await queues.backlogs())[TIERS[0]] == 1
        assert await entries.cancel("c", "t", TIERS[0], False, "test", 600) == "queued"
        assert await client.xlen(queue) == 0
        assert (await queues.backlogs())[TIERS[0]] == 0  # undelivered: left the backlog
        assert await client.hget(keys.req("c", "t"), "state") == b"cancelled"
        [(_, fields)] = await client.xrange(keys.out("c", "t"))
        assert decode(fields) == FinishMsg(FinishReason.ABORT, 0, 0, "cancelled: test")
        assert await entries.cancel("c", "t", TIERS[0], False, "test", 600) == "cancelled"

        full = dict(admit_args(), queue_max_len=1)
        await entries.admit(submit("d"), "t", **full)
        assert (await entries.admit(submit("e"), "t", **full))[:2] == ("queue_full", "1")
        # the limit is per tier: another tenant's stream in it counts too
        other = SubmitMsg("f", "u", TIERS[0], 0, [1], 1)
        assert (await entries.admit(other, "u", **full))[:2] == ("queue_full", "1")
        assert await client.xlen(queue) == 1
    finally:
        await queues.close()
        await client.delete(queue, keys.req("c", "t"), keys.req("d", "t"), keys.out("c", "t"), keys.tenant_stats("t"),
                            keys.concurrency("t"), *tier_keys(keys))
        await client.aclose()


def tier_keys(keys: RedisKeys) -> list[str]:
    return queue_keys(keys, ())


async def test_reclaim_covers_every_tenant_stream_and_a_delivered_cancel_keeps_the_backlog(
        redis_url: str) -> None:
    client: Any = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"qe{uuid.uuid4().hex[:8]}")
    queues, entries = TierQueues(client, keys, TIERS), QueueEntries(client, keys, None)
    tier = TIERS[2]
    try:
        for rid, tenant in (("x1", "t"), ("x2", "u"), ("x3", "u")):
            msg = SubmitMsg(rid, tenant, tier, 2, [1, 2], 4)
            assert (await entries.admit(msg, tenant, **admit_args()))[0] == "ok"
        got = await queues.pick(tier, "dead", 2)
        assert sorted(e.tenant for e in got) == ["t", "u"]
        assert (await queues.backlogs())[tier] == 1
        # delivered but not yet claimed: the cancel deletes it, the backlog count stays
        assert await entries.cancel("x1", "t", tier, True, "test", 60) == "queued"
        assert (await queues.backlogs())[tier] == 1
        reclaimed = await queues.autoclaim(tier, "alive", min_idle_ms=0)
        # u's live entry comes back; t's stream went with its only (deleted) entry
        assert [(e.tenant, e.msg.request_id if e.msg else None) for e in reclaimed] == [
            ("u", "x2")]
        assert not await client.exists(keys.queue(tier, "t"))
        pending = await client.xpending_range(keys.queue(tier, "u"), GROUP, "-", "+", 10)
        assert [p["consumer"] for p in pending] == [b"alive"]
    finally:
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()
