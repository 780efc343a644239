"""The drainer: moves envelopes from the tier queues into the engine, one at a time.

It pulls only when the engine can take work at a tier's priority (``has_capacity``: a free
seat and blocks, or lower-priority running work it may preempt), and at most as many entries
as ``policies.admission.pull_count`` allows (the engine's free seats). Among the tiers that have a
backlog and room, smooth weighted round-robin (``policies.wrr``) picks which one; inside the
tier, the fair pick (``TierQueues.pick``: the backlogged tenant with the least virtual token
counter, ``policies.fair_queue``) picks whose entry. When every tier is empty it blocks on
all their wake lists at once (``TierQueues.wait``), so an idle worker reacts within a round
trip or two (the wake, then the pick). After such a wait brought one entry, the next pull
waits again straight away (``quiet``): at low load the backlog count would find the tiers
empty nearly every time.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

from engine.protocol import EngineClient
from gateway.bus.backoff import run_forever
from gateway.bus.queues import Envelope, TierQueues
from policies.admission import pull_count
from policies.tiers import tier_priority
from policies.wrr import smooth_wrr_pick

IDLE_BLOCK_S = 0.2
NO_ROOM_WAIT_S = 0.05
QUIET_COUNT = 2  # per tier, when waiting without a backlog count: two tell a burst from a lone entry

log = logging.getLogger("carpool.worker")


class Drainer:
    def __init__(self, queues: TierQueues, engine: EngineClient, consumer: str,
                 weights: Mapping[str, int],
                 start: Callable[[list[Envelope]], Awaitable[None]]) -> None:
        self.queues = queues
        self.engine = engine
        self.consumer = consumer
        self.weights = {t: w for t, w in weights.items() if t in queues.tiers}
        self.start = start
        self.scores: dict[str, int] = {}
        self.room = asyncio.Event()  # set by the worker after each engine step
        # The last wait on empty tiers woke for a lone entry: the tiers are most likely
        # empty again, so the next pull waits on them directly, without counting backlogs
        # first (one round trip per request saved at low load).
        self.quiet = False

    async def run(self) -> None:
        # Entries read before a failure stay pending for us; the worker's maintenance
        # reclaims them once idle for the visibility timeout.
        self.quiet = False  # a (re)started drainer plans the backlog built meanwhile by weight
        await run_forever(self._step, "drainer", log)

    async def _step(self) -> None:
        """One round: wait for room, or pull and start what the queues hold. Nothing read is
        left unstarted when it returns (a subclass may hold the loop between rounds)."""
        open_tiers = [t for t in self.weights if self.engine.has_capacity(tier_priority(t))]
        if not open_tiers:
            self.quiet = False  # a backlog may build meanwhile: plan it by weight
            await self._wait_for_room()
            return
        envs = await self._pull(open_tiers)
        if envs:
            await self.start(envs)

    def _batch_size(self) -> int:
        return pull_count(self.engine.load())

    async def _pull(self, open_tiers: list[str]) -> list[Envelope]:
        """The next entries in WRR order: the picks for up to ``_batch_size()`` seats are
        planned with the backlogs known, then read with one pipelined fair pick per tier."""
        if self.quiet:
            return await self._wait_for_work(open_tiers, min(QUIET_COUNT, self._batch_size()))
        backlog = await self.queues.backlogs()
        left = {t: backlog.get(t, 0) for t in open_tiers
                if backlog.get(t, 0) > 0 and self.weights[t] > 0}
        if not left:
            return await self._wait_for_work(open_tiers, 1)
        plan: list[str] = []
        seats = self._batch_size()  # one engine load snapshot per plan, not one per pick
        while left and len(plan) < seats:
            tier, self.scores = smooth_wrr_pick(self.weights, self.scores, list(left))
            assert tier is not None
            plan.append(tier)
            left[tier] -= 1
            if not left[tier]:
                del left[tier]
        got = await self.queues.read_counts(dict(Counter(plan)), self.consumer)
        return [got[t].pop(0) for t in plan if got.get(t)]

    async def _wait_for_work(self, tiers: list[str], count: int) -> list[Envelope]:
        """Wait for an admission to any of ``tiers``, then pick up to ``count`` entries of
        each. One entry in all keeps the drainer quiet; more (a burst, or several tiers) and
        the next pull counts the backlogs to batch them and keep the tiers' weights. A wait
        that timed out counts the backlogs next too (a wake token may have been trimmed or
        taken by another worker while an entry remains)."""
        if await self.queues.wait(tiers, IDLE_BLOCK_S) is None:
            self.quiet = False
            return []
        got = await self.queues.read_counts({t: count for t in tiers}, self.consumer)
        envs = [e for t in tiers for e in got.get(t, [])]
        self.quiet = len(envs) <= 1
        return envs

    async def _wait_for_room(self) -> None:
        self.room.clear()
        try:
            await asyncio.wait_for(self.room.wait(), NO_ROOM_WAIT_S)
        except TimeoutError:
            pass
