"""The lean RESP connection of the hot loops, on asyncio's loop and on uvloop (what uvicorn
runs the gateway on), against real embedded Redis: replies and errors as redis-py gives them
raw, pipelined calls answered in order, a cancelled call that leaves the order intact,
EVALSHA falling back to EVAL, and a reconnect after the server drops the connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
import uvloop
from redis.credentials import UsernamePasswordCredentialProvider
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from gateway.bus.resp import RespConnection, Script

pytestmark = pytest.mark.timeout(30)


def run_on(loop_name: str, main: Callable[[], Awaitable[None]]) -> None:
    factory = uvloop.new_event_loop if loop_name == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


@contextlib.asynccontextmanager
async def lean(redis_url: str, *keys: str) -> AsyncIterator[tuple[Any, RespConnection]]:
    """A redis-py client and the lean connection built from it; ``keys`` deleted after."""
    client = aioredis.Redis.from_url(redis_url)
    conn = RespConnection.for_client(client)
    assert conn is not None
    try:
        yield client, conn
    finally:
        await conn.close()
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_calls_errors_scripts_and_reconnect(redis_url: str, loop_name: str) -> None:
    key = f"resp:{uuid.uuid4().hex}"

    async def main() -> None:
        async with lean(redis_url, key, key + ":x") as (client, conn):
            assert await conn.call("PING") == b"PONG"
            # concurrent calls are pipelined and each gets its own reply
            replies = await asyncio.gather(*(conn.call("INCR", key) for _ in range(50)))
            assert sorted(replies) == list(range(1, 51))
            with pytest.raises(ResponseError, match="WRONGTYPE"):
                await conn.call("XADD", key, "*", "f", "v")
            # a call cancelled while blocked: the next call still gets its own reply
            blocked = asyncio.create_task(conn.call("XREAD", "BLOCK", 200, "STREAMS",
                                                    key + ":s", "$"))
            await asyncio.sleep(0.05)
            blocked.cancel()
            assert await conn.call("GET", key) == b"50"
            script = Script(f"return {{KEYS[1], ARGV[1], '{uuid.uuid4().hex}'}}")
            res: Any = await conn.run_script(script, [key], [7])  # unknown sha: EVAL loads it
            assert res[:2] == [key.encode(), b"7"]
            assert await client.script_exists(script.sha) == [True]
            assert (await conn.run_script(script, [key], [8]))[:2] == [key.encode(), b"8"]
            entries = await conn.call("XADD", key + ":x", "*", "t", "token", "d", "{}")
            got = await conn.call("XREAD", "COUNT", 10, "STREAMS", key + ":x", "0-0")
            assert got == [[(key + ":x").encode(), [[entries, [b"t", b"token", b"d", b"{}"]]]]]
            # the server drops us: the in-flight call fails, the next one reconnects
            name = uuid.uuid4().hex
            await conn.call("CLIENT", "SETNAME", name)
            waiting = asyncio.create_task(conn.call("BLPOP", key + ":l", 5))
            await asyncio.sleep(0.05)
            for info in await client.client_list():
                if info.get("name") == name:
                    await client.client_kill_filter(_id=info["id"])
            with pytest.raises(RedisConnectionError):
                await waiting
            assert await conn.call("GET", key) == b"50"

    run_on(loop_name, main)


def test_not_for_unix_sockets_or_credential_providers() -> None:
    assert RespConnection.for_client(aioredis.Redis(unix_socket_path="/tmp/none.sock")) is None
    provider = UsernamePasswordCredentialProvider("u", "p")
    assert RespConnection.for_client(aioredis.Redis(credential_provider=provider)) is None
    assert RespConnection.for_client(aioredis.Redis(password="p")) is not None


def test_unpackable_argument_fails_its_call_only(redis_url: str) -> None:
    key = f"resp:{uuid.uuid4().hex}"

    async def main() -> None:
        async with lean(redis_url, key) as (_, conn):
            await conn.call("SET", key, "v")
            with pytest.raises(TypeError):
                await conn.call("SET", key, None)
            # the connection stays in step: the next call gets its own reply, not a stale one
            assert await asyncio.wait_for(conn.call("GET", key), 5) == b"v"

    run_on("asyncio", main)


def test_failed_handshake_leaks_no_socket_and_closed_refuses(redis_url: str) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        good = RespConnection.for_client(client)
        assert good is not None
        bad = RespConnection(good.host, good.port, db=99_999)  # SELECT fails
        try:
            before = len(await client.client_list())
            for _ in range(3):
                with pytest.raises(ResponseError):
                    await bad.call("PING")
            await asyncio.sleep(0.1)
            assert len(await client.client_list()) == before
            assert await good.call("PING") == b"PONG"
            await good.close()
            with pytest.raises(RedisConnectionError):
                await good.call("PING")  # closed: no silent reconnect
        finally:
            await bad.close()
            await client.aclose()

    run_on("asyncio", main)


def test_connections_probe_a_silent_redis(redis_url: str) -> None:
    async def main() -> None:
        async with lean(redis_url) as (_, conn):
            await conn.call("PING")
            assert conn._proto is not None
            sock = conn._proto.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            if hasattr(socket, "TCP_KEEPIDLE"):
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30

    for name in ("asyncio", "uvloop"):
        run_on(name, main)


def test_a_loading_redis_is_an_outage_and_other_errors_stay_response_errors() -> None:
    """A restarted Redis answers LOADING while it reads its AOF: the loops must see the
    outage (``UNREACHABLE``, retried quietly), not an error logged with its traceback."""
    from gateway.bus.outage import UNREACHABLE
    from gateway.bus.resp import _Protocol

    async def replies() -> list[BaseException | None]:
        proto = _Protocol()
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(3)]
        proto.waiters.extend(futs)
        proto.data_received(b"-LOADING Valkey is loading the dataset in memory\r\n"
                            b"-NOSCRIPT No matching script\r\n:7\r\n")
        return [f.exception() for f in futs]

    loading, noscript, ok = asyncio.run(replies())
    assert isinstance(loading, UNREACHABLE) and not isinstance(loading, ResponseError)
    assert "loading the dataset" in str(loading)
    assert isinstance(noscript, ResponseError) and str(noscript).startswith("NOSCRIPT")
    assert not isinstance(noscript, UNREACHABLE)
    assert ok is None
