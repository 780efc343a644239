"""Seats owed to the lower tiers beside urgent rows past the row cap, or beside every urgent
row while the urgent tier is backlogged. Pure.

While urgent (interactive) work is present, the engine's urgent row cap (``engine.core.row_cap``)
runs every urgent row and lower-tier rows only up to the cap. When the urgent rows alone pass
the cap, the lower tiers are owed seats on top of it by the drain weights: ``counted * (sum of
the lower tiers' weights) / the urgent weight``, each tier's part at most its demand, where
``counted`` (``counted_rows``) is the urgent rows past the cap while they are at most twice the
cap, and grows twice as fast beyond that until it counts every urgent row from three caps on;
every urgent row while the urgent tier is backlogged (below).

Why past the cap: urgent work within the cap keeps the step whole (owing seats for every
urgent row took interactive's TPOT to 2x alone in ``bench sla``'s overload row, ten urgent
rows beside a cap of seven; there the urgent rows pass the cap by 1-3 in half the steps).
Why every row from three caps on: interactive's own rows then make its steps three times its
TPOT target, a promise its load has already broken, and only owing for every row makes the
rows follow the weights (past the cap alone, every tier backlogged in ``bench sla``: 30
interactive rows beside a cap of 7 left best-effort 3.8 rows of 45, 0.08 of the rows
against 0.1). The ramp between keeps the count continuous.

The total is floored once, not per tier: per-tier floors owed best-effort (weight 1 of 6)
nothing until the urgent rows passed the cap by six or more. The caller spreads the total over
the tiers by smooth weighted round-robin, which carries the fractions across steps.

The drainer applies the same count (without demand: every lower tier may have some): the
lower tiers may hold that many requests in the engine even past the batch bound, else the
seats owed find no rows to run (``bench sla``, every tier backlogged: the bound held the lower
tiers to 16 rows beside 75 interactive ones, 0.82 of the tokens to interactive).

A backlogged urgent tier (``urgent_backlogged``) is owed no protection: the weights are the
contract among backlogged tiers, so every urgent row counts, within the cap too. Backlogged
means its demand alone would keep more rows running than the cap at the capped step's time
(Little's law: rows = decode tokens asked per second x seconds a step), a TPOT promise its own
load breaks. Why demand and not a queue: interactive never queued when it fitted the cap
(``bench sla``'s backlog row, traced: 0 entries waiting in Redis, dispatch within 3 ms, 10-13
interactive rows beside a cap of 9 for 25 s, 0.87 of the tokens to it, best-effort 0.31 of
its WRR share); it queued in Redis only once its rows had passed three caps, where every row
counts already. Why demand and not the rows running: owing for every row slows the steps,
which raises the rows a steady urgent load keeps running (the overload row's interactive,
0.5x capacity, would then stay past the cap), not the tokens it asks for.
"""

from __future__ import annotations

from collections.abc import Mapping


def counted_rows(urgent: int, cap: int, backlogged: bool = False) -> int:
    """The urgent rows that lower seats are owed for: every one while the urgent tier is
    ``backlogged``; else those past ``cap`` up to two caps, then two more per row, at most
    every urgent row (from three caps on)."""
    if backlogged:
        return max(0, urgent)
    past = urgent - cap
    if past <= 0:
        return 0
    return min(urgent, past + max(0, urgent - 2 * cap))


def owed_seats(urgent: int, cap: int, urgent_priority: int, weights: Mapping[int, int],
               demand: Mapping[int, int] | None = None, backlogged: bool = False) -> int:
    """Lower seats owed beside ``urgent`` rows under ``cap`` (0 when the urgent priority has
    no weight). ``weights``: priority -> weight (absent lower: 1). ``demand``: lower priority
    -> rows it could run (None: every weighted lower priority, unbounded). ``backlogged``:
    the urgent tier asks for more than its weight's share (every urgent row counts)."""
    w_urgent = weights.get(urgent_priority, 0)
    counted = counted_rows(urgent, cap, backlogged)
    if w_urgent <= 0 or counted <= 0:
        return 0
    if demand is None:
        demand = {p: counted * w for p, w in weights.items() if p > urgent_priority}
    # min(demand, counted * w / w_urgent) per tier, summed over the common denominator
    scaled = sum(min(n * w_urgent, counted * weights.get(p, 1))
                 for p, n in demand.items() if p > urgent_priority and n > 0)
    return scaled // w_urgent


def urgent_backlogged(urgent_tokens_s: float | None, cap: int | None, capped_step_s: float,
                      prompt_tokens_s: float = 0.0, per_token_s: float = 0.0,
                      margin: float = 1.0) -> bool:
    """Does the urgent tier ask for more than the capped batch gives it: would
    ``urgent_tokens_s`` (its decode tokens asked per second; None: unknown) keep more than
    ``margin`` x ``cap`` rows running in steps of ``capped_step_s`` (the decode step at the
    cap; None cap: no cap, nothing owed) plus the prompt tokens such a step carries at
    ``prompt_tokens_s``, ``per_token_s`` each (a step of t carries p * t of them: t = decode /
    (1 - c * p))? ``margin`` (>= 1) is the caller's hysteresis (``BACKLOG_ENTER``/``EXIT``)."""
    if urgent_tokens_s is None or cap is None:
        return False
    spare = 1.0 - per_token_s * prompt_tokens_s  # what the urgent prompts leave of a step
    if spare <= 0:
        return urgent_tokens_s > 0  # its prompts alone fill every step
    return urgent_tokens_s * capped_step_s / spare > cap * margin


# The hysteresis of the judgement: an urgent tier counts as backlogged once its demand would
# keep BACKLOG_ENTER x the cap's rows running, and as within it again below BACKLOG_EXIT x.
# Why: its demand is measured over a 10 s window (+-20 % between refits) and the cap moves
# with every refit, and each crossing owes the lower tiers seats for every urgent row or for
# none. At the edge that flipped (bench sla's overload row, interactive at 0.5x capacity,
# sampled every second: backlogged in 16 of 40 s), and every flip to backlogged gave ~40 %
# of interactive's rows away, so its requests ran longer, more of them ran at once and its
# TPOT went to 4.3x alone (5.2x its budget). A tier that asks up to a quarter more than its
# budget's rows keeps them; one that asks more is past its share by any measure.
BACKLOG_ENTER = 1.25
BACKLOG_EXIT = 1.05
