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

Non-urgent tiers (all but interactive) fill at most the batch bound's seats (``row_limit``,
from the step-cost model: ``policies.batch_bound``), so their overload queues in Redis, where
the fair pick and shedding act, instead of swelling every step. The last few of those seats
go only to tenants under their share (``policies.tenant_seats``): the pick skips a tier's
tenants over it (``held``: the tier, tenant and weight of each request the worker holds), so
a light tenant arriving beside a heavy one finds a seat at once, even when the bound moved
down under the rows held (then only such tiers are open, one start a round). While two
tenants of a tier hold rows, one over its share starts at most one request an engine step
(``policies.tenant_pace``, counted by ``tenant_pace.TenantPace``): a heavy tenant's burst of
prompts would otherwise pile into one step, which the light tenant's first token waits for or
shares; such a tier is read one entry a round, so the fair pick sees each start. A round that
finds only skipped tenants queued waits on the wake lists, briefly, so a light request that
arrives meanwhile starts at once. While the worker's interactive rows pass the
engine's row cap, the non-urgent tiers may hold as many rows as the cap owes them beside those
(``owed_rows``: ``policies.owed_seats``) when that is more than the bound, else the seats owed
find no rows to run. A request of a tenant under its share, in a tier where another tenant is
over its share, is started with its first token urgent (``first_token_urgent``,
``policies.tenant_seats``): the engine caps the step that computes it as an urgent arrival's.
With prefix-aware placement, a pick may pass over entries held for another worker
(``TierQueues.held_s``): a round that found only those waits until the soonest may be stolen
(or an admission comes), instead of polling the backlog or sleeping a whole idle wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping

from engine.protocol import EngineClient
from gateway.bus.backoff import run_forever
from gateway.bus.queues import Envelope, TierQueues
from gateway.worker.tenant_pace import TenantPace
from policies.admission import URGENT_PRIORITY, pull_count
from policies.tenant_pace import shared
from policies.tenant_seats import LowerRoom, first_token_urgent, lower_limit, lower_room
from policies.tiers import tier_priority
from policies.wrr import smooth_wrr_pick

IDLE_BLOCK_S = 0.2
NO_ROOM_WAIT_S = 0.05
# A tier closed for want of room opens when a step ends, which no wake list announces: the
# wait on the open tiers is then this short (bench sla's heavy row, traced: a light request
# arriving while its tier was full waited out the whole IDLE_BLOCK_S and missed a step).
CLOSED_BLOCK_S = NO_ROOM_WAIT_S
# A wait that timed out counts the backlogs next only when the last count, which found the
# tiers empty, is this old: an idle worker's rounds would otherwise read every shard
# 1 / IDLE_BLOCK_S times a second. After a count that found entries it counts at once: a
# burst's wake tokens may be trimmed while its entries wait (held a second, the tier status
# published them as waiting with no starts, and the edge shed the next burst: tier_saturated)
RECOUNT_S = 1.0
QUIET_COUNT = 2  # per tier, when waiting without a backlog count: two tell a burst from a lone entry

log = logging.getLogger("carpool.worker")


class Drainer:
    def __init__(self, queues: TierQueues, engine: EngineClient, consumer: str,
                 weights: Mapping[str, int],
                 start: Callable[[list[Envelope]], Awaitable[None]],
                 row_limit: Callable[[], int | None] = lambda: None,
                 held: Callable[[], Iterable[tuple[str, str, float]]] = tuple,
                 owed_rows: Callable[[int], int] = lambda urgent: 0,
                 steps_done: Callable[[], int] = lambda: 0) -> None:
        self.queues = queues
        self.engine = engine
        self.consumer = consumer
        self.weights = {t: w for t, w in weights.items() if t in queues.tiers}
        self.start = start
        self.row_limit = row_limit  # the batch bound for non-urgent rows (None: none)
        self.held = held  # (tier, tenant, weight) of each request the worker holds
        # lower rows the engine's row cap owes beside this many interactive rows past its cap
        self.owed_rows = owed_rows
        # this round: seats the non-urgent tiers may take, and each tier's tenants its pick
        # skips (empty: nobody is skipped)
        self.lower_seats = 0
        self.excluded: dict[str, frozenset[str]] = {}
        self.scores: dict[str, int] = {}
        self.pace = TenantPace(lambda: engine.stats().scheduler.num_steps)
        self.single: frozenset[str] = frozenset()  # tiers read one entry a round (paced)
        # the non-urgent tiers when this round read its entries: tier -> tenant -> rows, their
        # weights, and the seats shared (``first_token_urgent``)
        self._shares: tuple[dict[str, Counter[str]], dict[str, dict[str, float]], int] = (
            {}, {}, 0)
        self.room = asyncio.Event()  # set by the worker after each engine step
        # The last wait on empty tiers woke for a lone entry: the tiers are most likely
        # empty again, so the next pull waits on them directly, without counting backlogs
        # first (one round trip per request saved at low load).
        self.quiet = False
        self.steps_done = steps_done  # the engine's steps ended so far
        self.read_at = (0.0, 0)  # (wall clock, engine steps ended) of the last entries read
        # when (monotonic) a pull's backlog count last found the tiers empty (-inf: the last
        # count found entries)
        self.counted_at = float("-inf")

    async def run(self) -> None:
        # Entries read before a failure stay pending for us; the fleet checker's maintenance
        # reclaims them once idle for the visibility timeout.
        self.quiet = False  # a (re)started drainer plans the backlog built meanwhile by weight
        await run_forever(self._step, "drainer", log)

    async def _step(self) -> None:
        """One round: wait for room, or pull and start what the queues hold. Nothing read is
        left unstarted when it returns (a subclass may hold the loop between rounds)."""
        room = self._lower_room()
        self.lower_seats, self.excluded = room.seats, room.skip
        open_tiers = [t for t in self.weights if self.engine.has_capacity(tier_priority(t))
                      and (not _lower(t) or (room.seats > 0
                                             and (room.tiers is None or t in room.tiers)))]
        if not open_tiers:
            self.quiet = False  # a backlog may build meanwhile: plan it by weight
            await self._wait_for_room()
            return
        self.queues.held_s = None  # set again by this round's picks
        envs = await self._pull(open_tiers)
        held = self.queues.held_s  # placement: entries held for other workers, stealable in
        if not envs and (self.excluded or held is not None):
            # the backlog may be only tenants the pick skips, or entries held for others
            envs = await self._wait_for_admission(
                open_tiers, CLOSED_BLOCK_S if held is None else min(CLOSED_BLOCK_S, held))
        if envs:
            # when they were read, and the engine steps ended by then: the first token's marks
            self.read_at = (time.time(), self.steps_done())
            self.pace.started([(e.tier, e.tenant) for e in envs if e.tier in self.single])
            # the pull may have waited long for work (an idle tier): judge the first tokens by
            # the rows held now, not by those of the round's start (a burst that just ended
            # would still count as another tenant over its share)
            self._snapshot_shares()
            await self.start(envs)

    def _lower_room(self) -> LowerRoom:
        """Seats the non-urgent tiers may take this round, the tenants each tier's pick
        skips and the tiers open (``policies.tenant_seats.lower_room``). The worker's own
        requests of those tiers count (interactive ones do not: the row cap shares the step
        with them)."""
        rows, weights, limit = self._snapshot_shares()
        self.single = frozenset(t for t in rows if shared(rows[t]))
        paced = {t: self.pace.skip(t, rows[t], weights[t], limit) for t in self.single}
        return lower_room(rows, weights, limit, paced)

    def _snapshot_shares(self) -> tuple[dict[str, Counter[str]], dict[str, dict[str, float]], int]:
        """The rows the worker holds now in the non-urgent tiers (tier -> tenant -> rows), their
        weights and the seats they share; kept for ``first_token_urgent``."""
        rows: dict[str, Counter[str]] = {}
        weights: dict[str, dict[str, float]] = {}
        urgent = 0
        for tier, tenant, weight in self.held():
            if _lower(tier):
                rows.setdefault(tier, Counter())[tenant] += 1
                weights.setdefault(tier, {})[tenant] = weight
            else:
                urgent += 1
        # past the bound when the row cap owes the lower tiers seats beside urgent rows
        limit = lower_limit(self.engine.load(), self.row_limit(), self.owed_rows(urgent))
        self._shares = (rows, weights, limit)
        return rows, weights, limit

    def first_token_urgent(self, tier: str, tenant: str) -> bool:
        """Whether a request of ``tenant`` in ``tier`` started this round gets its first token
        as an urgent arrival would (``policies.tenant_seats.first_token_urgent``, by the rows
        held when its entries were read)."""
        rows, weights, limit = self._shares
        held = rows.get(tier)
        return held is not None and first_token_urgent(held, weights.get(tier, {}), limit,
                                                       tenant)

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
            self.counted_at = time.monotonic()  # found idle: the next count may wait
            return await self._wait_for_work(open_tiers, 1)
        self.counted_at = float("-inf")  # entries waited: a wait that times out recounts
        plan: list[str] = []
        seats = self._batch_size()  # one engine load snapshot per plan, not one per pick
        lower_seats = self.lower_seats
        while left and len(plan) < seats:
            tier, self.scores = smooth_wrr_pick(self.weights, self.scores, list(left))
            assert tier is not None
            plan.append(tier)
            left[tier] = 0 if tier in self.single else left[tier] - 1
            lower_seats -= _lower(tier)
            for t in [t for t in left if not left[t] or (lower_seats <= 0 and _lower(t))]:
                del left[t]
        got = await self.queues.read_counts(dict(Counter(plan)), self.consumer, self.excluded)
        return [got[t].pop(0) for t in plan if got.get(t)]

    async def _wait_for_work(self, tiers: list[str], count: int) -> list[Envelope]:
        """Wait for an admission to any of ``tiers``, then pick up to ``count`` entries of
        each. One entry in all keeps the drainer quiet; more (a burst, or several tiers) and
        the next pull counts the backlogs to batch them and keep the tiers' weights. A wait
        that timed out counts the backlogs next too (a wake token may have been trimmed or
        taken by another worker while an entry remains), when the last count is
        ``RECOUNT_S`` old: an idle worker reads every shard about once a second. While a tier is closed for want of
        room the wait is short: a step's end opens it and wakes nobody."""
        closed = len(tiers) < sum(1 for w in self.weights.values() if w > 0)
        if await self.queues.wait(tiers, CLOSED_BLOCK_S if closed else IDLE_BLOCK_S,
                                  self.consumer) is None:
            self.quiet = time.monotonic() - self.counted_at < RECOUNT_S
            return []
        counts = {t: min(count, self.lower_seats, 1 if t in self.single else count)
                  if _lower(t) else count for t in tiers}
        got = await self.queues.read_counts(counts, self.consumer, self.excluded)
        envs = [e for t in tiers for e in got.get(t, [])]
        # an entry held for another worker means work is queued: count the backlog next
        self.quiet = len(envs) <= 1 and self.queues.held_s is None
        return envs

    async def _wait_for_admission(self, tiers: list[str],
                                  timeout_s: float = CLOSED_BLOCK_S) -> list[Envelope]:
        """While the backlog is only tenants the pick skips (over their share, paced): wait
        for an admission to ``tiers``, at most ``CLOSED_BLOCK_S`` (a step's end, which wakes
        nobody, lets them start again), and pick once from the tier woken for. Waiting for
        the step's end alone (as before) left a light tenant's request that arrived
        meanwhile queued until the next poll: one that came late in a step missed the next
        step and waited a whole step more (bench sla's heavy row, traced)."""
        woke = await self.queues.wait(tiers, timeout_s, self.consumer)
        self.quiet = False  # a backlog is known: count it next round
        if woke is None or woke not in tiers:
            return []
        got = await self.queues.read_counts({woke: 1}, self.consumer, self.excluded)
        return got.get(woke, [])

    async def _wait_for_room(self) -> None:
        self.room.clear()
        try:
            await asyncio.wait_for(self.room.wait(), NO_ROOM_WAIT_S)
        except TimeoutError:
            pass


def _lower(tier: str) -> bool:
    """Non-urgent: its rows are held to the batch bound."""
    return tier_priority(tier) > URGENT_PRIORITY
