"""``bus/client.py``: the redis-py client factories (asyncio and sync), and the lean connection
built from the asyncio one."""

from __future__ import annotations

import asyncio

from gateway.bus.client import MAX_REDIS_CONNECTIONS, redis_client, sync_redis_client
from gateway.bus.resp import RespConnection


def test_client_and_its_lean_connection_reach_the_same_server(redis_url: str) -> None:
    async def go() -> tuple[bytes | None, bytes]:
        client = redis_client(redis_url)
        conn = RespConnection.for_client(client)
        assert conn is not None
        try:
            assert client.connection_pool.max_connections == MAX_REDIS_CONNECTIONS
            await client.set("t-client-probe", b"seen")
            return await client.get("t-client-probe"), await conn.call("GET", "t-client-probe")
        finally:
            await conn.close()
            await client.delete("t-client-probe")
            await client.aclose()

    via_client, via_lean = asyncio.run(go())
    assert via_client == via_lean == b"seen"


def test_the_sync_client_reaches_the_same_server(redis_url: str) -> None:
    sync = sync_redis_client(redis_url)
    try:
        sync.set("t-sync-probe", b"from sync")

        async def read() -> bytes | None:
            client = redis_client(redis_url)
            try:
                return await client.get("t-sync-probe")  # type: ignore[no-any-return]
            finally:
                await client.aclose()

        assert asyncio.run(read()) == b"from sync"
    finally:
        sync.delete("t-sync-probe")
        sync.close()
