"""The process-wide output reader survives a malformed stream entry: it is skipped and the
valid entries around it (and other streams) are still delivered (real embedded Redis)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from gateway.bus.messages import FinishMsg, TokenMsg, encode
from gateway.http.output_mux import OutputMux

pytestmark = pytest.mark.timeout(30)


async def next_messages(queue: asyncio.Queue[list[object]], n: int) -> list[object]:
    got: list[object] = []
    async with asyncio.timeout(5):
        while len(got) < n:
            got.extend(await queue.get())
    return got


async def test_malformed_entry_is_skipped(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    mux = OutputMux(client)
    bad_key, other_key = f"mux:{uuid.uuid4().hex}", f"mux:{uuid.uuid4().hex}"
    try:
        mux.start()
        bad_q, other_q = mux.register(bad_key), mux.register(other_key)
        await client.xadd(bad_key, encode(TokenMsg([1], "a")))
        await client.xadd(bad_key, {"t": "nonsense", "d": "{"})
        await client.xadd(bad_key, {"x": "no type"})
        await client.xadd(bad_key, encode(FinishMsg("stop", 1, 1)))
        assert await next_messages(bad_q, 2) == [TokenMsg([1], "a"), FinishMsg("stop", 1, 1)]
        # the reader is still alive for later entries and other streams
        await client.xadd(other_key, encode(TokenMsg([2], "b")))
        assert await next_messages(other_q, 1) == [TokenMsg([2], "b")]
        assert mux._task is not None and not mux._task.done()
    finally:
        # stop while idle: a cancel landing mid-XREAD can be lost inside redis-py
        mux.unregister(bad_key)
        mux.unregister(other_key)
        await asyncio.sleep(0.05)
        await mux.stop()
        await client.delete(bad_key, other_key)
        await client.aclose()
