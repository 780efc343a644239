"""Tier queues: one Redis Stream per tier, consumed by the worker group ``workers``.

Life of an entry: a gateway XADDs it (inside the admission script, ``quota.py``); a worker
XREADGROUPs it, which makes it *pending* for that worker; the worker ``claim``s the request
(state queued -> running) and runs it; when the request has finished the entry is XACKed and
XDELed, so ``XLEN`` is always queued + running. A worker keeps its pending entries fresh with
an idle-resetting XCLAIM heartbeat; entries of a worker that went silent for the visibility
timeout are taken over by another worker with XAUTOCLAIM.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import MessageError, SubmitMsg, decode
from gateway.bus.resp import LuaScript, RespConnection
from gateway.bus.scripts import BACKLOG_LUA, CLAIM_LUA


@dataclass(frozen=True)
class Envelope:
    tier: str
    entry_id: str
    msg: SubmitMsg | None  # None: the entry was deleted (cancelled) or unreadable


class TierQueues:
    def __init__(self, redis: Any, keys: RedisKeys, tiers: Iterable[str]) -> None:
        self.redis = redis
        self.keys = keys
        self.tiers = tuple(tiers)
        # Lean connections (``resp.py``) for the drainer's calls, on every request's path:
        # one that blocks (XREADGROUP BLOCK would hold up whatever is pipelined behind it)
        # and one for the rest.
        self._block_conn = RespConnection.for_client(redis)
        self._conn = RespConnection.for_client(redis)
        self._claim = LuaScript(redis, self._conn, CLAIM_LUA)
        self._backlogs = LuaScript(redis, self._conn, BACKLOG_LUA)

    async def close(self) -> None:
        for conn in (self._block_conn, self._conn):
            if conn is not None:
                await conn.close()

    async def ensure_groups(self) -> None:
        for tier in self.tiers:
            try:
                await self.redis.xgroup_create(self.keys.queue(tier), GROUP, id="0", mkstream=True)
            except Exception as exc:  # BUSYGROUP: another process made it first
                if "BUSYGROUP" not in str(exc):
                    raise

    async def backlogs(self) -> dict[str, int]:
        """Entries not yet delivered to any worker, per tier (XLEN minus pending)."""
        res = await self._backlogs(keys=[self.keys.queue(t) for t in self.tiers], args=[GROUP])
        return {tier: int(n) for tier, n in zip(self.tiers, res)}

    async def read(self, tiers: Iterable[str], consumer: str, block_ms: int | None,
                   count: int = 1) -> list[Envelope]:
        """Up to ``count`` new entries from each of ``tiers`` (blocking up to ``block_ms``)."""
        streams = {self.keys.queue(t): ">" for t in tiers}
        if not streams:
            return []
        conn = self._block_conn if block_ms is not None else self._conn
        if conn is not None:
            block = ("BLOCK", block_ms) if block_ms is not None else ()
            res = await conn.call("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count, *block,
                                  "STREAMS", *streams, *streams.values())
        else:
            res = await self.redis.xreadgroup(GROUP, consumer, streams, count=count,
                                              block=block_ms)
        return [self._envelope(key, eid, fields) for key, entries in res or [] for eid, fields in entries]

    async def read_counts(self, counts: dict[str, int], consumer: str) -> dict[str, list[Envelope]]:
        """``counts[tier]`` new entries per tier, in one pipelined round trip (non-blocking)."""
        if self._conn is not None:  # concurrent calls on one connection are pipelined
            got = await asyncio.gather(*(self.read([t], consumer, None, n)
                                         for t, n in counts.items()))
            return dict(zip(counts, got))
        pipe = self.redis.pipeline(transaction=False)
        for tier, n in counts.items():
            pipe.xreadgroup(GROUP, consumer, {self.keys.queue(tier): ">"}, count=n)
        out: dict[str, list[Envelope]] = {}
        for tier, res in zip(counts, await pipe.execute()):
            out[tier] = [self._envelope(key, eid, fields)
                         for key, entries in res or [] for eid, fields in entries]
        return out

    async def claim_many(self, request_ids: list[str], consumer: str, reclaim: bool) -> list[str]:
        """Claim each request (queued -> running) in one script call."""
        if not request_ids:
            return []
        keys = [self.keys.req(rid) for rid in request_ids]
        res = await self._claim(keys=keys, args=[consumer, 1 if reclaim else 0])
        return [r.decode() if isinstance(r, bytes) else str(r) for r in res]

    async def heartbeat(self, tier: str, consumer: str, entry_ids: list[str]) -> None:
        """Reset the idle time of our pending entries so nobody reclaims live work."""
        if entry_ids:
            await self.redis.xclaim(self.keys.queue(tier), GROUP, consumer, 0, entry_ids,
                                    justid=True)

    async def autoclaim(self, tier: str, consumer: str, min_idle_ms: int, count: int = 16) -> list[Envelope]:
        """Take over entries idle for ``min_idle_ms`` (their worker died)."""
        key = self.keys.queue(tier)
        res = await self.redis.xautoclaim(key, GROUP, consumer, min_idle_ms, "0-0", count=count)
        entries = res[1] if res else []
        return [self._envelope(key, eid, fields) for eid, fields in entries]

    def done_commands(self, tier: str, entry_id: str) -> list[tuple[Any, ...]]:
        """The commands that acknowledge and delete a finished entry, for ``execute``."""
        return [("XACK", self.keys.queue(tier), GROUP, entry_id),
                ("XDEL", self.keys.queue(tier), entry_id)]

    async def execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Run ``commands`` in one round trip; raw replies in order (the first error raises
        after all of them ran, as a redis-py pipeline does)."""
        if not commands:
            return []
        if self._conn is not None:  # concurrent calls on one connection are pipelined
            res = await asyncio.gather(*(self._conn.call(*c) for c in commands),
                                       return_exceptions=True)
            for r in res:
                if isinstance(r, BaseException):
                    raise r
            return res
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute())

    def _envelope(self, key: Any, entry_id: Any, fields: Any) -> Envelope:
        if isinstance(fields, list):  # a raw reply: [field, value, field, value, ...]
            fields = dict(zip(fields[::2], fields[1::2]))
        key_s = key.decode() if isinstance(key, bytes) else str(key)
        tier = key_s.rsplit(":", 1)[1]
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        msg: SubmitMsg | None = None
        if fields:
            try:
                decoded = decode(fields)
                msg = decoded if isinstance(decoded, SubmitMsg) else None
            except MessageError:
                msg = None
        return Envelope(tier, eid, msg)
