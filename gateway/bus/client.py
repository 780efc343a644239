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

A Redis Cluster is named by the URL option ``cluster=1`` (``redis://host:port/?cluster=1``,
any node will do): the client is then redis-py's ``RedisCluster``, which follows MOVED and
ASK and routes each command (a script: by its keys) to its slot's master. The key layout
(``keys.py``) keeps every script and transaction in one slot; the lean connections of the hot
loops are plain-server only (``RespConnection.for_client`` -> None), so on a cluster the hot
loops run on redis-py too.

Sentinel: ``redis+sentinel://[user:password@]host:port[,host:port...]/service[?db=N]`` names
the sentinels and the monitored service; the client asks them for the current master and
asks again after a failover (redis-py's ``Sentinel.master_for``); the password is the
master's (the sentinels take none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_REDIS_CONNECTIONS = 4096
POOL_TIMEOUT_S = 30
# A request's Redis call answers in well under a millisecond; one with no reply in this long
# means the server is frozen or cut off, and the request is answered 503 instead of hanging.
REQUEST_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
BLOCKING_MAX_CONNECTIONS = 16
# A cluster command that meets a failing-over or moving slot (a refused connection,
# CLUSTERDOWN) is retried, the topology read again before each try, with a backoff from 10 ms
# that stops growing at CLUSTER_RETRY_CAP_S: with redis-py's 1 s cap, clients noticed a
# promoted replica 1.3 s after the promotion, with this one 0.4-0.9 s after it
# (tests/gateway/faults/test_cluster_faults.py). CLUSTER_RETRIES tries ride out about 4 s (a
# failover with a node timeout of 1-2 s) before the call fails: the request gets a 503 with
# Retry-After.
CLUSTER_RETRY_CAP_S = 0.25
CLUSTER_RETRIES = 20


def _socket_options(url: str, socket_timeout_s: float | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"socket_timeout": socket_timeout_s,
                            "socket_connect_timeout": CONNECT_TIMEOUT_S}
    if not url.startswith("unix:"):  # TCP keepalive: a vanished host is noticed, not waited on
        opts["socket_keepalive"] = True
    return opts


def cluster_url(url: str) -> str | None:
    """``url`` without its ``cluster=1`` option if it names a cluster, else None."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    flags = [v for k, v in query if k == "cluster"]
    if not flags or flags[-1].lower() not in ("1", "true", "yes"):
        return None
    rest = urlencode([(k, v) for k, v in query if k != "cluster"])
    return urlunsplit(parts._replace(query=rest))


@dataclass(frozen=True)
class SentinelURL:
    sentinels: list[tuple[str, int]]
    service: str
    username: str | None
    password: str | None
    db: int


def sentinel_url(url: str) -> SentinelURL | None:
    """The parts of a ``redis+sentinel://`` URL, or None for any other URL."""
    from urllib.parse import parse_qs, unquote

    prefix = "redis+sentinel://"
    if not url.startswith(prefix):
        return None
    rest, _, query = url[len(prefix):].partition("?")
    netloc, _, service = rest.partition("/")
    creds, _, hosts = netloc.rpartition("@")
    user, _, password = creds.partition(":")
    nodes = []
    for h in hosts.split(","):
        host, _, port = h.rpartition(":")
        nodes.append((host or "127.0.0.1", int(port or 26379)))
    if not service.strip("/"):
        raise ValueError("a redis+sentinel:// URL names its service: .../mymaster")
    db = int(parse_qs(query).get("db", ["0"])[0])
    return SentinelURL(nodes, service.strip("/"), unquote(user) or None,
                       unquote(password) or None, db)


def _sentinel_master(parts: SentinelURL, socket_timeout_s: float | None,
                     sync: bool = False) -> Any:
    if sync:
        from redis.sentinel import Sentinel as SyncSentinel

        sentinel: Any = SyncSentinel(parts.sentinels, socket_timeout=CONNECT_TIMEOUT_S)
    else:
        from redis.asyncio.sentinel import Sentinel

        sentinel = Sentinel(parts.sentinels, socket_timeout=CONNECT_TIMEOUT_S)
    return sentinel.master_for(parts.service, username=parts.username,
                               password=parts.password, db=parts.db,
                               socket_timeout=socket_timeout_s,
                               socket_connect_timeout=CONNECT_TIMEOUT_S, socket_keepalive=True)


def _cluster_client(url: str, socket_timeout_s: float | None) -> Any:
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff

    retry = Retry(ExponentialWithJitterBackoff(cap=CLUSTER_RETRY_CAP_S, base=0.01),
                  CLUSTER_RETRIES)
    return RedisCluster.from_url(url, max_connections=MAX_REDIS_CONNECTIONS, retry=retry,
                                 **_socket_options(url, socket_timeout_s))


def redis_client(url: str, socket_timeout_s: float | None = REQUEST_TIMEOUT_S) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` (``redis://``, ``rediss://``, ``unix://``), or a
    ``RedisCluster`` for a URL with ``cluster=1``; each reply is waited for at most
    ``socket_timeout_s`` (None: forever)."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    if (plain := cluster_url(url)) is not None:
        return _cluster_client(plain, socket_timeout_s)
    if (sentinel := sentinel_url(url)) is not None:
        return _sentinel_master(sentinel, socket_timeout_s)

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

    if not hasattr(redis, "connection_pool"):  # a cluster: PUBLISH reaches every node, so a
        # subscriber on any one of them hears it; whichever node accepts (``_AnyClusterNode``)
        node = (redis.get_nodes() or list(redis.nodes_manager.startup_nodes.values()))[0]
        kwargs = {k: v for k, v in redis.get_connection_kwargs().items() if k in _PLAIN_KWARGS}
        base = aioredis.SSLConnection if kwargs.pop("ssl", False) else aioredis.Connection
        follows = type("AnyClusterNode", (_AnyClusterNode, base), {"cluster": redis})
        return aioredis.Redis(connection_pool=aioredis.ConnectionPool(
            connection_class=follows, host=node.host, port=node.port,
            max_connections=BLOCKING_MAX_CONNECTIONS, **{**kwargs, "socket_timeout": None}))
    pool = redis.connection_pool
    if hasattr(pool, "service_name"):  # Sentinel: the same service's master, no read timeout
        return pool.sentinel_manager.master_for(
            pool.service_name, socket_timeout=None, socket_keepalive=True,
            **{k: v for k, v in pool.connection_kwargs.items()
               if k in ("username", "password", "db", "socket_connect_timeout")})
    kwargs = {**pool.connection_kwargs, "socket_timeout": None}
    return aioredis.Redis(connection_pool=aioredis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=BLOCKING_MAX_CONNECTIONS,
        **kwargs))


class _AnyClusterNode:
    """Mixed into a connection class for a cluster's listener (a pub/sub subscriber): each
    connect, a reconnect after its node died included, goes to the first node that accepts:
    the one it used last, then the masters and replicas the cluster client knows (its node
    cache, read again whenever its own commands meet a failover). Pinned to the node it
    started on, a worker's cancel listener stayed deaf once that node died: its requests
    generated on after their clients had gone (tests/gateway/faults/test_cluster_faults.py)."""

    cluster: Any = None  # the cluster client, set on the class made per listener client
    host: str
    port: int

    def _candidates(self) -> list[tuple[str, int]]:
        nodes = [*self.cluster.get_primaries(), *self.cluster.get_replicas(),
                 *self.cluster.nodes_manager.startup_nodes.values()]
        found = [(self.host, self.port)]
        for node in nodes:
            if (node.host, node.port) not in found:
                found.append((node.host, node.port))
        return found

    async def _connect(self) -> None:
        failed: BaseException | None = None
        for host, port in self._candidates():
            self.host, self.port = host, port
            try:
                await super()._connect()  # type: ignore[misc]
                return
            except (OSError, TimeoutError) as exc:  # refused, unreachable: the next node
                failed = exc
        assert failed is not None
        raise failed


# the connection settings a plain client takes from a cluster client's
_PLAIN_KWARGS = ("username", "password", "socket_connect_timeout", "socket_keepalive", "ssl",
                 "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
                 "ssl_check_hostname", "socket_timeout")


def check_redis(url: str) -> None:
    """PING the server ``url`` names; if that fails (refused, a TLS certificate that does not
    verify, a wrong user or password) exit with one line that says where and why."""
    from urllib.parse import urlsplit

    import redis as sync_redis
    from redis.cluster import RedisCluster

    sentinel = sentinel_url(url)
    if sentinel is not None:
        where = f"the master of {sentinel.service} (sentinels {sentinel.sentinels})"
    else:
        parts = urlsplit(url)
        where = f"{parts.hostname}:{parts.port}" if parts.hostname else parts.path
    plain = cluster_url(url)
    try:
        if sentinel is not None:
            client = _sentinel_master(sentinel, REQUEST_TIMEOUT_S, sync=True)
        elif plain is not None:
            client = RedisCluster.from_url(plain, **_socket_options(plain, REQUEST_TIMEOUT_S))
        else:
            client = sync_redis_client(url)
        try:
            client.ping()
        finally:
            client.close()
    except sync_redis.AuthenticationError as exc:
        raise SystemExit(f"carpool: Redis at {where} refused the user or password: {exc}") \
            from None
    except (sync_redis.RedisError, OSError) as exc:
        raise SystemExit(f"carpool: cannot use Redis at {where}: {exc}") from None


def sync_redis_client(url: str) -> Any:
    """A synchronous ``redis.Redis`` for ``url``, for a few one-off calls outside an event
    loop (the benchmark asks the server for its pid); close it after use."""
    import redis

    return redis.Redis.from_url(url, **_socket_options(url, REQUEST_TIMEOUT_S))


def text(value: Any) -> str:
    """A reply value as text (these clients return bytes; a script's number as ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)
