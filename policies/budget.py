"""Budgets and prices: pure functions over numbers, no I/O.

A price is per 1M prompt / cached prompt / completion tokens (any currency). A cost is kept
in micro-units (1e-6 of the currency) as an integer, so Redis adds it exactly: ``t`` tokens at
``p`` per 1M cost ``t * p`` micro-units (rounded once per request).

A budget caps what a tenant may spend in a period (``daily`` or ``monthly``, UTC calendar),
in tokens (prompt + completion) or in cost. Admission refuses a tenant whose period has
reached its budget; it charges an admitted request's reservation at once (prompt + max_tokens
per choice, at the completion price) and the settle replaces it with what the request
delivered. So the tenant is never charged past its budget by more than one reservation: the
request that crossed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

PERIODS = ("daily", "monthly")
MAX_BUDGET_TOKENS = 10**15
MAX_BUDGET_COST = 10.0**9  # currency units; micro-units stay below 2**63
MAX_PRICE = 10.0**6  # per 1M tokens


@dataclass(frozen=True)
class Price:
    """Per 1M tokens."""

    prompt: float
    cached: float
    completion: float

    def __post_init__(self) -> None:
        for name in ("prompt", "cached", "completion"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (
                    math.isfinite(v) and 0 <= v <= MAX_PRICE):
                raise ValueError(f"price {name} must be a number in [0, {MAX_PRICE:g}] per 1M "
                                 f"tokens, got {v!r}")

    def cost_micro(self, prompt: int, cached: int, completion: int) -> int:
        """Micro-units for these tokens (``cached`` is part of ``prompt``)."""
        return round((prompt - cached) * self.prompt + cached * self.cached
                     + completion * self.completion)


def parse_prices(raw: str) -> dict[str, Price]:
    """``model=prompt/cached/completion;model2=...`` (per 1M tokens)."""
    out = {}
    for part in (p.strip() for p in raw.split(";")):
        if not part:
            continue
        model, sep, nums = part.rpartition("=")
        values = nums.split("/")
        if not sep or not model or len(values) != 3:
            raise ValueError(f"price {part!r}: expected model=prompt/cached/completion")
        try:
            out[model.strip()] = Price(*(float(v) for v in values))
        except ValueError as exc:
            raise ValueError(f"price {part!r}: {exc}") from exc
    return out


@dataclass(frozen=True)
class Budget:
    """A limit per period in tokens or in cost (one of them; 0 = none)."""

    tokens: int = 0
    cost: float = 0.0
    period: str = "monthly"

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or not (
                0 <= self.tokens <= MAX_BUDGET_TOKENS):
            raise ValueError(f"budget_tokens must be an integer in [0, {MAX_BUDGET_TOKENS}], "
                             f"got {self.tokens!r}")
        c = self.cost
        if isinstance(c, bool) or not isinstance(c, int | float) or not (
                math.isfinite(c) and 0 <= c <= MAX_BUDGET_COST):
            raise ValueError(f"budget_cost must be a number in [0, {MAX_BUDGET_COST:g}], "
                             f"got {c!r}")
        if self.tokens and c:
            raise ValueError("a budget is in tokens or in cost, not both")
        if self.period not in PERIODS:
            raise ValueError(f"budget_period must be one of {', '.join(PERIODS)}, "
                             f"got {self.period!r}")

    @property
    def limit(self) -> int:
        """In the ledger's units: tokens, or cost in micro-units; 0 = no budget."""
        return self.tokens or round(self.cost * 1_000_000)

    @property
    def in_cost(self) -> bool:
        return not self.tokens and self.cost > 0


def period_window(period: str, now: float) -> tuple[str, float]:
    """The period containing ``now`` (unix s): its id (``d20261206``, ``m202612``) and the
    unix time it ends (the budget's reset)."""
    t = datetime.fromtimestamp(now, UTC)
    if period == "daily":
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
        end = datetime.fromordinal(start.toordinal() + 1).replace(tzinfo=UTC)
        return "d" + start.strftime("%Y%m%d"), end.timestamp()
    if period == "monthly":
        end = datetime(t.year + t.month // 12, t.month % 12 + 1, 1, tzinfo=UTC)
        return "m" + t.strftime("%Y%m"), end.timestamp()
    raise ValueError(f"unknown period {period!r}")


def charge(budget: Budget, price: Price | None, prompt: int, cached: int,
           completion: int) -> int:
    """What these tokens count against ``budget`` (its units); a cost budget with no price
    for the model counts nothing."""
    if budget.in_cost:
        return price.cost_micro(prompt, cached, completion) if price else 0
    return prompt + completion
