"""The urgent row cap: which running rows sit out a step so that urgent work stays fast.
Torch-free.

A runtime knob (``Scheduler.set_urgent_row_cap``; it changes while the engine runs, so it is
not in ``SchedulerConfig``). While a request of priority <= ``urgent_priority`` is running,
waiting or swapped, a step schedules at most ``cap`` rows in total: every urgent row first,
then lower-priority rows up to the cap: the lower seats go to the lower priorities by smooth
weighted round-robin over ``weights`` (priority -> weight, the tiers' drain weights; scores
carried from step to step so the shares hold over time; strict priority order without
weights), and within a priority to the rows that ran least recently (so they take turns),
then by arrival. The running rows left
over are *held back*: skipped for this step, keeping their KV blocks (paused, no recompute
cost; only the usual memory rules preempt them), and no lower-priority request is swapped in
or admitted past the cap. With no urgent request present no cap applies.

Why: a step's cost grows with its rows, so every lower-tier row slows every urgent one; the
cap (set by the worker from a step-cost model and a TPOT target) bounds the urgent rows'
step time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from engine.core.request import Request
from engine.core.request_queue import RequestQueue
from policies.wrr import smooth_wrr_pick


@dataclass(frozen=True)
class RowCap:
    cap: int
    urgent_priority: int
    # priority -> weight for the lower priorities' seats; empty: strict priority order
    weights: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cap < 0:
            raise ValueError(f"row cap must be >= 0, got {self.cap}")
        if any(w < 0 for w in self.weights.values()):
            raise ValueError(f"row cap weights must be >= 0, got {dict(self.weights)}")


@dataclass(frozen=True)
class StepRowCap:
    """The cap as it applies to one step."""

    cap: int
    urgent_priority: int
    held: frozenset[str]  # running rows that sit this step out

    def admits(self, priority: int, rows_scheduled: int) -> bool:
        """May a swapped or waiting request of ``priority`` start, ``rows_scheduled`` rows in?"""
        return priority <= self.urgent_priority or rows_scheduled < self.cap


def _queued_urgent(queue: RequestQueue, urgent_priority: int) -> int:
    head = queue.peek()
    if head is None or head.priority > urgent_priority:
        return 0  # the common case, without copying the queue
    n = 0
    for req in queue:  # (priority, arrival) order: the urgent ones come first
        if req.priority > urgent_priority:
            break
        n += 1
    return n


def plan_step(cap: RowCap, running: Iterable[Request], waiting: RequestQueue,
              swapped: RequestQueue, scores: dict[int, int]) -> StepRowCap | None:
    """The rows held back this step, or None when no urgent request is present. ``scores``
    are the weighted round-robin's, carried between steps (updated in place)."""
    up = cap.urgent_priority
    lower: dict[int, list[Request]] = {}
    urgent = 0
    for req in running:
        if req.priority <= up:
            urgent += 1
        else:
            lower.setdefault(req.priority, []).append(req)
    # Urgent requests still queued may start this step: their seats are reserved up front.
    urgent += _queued_urgent(waiting, up) + _queued_urgent(swapped, up)
    if not urgent:
        return None
    for rows in lower.values():
        rows.sort(key=lambda r: (r.last_scheduled_step, r.arrival_time))
    kept = _seat_rows(max(0, cap.cap - urgent), lower, cap.weights, scores)
    held = frozenset(r.request_id for rows in lower.values() for r in rows
                     if r.request_id not in kept)
    return StepRowCap(cap.cap, up, held)


def _seat_rows(seats: int, lower: dict[int, list[Request]], weights: Mapping[int, int],
               scores: dict[int, int]) -> set[str]:
    """The ids of the lower rows that run: ``seats`` of them, spread over the priorities."""
    order = sorted(lower)
    if not weights:  # strict priority: the most urgent lower rows first
        ranked = [r for p in order for r in lower[p]]
        return {r.request_id for r in ranked[:seats]}
    w = {p: weights.get(p, 1) for p in order}
    taken = dict.fromkeys(order, 0)
    kept: set[str] = set()
    while len(kept) < seats:
        left = [p for p in order if taken[p] < len(lower[p])]
        pick, new = smooth_wrr_pick(w, scores, left)
        if pick is None:
            break
        scores.update(new)
        kept.add(lower[pick][taken[pick]].request_id)
        taken[pick] += 1
    return kept
