"""What a streamed request costs Redis, on a server of its own (its command counts are this
module's alone; a script's inner commands count, as ``INFO commandstats`` counts them, and as
``carpool bench redis`` reports them): 32 requests from 32 tenants, each admitted, woken for,
picked, claimed, streamed 64 tokens one engine step at a time by the worker's writer,
finished and settled. Each phase's count is held to its budget, so a change that adds
commands to a request's path fails here; the tokens and the fair queue's charges are checked
against what was written (a write without its script must still write each token once and
charge each output token once)."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from gateway.bus.keys import RedisKeys
from gateway.bus.messages import FinishMsg, SubmitMsg, TokenMsg, decode
from gateway.bus.queues import TierQueues
from gateway.tenancy.quota import QuotaEnforcer
from gateway.tenancy.tenants import Tenant
from gateway.worker.writer import CHARGE_EVERY, OutputWriter, inflight_record
from policies.tiers import TIERS

pytestmark = pytest.mark.timeout(60)
TIER = TIERS[2]
STREAMS, TOKENS, PROMPT = 32, 64, 2


async def counts(client: Any) -> Counter[str]:
    stats = await client.info("commandstats")
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})


class Meter:
    """Commands by name since the last ``take`` (the INFO that reads them is left out)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.last: Counter[str] = Counter()

    async def take(self) -> Counter[str]:
        now = await counts(self.client)
        got = now - self.last
        self.last = now
        # not a request's: the INFO, a connection's handshake, a script's first load, and
        # the gateway's read of every shard's depth (at most every half second)
        for name in ("info", "hello", "client|setinfo", "eval", "script|load", "hgetall"):
            del got[name]
        return got


async def test_a_streamed_request_costs_its_budget(own_url: str) -> None:
    client: Any = aioredis.Redis.from_url(own_url)
    keys = RedisKeys(f"rc{uuid.uuid4().hex[:8]}")
    quota = QuotaEnforcer(client, keys, queue_max_len=1000, lease_ms=60_000, req_ttl_s=600,
                          ledger_retention_s=3600)
    queues = TierQueues(client, keys, TIERS)
    writer = OutputWriter(client, keys, stream_ttl_s=600)
    tenants = [Tenant(f"tenant{i}") for i in range(STREAMS)]
    meter = Meter(client)
    try:
        await meter.take()
        for i, t in enumerate(tenants):
            msg = SubmitMsg(f"r{i}", t.id, TIER, 0, [1] * PROMPT, TOKENS)
            assert (await quota.admit(t, msg, PROMPT + TOKENS)).ok
        admit = await meter.take()

        # a drainer woken by the first token picks every entry: the other tokens are stale
        assert await queues.wait([TIER], 1.0) == TIER
        got = (await queues.read_counts({TIER: STREAMS}, "w1"))[TIER]
        assert sorted(e.tenant for e in got) == sorted(t.id for t in tenants)
        assert await queues.claim_many([(e.msg.request_id, e.tenant) for e in got if e.msg],
                                       "w1", reclaim=False) == ["run"] * STREAMS
        assert await client.llen(keys.wake(TIER)) == 0  # no token left to wake anyone
        start = await meter.take()

        recs = [inflight_record(e, e.msg) for e in got if e.msg]
        for n in range(1, TOKENS + 1):
            await writer._write([(r, RequestOutput(
                r.request_id, [n], "x", n == TOKENS, "length" if n == TOKENS else None,
                PROMPT, n)) for r in recs])
        stream = await meter.take()

        for t, r in zip(tenants, sorted(recs, key=lambda r: int(r.request_id[1:]))):
            assert await quota.settle(t, r.request_id, PROMPT + TOKENS, PROMPT + TOKENS,
                                      "settled:completed")
        settle = await meter.take()

        # each stream: every token once, in order, then the finish
        for r in recs:
            msgs = [decode(f) for _, f in await client.xrange(keys.out(r.request_id, r.tenant))]
            assert [m.token_ids for m in msgs[:-1] if isinstance(m, TokenMsg)] == [
                [n] for n in range(1, TOKENS + 1)]
            assert isinstance(msgs[-1], FinishMsg)
            assert msgs[-1].finish_reason == FinishReason.LENGTH
            # the fair queue's counter and service: the prompt (at the pick) and every
            # output token, charged once
            vtc = keys.vtc(TIER, keys.shard_of(r.tenant))
            assert float(await client.hget(vtc, r.tenant)) == PROMPT + TOKENS
            assert float(await client.hget(vtc, f":s:{r.tenant}")) == PROMPT + TOKENS
    finally:
        await writer.close()
        await queues.close()
        await client.delete(*[k async for k in client.scan_iter(f"{keys.ns}:*")])
        await client.aclose()

    per_req = {name: sum(c.values()) / STREAMS for name, c in (
        ("admit", admit), ("start", start), ("settle", settle))}
    # a token write is its XADD, and the charge every CHARGE_EVERY writes (two); a script runs
    # only where a request finishes (one call per shard), with the finish's own commands
    shards = len({keys.shard_of(t.id) for t in tenants})
    assert stream["evalsha"] <= shards
    assert stream["xadd"] == STREAMS * (TOKENS + 1)
    assert stream["hincrbyfloat"] == 2 * STREAMS * -(-TOKENS // CHARGE_EVERY)
    finish = sum(stream.values()) / STREAMS - TOKENS - 2 * -(-TOKENS // CHARGE_EVERY)
    # the budgets: what each phase costs as written, plus about one
    assert per_req["admit"] <= 21, admit
    assert per_req["start"] <= 17, start
    assert finish <= 16, stream
    assert per_req["settle"] <= 4, settle
    # about 1.06 a token plus 55 a request: 1.9 at 64 tokens with a message per token (a
    # loaded worker's writes carry more than one: ``carpool bench redis``)
    total = (sum(per_req.values()) + sum(stream.values()) / STREAMS) / TOKENS
    assert total <= 1.95, (per_req, finish, total)
