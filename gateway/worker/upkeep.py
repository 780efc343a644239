"""The worker's upkeep of the queue group: the heartbeat of its own pending entries, the
reclaim of dead workers' entries, and departures (``bus/pending.py`` holds the index each
reads).

- ``maintain`` (every third of the visibility timeout): XCLAIM-heartbeat this worker's
  pending entries, then, on the fleet's checker alone (``recovery.checker``), XAUTOCLAIM
  entries idle past the visibility timeout from the streams in the pending index.
- ``claim_dead`` (every ``DEAD_CHECK_S``): the consumers holding pending entries, from the
  index, against the tier status (``recovery.DeadWorkers``); a dead one's entries are taken
  over at once, then it departs: it leaves the group of every stream where it holds nothing
  more, and its tier status field is removed. One live worker does it a round
  (``recovery.checker``); the others read only the tier status.
- ``depart`` (a clean stop): this worker leaves the groups the same way.

Each round's Redis commands: one per shard to read the index, one per indexed stream, and
the tier status read (the dead-worker check: the tier status read, and the rest by one
worker of the fleet); none per idle or backlogged tenant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.bus.keys import RedisKeys
from gateway.bus.queues import Envelope, TierQueues
from gateway.worker.recovery import DeadWorkers
from gateway.worker.tier_status import STALE_AFTER_S
from gateway.worker.writer import Inflight

log = logging.getLogger("carpool.worker")

DEAD_CHECK_S = 2.0  # how often a worker looks for dead workers' requests to take over


class Upkeep:
    def __init__(self, redis: Any, keys: RedisKeys, queues: TierQueues, consumer: str,
                 dead_workers: DeadWorkers, start: Callable[[list[Envelope], bool], Awaitable[None]],
                 inflight: Callable[[], list[Inflight]], draining: Callable[[], bool]) -> None:
        self.redis = redis
        self.keys = keys
        self.queues = queues
        self.consumer = consumer
        self.dead_workers = dead_workers
        self._start = start
        self._inflight = inflight
        self._draining = draining

    async def maintain(self, visibility_timeout_s: float) -> None:
        """One heartbeat and reclaim round."""
        min_idle_ms = int(visibility_timeout_s * 1000)
        by_stream: dict[tuple[str, str], list[str]] = {}
        for rec in self._inflight():
            by_stream.setdefault((rec.tier, rec.tenant), []).append(rec.entry_id)
        for (tier, tenant), ids in by_stream.items():
            await self.queues.heartbeat(tier, tenant, self.consumer, ids)
        # one worker of the fleet reclaims (``recovery.checker``): each XAUTOCLAIMed every
        # indexed stream, O(workers x running tenants) a round
        if not self._draining() and self.dead_workers.is_checker(time.monotonic()):
            reclaimed = await self.queues.autoclaim(None, self.consumer, min_idle_ms)
            if reclaimed:
                await self._start(reclaimed, True)

    async def claim_dead(self) -> None:
        """One check for dead workers: their requests are taken over without waiting for the
        visibility timeout, and they depart."""
        # every round: liveness is when each status last changed, seen here
        statuses = await self.redis.hgetall(self.keys.tier_status)
        now = time.monotonic()
        if not self.dead_workers.checks(statuses, now):
            return  # another live worker scans the index this round (``recovery.checker``)
        holders = await self.queues.pending_consumers()
        dead_ones = self.dead_workers.update(statuses, holders, now)
        for dead in dead_ones if not self._draining() else ():
            log.warning("worker %s: status unchanged for %.0f s: taking over its requests",
                        dead, STALE_AFTER_S)
            envs = await self.queues.claim_from(None, dead, self.consumer,
                                                int(STALE_AFTER_S * 1000))
            if envs:
                await self._start(envs, True)
            await self.depart(dead)

    async def depart(self, worker: str) -> int:
        """``worker`` leaves the group where it holds no pending entry, and the tier status;
        returns how many streams it still holds entries in."""
        left = await self.queues.pending.depart(worker)
        if not left:
            await self.redis.hdel(self.keys.tier_status, worker)
        return left
