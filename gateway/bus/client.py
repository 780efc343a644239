"""Redis clients: every redis-py client a Carpool process uses is made here (asyncio ones,
and a synchronous one for the tools that make a few one-off calls).

One blocking pool per client: each in-flight request may hold a connection while it waits (a
non-streaming admission, a cancel), so the pool is large and a caller that finds it exhausted
waits (``timeout``) instead of failing. The hot loops add their own lean connections on top
(``resp.RespConnection.for_client``), with this client's settings.

No call waits on Redis forever: a connect gives up after ``CONNECT_TIMEOUT_S``, a reply that
does not come in ``REQUEST_TIMEOUT_S`` (a frozen or partitioned server: the TCP connection
stays up, nothing answers) raises redis-py's ``TimeoutError``, which the HTTP edge answers
503 like a refused connection (``http/backend.py``, ``bus/outage.py``). Calls that wait on
purpose use a client without the read timeout (``blocking_client``: the worker's cancel
listener) or add their own wait to it (``RespConnection.call(wait_s=...)``: BLPOP).
"""

from __future__ import annotations

from typing import Any

MAX_REDIS_CONNECTIONS = 4096
POOL_TIMEOUT_S = 30
# A request's Redis call answers in well under a millisecond; one with no reply in this long
# means the server is frozen or cut off, and the request is answered 503 instead of hanging.
REQUEST_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
BLOCKING_MAX_CONNECTIONS = 16


def _socket_options(url: str, socket_timeout_s: float | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"socket_timeout": socket_timeout_s,
                            "socket_connect_timeout": CONNECT_TIMEOUT_S}
    if not url.startswith("unix:"):  # TCP keepalive: a vanished host is noticed, not waited on
        opts["socket_keepalive"] = True
    return opts


def redis_client(url: str, socket_timeout_s: float | None = REQUEST_TIMEOUT_S) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` (``redis://``, ``rediss://``, ``unix://``);
    each reply is waited for at most ``socket_timeout_s`` (None: forever)."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    # A pooled connection that Redis closed while it sat idle (a restart) fails on its next
    # use: the call is tried once more, at once, on a new connection, rather than answering
    # one more request 503 after Redis is back. (Once only: a dead server fails both fast.)
    # A timeout is not retried: a frozen server would just make the caller wait twice.
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_REDIS_CONNECTIONS, timeout=POOL_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        retry_on_error=[RedisConnectionError], **_socket_options(url, socket_timeout_s))
    return aioredis.Redis(connection_pool=pool)


def blocking_client(redis: Any) -> Any:
    """A client to the server ``redis`` talks to, with its settings but no read timeout, for
    the calls that wait on purpose (a pubsub listener waits for the next message however long
    it takes); a small pool of its own. Close it after use."""
    import redis.asyncio as aioredis

    pool = redis.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": None}
    return aioredis.Redis(connection_pool=aioredis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=BLOCKING_MAX_CONNECTIONS,
        **kwargs))


def sync_redis_client(url: str) -> Any:
    """A synchronous ``redis.Redis`` for ``url``, for a few one-off calls outside an event
    loop (the benchmark asks the server for its pid); close it after use."""
    import redis

    return redis.Redis.from_url(url, **_socket_options(url, REQUEST_TIMEOUT_S))


def text(value: Any) -> str:
    """A reply value as text (these clients return bytes; a script's number as ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)
