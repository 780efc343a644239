"""Tier queues: one Redis Stream per tier, consumed by the worker group ``workers``. This
module is the only code that adds, acknowledges or deletes queue entries.

Life of an entry: a gateway XADDs it (``QueueEntries.admit``, in the admission script); a
worker XREADGROUPs it (``TierQueues.read``), which makes it *pending* for that worker; the
worker ``claim``s the request (state queued -> running) and runs it; when the request has
finished the entry is XACKed and XDELed (``QueueEntries`` step writes, or
``TierQueues.done_commands`` for one dropped unrun), so ``XLEN`` is always queued + running. A
cancel while queued XDELs it (``QueueEntries.cancel``). A worker keeps its pending entries
fresh with an idle-resetting XCLAIM heartbeat; entries of a worker that went silent for the
visibility timeout are taken over by another worker with XAUTOCLAIM.

Adding, cancelling and finishing each happen in one Lua script (``scripts.py``) together with
the request's state change; ``QueueEntries`` builds their keys and arguments and runs them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.core.finish import FinishReason
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import (
    CancelMsg,
    FinishMsg,
    MessageError,
    SubmitMsg,
    TokenMsg,
    decode,
    encode,
    encode_payload,
    outcome,
)
from gateway.bus.resp import LuaScript, RespConnection
from gateway.bus.scripts import ADMIT_LUA, BACKLOG_LUA, CANCEL_LUA, CLAIM_LUA, STEP_LUA

TOKEN_TYPE = encode(TokenMsg([], ""))["t"]
FINISH_TYPE = encode(FinishMsg(FinishReason.STOP, 0, 0))["t"]


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


class QueueEntries:
    """The three atomic steps that add, delete and finish queue entries, each with the
    request's state change (``ADMIT_LUA``, ``CANCEL_LUA``, ``STEP_LUA``). It needs only a
    redis-py client (the scripts' fallback path), the keys and, for the hot paths, a lean
    connection (``conn``, owned by the caller): a gateway-only process, which has no
    ``TierQueues``, makes one for admission and one for cancellation."""

    def __init__(self, redis: Any, keys: RedisKeys, conn: RespConnection | None) -> None:
        self.keys = keys
        self._conn = conn
        self._admit = LuaScript(redis, conn, ADMIT_LUA)
        self._cancel = LuaScript(redis, conn, CANCEL_LUA)
        self._step = LuaScript(redis, conn, STEP_LUA)

    async def admit(self, msg: SubmitMsg, tenant_id: str, *, rpm: int, tpm: int, max_concurrency: int,
                    queue_max_len: int, cost: int, lease_ms: int, req_ttl_s: int
                    ) -> tuple[str, str]:
        """Check the tenant's limits and enqueue ``msg`` in one step: ``("ok", entry id)``,
        or ``(the limit that refused it, retry-after seconds)``."""
        k, fields = self.keys, encode(msg)
        res = await self._admit(
            keys=[k.bucket(tenant_id, "rpm"), k.bucket(tenant_id, "tpm"),
                  k.concurrency(tenant_id), k.queue(msg.tier), k.req(msg.request_id), k.stats],
            args=[rpm, tpm, max_concurrency, queue_max_len, cost, msg.request_id, lease_ms,
                  fields["t"], fields["d"], tenant_id, msg.tier, req_ttl_s],
        )
        return _text(res[0]), _text(res[1])

    async def cancel(self, request_id: str, reader_gone: bool, reason: str,
                     stream_ttl_s: int) -> str:
        """Cancel wherever the request is (a queued entry is deleted); returns the state it
        was found in: queued | running | finished | cancelled | unknown."""
        finish = encode(FinishMsg(FinishReason.ABORT, 0, 0, f"cancelled: {reason}"))
        k = self.keys
        res = await self._cancel(
            keys=[k.req(request_id), k.out(request_id), k.stats],
            args=[1 if reader_gone else 0,
                  encode_payload(CancelMsg(request_id, reader_gone, reason)),
                  k.cancel_channel, finish["t"], finish["d"], stream_ttl_s],
        )
        return _text(res)

    def step(self, stream_ttl_s: int) -> StepWrite:
        """An empty write of one engine step's outputs, to ``add`` requests to."""
        return StepWrite(self.keys, stream_ttl_s)

    async def write_step(self, step: StepWrite) -> None:
        await self._step(keys=step.keys, args=step.args)

    def send_step_now(self, step: StepWrite) -> asyncio.Future[Any] | None:
        """Send ``step`` right away from synchronous code (the engine's step callback) and
        return its reply's future; None (nothing sent) unless the lean connection is up.
        A NOSCRIPT reply means the server lost the script: ``write_step`` loads it."""
        if self._conn is None:
            return None
        return self._conn.send_now("EVALSHA", self._step.sha, len(step.keys), *step.keys,
                                   *step.args)


class StepWrite:
    """``STEP_LUA``'s keys and arguments for one engine step, a request at a time."""

    __slots__ = ("_k", "args", "keys")

    def __init__(self, keys: RedisKeys, stream_ttl_s: int) -> None:
        self._k = keys
        self.keys: list[str] = [keys.stats]
        # the stream TTL is refreshed once it fell below two thirds (not on every step)
        self.args: list[Any] = [stream_ttl_s, stream_ttl_s * 2 // 3, GROUP, TOKEN_TYPE,
                                FINISH_TYPE]

    def add(self, request_id: str, tier: str, entry_id: str, reader_gone: bool,
            tokens: TokenMsg | None, finish: FinishMsg | None) -> None:
        """Write ``tokens`` (None: none) to the request's stream; with ``finish`` the
        request ends: the finish is written (or the stream deleted if ``reader_gone``), its
        outcome counted, and its queue entry acknowledged and deleted."""
        k = self._k
        self.keys += [k.req(request_id), k.out(request_id), k.queue(tier)]
        self.args += [1 if finish is not None else 0, 1 if reader_gone else 0,
                      encode(tokens)["d"] if tokens is not None else "",
                      encode(finish)["d"] if finish is not None else "",
                      entry_id, outcome(finish.finish_reason) if finish is not None else ""]

    def __bool__(self) -> bool:
        return len(self.keys) > 1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
