"""Cancellation from the gateway side: client gone, explicit cancel, server deadline.

One Lua script decides by the request's state, atomically against the worker's claim:
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
from gateway.bus.messages import CancelMsg, FinishMsg, encode, encode_payload

# KEYS: req, out, stats;  ARGV: reader_gone (0/1), cancel payload, channel, finish type,
# finish data, ttl.  Returns the state found: queued | running | finished | cancelled | unknown
CANCEL_LUA = """
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'unknown' end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'cancel', ARGV[1] == '1' and 'gone' or 'live')
  local q, e = redis.call('HGET', KEYS[1], 'queue'), redis.call('HGET', KEYS[1], 'entry')
  if q and e then redis.call('XDEL', q, e) end
  if ARGV[1] == '1' then
    redis.call('DEL', KEYS[2])
  else
    redis.call('XADD', KEYS[2], '*', 't', ARGV[4], 'd', ARGV[5])
    redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
  end
  redis.call('HINCRBY', KEYS[3], 'aborted', 1)
  return 'queued'
end
if st == 'running' then
  if not redis.call('HGET', KEYS[1], 'cancel') then
    redis.call('HSET', KEYS[1], 'cancel', ARGV[1] == '1' and 'gone' or 'live')
    redis.call('PUBLISH', ARGV[3], ARGV[2])
  end
  return 'running'
end
return st
"""


class Canceller:
    def __init__(self, redis: Any, keys: RedisKeys, stream_ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl = stream_ttl_s
        self._script = redis.register_script(CANCEL_LUA)

    async def cancel(self, request_id: str, reader_gone: bool, reason: str) -> str:
        """Cancel wherever the request is; returns the state it was found in."""
        finish = encode(FinishMsg("abort", 0, 0, f"cancelled: {reason}"))
        res = await self._script(
            keys=[self.keys.req(request_id), self.keys.out(request_id), self.keys.stats],
            args=[1 if reader_gone else 0, encode_payload(CancelMsg(request_id, reader_gone, reason)),
                  self.keys.cancel_channel, finish["t"], finish["d"], self.ttl],
        )
        return res.decode() if isinstance(res, bytes) else str(res)

    async def owner(self, request_id: str) -> str | None:
        raw = await self.redis.hget(self.keys.req(request_id), "tenant")
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
