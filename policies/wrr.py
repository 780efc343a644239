"""Smooth weighted round-robin (nginx's algorithm) as a pure function.

Each pick adds every eligible tier's weight to its running score, takes the highest score,
and subtracts the sum of eligible weights from the winner. Over any window the picks follow
the weights and are interleaved (6:3:1 gives a,b,a,a,b,a,c,a,b,a rather than a*6,b*3,c).
Ineligible tiers (empty, or no engine room at their priority) keep their score and take no
share, so their share is redistributed to the others in proportion to their weights.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)  # a tier name, or an engine priority


def smooth_wrr_pick(
    weights: Mapping[K, int],
    current: Mapping[K, int],
    eligible: Iterable[K],
) -> tuple[K | None, dict[K, int]]:
    """Pick one of ``eligible`` and return it with the new scores (``current`` is not mutated).

    Ties go to the first eligible tier in ``weights`` order, so the result is deterministic.
    Returns ``(None, scores)`` when nothing is eligible.
    """
    allowed = [t for t in weights if t in set(eligible) and weights[t] > 0]
    scores = {t: current.get(t, 0) for t in weights}
    if not allowed:
        return None, scores
    total = 0
    for t in allowed:
        scores[t] += weights[t]
        total += weights[t]
    best = max(allowed, key=lambda t: scores[t])  # max keeps the first of equals
    scores[best] -= total
    return best, scores


def wrr_sequence(weights: Mapping[str, int], n: int, eligible: Iterable[str] | None = None) -> list[str]:
    """The first ``n`` picks with a fixed eligible set (all tiers by default)."""
    elig = list(weights) if eligible is None else list(eligible)
    scores: dict[str, int] = {}
    picks: list[str] = []
    for _ in range(n):
        tier, scores = smooth_wrr_pick(weights, scores, elig)
        if tier is None:
            break
        picks.append(tier)
    return picks
