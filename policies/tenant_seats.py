"""Seats for non-urgent work under the batch bound, and a small reserve of them for tenants
under their share. Pure functions; the drainer applies them (``gateway/worker/drainer.py``).

Non-urgent requests (every tier but interactive) may occupy at most ``lower_limit`` engine
seats: the batch bound (``policies.batch_bound``) when there is one, and never the seats
``policies.admission`` keeps for interactive. Only non-urgent requests count against it:
interactive rows are governed by the engine's urgent row cap, which gives the lower tiers
seats by weight beside them; counting interactive here starved them (every tier backlogged,
interactive alone filled the bound and best-effort got a third of its share). For the same
reason the limit grows to the seats the row cap owes the lower tiers beside interactive rows
past the cap: those seats need lower rows in the engine to run.

The fair pick in Redis chooses *whose* request goes next, but only when a seat frees. A heavy
tenant alone in its tier would otherwise fill every seat, and a light tenant's request that
arrives then waits for one of the heavy requests to finish (a whole generation) before the
pick can prefer it. So the last ``tenant_reserve`` seats are kept for a tenant that is under
its share: a tenant may take one only while it holds fewer rows than its weighted share of the
seats among the tenants of its tier holding rows *plus one newcomer of its own weight*
(``over_share``). A heavy tenant alone is thus held to the seats minus the reserve, and a light
tenant arriving finds a seat at once; the reserve refills as heavy requests finish.

The limit moves (the bound is refitted from the steps) and can fall under the rows already
held, which leave only as they finish. A limit that closed every non-urgent tier then also
closed the reserve: a light tenant's request waited in Redis until enough heavy rows
finished (bench sla's heavy row, traced: 399 ms in Redis, its first token three steps after
its arrival). So at or past the limit (``lower_room``) a tier where a tenant is over its
share still serves its other tenants, one start a round and each only while under its share
(so they overshoot the limit by at most their shares); its tenants over their share, and
every tier where nobody is, wait for rows to finish.

A seat at once is not a first token at once: the light tenant's first token still waited for
the step in progress and then its own, which carried the heavy tenant's rows and its paced
start. So a request of a tenant under its share, in a tier where another tenant is over its
share (``first_token_urgent``), is marked for the engine, which caps the step computing its
first token as an urgent arrival's (``engine.core.row_cap``). Only beside a tenant over its
share: two tenants within their shares marking every start would cap most steps of a busy
tier for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.admission import URGENT_PRIORITY, EngineLoad, reserved_seats

# The reserve is 1/16 of the non-urgent seats, at least 2: a light tenant arriving while the
# batch is full finds a seat; at the knee of the step-cost curve the seats it idles cost
# well under 1 % of tokens/s (a few rows of ~60 at 90 % of the asymptote).
RESERVE_DIVISOR = 16
MIN_RESERVE = 2


def lower_limit(load: EngineLoad, bound: int | None, owed: int = 0) -> int:
    """The seats non-urgent work may fill: the bound (None: none) or, when more, the seats
    the row cap owes it beside urgent rows past the cap (``policies.owed_seats``), never the
    urgent reserve of ``policies.admission``."""
    seats = load.max_num_seqs - reserved_seats(load, URGENT_PRIORITY + 1)
    return seats if bound is None else min(max(bound, owed), seats)


def tenant_reserve(limit: int) -> int:
    """Seats of ``limit`` kept for tenants under their share (none when limit is tiny)."""
    return min(max(0, limit - 1), max(MIN_RESERVE, -(-limit // RESERVE_DIVISOR)))


def over_share(held: Mapping[str, int], weights: Mapping[str, float], seats: int
               ) -> frozenset[str]:
    """The tenants of one tier that may not take a reserved seat: those whose next row would
    exceed their weighted share of ``seats`` among the tenants holding rows (``held``) and
    one newcomer of their own weight. ``weights``: absent means 1."""
    holding = {t: n for t, n in held.items() if n > 0}
    total = sum(weights.get(t, 1.0) for t in holding)
    out = set()
    for tenant, rows in holding.items():
        w = weights.get(tenant, 1.0)
        if rows + 1 > seats * w / (total + w):
            out.add(tenant)
    return frozenset(out)


def first_token_urgent(held: Mapping[str, int], weights: Mapping[str, float], seats: int,
                       tenant: str) -> bool:
    """Whether ``tenant``'s next request in its tier (``held``: rows each tenant of the tier
    holds; ``weights``: absent means 1) gets its first token as an urgent arrival would: it
    is not over its share of ``seats`` and another tenant of the tier is."""
    over = over_share(held, weights, seats)
    return tenant not in over and any(t != tenant for t in over)


@dataclass(frozen=True)
class LowerRoom:
    """What the drainer may start of the non-urgent tiers this round."""

    seats: int  # starts in all, at most
    skip: dict[str, frozenset[str]]  # per tier, the tenants its pick skips (absent: none)
    tiers: frozenset[str] | None = None  # the tiers open (None: every one, while seats > 0)


def lower_room(rows: Mapping[str, Mapping[str, int]],
               weights: Mapping[str, Mapping[str, float]], limit: int,
               paced: Mapping[str, frozenset[str]]) -> LowerRoom:
    """The room under ``limit`` for the non-urgent tiers holding ``rows`` (tier -> tenant ->
    rows; ``weights`` likewise, absent means 1): past the reserve, everyone but the
    ``paced`` tenants; inside it, only tenants under their share; at or past the limit, one
    start a round for a tenant under its share in a tier where another is over it."""
    free = limit - sum(n for tenants in rows.values() for n in tenants.values())
    reserve = tenant_reserve(limit)
    if free > reserve:
        return LowerRoom(free - reserve, _nonempty(paced))
    over = {t: over_share(rows[t], weights.get(t, {}), limit) for t in rows}
    skip = {t: over[t] | paced.get(t, frozenset()) for t in rows}
    if free > 0:
        return LowerRoom(free, _nonempty(skip))
    hogged = frozenset(t for t, ex in over.items() if ex)
    return LowerRoom(1 if hogged else 0, {t: skip[t] for t in hogged}, hogged)


def _nonempty(skip: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    return {t: ex for t, ex in skip.items() if ex}
