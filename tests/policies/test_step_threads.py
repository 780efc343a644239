"""The per-step thread choice against a straightforward reference: an EWMA of the other
runnable tasks, and the cores held moved by explicit thresholds."""

from __future__ import annotations

import math
import random

import pytest

from policies.step_threads import ALPHA, ENTER, LEAVE, Contention, observe, threads


def reference(samples: list[int], own: int = 1) -> list[tuple[float, int]]:
    """(level, held) after each sample, written out directly."""
    level, held, out = 0.0, 0, []
    for runnable in samples:
        if runnable >= 0:
            level = ALPHA * max(0, runnable - own) + (1 - ALPHA) * level
            up = math.floor(level - ENTER) + 1 if level >= ENTER else 0  # k with level >= k-1+ENTER
            down = max(0, math.ceil(level - LEAVE))  # k with level > k-1+LEAVE
            if up > held:
                held = up
            elif down < held:
                held = down
        out.append((level, held))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_matches_the_reference_on_random_samples(seed: int) -> None:
    rng = random.Random(seed)
    samples = [rng.choice([-1, 0, 1, 1, 1, 2, 2, 3, 4]) for _ in range(200)]
    state, got = Contention(), []
    for s in samples:
        state = observe(state, s)
        got.append((state.level, state.held))
    want = reference(samples)
    assert [h for _, h in got] == [h for _, h in want]
    assert [lv for lv, _ in got] == pytest.approx([lv for lv, _ in want])


def run(samples: list[int]) -> list[int]:
    state, held = Contention(), []
    for s in samples:
        state = observe(state, s)
        held.append(threads(state, configured=2, cores=2))
    return held


def test_one_burst_does_not_flip_but_a_neighbour_does_and_leaving_restores() -> None:
    quiet = [1] * 10
    assert run(quiet + [3] + quiet) == [2] * 21  # one event-loop burst: 2 others for a step
    chosen = run(quiet + [2] * 10 + quiet)  # a neighbour holds a core for 10 steps
    assert 1 in chosen[10:20] and chosen[:10] == [2] * 10
    assert chosen[-1] == 2  # and the count comes back once it left


def test_hysteresis_holds_between_the_thresholds() -> None:
    state = Contention(level=(ENTER + LEAVE) / 2, held=1)
    assert observe(state, 1 + 1, alpha=0.0).held == 1  # level unchanged, between: stays
    state = Contention(level=(ENTER + LEAVE) / 2, held=0)
    assert observe(state, 1, alpha=0.0).held == 0


def test_threads_stay_within_one_and_the_configured_count() -> None:
    assert threads(Contention(held=0), configured=8, cores=16) == 8
    assert threads(Contention(held=9), configured=8, cores=16) == 7
    assert threads(Contention(held=5), configured=2, cores=2) == 1
    assert observe(Contention(1.5, 1), -1) == Contention(1.5, 1)  # unreadable: unchanged
