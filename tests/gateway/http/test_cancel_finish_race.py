"""A cancel that races the finish leaves no output stream behind: the relay's cancel and DEL
land before the worker's final write, which arrives before the worker saw the CancelMsg
(real embedded Redis, the real writer and canceller)."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from engine.core.outputs import RequestOutput
from gateway.bus.keys import RedisKeys
from gateway.http.cancel import Canceller
from gateway.worker.writer import Inflight, OutputWriter
from policies.tiers import TIERS
from tests.gateway.queue_helpers import queue_keys

pytestmark = pytest.mark.timeout(30)


def outputs(rid: str) -> list[tuple[Inflight, RequestOutput]]:
    rec = Inflight(rid, TIERS[0], "0-1", tenant="t")  # reader_gone unset: the CancelMsg has not arrived
    return [(rec, RequestOutput(rid, [7], "a", False, None, 3, 1)),
            (rec, RequestOutput(rid, [8], "b", True, "length", 3, 2))]


@pytest.mark.parametrize("reader_gone", [True, False])
async def test_final_write_after_cancel(redis_url: str, reader_gone: bool) -> None:
    client = aioredis.Redis.from_url(redis_url)
    keys = RedisKeys(f"race{uuid.uuid4().hex[:8]}")
    rid = "req-1"
    writer = OutputWriter(client, keys, stream_ttl_s=600)
    try:
        await client.hset(keys.req(rid, "t"), mapping={"state": "running", "tenant": "t"})
        assert await Canceller(client, keys, 600).cancel(rid, "t", reader_gone, "disconnect") == "running"
        await client.delete(keys.out(rid, "t"))  # what the relay does right after cancelling
        await writer._write(outputs(rid))
        assert await client.hget(keys.req(rid, "t"), "state") == b"finished"
        if reader_gone:
            assert not await client.exists(keys.out(rid, "t"))
        else:  # an explicit cancel's reader is still there and needs the final event
            entries = await client.xrange(keys.out(rid, "t"))
            assert [e[1][b"t"] for e in entries] == [b"token", b"finish"]
            assert 0 < await client.ttl(keys.out(rid, "t")) <= 600
    finally:
        await client.delete(keys.req(rid, "t"), keys.out(rid, "t"), keys.tenant_stats("t"),
                            *queue_keys(keys))
        await client.aclose()
