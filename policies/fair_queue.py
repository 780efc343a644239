"""Fair queuing inside a tier: the Virtual Token Counter (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024), as pure functions. No I/O; ``bus/scripts.py``'s
``PICK_LUA`` and ``ADMIT_LUA`` implement the same rules in Redis (a test compares them).

Each tenant of a tier has a counter: the service it received, in tokens divided by its weight
(prompt tokens charged when its request is picked, output tokens as they are generated). The
next request of a tier comes from the *backlogged* tenant (one with entries not yet picked)
with the least counter. Ties are common, not rare: a tenant that becomes backlogged is lifted
to exactly the least backlogged counter (below), so a light tenant's every request ties with
the heavy tenant it is lifted to. A tie goes to the tenant *least served* (its service in
tokens / weight, never lifted: the light one, which received less), then to the one whose
next entry is the oldest (first come, first served among equals), and only then to the
smaller tenant id, so the pick stays deterministic. (The tie went to the smaller id before:
in ``carpool bench sla`` "sla-heavy" sorts before "sla-light", so the heavy tenant won every
tie.)

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

# a tenant whose next entry is unknown sorts after every known one
NO_HEAD = (float("inf"), float("inf"))


def pick(counters: Mapping[str, float], backlogged: Iterable[str],
         served: Mapping[str, float] | None = None,
         heads: Mapping[str, tuple[float, float]] | None = None) -> str | None:
    """The backlogged tenant with the least counter (absent = 0); ties to the least
    ``served`` (absent = 0), then the oldest head entry (``heads``: tenant -> its next
    entry's stream id as (milliseconds, sequence); absent = ``NO_HEAD``), then the smaller
    id. None if none is backlogged."""
    served, heads = served or {}, heads or {}
    return min(backlogged, default=None, key=lambda t: (
        counters.get(t, 0.0), served.get(t, 0.0), heads.get(t, NO_HEAD), t))


def charge(counters: Mapping[str, float], tenant: str, tokens: int, weight: float
           ) -> dict[str, float]:
    """Counters after ``tenant`` was served ``tokens`` (``counters`` is not mutated); the
    same charge keeps the ``served`` tallies of ``pick``."""
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
