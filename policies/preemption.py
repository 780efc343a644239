"""Preemption decisions as pure functions over snapshots. Torch-free.

The scheduler owns the mechanism (free, swap, requeue); this module only decides *who*.
Policy: the least urgent request goes first (highest priority number), and among equals the
latest arrival (it has the least sunk work and FCFS fairness favours the earlier ones).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VictimCandidate:
    request_id: str
    priority: int  # 0 is most urgent
    arrival_time: float


def victim_key(priority: int, arrival_time: float) -> tuple[int, float]:
    """Larger key = preempted first."""
    return (priority, arrival_time)


def choose_victim(candidates: Iterable[VictimCandidate]) -> str | None:
    """The request to preempt among ``candidates``, or None if there are none.

    Lowest priority first (largest number), then latest arrival; ties on both go to the
    candidate listed last (the most recently admitted).
    """
    best: VictimCandidate | None = None
    for c in candidates:
        if best is None or victim_key(c.priority, c.arrival_time) >= victim_key(
            best.priority, best.arrival_time
        ):
            best = c
    return None if best is None else best.request_id


def may_preempt_for(waiting_priority: int, running_priority: int) -> bool:
    """May a blocked waiting/swapped request of ``waiting_priority`` evict a running one?

    Only for *strictly* higher urgency (smaller number): never for equal priority, which
    would just churn work between peers.
    """
    return waiting_priority < running_priority
