"""Pacing a tier's tenants over their share: while another tenant of their tier holds rows,
each may start at most ``STARTS_PER_STEP`` requests an engine step. Pure functions; the
drainer applies them (``gateway/worker/tenant_pace.py`` counts the starts of each step).

Why (traced in ``carpool bench sla``'s heavy row on the 2-core CPU): a prompt token costs
about what a decode row does (a step-cost fit of that row: ~2.1 ms a row, ~2.0 ms a prompt
token), so a step that starts several of a heavy tenant's requests is much longer (31 rows with
159 prompt tokens: 467 ms; 51 rows with 93: 218 ms). A light tenant's first token waits for
the step in progress and then its own, so its tail was made of those steps. The batch bound
caps the rows, not how many start at once: whenever several seats freed in one step
(requests finishing together, the bound moving up) the heavy backlog filled them all in it
(0 to 5 heavy starts a step, one on average). Held to one start a step, the rest of its
backlog stays in Redis, where the fair pick serves the light tenant first, and its prompts
spread over steps instead of piling into one.

Only tenants over their share (``policies.tenant_seats.over_share``) are paced, and only
while another tenant of their tier holds rows: a tenant alone in its tier, or one under its
share, starts as many as the seats allow. At the bound a tenant's requests finish at about
its rows / their output length a step (under one in the bench), so one start a step keeps a
heavy tenant near its rows; one whose requests finish faster than that is held below them
while it shares the tier, which is the point: it is over its share.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.tenant_seats import over_share

STARTS_PER_STEP = 1


def shared(held: Mapping[str, int]) -> bool:
    """Whether pacing applies in a tier: at least two of its tenants hold rows."""
    return sum(1 for n in held.values() if n > 0) >= 2


def paced(held: Mapping[str, int], weights: Mapping[str, float], seats: int,
          started: Mapping[str, int], per_step: int = STARTS_PER_STEP) -> frozenset[str]:
    """The tenants of one tier that may start nothing more this step: over their share of
    ``seats`` (``held``: rows each holds; ``weights``: absent means 1) and with ``per_step``
    starts already (``started``: this step's), while the tier is ``shared``."""
    if not shared(held):
        return frozenset()
    return frozenset(t for t in over_share(held, weights, seats)
                     if started.get(t, 0) >= per_step)
