"""The Virtual Token Counter (``policies.fair_queue``) in a simulation of what a worker does:
a batch of ``SLOTS`` seats; a free seat is filled by the fair pick (prompt charged), every
running request then generates one token a step (charged as it goes). Checked: the service of
two continuously backlogged tenants stays within the bound (and a first-come-first-served
queue in the same simulation breaks it, so the bound is not vacuous), shares follow the
weights, and a newly active tenant gets no banked credit."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.fair_queue import charge, lift, pick

SLOTS = 4


@dataclass
class Sim:
    """Tenants' queues of (prompt, output) requests, seats, counters and the actual service
    (tokens / weight), kept apart from the counters so the check is independent of them."""

    weights: dict[str, float]
    fair: bool = True  # False: first come, first served (one global arrival order)
    counters: dict[str, float] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)
    queues: dict[str, deque[tuple[int, int]]] = field(default_factory=dict)
    arrivals: deque[str] = field(default_factory=deque)
    running: list[list[object]] = field(default_factory=list)  # [tenant, tokens left]
    last: str | None = None
    picks: list[str] = field(default_factory=list)

    def arrive(self, tenant: str, prompt: int, output: int) -> None:
        q = self.queues.setdefault(tenant, deque())
        if not q:  # it becomes backlogged
            self.counters[tenant] = lift(self.counters, tenant, self.backlogged(), self.last)
        q.append((prompt, output))
        self.arrivals.append(tenant)

    def backlogged(self) -> list[str]:
        return [t for t, q in self.queues.items() if q]

    def step(self) -> None:
        while len(self.running) < SLOTS and self.backlogged():
            # a tenant's next request is its oldest arrival still queued
            heads = {t: (float(self.arrivals.index(t)), 0.0) for t in self.backlogged()}
            tenant = (pick(self.counters, self.backlogged(), self.served, heads)
                      if self.fair else self.arrivals[0])
            assert tenant is not None
            self.arrivals.remove(tenant)  # its oldest arrival
            prompt, output = self.queues[tenant].popleft()
            self._serve(tenant, prompt)
            self.last = tenant
            self.picks.append(tenant)
            self.running.append([tenant, output])
        for row in self.running:
            self._serve(str(row[0]), 1)
            row[1] = int(row[1]) - 1  # type: ignore[call-overload]
        self.running = [r for r in self.running if int(r[1]) > 0]  # type: ignore[call-overload]

    def _serve(self, tenant: str, tokens: int) -> None:
        w = self.weights[tenant]
        self.counters = charge(self.counters, tenant, tokens, w)
        self.served[tenant] = self.served.get(tenant, 0.0) + tokens / w


def bound(max_prompt: int, max_output: int, weights: dict[str, float]) -> float:
    """2 * U: U, the most weighted service one tenant can gain on another between two of the
    other's picks: a prompt, plus the output its seats generate before one of them frees."""
    return 2 * (max_prompt + SLOTS * max_output) / min(weights.values())


def run_backlogged(sim: Sim, rng: random.Random, steps: int, costs: dict[str, tuple[int, int]]
                   ) -> float:
    """Keep every tenant backlogged for ``steps`` steps; the largest service gap seen."""
    worst = 0.0
    for _ in range(steps):
        for tenant, (max_p, max_o) in costs.items():
            while len(sim.queues.get(tenant, ())) < 2 * SLOTS:
                sim.arrive(tenant, rng.randint(1, max_p), rng.randint(1, max_o))
        sim.step()
        a, b = (sim.served.get(t, 0.0) for t in costs)
        worst = max(worst, abs(a - b))
    return worst


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from([1.0, 0.5]))
def test_two_backlogged_tenants_stay_within_the_bound(seed: int, wa: float, wb: float) -> None:
    rng = random.Random(seed)
    costs = {"heavy": (60, 30), "light": (8, 4)}
    weights = {"heavy": wa, "light": wb}
    worst = run_backlogged(Sim(weights), rng, 400, costs)
    assert worst <= bound(60, 30, weights)


def test_fifo_breaks_the_bound_the_fair_queue_keeps() -> None:
    costs = {"heavy": (60, 30), "light": (8, 4)}
    weights = {"heavy": 1.0, "light": 1.0}
    fifo = run_backlogged(Sim(weights, fair=False), random.Random(1), 400, costs)
    fair = run_backlogged(Sim(weights), random.Random(1), 400, costs)
    assert fair <= bound(60, 30, weights) < fifo


@pytest.mark.parametrize("weights", [{"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 1.0},
                                     {"a": 1.0, "b": 4.0}])
def test_token_shares_follow_the_weights(weights: dict[str, float]) -> None:
    sim = Sim(weights)
    rng = random.Random(7)
    run_backlogged(sim, rng, 2000, {"a": (40, 20), "b": (10, 5)})
    tokens = {t: sim.served[t] * weights[t] for t in weights}
    share = tokens["a"] / (tokens["a"] + tokens["b"])
    assert share == pytest.approx(weights["a"] / sum(weights.values()), abs=0.03)


def test_a_newly_active_tenant_gets_no_banked_credit() -> None:
    weights = {"old": 1.0, "new": 1.0}
    sim = Sim(weights)
    for _ in range(50):  # "old" alone for a while: its counter runs far ahead of "new"'s 0
        sim.arrive("old", 10, 1)
        sim.step()
    assert sim.counters["old"] > 100
    for _ in range(40):
        sim.arrive("old", 10, 1)
        sim.arrive("new", 10, 1)
    sim.picks.clear()
    for _ in range(10):
        sim.step()
    # without the lift "new" would take every seat until it caught up (~10 picks); lifted,
    # the two alternate from the start
    first = sim.picks[:10]
    assert 4 <= first.count("new") <= 6
    # the lift is to the least backlogged counter, never a lowering
    assert lift({"x": 5.0, "y": 3.0}, "x", ["y"], None) == 5.0
    assert lift({"y": 3.0, "z": 7.0}, "x", ["y", "z"], None) == 3.0


def test_with_nobody_backlogged_the_lift_is_to_the_last_picked_tenant() -> None:
    counters = {"a": 40.0, "b": 10.0}
    assert lift(counters, "c", [], "a") == 40.0  # not b's lower counter
    assert lift(counters, "c", [], None) == 0.0
    assert lift({"c": 50.0, "a": 40.0}, "c", [], "a") == 50.0


def test_pick_least_counter_ties_to_smaller_id_and_charge_divides_by_weight() -> None:
    assert pick({"a": 3.0, "b": 1.0, "c": 1.0}, ["a", "c", "b"]) == "b"
    assert pick({"a": 3.0}, ["a", "z"]) == "z"  # absent = 0
    assert pick({}, []) is None
    # ties: the least served, then the oldest head entry, before the id
    assert pick({"a": 1.0, "b": 1.0}, ["a", "b"], {"a": 9.0, "b": 2.0}) == "b"
    assert pick({"a": 1.0, "b": 1.0}, ["a", "b"], {}, {"a": (5.0, 0.0), "b": (4.0, 7.0)}) == "b"
    assert pick({"a": 1.0, "b": 1.0}, ["a", "b"], {}, {"b": (4.0, 0.0)}) == "b"  # a: unknown
    assert charge({"a": 1.0}, "a", 6, 2.0) == {"a": 4.0}
    with pytest.raises(ValueError, match="weight"):
        charge({}, "a", 1, 0)


def _before(t: str, u: str, c: dict[str, float], s: dict[str, float],
            h: dict[str, tuple[float, float]]) -> bool:
    """Reference: does ``t`` go before ``u``, field by field as the docstring says."""
    if c.get(t, 0.0) != c.get(u, 0.0):
        return c.get(t, 0.0) < c.get(u, 0.0)
    if s.get(t, 0.0) != s.get(u, 0.0):
        return s.get(t, 0.0) < s.get(u, 0.0)
    ht, hu = h.get(t, (math.inf, math.inf)), h.get(u, (math.inf, math.inf))
    if ht[0] != hu[0]:
        return ht[0] < hu[0]
    if ht[1] != hu[1]:
        return ht[1] < hu[1]
    return t < u


small = st.integers(0, 2).map(float)  # few values: ties at every level


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("abcde"), st.tuples(
    small, small, st.one_of(st.none(), st.tuples(small, small))), min_size=1))
def test_pick_matches_a_pairwise_reference(tenants: dict[str, tuple[float, float, Any]]
                                           ) -> None:
    c = {t: v[0] for t, v in tenants.items()}
    s = {t: v[1] for t, v in tenants.items()}
    h = {t: v[2] for t, v in tenants.items() if v[2] is not None}
    want = [t for t in tenants if all(_before(t, u, c, s, h) for u in tenants if u != t)]
    assert [pick(c, list(tenants), s, h)] == want


def test_a_light_request_lifted_to_a_heavy_counter_is_picked_next() -> None:
    # "heavy" sorts before "light": with ties to the smaller id, every light request
    # (lifted to exactly heavy's counter) waited for a heavy pick first
    sim = Sim({"heavy": 1.0, "light": 1.0})
    rng = random.Random(3)
    for _ in range(30):
        while len(sim.queues.get("heavy", ())) < 2 * SLOTS:
            sim.arrive("heavy", rng.randint(10, 40), rng.randint(2, 6))
        for _ in range(3):
            sim.step()
        sim.arrive("light", 8, 2)
        assert sim.counters["light"] == sim.counters["heavy"]  # a tie, by the lift
        sim.picks.clear()
        while not sim.picks:
            sim.step()
        assert sim.picks[0] == "light", sim.picks
