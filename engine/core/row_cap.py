"""The urgent row cap: which running rows sit out a step so that urgent work stays fast.
Torch-free.

A runtime knob (``Scheduler.set_urgent_row_cap``; it changes while the engine runs, so it is
not in ``SchedulerConfig``). While a request of priority <= ``urgent_priority`` is running,
waiting or swapped, a step schedules at most ``cap`` rows in total: every urgent row first,
then lower-priority rows up to the cap, in priority order and, within a priority, the rows
that ran least recently first (so they take turns), then by arrival. The running rows left
over are *held back*: skipped for this step, keeping their KV blocks (paused, no recompute
cost; only the usual memory rules preempt them), and no lower-priority request is swapped in
or admitted past the cap. With no urgent request present no cap applies.

Why: a step's cost grows with its rows, so every lower-tier row slows every urgent one; the
cap (set by the worker from a step-cost model and a TPOT target) bounds the urgent rows'
step time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine.core.request import Request
from engine.core.request_queue import RequestQueue


@dataclass(frozen=True)
class RowCap:
    cap: int
    urgent_priority: int

    def __post_init__(self) -> None:
        if self.cap < 0:
            raise ValueError(f"row cap must be >= 0, got {self.cap}")


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
              swapped: RequestQueue) -> StepRowCap | None:
    """The rows held back this step, or None when no urgent request is present."""
    up = cap.urgent_priority
    lower: list[Request] = []
    urgent = 0
    for req in running:
        if req.priority <= up:
            urgent += 1
        else:
            lower.append(req)
    # Urgent requests still queued may start this step: their seats are reserved up front.
    urgent += _queued_urgent(waiting, up) + _queued_urgent(swapped, up)
    if not urgent:
        return None
    keep = max(0, cap.cap - urgent)
    # Within a priority the rows that ran least recently go first, so the rows held back
    # rotate: while urgent work stays present, no lower row is held back for ever.
    lower.sort(key=lambda r: (r.priority, r.last_scheduled_step, r.arrival_time))
    held = frozenset(r.request_id for r in lower[keep:])
    return StepRowCap(cap.cap, up, held)
