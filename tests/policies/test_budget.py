"""Budgets and prices: periods, charges, validation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from policies.budget import Budget, Price, charge, parse_prices, period_window


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_period_windows() -> None:
    assert period_window("daily", ts(2026, 12, 6, 23, 59)) == ("d20261206", ts(2026, 12, 7))
    assert period_window("monthly", ts(2026, 12, 6, 12)) == ("m202612", ts(2027, 1, 1))
    assert period_window("monthly", ts(2026, 2, 28, 23)) == ("m202602", ts(2026, 3, 1))
    assert period_window("daily", ts(2026, 12, 31, 5))[1] == ts(2027, 1, 1)


def test_charges_in_tokens_and_micro_units() -> None:
    price = Price(prompt=2.0, cached=0.5, completion=8.0)
    assert price.cost_micro(prompt=100, cached=40, completion=10) == 60 * 2 + 40 * 0.5 + 80
    assert charge(Budget(tokens=1000), price, 100, 40, 10) == 110
    assert charge(Budget(cost=1.5), price, 100, 40, 10) == 220
    assert charge(Budget(cost=1.5), None, 100, 40, 10) == 0
    assert Budget(cost=1.5).limit == 1_500_000 and Budget(tokens=7).limit == 7


@pytest.mark.parametrize("kwargs, words", [
    ({"tokens": -1}, "budget_tokens"), ({"tokens": 10**16}, "budget_tokens"),
    ({"cost": -0.5}, "budget_cost"), ({"cost": float("inf")}, "budget_cost"),
    ({"cost": 1e12}, "budget_cost"), ({"tokens": 5, "cost": 1.0}, "not both"),
    ({"tokens": 5, "period": "weekly"}, "budget_period"), ({"tokens": True}, "budget_tokens")])
def test_bad_budgets(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Budget(**kwargs)  # type: ignore[arg-type]


def test_parse_prices() -> None:
    got = parse_prices("echo=1/0.5/4; org/m=0/0/2")
    assert got == {"echo": Price(1, 0.5, 4), "org/m": Price(0, 0, 2)}
    for bad in ("echo=1/2", "=1/2/3", "echo=1/x/3", "echo=-1/0/0"):
        with pytest.raises(ValueError):
            parse_prices(bad)
