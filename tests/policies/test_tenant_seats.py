"""Seats for non-urgent work and the tenant reserve, against straightforward references."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from policies.admission import EngineLoad
from policies.tenant_seats import (
    MIN_RESERVE,
    RESERVE_DIVISOR,
    first_token_urgent,
    lower_limit,
    lower_room,
    over_share,
    tenant_reserve,
)


def load(max_seqs: int) -> EngineLoad:
    return EngineLoad(0, 0, 0, 100, 100, max_seqs, None)


def test_lower_limit_is_the_bound_within_the_urgent_reserve() -> None:
    assert lower_limit(load(256), None) == 256 - 256 // 8
    assert lower_limit(load(256), 57) == 57
    assert lower_limit(load(32), 57) == 32 - 32 // 8


def test_lower_limit_grows_to_the_seats_owed_past_the_cap() -> None:
    """The row cap's owed seats need lower rows to run: the limit is the larger of the bound
    and the owed seats, still within the urgent reserve; no bound stays no bound."""
    for owed in range(0, 300, 7):
        assert lower_limit(load(256), 57, owed) == min(max(57, owed), 256 - 256 // 8)
        assert lower_limit(load(256), None, owed) == 256 - 256 // 8


def test_reserve_size() -> None:
    for limit in range(1, 600):
        want = max(MIN_RESERVE, -(-limit // RESERVE_DIVISOR))
        r = tenant_reserve(limit)
        assert r == min(want, limit - 1)  # at least one seat is never reserved
        assert 0 <= r < limit


def reference_over_share(held: dict[str, int], weights: dict[str, float], seats: int
                         ) -> set[str]:
    """Exact arithmetic: t is over when held + 1 > seats * w_t / (sum of holders' w + w_t)."""
    w = {t: Fraction(weights.get(t, 1.0)) for t in held}
    holders = [t for t, n in held.items() if n > 0]
    total = sum((w[t] for t in holders), Fraction(0))
    return {t for t in holders if held[t] + 1 > seats * w[t] / (total + w[t])}


@pytest.mark.parametrize("seed", range(6))
def test_over_share_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        tenants = [f"t{i}" for i in range(rng.randint(0, 5))]
        held = {t: rng.randint(0, 40) for t in tenants}
        weights = {t: rng.choice([0.5, 1.0, 2.0, 4.0]) for t in tenants if rng.random() < 0.7}
        seats = rng.randint(1, 80)
        assert set(over_share(held, weights, seats)) == reference_over_share(
            held, weights, seats)


def test_a_heavy_tenant_alone_leaves_the_reserve_and_a_light_one_may_take_it() -> None:
    seats = 57
    heavy_rows = seats - tenant_reserve(seats)
    assert over_share({"heavy": heavy_rows}, {}, seats) == {"heavy"}
    # the light tenant arrives (no rows yet) or holds a few: only heavy is skipped
    assert over_share({"heavy": heavy_rows, "light": 5}, {}, seats) == {"heavy"}
    # weight 4 beside weight 1, with a newcomer of weight 4: owed 4/9 of the seats (25.3)
    assert over_share({"big": 24, "small": 3}, {"big": 4.0}, 57) == frozenset()
    assert over_share({"big": 25, "small": 3}, {"big": 4.0}, 57) == {"big"}


def reference_may_start(rows: dict[str, dict[str, int]], weights: dict[str, dict[str, float]],
                        limit: int, paced: dict[str, frozenset[str]], tier: str,
                        tenant: str) -> bool:
    """Whether ``tenant`` (perhaps holding no row yet) of ``tier`` may start now, as the
    module docstring says, with the exact-arithmetic ``reference_over_share``."""
    free = limit - sum(sum(t.values()) for t in rows.values())
    held = rows.get(tier, {})
    over = reference_over_share(held, weights.get(tier, {}), limit)
    if tenant in paced.get(tier, frozenset()):
        return False
    if free > tenant_reserve(limit):
        return True
    if free > 0:
        return tenant not in over
    return tenant not in over and bool(over)  # past the limit: only beside a hog


@pytest.mark.parametrize("seed", range(6))
def test_lower_room_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        rows = {tier: {f"t{i}": rng.randint(0, 30) for i in range(rng.randint(1, 3))}
                for tier in ("batch", "best-effort") if rng.random() < 0.8}
        weights = {tier: {t: rng.choice([0.5, 1.0, 2.0]) for t in held if rng.random() < 0.5}
                   for tier, held in rows.items()}
        limit = rng.randint(2, 90)
        paced = {tier: frozenset(t for t in held if rng.random() < 0.2)
                 for tier, held in rows.items()}
        room = lower_room(rows, weights, limit, paced)
        free = limit - sum(sum(t.values()) for t in rows.values())
        reserve = tenant_reserve(limit)
        want_seats = free - reserve if free > reserve else free if free > 0 else None
        for tier in ("batch", "best-effort"):
            for tenant in [*rows.get(tier, {}), "newcomer"]:
                got = (room.seats > 0 and (room.tiers is None or tier in room.tiers)
                       and tenant not in room.skip.get(tier, frozenset()))
                assert got == reference_may_start(rows, weights, limit, paced, tier, tenant), (
                    rows, weights, limit, paced, tier, tenant)
        if want_seats is not None:
            assert room.seats == want_seats
        else:  # past the limit: one start a round, and only where someone is crowded out
            assert room.seats == (1 if room.tiers else 0)


def test_a_bound_fallen_under_the_heavy_rows_leaves_the_light_tenant_a_seat() -> None:
    rows = {"batch": {"heavy": 40, "light": 3}, "best-effort": {"solo": 10}}
    room = lower_room(rows, {}, 31, {})  # the bound fell from 46 to 31
    assert room.seats == 1 and room.tiers == {"batch"}  # best-effort's one tenant waits
    assert room.skip == {"batch": {"heavy"}}
    # the light tenant past its share waits too
    assert lower_room({"batch": {"heavy": 40, "light": 11}}, {}, 31, {}).skip == {
        "batch": {"heavy", "light"}}


def reference_first_token_urgent(held: dict[str, int], weights: dict[str, float], seats: int,
                                 tenant: str) -> bool:
    """Exact arithmetic, tenant by tenant: ``tenant`` is within its share (holding nothing,
    or its next row within seats * w / (holders' w + w)) and some other holder is not."""
    def over(t: str) -> bool:
        if held.get(t, 0) <= 0:
            return False
        total = sum(Fraction(weights.get(u, 1.0)) for u, n in held.items() if n > 0)
        w = Fraction(weights.get(t, 1.0))
        return held[t] + 1 > seats * w / (total + w)
    return not over(tenant) and any(over(t) for t in held if t != tenant)


@pytest.mark.parametrize("seed", range(4))
def test_first_token_urgent_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    seen = set()
    for _ in range(500):
        tenants = [f"t{i}" for i in range(rng.randint(0, 4))]
        held = {t: rng.choice([0, 0, 1, 2, rng.randint(0, 60)]) for t in tenants}
        weights = {t: rng.choice([0.5, 1.0, 2.0]) for t in tenants if rng.random() < 0.5}
        seats = rng.randint(1, 80)
        for tenant in tenants + ["newcomer"]:
            got = first_token_urgent(held, weights, seats, tenant)
            assert got == reference_first_token_urgent(held, weights, seats, tenant)
            seen.add(got)
    assert seen == {True, False}


def test_first_token_urgent_beside_a_heavy_tenant_only() -> None:
    """The bench's heavy row: a light tenant beside a heavy one over its share is marked,
    the heavy one is not; a tenant alone, or two within their shares, are not."""
    assert first_token_urgent({"heavy": 38, "light": 1}, {}, 40, "light")
    assert first_token_urgent({"heavy": 38}, {}, 40, "light")  # holding nothing yet
    assert not first_token_urgent({"heavy": 38, "light": 1}, {}, 40, "heavy")
    assert not first_token_urgent({"light": 3}, {}, 40, "light")
    assert not first_token_urgent({"a": 5, "b": 6}, {}, 40, "a")
