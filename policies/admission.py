"""Admission: whether an engine has room for one more request, and how many the worker's
drainer may pull now. Pure functions of an ``EngineLoad`` snapshot; the one place these two
decisions are made (the real engine, the FAKE echo engine and the drainer all call them).

Imports nothing from ``engine/``: an engine builds an ``EngineLoad`` from its own state.

Only work at least as urgent as the newcomer stands in its way: a waiting or swapped request of
a lower priority (e.g. best-effort work evicted by a preemption) starts after it, so it does not
count toward the seats taken (no priority inversion between the drainer and the engine's own
queue). The short queue (``MAX_ENGINE_WAITING``) is kept per priority: the engine's urgent row
cap gives each priority its own seats by weight (``engine.core.row_cap``), so more urgent
queued work must not keep a tier's requests out of the engine (it did: batch's queue of four
kept best-effort from ever being pulled while every tier was backlogged). The real engine
reports requests it has not placed yet by their priority (``engine.frontend.inbox``); any it
cannot place by priority count toward every priority's queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

# Keep a few percent of blocks in reserve so running requests can keep decoding.
MIN_FREE_BLOCK_FRACTION = 0.05
# A short queue inside the engine lets the next step admit at once; a long one would move the
# tier decision from the drainer's WRR into the engine's priority order.
MAX_ENGINE_WAITING = 4
# Entries the drainer reads per round trip, at most (bounded further by the free seats).
MAX_PULL = 8
# Seats kept free for the most urgent priority (0, interactive): a lower-priority request
# may not take the last max_num_seqs // URGENT_RESERVE_DIVISOR of them (none below 8), so an
# interactive arrival finds a seat instead of preempting lower work it waited behind (with
# --max-num-seqs 32: 4 seats; the row cap runs far fewer lower rows than the rest anyway).
URGENT_PRIORITY = 0
URGENT_RESERVE_DIVISOR = 8


@dataclass(frozen=True)
class EngineLoad:
    """A snapshot for admission decisions (the drainer) and metrics."""

    num_running: int
    num_waiting: int
    num_swapped: int
    num_free_blocks: int
    num_total_blocks: int
    max_num_seqs: int
    # The largest priority number running, i.e. the work a more urgent request may preempt;
    # None when idle or when the engine never preempts (the echo engine).
    lowest_running_priority: int | None
    # (priority, count) of the waiting / swapped requests whose priority the engine knows,
    # ascending by priority. ``num_waiting`` may count more (requests posted to the engine
    # and not applied yet): those count as urgent. Empty: every one counts as urgent.
    waiting_by_priority: tuple[tuple[int, int], ...] = ()
    swapped_by_priority: tuple[tuple[int, int], ...] = ()


def by_priority(priorities: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``(priority, count)`` pairs, ascending, for an ``EngineLoad`` field."""
    return tuple(sorted(Counter(priorities).items()))


def _at_least_as_urgent(total: int, counts: tuple[tuple[int, int], ...], priority: int) -> int:
    return total - sum(n for p, n in counts if p > priority)


def waiting_ahead(load: EngineLoad, priority: int) -> int:
    """Waiting requests that would start no later than a new one of ``priority``."""
    return _at_least_as_urgent(load.num_waiting, load.waiting_by_priority, priority)


def waiting_at(load: EngineLoad, priority: int) -> int:
    """Waiting requests of ``priority`` itself, plus those of no known priority yet."""
    known = sum(n for _, n in load.waiting_by_priority)
    return load.num_waiting - known + dict(load.waiting_by_priority).get(priority, 0)


def free_seats(load: EngineLoad, priority: int | None = None) -> int:
    """Seats left once everything already inside the engine runs (may be negative); with
    ``priority``, once everything at least as urgent runs (lower-priority queued work
    starts after it)."""
    if priority is None:
        return load.max_num_seqs - load.num_running - load.num_swapped - load.num_waiting
    swapped = _at_least_as_urgent(load.num_swapped, load.swapped_by_priority, priority)
    return load.max_num_seqs - load.num_running - swapped - waiting_ahead(load, priority)


def reserved_seats(load: EngineLoad, priority: int) -> int:
    """Free seats a request of ``priority`` must leave to the urgent priority."""
    if priority <= URGENT_PRIORITY:
        return 0
    return load.max_num_seqs // URGENT_RESERVE_DIVISOR


def engine_has_capacity(load: EngineLoad, priority: int) -> bool:
    """Room for one more request of ``priority``: a free seat (past the urgent reserve)
    with blocks to spare and only a short queue of its own priority inside the engine, or
    lower-priority running work it may preempt."""
    free_fraction = load.num_free_blocks / max(1, load.num_total_blocks)
    if waiting_at(load, priority) >= MAX_ENGINE_WAITING:
        return False
    if free_seats(load, priority) > reserved_seats(load, priority) and (
            free_fraction > MIN_FREE_BLOCK_FRACTION):
        return True
    lowest = load.lowest_running_priority
    return lowest is not None and lowest > priority


def pull_count(load: EngineLoad, max_pull: int = MAX_PULL) -> int:
    """How many entries the drainer may read now: the free seats, at least one (it pulls
    only after ``engine_has_capacity`` said yes, which a preemption may make true with no
    seat free) and at most ``max_pull``."""
    return max(1, min(max_pull, free_seats(load)))
