"""The step budget's batch bound: steps whose seconds follow a known law in their rows give
the row limit a brute-force scan of that law finds (the knee of tokens/s, or the rows a
lower-tier TTFT target allows), and the worker hands it to its drainer."""

from __future__ import annotations

from typing import Any

from gateway.worker.step_budget import StepBudget
from policies.batch_bound import MIN_ROW_LIMIT, STEPS_PER_FIRST_TOKEN, THROUGHPUT_FRACTION
from tests.gateway.worker.test_step_budget import MAX_SEQS, RecordingEngine, synthetic_step

A, M = 0.08, 0.0075  # the synthetic steps' seconds: A + M * rows


def scan_limit(ttft_s: float | None) -> int | None:
    knee = next(r for r in range(1, 10_000)
                if r / (A + M * r) >= THROUGHPUT_FRACTION / M * (1 - 1e-9))
    if ttft_s is not None:
        knee = min(knee, max(r for r in range(10_000)
                             if A + M * r <= ttft_s / STEPS_PER_FIRST_TOKEN * (1 + 1e-9)))
    limit = max(MIN_ROW_LIMIT, knee)
    return None if limit >= MAX_SEQS else limit


def test_the_bound_is_the_knee_of_the_steps_law_or_the_ttft_rows() -> None:
    for ttft in (None, 0.5):
        engine = RecordingEngine()
        budget = StepBudget(engine)  # type: ignore[arg-type]
        budget.lower_ttft_s = ttft
        budget.attach()
        assert budget.update() is None and budget.row_limit is None  # no data, no bound
        (observe,) = engine.observers
        for i in range(200):  # prefill chunks too: the law is in rows alone
            rows = 1 + (i * 7) % 90
            out, _ = synthetic_step(rows, 200, prefill=(i % 3) * 50)
            observe(out, A + M * len(out.scheduled))
        budget.update()
        assert budget.row_limit == scan_limit(ttft) and budget.row_limit is not None
    assert scan_limit(None) != scan_limit(0.5)  # the target did bind


def test_the_worker_passes_the_bound_and_its_requests_to_the_drainer(
        echo_gateway: Any) -> None:
    worker = echo_gateway.services.worker
    worker.step_budget.row_limit = 42
    try:
        assert worker.drainer.row_limit() == 42
    finally:
        worker.step_budget.row_limit = None
    assert list(worker.drainer.held()) == [(r.tier, r.tenant, r.weight)
                                           for r in worker.inflight.values()]
