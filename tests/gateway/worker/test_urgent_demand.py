"""UrgentDemand: requests started per second over the window times the mean output tokens
of the last finished ones, against a straightforward count over a recorded history."""

from __future__ import annotations

import random

import pytest

from gateway.worker.urgent_demand import UrgentDemand


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_unknown_until_a_request_finished() -> None:
    demand = UrgentDemand(clock=Clock())
    demand.started()
    assert demand.tokens_per_s() is None
    demand.finished(32)
    assert demand.tokens_per_s() is not None


@pytest.mark.parametrize("seed", range(4))
def test_matches_a_count_over_the_history(seed: int) -> None:
    rng = random.Random(seed)
    clock = Clock()
    born = clock.now
    window, kept = 10.0, 8
    demand = UrgentDemand(window_s=window, kept=kept, clock=clock)
    starts: list[tuple[float, int]] = []
    finished: list[int] = []
    for _ in range(400):
        clock.now += rng.expovariate(4.0)
        if rng.random() < 0.6:
            prompt = rng.randint(1, 200)
            demand.started(prompt)
            starts.append((clock.now, prompt))
        else:
            tokens = rng.randint(1, 64)
            demand.finished(tokens)
            finished.append(tokens)
        if not finished:
            continue
        now = clock.now
        in_window = [p for t, p in starts if t >= now - window]
        seen = max(1.0, min(window, now - born))
        last = finished[-kept:]
        want = len(in_window) / seen * sum(last) / len(last)
        assert demand.tokens_per_s() == pytest.approx(want)
        assert demand.prompt_tokens_per_s() == pytest.approx(sum(in_window) / seen)
