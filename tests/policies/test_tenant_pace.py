"""Pacing over-share tenants (``policies.tenant_pace``) against a straightforward reference
in exact arithmetic, on random tiers."""

from __future__ import annotations

import random
from fractions import Fraction

from policies.tenant_pace import STARTS_PER_STEP, paced, shared


def reference(held: dict[str, int], weights: dict[str, float], seats: int,
              started: dict[str, int], per_step: int) -> set[str]:
    """Paced: two or more tenants hold rows, t holds rows and its next row would pass its
    weighted share of ``seats`` among the holders and a newcomer of its weight, and t started
    ``per_step`` already."""
    holders = [t for t, n in held.items() if n > 0]
    if len(holders) < 2:
        return set()
    total = sum(Fraction(weights.get(t, 1.0)) for t in holders)
    out = set()
    for t in holders:
        w = Fraction(weights.get(t, 1.0))
        if held[t] + 1 > seats * w / (total + w) and started.get(t, 0) >= per_step:
            out.add(t)
    return out


def test_paced_matches_the_reference_on_random_tiers() -> None:
    rng = random.Random(11)
    for _ in range(4000):
        names = [f"t{i}" for i in range(rng.randint(0, 5))]
        held = {t: rng.choice([0, 0, 1, 2, 5, 13, 40]) for t in names}
        weights = {t: rng.choice([0.5, 1.0, 1.0, 2.0, 3.0]) for t in names if rng.random() < .7}
        started = {t: rng.randint(0, 3) for t in names if rng.random() < .8}
        seats, per_step = rng.randint(1, 80), rng.randint(1, 3)
        got = paced(held, weights, seats, started, per_step)
        assert got == reference(held, weights, seats, started, per_step), (
            held, weights, started, seats, per_step)


def test_a_heavy_tenant_is_paced_only_beside_another_tenant() -> None:
    heavy_alone = {"heavy": 40}
    assert not shared(heavy_alone)
    assert paced(heavy_alone, {}, 48, {"heavy": 5}) == frozenset()
    beside = {"heavy": 40, "light": 3}
    assert shared(beside)
    assert paced(beside, {}, 48, {"heavy": STARTS_PER_STEP}) == {"heavy"}
    assert paced(beside, {}, 48, {"heavy": STARTS_PER_STEP - 1}) == frozenset()
    # the light tenant, under its share, is never paced however many it started
    assert paced(beside, {}, 48, {"heavy": 0, "light": 9}) == frozenset()
