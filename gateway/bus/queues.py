"""Tier queues: one Redis Stream per (tier, tenant), consumed by the worker group ``workers``,
with fair queuing between a tier's tenants (``policies.fair_queue``). This module is the only
code that adds, delivers, acknowledges or deletes queue entries.

Life of an entry: a gateway XADDs it to its tenant's stream (``QueueEntries.admit``, in the
admission script, which also counts it in the tier's *backlogged* index and lifts a newly
backlogged tenant's counter); a worker's fair pick (``TierQueues.pick``, ``PICK_LUA``) takes
the backlogged tenant with the least virtual token counter and XREADGROUPs its next entry,
which makes it *pending* for that worker, and charges its prompt tokens; the worker
``claim``s the request (state queued -> running) and runs it; output tokens are charged as
they are written and, when the request has finished, the entry is XACKed and XDELed
(``QueueEntries`` step writes, or ``TierQueues.done_commands`` for one dropped unrun), so a
tier's summed ``XLEN`` is always queued + running. A cancel while queued XDELs it
(``QueueEntries.cancel``). A worker keeps its pending entries fresh with an idle-resetting
XCLAIM heartbeat; entries of a worker that went silent for the visibility timeout are taken
over by another worker with XAUTOCLAIM, over the streams of the tier that hold pending
entries (the pending index, ``pending.py``: reclaim costs O(pending entries), not O(tenant
streams)).

Each admission also pushes its shard on the tier's wake list: an idle drainer BLPOPs the
lists of its tiers (``wait``) instead of blocking on streams it cannot know in advance.

The streams and the fair queue's state are split into shards (``keys.py``), each in one hash
slot. A worker reads every shard's backlog in one script call per shard (``backlogs``: the
entries waiting and the least-counter tenants of each tier), then picks from the shards whose
least counter is lowest (``pick``), so the fair queue spans the shards; a pick also lifts a
candidate whose counter fell behind the worker's virtual time (the counter it last picked
at), so a shard that sat idle banks no credit. Each script call touches one shard.

Prefix-aware placement (``policies/placement.py``): an entry may name a preferred worker
(field ``p``, from the gateway); its admission also wakes that worker on its own list. A
pick with a placement wait (``TierQueues(placement_wait_ms=...)``) passes over a tenant whose
next entry prefers another worker and is younger than the wait, so the preferred worker takes
it first and anyone steals it after the wait; ``held_s`` then says how soon (the drainer's
next wait).

Adding, picking, cancelling and finishing each happen in one Lua script (``scripts.py``)
together with the request's state change and the counters; ``QueueEntries`` builds their
keys and arguments and runs them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from engine.core.finish import FinishReason
from gateway.bus.client import text
from gateway.bus.keys import GROUP, RedisKeys
from gateway.bus.messages import (
    CancelMsg,
    FinishMsg,
    MessageError,
    SubmitMsg,
    decode,
    encode,
    encode_payload,
)
from gateway.bus.pending import PendingIndex
from gateway.bus.resp import LuaScript, RespConnection, call, pipelined
from gateway.bus.scripts import ADMIT_LUA, PICK_LUA, STEP_LUA
from gateway.bus.shard_view import BacklogView, DepthView
from gateway.bus.single_flight import SingleFlight
from gateway.bus.state_scripts import BACKLOG_LUA, CANCEL_LUA, CLAIM_LUA, DONE_LUA
from gateway.bus.step_write import StepWrite
from gateway.bus.wake import WakeTokens, push


@dataclass(frozen=True)
class Envelope:
    tier: str
    entry_id: str
    msg: SubmitMsg | None  # None: the entry was deleted (cancelled) or unreadable
    tenant: str = ""  # whose stream it is in
    weight: float = 1.0  # the tenant's fair-queue weight at admission (its output's charge)


@dataclass(frozen=True)
class BudgetCheck:
    """The admission's budget arguments: the period's spend key, the budget (0 = none), the
    reservation's charge and the seconds until the period ends (``policies/budget.py``)."""

    key: str
    limit: int
    charge: int
    reset_s: int


class TierQueues:
    def __init__(self, redis: Any, keys: RedisKeys, tiers: Iterable[str],
                 placement_wait_ms: float = 0.0) -> None:
        self.redis = redis
        self.keys = keys
        self.tiers = tuple(tiers)
        self.placement_wait_ms = placement_wait_ms  # 0: entries' preferences are ignored
        # after a pick: seconds until an entry held for another worker may be stolen (None:
        # the picks passed over none)
        self.held_s: float | None = None
        # Lean connections (``resp.py``) for the drainer's calls, on every request's path:
        # one that blocks (BLPOP would hold up whatever is pipelined behind it) and one for
        # the rest.
        self._block_conn = RespConnection.for_client(redis)
        self._conn = RespConnection.for_client(redis)
        self._claim = LuaScript(redis, self._conn, CLAIM_LUA)
        self._backlogs = LuaScript(redis, self._conn, BACKLOG_LUA)
        self._pick = LuaScript(redis, self._conn, PICK_LUA)
        self.view = BacklogView(self.tiers, keys.shards)
        self.wake = WakeTokens(redis, keys, self._block_conn, self._conn)
        self.pending = PendingIndex(redis, keys, self.tiers)  # where the reclaim looks

    async def close(self) -> None:
        for conn in (self._block_conn, self._conn):
            if conn is not None:
                await conn.close()

    async def backlogs(self) -> dict[str, int]:
        """Entries not yet delivered to any worker, per tier (every shard read; the view
        ``pick`` plans with)."""
        await self._read_shards(self.keys.shard_range())
        return self.view.totals()

    async def _read_shards(self, shards: Iterable[int], named: Iterable[int] = ()) -> None:
        """Each shard's count of entries not yet picked (one HMGET each), then the backlog
        script only on the shards that have some: an idle shard costs one command. The
        shards ``named`` by wake tokens most likely have some: the script alone reads them
        (its own count skips a tier with none)."""
        k = self.keys
        fields = [f"b:{t}" for t in self.tiers]
        named = set(named)
        shards = list(shards)
        probed = [s for s in shards if s not in named]
        counts = await asyncio.gather(*(self._call("HMGET", k.depth(s), *fields)
                                        for s in probed))
        for s, n in zip(probed, counts):
            if not any(int(x or 0) > 0 for x in n):
                self.view.update(s, [(0, [])] * len(self.tiers))
        shards = [s for s in shards if s in named] + [
            s for s, n in zip(probed, counts) if any(int(x or 0) > 0 for x in n)]
        res = await asyncio.gather(*(self._backlogs(
            keys=[*(key for t in self.tiers for key in (k.backlogged(t, s), k.vtc(t, s))),
                  k.depth(s)],
            args=[self.view.candidates, *self.tiers]) for s in shards))
        for s, per_tier in zip(shards, res):
            self.view.update(s, per_tier)
        self.view.fresh = True

    async def _call(self, *args: Any) -> Any:
        return await call(self._conn, self.redis, *args)

    async def pick(self, tier: str, consumer: str, count: int = 1,
                   skip: Iterable[str] = ()) -> list[Envelope]:
        """Up to ``count`` entries of ``tier`` by the fair pick (non-blocking), none of the
        tenants in ``skip`` (their entries stay queued): from the shards whose least
        counter is lowest in the backlog view (read first unless ``backlogs`` or ``wait``
        just read it)."""
        got = await self._pick_tier(tier, consumer, count, frozenset(skip))
        self.view.fresh = False
        return got

    async def _pick_tier(self, tier: str, consumer: str, count: int,
                         skip: frozenset[str]) -> list[Envelope]:
        if not self.view.fresh:
            await self.backlogs()
        k = self.keys
        out: list[Envelope] = []
        # the shard with the least counter gives entries until its least passes the next
        # shard's (the ceiling); then that one: the fair queue's order across shards
        for _ in range(count + self.keys.shards):
            step = self.view.next_shard(tier, skip)
            if step is None or len(out) >= count:
                break
            s, cands, ceiling = step
            want = count - len(out)
            got, left, held = await self._pick(
                keys=[k.backlogged(tier, s), k.vtc(tier, s), k.depth(s), k.pending(s),
                      k.consumed(consumer, s), *(k.queue(tier, t) for t in cands)],
                args=[GROUP, consumer, want, self.view.virtual_time(tier), ceiling, tier,
                      int(self.placement_wait_ms), *cands])
            if text(held):  # ms until an entry held for another worker is stealable
                held_s = float(text(held)) / 1000
                self.held_s = held_s if self.held_s is None else min(self.held_s, held_s)
            self.view.picked(tier, s, want, [text(r[3]) for r in got], left)
            out += [self._envelope(key, eid, fields) for key, eid, fields, _ in got]
            self.wake.answered(tier, s, len(got))
        return out

    async def read_counts(self, counts: dict[str, int], consumer: str,
                          skip: Mapping[str, Iterable[str]] | None = None
                          ) -> dict[str, list[Envelope]]:
        """``counts[tier]`` entries per tier by the fair pick, pipelined (non-blocking); the
        pick of a tier skips the tenants ``skip[tier]`` names. Sets ``held_s``."""
        skip = skip or {}
        self.held_s = None
        if not self.view.fresh:
            await self.backlogs()
        got = await asyncio.gather(*(self._pick_tier(t, consumer, n, frozenset(skip.get(t, ())))
                                     for t, n in counts.items()))
        self.view.fresh = False
        return dict(zip(counts, got))

    async def wait(self, tiers: Iterable[str], timeout_s: float,
                   consumer: str | None = None) -> str | None:
        """Block until an admission to one of ``tiers`` (its wake token, ``wake.py``), up
        to ``timeout_s``; the tier woken for, or None. The backlog of the shards named by the
        tokens on the list woken, and of the shards the view lists with entries, is then read
        for the pick that follows (``backlogs`` reads them all). A token may be stale (another
        worker took the entry): that shard's read finds nothing. With placement on, the
        admissions that prefer ``consumer`` wake it too."""
        tiers = tuple(tiers)
        keys = [self.keys.wake(t) for t in tiers]
        if consumer and self.placement_wait_ms > 0:
            keys += [self.keys.wake_worker(consumer, t) for t in tiers]
        if not keys:
            return None
        got = await self.wake.pop(keys, timeout_s)
        if got is None:
            return None
        # the shards the tokens name, and those the view lists with entries: the others were
        # empty at the last full read and have had no admission since whose token is there
        await self._read_shards(sorted(got[1] | self.view.busy()), got[1])
        return got[0]

    async def claim_many(self, requests: list[tuple[str, str]], consumer: str,
                         reclaim: bool) -> list[str]:
        """Claim each (request id, tenant) (queued -> running): one script call per shard."""
        if not requests:
            return []
        by_shard: dict[int, list[int]] = {}
        for i, (_, tenant) in enumerate(requests):
            by_shard.setdefault(self.keys.shard_of(tenant), []).append(i)
        groups = list(by_shard.values())
        res = await asyncio.gather(*(self._claim(
            keys=[self.keys.req(*requests[i]) for i in idx], args=[consumer, 1 if reclaim else 0])
            for idx in groups))
        out = [""] * len(requests)
        for idx, got in zip(groups, res):
            for i, r in zip(idx, got):
                out[i] = text(r)
        return out

    async def heartbeat(self, tier: str, tenant: str, consumer: str, entry_ids: list[str]) -> None:
        """Reset the idle time of our pending entries so nobody reclaims live work."""
        if entry_ids:
            try:
                await self.redis.xclaim(self.keys.queue(tier, tenant), GROUP, consumer, 0,
                                        entry_ids, justid=True)
            except ResponseError as exc:
                if not _nogroup(exc):
                    raise  # NOGROUP: Redis lost the stream, and our entries with it

    async def autoclaim(self, tier: str | None, consumer: str, min_idle_ms: int,
                        count: int = 16) -> list[Envelope]:
        """Take over entries idle for ``min_idle_ms`` (their worker died), from every stream
        of ``tier`` (None: every tier) in the pending index (``pending.py``)."""
        return [self._envelope(*r) for r in await self.pending.autoclaim(
            tier, consumer, min_idle_ms, count)]

    async def pending_consumers(self, tier: str | None = None) -> set[str]:
        """The consumers that hold pending entries of ``tier`` (None: any tier)."""
        return await self.pending.holders(None if tier is None else [tier])

    async def claim_from(self, tier: str | None, dead: str, consumer: str, min_idle_ms: int,
                         count: int = 100) -> list[Envelope]:
        """Take over ``dead``'s pending entries of ``tier`` (None: every tier) idle for
        ``min_idle_ms`` (a
        worker known dead before the visibility timeout: ``recovery.DeadWorkers``)."""
        return [self._envelope(*r) for r in await self.pending.claim_from(
            tier, dead, consumer, min_idle_ms, count)]

    def done_commands(self, env: Envelope) -> list[tuple[Any, ...]]:
        """The command that acknowledges and deletes a finished entry (and counts it out of
        its tier's depth), for ``execute``."""
        k = self.keys
        shard = k.shard_of(env.tenant)
        return [("EVAL", DONE_LUA, 4, k.queue(env.tier, env.tenant), k.depth(shard),
                 k.queue_tenants(env.tier, shard), k.pending(shard), GROUP, env.entry_id,
                 env.tier, env.tenant)]

    async def execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Run ``commands`` in one round trip; raw replies in order (the first error raises
        after all of them ran, as a redis-py pipeline does)."""
        return await pipelined(self._conn, self.redis, commands)

    def _envelope(self, key: Any, entry_id: Any, fields: Any) -> Envelope:
        if isinstance(fields, list):  # a raw reply: [field, value, field, value, ...]
            fields = dict(zip(fields[::2], fields[1::2]))
        key_s = text(key)
        tier, tenant = key_s.rsplit(":", 2)[1:]
        msg: SubmitMsg | None = None
        weight = 1.0
        if fields:
            try:
                decoded = decode(fields)
                msg = decoded if isinstance(decoded, SubmitMsg) else None
                weight = float(fields.get(b"w", fields.get("w", 1)))
            except (MessageError, ValueError):
                msg = None
        return Envelope(tier, text(entry_id), msg, tenant, weight)


def _nogroup(exc: ResponseError) -> bool:
    return str(exc).startswith("NOGROUP")


class QueueEntries:
    """The three atomic steps that add, delete and finish queue entries, each with the
    request's state change (``ADMIT_LUA``, ``CANCEL_LUA``, ``STEP_LUA``). It needs only a
    redis-py client (the scripts' fallback path), the keys and, for the hot paths, a lean
    connection (``conn``, owned by the caller): a gateway-only process, which has no
    ``TierQueues``, makes one for admission and one for cancellation."""

    def __init__(self, redis: Any, keys: RedisKeys, conn: RespConnection | None) -> None:
        self.keys = keys
        self.redis = redis
        self._conn = conn
        self._admit = LuaScript(redis, conn, ADMIT_LUA)
        self._cancel = LuaScript(redis, conn, CANCEL_LUA)
        self._step = LuaScript(redis, conn, STEP_LUA)
        self.depths = DepthView(keys.shards)
        self._refresh_depths = SingleFlight(self._read_depths)

    async def _call(self, *args: Any) -> Any:
        return await call(self._conn, self.redis, *args)

    async def _read_depths(self) -> None:
        """Every shard's depth per tier (one read per shard, at most every half second). The
        admissions that find the view stale meanwhile share the one read in flight
        (``_refresh_depths``): a burst's admissions each read every shard otherwise (HGETALL
        ~0.05 a streamed token at 16 workers, with a connection each)."""
        self.depths.refreshed(await asyncio.gather(*(
            self.redis.hgetall(self.keys.depth(s)) for s in self.keys.shard_range())))

    async def admit(self, msg: SubmitMsg, tenant_id: str, *, rpm: int, tpm: int, max_concurrency: int,
                    queue_max_len: int, cost: int, lease_ms: int, req_ttl_s: int,
                    weight: float = 1.0, budget: BudgetCheck | None = None,
                    prefer: str = "") -> tuple[str, str, float, float]:
        """Check the tenant's limits and enqueue ``msg`` in one step: ``("ok", entry id,
        ...)``, or ``(the limit that refused it, retry-after seconds, ...)``, then the rpm and
        tpm buckets' levels after the call. ``weight``: the tenant's fair-queue weight (its
        service is counted in tokens / weight). ``budget``: the tenant's period spend to check
        and charge. The tier's depth is the tenant's shard's, exact, plus the other shards' as
        this process last read them (``DepthView``). An admission then wakes a drainer, and
        the worker it ``prefer``s (placement; '' = any), which takes it first."""
        k, fields, tier = self.keys, encode(msg), msg.tier
        shard = k.shard_of(tenant_id)
        b = budget or BudgetCheck(k.budget(tenant_id, "-"), 0, 0, 0)
        if self.depths.stale():
            await self._refresh_depths()
        res = await self._admit(
            keys=[k.bucket(tenant_id, "rpm"), k.bucket(tenant_id, "tpm"),
                  k.concurrency(tenant_id), k.queue(tier, tenant_id),
                  k.req(msg.request_id, tenant_id), k.stats(shard), k.queue_tenants(tier, shard),
                  k.backlogged(tier, shard), k.vtc(tier, shard), k.depth(shard), b.key],
            args=[rpm, tpm, max_concurrency, queue_max_len, cost, msg.request_id, lease_ms,
                  fields["t"], fields["d"], tenant_id, tier, req_ttl_s, GROUP,
                  len(msg.prompt_token_ids), repr(float(weight)),
                  self.depths.others(tier, shard), b.limit, b.charge, b.reset_s, prefer],
        )
        self.depths.set(tier, shard, int(res[4]))
        if text(res[0]) == "ok":
            await push(self._call, k, tier, shard, prefer)  # wake a drainer (``wake.py``)
        return text(res[0]), text(res[1]), float(text(res[2])), float(text(res[3]))

    async def cancel(self, request_id: str, tenant: str, tier: str, reader_gone: bool,
                     reason: str, stream_ttl_s: int) -> str:
        """Cancel wherever the request is (a queued entry is deleted); returns the state it
        was found in: queued | running | finished | cancelled | unknown."""
        finish = encode(FinishMsg(FinishReason.ABORT, 0, 0, f"cancelled: {reason}"))
        k = self.keys
        shard = k.shard_of(tenant)
        res = await self._cancel(
            keys=[k.req(request_id, tenant), k.out(request_id, tenant), k.stats(shard),
                  k.queue(tier, tenant), k.backlogged(tier, shard), k.depth(shard),
                  k.queue_tenants(tier, shard), k.pending(shard)],
            args=[1 if reader_gone else 0,
                  encode_payload(CancelMsg(request_id, reader_gone, reason)),
                  k.cancel_channel, finish["t"], finish["d"], stream_ttl_s, GROUP, tier],
        )
        return text(res)

    def step(self, stream_ttl_s: int, ledger_ttl_s: int = 0) -> StepWrite:
        """An empty write of one engine step's outputs, to ``add`` requests to."""
        return StepWrite(self.keys, stream_ttl_s, ledger_ttl_s)

    async def write_step(self, step: StepWrite) -> None:
        """One script call per shard where a request finishes; the other shards' writes as
        plain commands, in one pipeline (``StepWrite``)."""
        await asyncio.gather(*(self._step(keys=keys, args=args) for keys, args in step.calls()),
                             pipelined(self._conn, self.redis, step.commands()))

    def send_step_now(self, step: StepWrite) -> asyncio.Future[Any] | None:
        """Send ``step`` right away from synchronous code (a script call per shard where a
        request finishes, plain commands for the rest), and return the future of their
        replies; None (nothing sent) unless the lean connection is up. A script call
        answered NOSCRIPT (the server lost the script) ran nothing: it alone is sent again,
        with the script (the plain commands beside it were applied)."""
        if self._conn is None or not self._conn.ready:
            return None
        calls = step.calls()
        scripts = [self._conn.send_now("EVALSHA", self._step.sha, len(keys), *keys, *args)
                   for keys, args in calls]
        plain = [self._conn.send_now(*c) for c in step.commands()]
        return asyncio.ensure_future(self._replies(calls, scripts, plain))

    async def _replies(self, calls: list[tuple[list[str], list[Any]]],
                       scripts: list[asyncio.Future[Any] | None],
                       plain: list[asyncio.Future[Any] | None]) -> None:
        # all sent: ``send_now`` sends on a connection found ready, in one synchronous turn
        got = await asyncio.gather(*(f for f in (*scripts, *plain) if f is not None),
                                   return_exceptions=True)
        for exc in got:
            if isinstance(exc, BaseException) and not str(exc).startswith("NOSCRIPT"):
                raise exc
        lost = [c for c, r in zip(calls, got)
                if isinstance(r, ResponseError) and str(r).startswith("NOSCRIPT")]
        await asyncio.gather(*(self._step(keys=keys, args=args) for keys, args in lost))
