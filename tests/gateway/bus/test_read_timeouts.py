"""Read timeouts (``bus/client.py``, ``bus/resp.py``) against real embedded Redis, a blocking
command standing in for a server that does not answer: the request path's client and its lean
connection raise redis-py's ``TimeoutError`` when no reply comes in their read timeout (the
lean one then reconnects for the next call), a call that blocks on purpose adds its own wait,
and the blocking client (the worker's cancel listener) waits for a pubsub message however
long it takes; every client keeps its connect timeout and TCP keepalive."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.bus.client import CONNECT_TIMEOUT_S, blocking_client, redis_client
from gateway.bus.resp import RespConnection

pytestmark = pytest.mark.timeout(30)

SHORT_S = 0.3  # the read timeout under test
BLOCK_S = 1  # BLPOP's own wait on an empty list: longer than SHORT_S


async def test_the_request_client_times_out_and_the_blocking_one_waits(redis_url: str) -> None:
    client = redis_client(redis_url, socket_timeout_s=SHORT_S)
    listener = blocking_client(client)
    key, channel = f"t-empty-{uuid.uuid4().hex}", f"t-chan-{uuid.uuid4().hex}"
    try:
        kw = client.connection_pool.connection_kwargs
        assert kw["socket_connect_timeout"] == CONNECT_TIMEOUT_S and kw["socket_keepalive"]
        with pytest.raises(RedisTimeoutError):
            await client.blpop([key], timeout=BLOCK_S)
        assert await client.ping()  # the next call goes through
        assert await listener.blpop([key], timeout=BLOCK_S) is None  # waited it out
        pubsub = listener.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(channel)

        async def publish_later() -> None:
            await asyncio.sleep(3 * SHORT_S)
            await client.publish(channel, b"cancel")

        async def next_message() -> dict[str, object]:
            while True:  # (the subscribe confirmation comes back as None)
                got = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                if got is not None:
                    return got  # type: ignore[no-any-return]

        task = asyncio.create_task(publish_later())
        message = await asyncio.wait_for(next_message(), 10)
        await task
        assert message is not None and message["data"] == b"cancel"
        await pubsub.aclose()
    finally:
        await listener.aclose()
        await client.aclose()


async def test_the_lean_connection_times_out_then_reconnects(redis_url: str) -> None:
    client = redis_client(redis_url, socket_timeout_s=SHORT_S)
    conn = RespConnection.for_client(client)
    assert conn is not None and conn.timeout_s == SHORT_S
    key = f"t-empty-{uuid.uuid4().hex}"
    try:
        with pytest.raises(RedisTimeoutError):
            await conn.call("BLPOP", key, BLOCK_S)
        assert await conn.call("PING") == b"PONG"  # a fresh connection, replies in order
        assert await conn.call("BLPOP", key, BLOCK_S, wait_s=BLOCK_S) is None
        await conn.call("RPUSH", key, b"x")
        assert await conn.call("LPOP", key) == b"x"
    finally:
        await conn.close()
        await client.aclose()
