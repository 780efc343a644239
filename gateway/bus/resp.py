"""A dedicated Redis connection for the hot loops: RESP2 straight on an asyncio protocol.

The per-step writer and the output reader each make one Redis call per engine step, whatever
the load. Through redis-py's asyncio client a call costs ~70-150 us of Python (connection
pool, retry and timeout wrappers, response callbacks); here it is the hiredis packer and
parser and a future, ~10-20 us. Replies come back raw (bytes, ints, nested lists; an XREAD
entry's fields are a flat list), error replies raise ``redis.exceptions.ResponseError``
(LOADING: ``BusyLoadingError``, as redis-py raises it) and a lost connection raises
``redis.exceptions.ConnectionError`` (the next call reconnects), so the callers' error handling
stays what it was with redis-py.

Calls issued concurrently are pipelined on the one connection and answered in order; a
blocking command (``XREAD BLOCK``) therefore holds up the calls behind it, so each loop that
blocks owns its own ``RespConnection``. ``for_client`` builds one from a redis-py client's
settings, or returns None for what it does not speak (TLS, unix sockets): callers then keep
using redis-py. It takes that client's read timeout too: a call (connecting included) with no
reply in ``timeout_s`` plus what the command itself blocks for (``call(wait_s=...)``) drops
the connection (the replies behind it would come out of order) and raises redis-py's
``TimeoutError``, so a frozen Redis is an outage to the callers, not a hang.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import socket
from typing import Any

import hiredis
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# idle seconds before the first probe, seconds between probes, probes before giving up
_KEEPALIVE = (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))


def reply_error(text: str) -> Exception:
    """An error reply as redis-py raises it for the callers' ``except`` clauses: LOADING (a
    restarted Redis still reading its AOF or RDB) is redis-py's ``BusyLoadingError``, a
    ``ConnectionError``, so the loops treat it as the outage it is and retry quietly; every
    other reply is a ``ResponseError`` with its code kept in the text (NOSCRIPT, NOGROUP)."""
    if text.startswith("LOADING "):
        return BusyLoadingError(text)
    return ResponseError(text)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: Any = None  # asyncio's or uvloop's (not an asyncio.Transport subclass)
        self.lost = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a Redis that vanished (half-open TCP) shows up as a lost
            # connection in about a minute, not never: the blocking readers would wait forever
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for opt, value in _KEEPALIVE:
                if hasattr(socket, opt):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            fut = self.waiters.popleft()
            if fut.done():  # its caller was cancelled: the reply still keeps the order
                continue
            if isinstance(reply, hiredis.ReplyError):
                fut.set_exception(reply_error(str(reply)))
            else:
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(RedisConnectionError(f"connection to Redis lost: {exc}"))


class RespConnection:
    def __init__(self, host: str, port: int, *, db: int = 0, username: str | None = None,
                 password: str | None = None, timeout_s: float | None = None) -> None:
        self.host, self.port, self.db = host, port, db
        self.timeout_s = timeout_s
        self.username, self.password = username, password
        self._proto: _Protocol | None = None
        self._connecting = asyncio.Lock()
        self._closed = False

    @classmethod
    def for_client(cls, redis: Any) -> RespConnection | None:
        """A connection to the server ``redis`` (a redis-py asyncio client) talks to, with
        its credentials and database; None unless it is a plain TCP connection with a plain
        username/password (TLS, unix sockets and credential providers stay on redis-py)."""
        from redis.asyncio.connection import Connection

        pool = getattr(redis, "connection_pool", None)
        if pool is None or pool.connection_class is not Connection:
            return None
        kw = pool.connection_kwargs
        if kw.get("credential_provider") is not None:
            return None  # credentials we can't replay here: redis-py keeps the whole path
        return cls(kw.get("host", "localhost"), int(kw.get("port", 6379)), db=int(kw.get("db") or 0),
                   username=kw.get("username"), password=kw.get("password"),
                   timeout_s=kw.get("socket_timeout"))

    async def call(self, *args: Any, wait_s: float = 0.0) -> Any:
        """Send one command and return its raw reply; ``wait_s``: how long the command
        itself may block on the server (BLPOP's timeout), added to the read timeout."""
        if self._closed:  # a late caller must not open a connection nobody will close
            raise RedisConnectionError("connection closed")
        if self.timeout_s is None:
            return await self._call(args)
        try:
            async with asyncio.timeout(self.timeout_s + wait_s):
                return await self._call(args)
        except TimeoutError:
            self._drop()
            raise RedisTimeoutError(f"no reply from Redis at {self.host}:{self.port} in "
                                    f"{self.timeout_s + wait_s:.1f} s") from None

    async def _call(self, args: tuple[Any, ...]) -> Any:
        proto = self._proto
        if proto is None or proto.lost:
            proto = await self._connect()
        return await self._send(proto, args)

    def _drop(self) -> None:
        """Close the connection after a timeout: the next call connects anew."""
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.lost = True
            proto.transport.close()

    @property
    def ready(self) -> bool:
        """Connected and not closed: ``send_now`` will send."""
        return not self._closed and self._proto is not None and not self._proto.lost

    def send_now(self, *args: Any) -> asyncio.Future[Any] | None:
        """Send one command right away, from synchronous code, and return the future of its
        reply; None (nothing sent) unless the connection is ``ready``."""
        if not self.ready:
            return None
        assert self._proto is not None
        return self._send(self._proto, args)

    async def run_script(self, script: Script, keys: list[Any], args: list[Any]) -> Any:
        """EVALSHA, loading the script with EVAL when the server does not have it."""
        try:
            return await self.call("EVALSHA", script.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self.call("EVAL", script.source, len(keys), *keys, *args)

    async def close(self) -> None:
        self._closed = True
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()
            await asyncio.sleep(0)  # let connection_lost run

    def _send(self, proto: _Protocol, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        assert proto.transport is not None
        # Pack first: a waiter queued for a command that never went out would take the
        # next command's reply, and every reply after it would go to the wrong caller.
        data = hiredis.pack_command(args)
        fut = asyncio.get_running_loop().create_future()
        proto.waiters.append(fut)
        proto.transport.write(data)
        return fut

    async def _connect(self) -> _Protocol:
        async with self._connecting:
            if self._proto is not None and not self._proto.lost:
                return self._proto
            loop = asyncio.get_running_loop()
            try:
                _, proto = await loop.create_connection(_Protocol, self.host, self.port)
            except OSError as exc:
                raise RedisConnectionError(f"cannot connect to Redis at "
                                           f"{self.host}:{self.port}: {exc}") from exc
            try:
                if self.password:
                    auth = (self.username, self.password) if self.username else (self.password,)
                    await self._send(proto, ("AUTH", *auth))
                if self.db:
                    await self._send(proto, ("SELECT", self.db))
            except BaseException:  # a failed or cancelled handshake must not leak the socket
                if proto.transport is not None:
                    proto.transport.close()
                raise
            self._proto = proto
            return proto


class Script:
    """A Lua script's source and SHA1, for ``RespConnection.run_script``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


async def call(conn: RespConnection | None, redis: Any, *args: Any) -> Any:
    """One command on the lean connection where there is one, else through redis-py."""
    if conn is not None:
        return await conn.call(*args)
    return await redis.execute_command(*args)


async def pipelined(conn: RespConnection | None, redis: Any,
                    commands: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``commands`` in one round trip, on the lean connection where there is one, else a
    redis-py pipeline; raw replies in order (the first error raises after all of them ran,
    as a redis-py pipeline does)."""
    if not commands:
        return []
    if conn is not None:  # concurrent calls on one connection are pipelined
        res = await asyncio.gather(*(conn.call(*c) for c in commands), return_exceptions=True)
        for r in res:
            if isinstance(r, BaseException):
                raise r
        return res
    pipe = redis.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute())


class LuaScript:
    """A Lua script called through ``conn`` when there is one, else through redis-py (the
    same raw reply either way: redis-py applies no callback to EVALSHA)."""

    def __init__(self, redis: Any, conn: RespConnection | None, source: str) -> None:
        self._redis_py = redis.register_script(source)
        self._conn = conn
        self._script = Script(source)
        self.sha = self._script.sha

    async def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        if self._conn is None:
            return await self._redis_py(keys=keys, args=args)
        return await self._conn.run_script(self._script, keys, args)
