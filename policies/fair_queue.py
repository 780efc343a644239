"""Fair queuing inside a tier: the Virtual Token Counter (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024), as pure functions. No I/O; ``bus/scripts.py``'s
``PICK_LUA`` and ``ADMIT_LUA`` implement the same rules in Redis (a test compares them).

Each tenant of a tier has a counter: the service it received, in tokens divided by its weight
(prompt tokens charged when its request is picked, output tokens as they are generated). The
next request of a tier comes from the *backlogged* tenant (one with entries not yet picked)
with the least counter; ties go to the smaller tenant id, so the pick is deterministic.

No banked credit: when a tenant becomes backlogged (its first queued entry), its counter is
lifted to ``max(own, min over the backlogged tenants)``; with nobody backlogged, to
``max(own, counter of the last tenant picked)`` (the paper's Algorithm 2: the client that
last left the queue). A tenant that stayed away therefore cannot claim the service it did not
use, and one that just left cannot reset itself below the others.

Bound (the paper's Theorem 4.4, restated for what a worker does): with two tenants
continuously backlogged, their counters differ by at most ``2 * U``, where ``U`` is the
most weighted service one pick can bring before the other tenant's counter catches up: the
largest prompt / weight plus the output the batch can generate for one tenant while a pick
waits (see ``tests/policies/test_fair_queue.py`` for the simulation it is checked against).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def pick(counters: Mapping[str, float], backlogged: Iterable[str]) -> str | None:
    """The backlogged tenant with the least counter (absent = 0); None if none is."""
    best: str | None = None
    best_c = 0.0
    for tenant in backlogged:
        c = counters.get(tenant, 0.0)
        if best is None or c < best_c or (c == best_c and tenant < best):
            best, best_c = tenant, c
    return best


def charge(counters: Mapping[str, float], tenant: str, tokens: int, weight: float
           ) -> dict[str, float]:
    """Counters after ``tenant`` was served ``tokens`` (``counters`` is not mutated)."""
    if weight <= 0:
        raise ValueError(f"weight must be > 0, got {weight!r}")
    out = dict(counters)
    out[tenant] = out.get(tenant, 0.0) + tokens / weight
    return out


def lift(counters: Mapping[str, float], tenant: str, backlogged: Iterable[str],
         last: str | None) -> float:
    """The counter of ``tenant`` as it becomes backlogged (it is not among ``backlogged``):
    lifted to the least backlogged counter, or, with nobody backlogged, to the counter of
    ``last`` (the tenant picked last; None: nobody yet). Never lowered."""
    own = counters.get(tenant, 0.0)
    others = [counters.get(t, 0.0) for t in backlogged if t != tenant]
    if others:
        return max(own, min(others))
    if last is not None:
        return max(own, counters.get(last, 0.0))
    return own
