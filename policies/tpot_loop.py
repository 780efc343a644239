"""Interactive's TPOT held by measurement, not only by the step-cost law. Pure.

The step budget (``gateway.worker.step_budget``) caps a step's rows so that the mean step
interactive runs in, its TPOT, stays within a target of 1.2x its step alone. It prices that
through a fitted law (``policies.step_cost``), and the law is off by more than the 1.2x can
absorb: its base moved 31.8 -> 47.8 ms between two bench sla runs on one machine, with
interactive's TPOT under overload 1.82x alone in the second; in another, the law put
interactive's step alone at 64-68 ms where it measured 72-93 ms, so a target of 1.2x the
law's figure was 1.08x the real one, the cap left the lower tiers no rows, and bulk goodput
was 0.09 of the FCFS baseline's. Two measurements correct it:

``alone_bias``: how much longer interactive's steps alone ran than the law said of the same
steps (measured seconds over predicted, summed over the recent steps that ran interactive
rows only, the slowest STALL_SHARE of them by that ratio left out: a shared machine's stalls
land in single steps). The law's figure for interactive alone, at the demand it asks now, is
priced with the law scaled by it. Below 1 too: under overload the law refits on steps with
bulk rows and prompts and overprices interactive's step alone (bench sla, traced: at the
same 117 tok/s of interactive, a 98 ms target in the overload row against 82 ms in the alone
row, and the loop held interactive's TPOT to the higher one). A ratio and not the steps' own
mean, because the mean belongs to the demand it was measured at: the mean of the last steps of bench sla's alone row (a burst: 85 ms) set
a 91 ms target for the overload row against a 62 ms TPOT alone, and the loop held the steps
to it (1.48x alone).

Fed only while the lower tiers hold no request at all: under overload interactive's requests
last longer, so more of them run at once, and its steps without lower rows are longer than
alone (bench sla, traced: fed from those, the target climbed 153 -> 236 ms within the
overload row, letting in lower rows that made the steps longer still).

``next_gain``: integral control of what the cap is priced to: ``gain x target``. The loop
compares the mean step of the steps that ran interactive rows (TPOT is that mean), once
MIN_LOOP_STEPS of them gathered (a refit's second holds three 300 ms steps on a slow
machine), with the target and moves the gain by (target / measured) ** GAIN_EXPONENT (a smaller
exponent up): down
when the steps ran long and lower rows ran within the cap among them (those are what the cap
can take away; seats owed past it are not), up when they ran short while the cap held lower
work back (rows reached it and lower requests waited), unchanged otherwise, so a quiet
period winds nothing up. Bounded to [GAIN_MIN, GAIN_MAX]. The budget never lets the gain
take the cap below interactive's own rows (``StepBudget.plan``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# How far the gain moves towards the measured error in one refit (1 would jump all the way):
# half, because a second of ~80 ms steps holds ~12 of them, one in four or five carrying a
# prompt chunk 2-3x the others long, so the mean of one window is +-15 % noise. Up, a
# quarter: one lower row can cost a third of the target (a prompt with it), so an equal
# step up overshot into steps 1.7x the target and back down every few refits (a limit
# cycle between the cap at interactive's rows and 3-4 above); interactive's side is the
# promise, the lower tiers' the spare.
GAIN_EXPONENT = 0.5
GAIN_UP_EXPONENT = 0.25
# The law is not that far off (its error measured 0.85-1.5x): a gain outside these is an
# error of the loop's own, e.g. steps slowed by a neighbour that no cap can give back.
GAIN_MIN = 0.5
GAIN_MAX = 2.0
# Steps with interactive rows a window needs before it moves the gain (a refit after a
# quiet second has a step or two: no mean); at most LOOP_STEPS_KEPT are kept waiting.
MIN_LOOP_STEPS = 5
LOOP_STEPS_KEPT = 64
# Interactive-only steps the bias needs (fewer: the law's figure as it is), how many are kept
# (a bench sla alone row's worth) and for how long; the share of them left out as stalls; and
# the bias's bounds (the law's error measured 0.85-1.5x: past these it is a stall's).
MIN_ALONE_STEPS = 16
ALONE_STEPS_KEPT = 256
ALONE_MAX_AGE_S = 120.0
# Why 1 % and not 5 %: the GIL waits of a busy event loop come every few steps, they are
# interactive's TPOT as much as its compute, and leaving out one step in 20 put the target
# at 1.11x its TPOT alone (bench sla, 2 cores) where the headroom says 1.2x.
STALL_SHARE = 0.01
BIAS_MIN = 0.5
BIAS_MAX = 2.0


@dataclass(frozen=True, slots=True)
class LoopStep:
    """One engine step as the loop sees it: its seconds, its rows, and how many of them were
    interactive's (``urgent_rows``); the rest were the lower tiers'."""

    seconds: float
    rows: int
    urgent_rows: int

    @property
    def lower_rows(self) -> int:
        return self.rows - self.urgent_rows


def enough(steps: Sequence[LoopStep]) -> bool:
    """Do ``steps`` hold MIN_LOOP_STEPS with interactive rows (a window to judge)?"""
    return sum(s.urgent_rows > 0 for s in steps) >= MIN_LOOP_STEPS


def next_gain(gain: float, steps: Sequence[LoopStep], target_s: float, cap: int | None,
              lower_waiting: bool) -> float:
    """The gain after a window of ``steps`` (those with interactive rows count) against
    ``target_s``, the cap in force being ``cap`` (None: no cap, so it held nothing back) and
    the lower tiers having work in the engine or not (``lower_waiting``). Unchanged with too
    few steps (``enough``)."""
    urgent = [s for s in steps if s.urgent_rows > 0]
    if len(urgent) < MIN_LOOP_STEPS or target_s <= 0:
        return gain
    measured = sum(s.seconds for s in urgent) / len(urgent)
    if measured <= 0:
        return gain
    ratio = target_s / measured
    # removable: lower rows ran within the cap, beside fewer interactive rows than it (past
    # the cap they are seats owed to the lower tiers, which a lower cap only adds to)
    removable = any(s.lower_rows > 0 and (cap is None or s.urgent_rows < cap) for s in urgent)
    # held back: lower work waited while the steps ran at the cap (a cap at interactive's
    # own rows lets no lower row in, and that must still be undone when the steps run short)
    held_back = cap is not None and lower_waiting and any(s.rows >= cap for s in urgent)
    if ratio < 1.0 and removable:
        gain *= ratio ** GAIN_EXPONENT
    elif ratio > 1.0 and held_back:
        gain *= ratio ** GAIN_UP_EXPONENT
    return min(GAIN_MAX, max(GAIN_MIN, gain))


def alone_bias(steps: Sequence[tuple[float, float]]) -> float | None:
    """Measured over predicted seconds of interactive's steps alone, ``steps`` as (measured,
    predicted) pairs, the slowest STALL_SHARE by ratio left out (one at least: a stall among
    the first 16 steps would double the target); within [BIAS_MIN, BIAS_MAX]. None
    with fewer than MIN_ALONE_STEPS."""
    kept = [(s, p) for s, p in steps if p > 0]
    if len(kept) < MIN_ALONE_STEPS:
        return None
    kept.sort(key=lambda sp: sp[0] / sp[1])
    kept = kept[:len(kept) - math.ceil(len(kept) * STALL_SHARE)]  # one at least
    bias = sum(s for s, _ in kept) / sum(p for _, p in kept)
    return min(BIAS_MAX, max(BIAS_MIN, bias))
