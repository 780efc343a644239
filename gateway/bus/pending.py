"""The pending index: where the reclaim looks, so that finding dead workers and taking over
their entries costs O(workers + pending entries), not O(tenant streams).

Contract (every step is one script call in one shard's slot, ``keys.py``):

- ``{T}:qp`` (a set per shard, members ``"{tier}:{tenant}"``) holds every stream of the shard
  that has a picked, unacknowledged entry. the pick script adds the stream in the same step as
  its XREADGROUP, so a pending entry is never outside the index. A stale member (its entries
  all acknowledged) costs one read; a missing one would lose work, so members leave only
  where a script sees, atomically, that nothing is pending: the step and done scripts and
  the cancel when they delete an emptied stream, and ``PRUNE_LUA`` when a reclaim round finds
  the stream's pending count at 0. So the index holds the streams with pending entries plus
  at most the streams whose last pending entry was acknowledged since the last round.
- ``{T}:qc:{worker}`` (per shard) holds the streams where the worker is a consumer of the
  group (the pick script adds them; a reclaim adds the streams it took entries from). At the
  worker's departure (a clean stop, or declared dead and its entries taken over)
  ``DEPART_LUA`` deletes it from each stream's group where it holds 0 pending entries, and
  the set goes with its last member: bounded work per departure, nothing per second.

A reclaim round reads the 16 shards' indexes (one SMEMBERS each, whatever the tenant count)
and then sends one command per indexed stream, ``FANOUT`` at a time. Idle and backlogged
tenants without picked entries cost nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

from redis.exceptions import ResponseError

from gateway.bus.client import text
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.resp import LuaScript
from gateway.bus.state_scripts import DEPART_LUA, PRUNE_LUA

Raw = tuple[str, Any, Any]  # (stream key, entry id, fields): what the queues make envelopes of
# Calls a round or a departure has in flight at once: redis-py's pool opens a connection for
# each concurrent call, so a gather over every stream opened one per stream (the fleet
# checker's first round with 128 pending streams: 118 new connections, each a handshake, a
# HELLO and two CLIENT SETINFO; a 16-worker stop: 500 and more).
FANOUT = 8


class PendingIndex:
    def __init__(self, redis: Any, keys: RedisKeys, tiers: Iterable[str]) -> None:
        self.redis = redis
        self.keys = keys
        self.tiers = tuple(tiers)
        self._prune = LuaScript(redis, None, PRUNE_LUA)
        self._depart = LuaScript(redis, None, DEPART_LUA)

    def _member_key(self, member: str) -> tuple[str, str]:
        tier, tenant = member.split(":", 1)
        return tier, self.keys.queue(tier, tenant)

    async def streams(self, tiers: Iterable[str] | None = None) -> list[tuple[int, str, str]]:
        """(shard, member, stream key) of every indexed stream of ``tiers`` (default: all):
        one SMEMBERS per shard."""
        want = set(self.tiers if tiers is None else tiers)
        sets = await _bounded(partial(self.redis.smembers, self.keys.pending(s))
                              for s in self.keys.shard_range())
        out = []
        for s, members in zip(self.keys.shard_range(), sets):
            for raw in members:
                member = text(raw)
                tier, key = self._member_key(member)
                if tier in want:
                    out.append((s, member, key))
        return out

    async def holders(self, tiers: Iterable[str] | None = None) -> set[str]:
        """The consumers that hold pending entries (any indexed stream of ``tiers``); a stream
        found with none is pruned from the index."""
        found = await self.streams(tiers)
        summaries = await _bounded((partial(self.redis.xpending, key, GROUP)
                                    for _, _, key in found), return_exceptions=True)
        out: set[str] = set()
        stale = []
        for (s, member, key), summary in zip(found, summaries):
            if isinstance(summary, ResponseError) and _nogroup(summary):
                stale.append((s, member, key))
                continue
            if isinstance(summary, BaseException):
                raise summary
            if not summary.get("pending"):
                stale.append((s, member, key))
            out |= {text(c["name"]) for c in summary.get("consumers") or ()}
        await _bounded(partial(self._prune, keys=[self.keys.pending(s), key], args=[GROUP, member])
                       for s, member, key in stale)
        return out

    async def autoclaim(self, tier: str | None, consumer: str, min_idle_ms: int,
                        count: int = 16) -> list[Raw]:
        """Take over entries of ``tier`` (None: every tier) idle for ``min_idle_ms`` (their
        worker died), from every indexed stream."""
        out: list[Raw] = []
        for s, member, key in await self.streams(None if tier is None else [tier]):
            try:
                res = await self.redis.xautoclaim(key, GROUP, consumer, min_idle_ms, "0-0",
                                                  count=count)
            except ResponseError as exc:
                if not _nogroup(exc):
                    raise
                await self._recreate_group(key)  # Redis came back without it: nothing to take
                continue
            got = [(key, eid, fields) for eid, fields in (res[1] if res else [])]
            if got:
                await self.redis.sadd(self.keys.consumed(consumer, s), member)
            out += got
        return out

    async def claim_from(self, tier: str | None, dead: str, consumer: str, min_idle_ms: int,
                         count: int = 100) -> list[Raw]:
        """Take over ``dead``'s pending entries of ``tier`` (None: every tier) idle for
        ``min_idle_ms``."""
        out: list[Raw] = []
        for s, member, key in await self.streams(None if tier is None else [tier]):
            try:
                rows = await self.redis.xpending_range(key, GROUP, "-", "+", count,
                                                       consumername=dead, idle=min_idle_ms)
                ids = [r["message_id"] for r in rows]
                claimed = await self.redis.xclaim(key, GROUP, consumer, min_idle_ms,
                                                  ids) if ids else []
            except ResponseError as exc:
                if not _nogroup(exc):
                    raise
                continue
            if claimed:
                await self.redis.sadd(self.keys.consumed(consumer, s), member)
            out += [(key, eid, fields) for eid, fields in claimed]
        return out

    async def depart(self, worker: str) -> int:
        """Delete ``worker`` from the group of every stream where it is a consumer and holds
        no pending entry; returns how many streams it still holds entries in (0: gone)."""
        sets = await _bounded(partial(self.redis.smembers, self.keys.consumed(worker, s))
                              for s in self.keys.shard_range())
        calls = [(s, text(raw)) for s, members in zip(self.keys.shard_range(), sets)
                 for raw in members]
        res = await _bounded(partial(
            self._depart, keys=[self.keys.consumed(worker, s), self._member_key(member)[1]],
            args=[GROUP, worker, member]) for s, member in calls)
        return sum(1 for r in res if not int(r))

    async def seed(self) -> int:
        """Add to the index every stream of the tiers' tenant sets (``qt``) that holds pending
        entries: once at a worker's start, so entries picked by a version that kept no index
        are still found (O(tenant streams), once; adding a member is always safe). Returns
        how many streams it found."""
        k = self.keys
        found = 0
        for s in k.shard_range():
            for tier in self.tiers:
                members = [text(m) for m in await self.redis.smembers(k.queue_tenants(tier, s))]
                for tenant in members:
                    try:
                        summary = await self.redis.xpending(k.queue(tier, tenant), GROUP)
                    except ResponseError:
                        continue  # no stream or no group: nothing pending there
                    if summary.get("pending"):
                        await self.redis.sadd(k.pending(s), f"{tier}:{tenant}")
                        found += 1
        return found

    async def _recreate_group(self, key: str) -> None:
        with contextlib.suppress(ResponseError):  # BUSYGROUP: another worker was first
            await self.redis.xgroup_create(key, GROUP, id="0", mkstream=True)


async def _bounded(calls: Iterable[Callable[[], Awaitable[Any]]],
                   return_exceptions: bool = False) -> list[Any]:
    """``asyncio.gather`` of ``calls``' results with at most ``FANOUT`` of them running at
    once (each made only once it may run: none is left never awaited by a cancel)."""
    gate = asyncio.Semaphore(FANOUT)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(c) for c in calls), return_exceptions=return_exceptions)


def _nogroup(exc: ResponseError) -> bool:
    return str(exc).startswith("NOGROUP")
