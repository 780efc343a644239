"""Redis clients: every redis-py client a Carpool process uses is made here (asyncio ones,
and a synchronous one for the tools that make a few one-off calls).

One blocking pool per client: each in-flight request may hold a connection while it waits (a
non-streaming admission, a cancel), so the pool is large and a caller that finds it exhausted
waits (``timeout``) instead of failing. The hot loops add their own lean connections on top
(``resp.RespConnection.for_client``), with this client's settings.
"""

from __future__ import annotations

from typing import Any

MAX_REDIS_CONNECTIONS = 4096
POOL_TIMEOUT_S = 30


def redis_client(url: str) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` (``redis://``, ``rediss://``, ``unix://``)."""
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    # A pooled connection that Redis closed while it sat idle (a restart) fails on its next
    # use: the call is tried once more, at once, on a new connection, rather than answering
    # one more request 503 after Redis is back. (Once only: a dead server fails both fast.)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_REDIS_CONNECTIONS, timeout=POOL_TIMEOUT_S,
        retry_on_error=[RedisConnectionError])
    return aioredis.Redis(connection_pool=pool)


def sync_redis_client(url: str) -> Any:
    """A synchronous ``redis.Redis`` for ``url``, for a few one-off calls outside an event
    loop (the benchmark asks the server for its pid); close it after use."""
    import redis

    return redis.Redis.from_url(url)


def text(value: Any) -> str:
    """A reply value as text (these clients return bytes; a script's number as ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)
