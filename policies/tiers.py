"""Service tiers and the engine priority each maps to. Pure data, no I/O.

Lower priority number = more urgent, so the engine's priority preemption (issue #2) evicts
best-effort work before batch before interactive.
"""

from __future__ import annotations

INTERACTIVE = "interactive"
BATCH = "batch"
BEST_EFFORT = "best-effort"

TIERS: tuple[str, ...] = (INTERACTIVE, BATCH, BEST_EFFORT)

TIER_PRIORITY: dict[str, int] = {INTERACTIVE: 0, BATCH: 1, BEST_EFFORT: 2}

# Default drain weights for smooth WRR: with every tier backlogged, 6 of 10 pulls are
# interactive, 3 batch, 1 best-effort; an empty tier's share goes to the others in proportion.
DEFAULT_TIER_WEIGHTS: dict[str, int] = {INTERACTIVE: 6, BATCH: 3, BEST_EFFORT: 1}

_ALIASES = {"default": INTERACTIVE, "auto": INTERACTIVE, "flex": BATCH, "best_effort": BEST_EFFORT}


def normalize_tier(name: str) -> str | None:
    """Canonical tier name for ``name`` (case-insensitive; OpenAI's "auto"/"default"/"flex"
    map to interactive/interactive/batch), or None when it is not a tier."""
    key = name.strip().lower()
    if key in TIER_PRIORITY:
        return key
    return _ALIASES.get(key)


def tier_priority(tier: str) -> int:
    return TIER_PRIORITY[tier]
