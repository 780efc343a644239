"""Test-side views of the tier queues (``bus/queues.py``): a tier is one stream per tenant,
listed in the tier's tenant set, so what tests used to read from one stream per tier they
read here, summed over the tier's tenant streams."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from gateway.bus.keys import GROUP, RedisKeys
from policies.tiers import TIERS


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def tier_streams(r: Any, keys: RedisKeys, tier: str) -> list[str]:
    """The tenant streams of ``tier`` (a synchronous redis-py client)."""
    return sorted(keys.queue(tier, _text(t)) for s in keys.shard_range()
                  for t in r.smembers(keys.queue_tenants(tier, s)))


def queued(r: Any, keys: RedisKeys, tier: str) -> int:
    """Entries of ``tier`` (queued + running): its streams' summed XLEN."""
    return sum(r.xlen(s) for s in tier_streams(r, keys, tier))


def pending(r: Any, keys: RedisKeys, tier: str) -> int:
    """Entries of ``tier`` delivered to a worker and not acknowledged."""
    total = 0
    for stream in tier_streams(r, keys, tier):
        try:
            total += r.xpending(stream, GROUP)["pending"]
        except ResponseError as exc:
            _gone(exc)
    return total


def _gone(exc: ResponseError) -> None:
    """A stream deleted since it was listed (its last entry done meanwhile) holds nothing
    pending (an EXISTS first would leave the same gap); any other error is raised."""
    if not str(exc).startswith("NOGROUP"):
        raise exc


async def aqueued(client: Any, keys: RedisKeys, tier: str) -> int:
    """``queued`` with an asyncio client."""
    members = [t for s in keys.shard_range()
               for t in await client.smembers(keys.queue_tenants(tier, s))]
    return sum([await client.xlen(keys.queue(tier, _text(t))) for t in members])


async def apending(client: Any, keys: RedisKeys, tier: str) -> int:
    """``pending`` with an asyncio client."""
    total = 0
    members = [t for s in keys.shard_range()
               for t in await client.smembers(keys.queue_tenants(tier, s))]
    for t in members:
        try:
            total += (await client.xpending(keys.queue(tier, _text(t)), GROUP))["pending"]
        except ResponseError as exc:
            _gone(exc)
    return total


def queue_keys(keys: RedisKeys, tenants: tuple[str, ...] = ("t",)) -> list[str]:
    """Every queue key of the namespace for ``tenants`` (to delete after a test), with every
    shard's tier state, depth and counters."""
    shard = [k for s in keys.shard_range() for k in (keys.depth(s), keys.stats(s))]
    return shard + [k for t in TIERS for k in (
        keys.wake(t), *(keys.queue(t, n) for n in tenants),
        *(k2 for s in keys.shard_range() for k2 in (keys.queue_tenants(t, s),
                                                     keys.backlogged(t, s), keys.vtc(t, s))))]
