"""Cancellation from the gateway side: client gone, explicit cancel, server deadline.

One Lua script (``QueueEntries.cancel`` in ``bus/queues.py``, the owner of queue entries)
decides by the request's state, atomically against the worker's claim:
  queued   -> state cancelled, the queue entry is deleted (a worker that already read it sees
              'cancelled' at claim and drops it); a live reader gets a final abort event
  running  -> a cancel mark on the request and a CancelMsg on the channel: the owning worker
              calls ``engine.abort(id)`` and the KV blocks are freed at the next step
  finished -> nothing to do
``reader_gone`` (disconnect, deadline, stalled reader) makes the worker delete the output
stream instead of writing into it, so nothing is left behind in Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.bus.keys import RedisKeys
from gateway.bus.queues import QueueEntries


class Canceller:
    def __init__(self, redis: Any, keys: RedisKeys, stream_ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl = stream_ttl_s
        self._entries = QueueEntries(redis, keys, None)  # through redis-py: not hot

    async def cancel(self, request_id: str, tenant: str, reader_gone: bool, reason: str,
                     tier: str | None = None) -> str:
        """Cancel ``tenant``'s request wherever it is; returns the state it was found in.
        ``tier``: the request's (read from its record when not given)."""
        if tier is None:
            raw = await self.redis.hget(self.keys.req(request_id, tenant), "tier")
            tier = raw.decode() if raw is not None else ""
        return await self._entries.cancel(request_id, tenant, tier, reader_gone, reason,
                                          self.ttl)

    async def owner(self, request_id: str, tenant: str) -> str | None:
        """The owner of ``request_id`` if it lives in ``tenant``'s shard (another shard's
        request is not found from here, which a BOLA check answers 404 all the same)."""
        raw = await self.redis.hget(self.keys.req(request_id, tenant), "tenant")
        return raw.decode() if raw is not None else None


async def wait_for_disconnect(
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]]) -> None:
    """Return when the client goes away. Works for streaming and non-streaming handlers alike:
    once the body has been read, the next ``receive()`` only completes with
    ``http.disconnect`` (Starlette's ``is_disconnected()`` does not see it for non-streaming
    handlers that are busy awaiting a result)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0)  # stray body chunks after the body: ignore
