"""The wake lists (``keys.py``: ``wake``, ``wake_worker``): a token per admission naming its
shard, so an idle drainer BLPOPs its tiers' lists instead of polling shards it cannot know
in advance. Owned here: the admission's push (``push``), the drainer's pop (``WakeTokens.pop``)
and the stale tokens' removal (``WakeTokens.answered``).

A token is a hint, never the record: an entry whose token was trimmed, or popped by a drainer
that did not take it, is found by the drainer's next full count (``TierQueues.backlogs``).
Tokens of one shard are interchangeable (each says "an entry of this shard waits"), so a
drainer that picked ``n`` entries of a shard removes ``n`` of its tokens (less the one it
popped): the tokens of a burst a full count picked at once would otherwise wake a drainer
each, to read shards with nothing left (about ten commands a request with 32 streams)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.bus.client import text
from gateway.bus.keys import RedisKeys
from gateway.bus.resp import RespConnection, call

WAKE_MAX = 64  # tokens kept per list (a burst's beyond them are found by the full count)


async def push(call: Callable[..., Awaitable[Any]], keys: RedisKeys, tier: str, shard: int,
               prefer: str = "") -> None:
    """An admission's tokens: on its tier's list, and on the list of the worker it
    ``prefer``s (placement; '' = none), which takes it first. A list is trimmed to
    ``WAKE_MAX`` only once past it, not at every push."""
    wakes = [keys.wake(tier), *([keys.wake_worker(prefer, tier)] if prefer else [])]
    # the preferred worker is woken even when another drainer took the tier's token
    lens = await asyncio.gather(*(call("RPUSH", w, shard) for w in wakes),
                                *([call("EXPIRE", wakes[1], 60)] if prefer else []))
    await asyncio.gather(*(call("LTRIM", w, -WAKE_MAX, -1)
                           for w, n in zip(wakes, lens) if int(n) > WAKE_MAX))


class WakeTokens:
    """A drainer's side: the pop, and the removal of the tokens its picks answered."""

    def __init__(self, redis: Any, keys: RedisKeys, block_conn: RespConnection | None,
                 conn: RespConnection | None) -> None:
        self.redis, self.keys = redis, keys
        self._block_conn, self._conn = block_conn, conn
        self._popped: set[tuple[str, int]] = set()  # the last pop's tier's token (tier, shard)
        self._sending: set[asyncio.Future[Any]] = set()  # LREMs sent through redis-py

    async def pop(self, lists: list[str], timeout_s: float) -> tuple[str, set[int]] | None:
        """Block up to ``timeout_s`` for a token on ``lists``: the tier woken for and the
        shards named by the token and by those still queued on its list (an older token may
        come first), or None."""
        self._popped = set()
        if self._block_conn is not None:
            res = await self._block_conn.call("BLPOP", *lists, timeout_s, wait_s=timeout_s)
        else:
            res = await self.redis.blpop(lists, timeout=timeout_s)
        if not res:
            return None
        queued = await self._call("LRANGE", res[0], 0, -1)
        named = {int(text(x)) % self.keys.shards for x in [res[1], *(queued or ())]}
        tier = text(res[0]).rsplit(":", 1)[1]
        if text(res[0]) == self.keys.wake(tier):  # the tier's own list: a pick answers it
            self._popped = {(tier, int(text(res[1])) % self.keys.shards)}
        return tier, named

    def answered(self, tier: str, shard: int, n: int) -> None:
        """``n`` entries of ``tier`` were picked from ``shard``: as many of its tokens, less
        the one popped for it, go (LREM, sent without waiting for the reply)."""
        n -= (tier, shard) in self._popped
        self._popped.discard((tier, shard))
        if n <= 0:
            return
        args = ("LREM", self.keys.wake(tier), n, shard)
        fut: asyncio.Future[Any] | None
        if self._conn is not None and self._conn.ready:
            fut = self._conn.send_now(*args)
        else:
            fut = asyncio.ensure_future(self._call(*args))
            self._sending.add(fut)
            fut.add_done_callback(self._sending.discard)
        if fut is not None:
            fut.add_done_callback(_ignore)

    async def _call(self, *args: Any) -> Any:
        return await call(self._conn, self.redis, *args)


def _ignore(fut: asyncio.Future[Any]) -> None:
    """A failed LREM leaves its tokens, which cost a read each (retrieved: not logged)."""
    if not fut.cancelled():
        fut.exception()
