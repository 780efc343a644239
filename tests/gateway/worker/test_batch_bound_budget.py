"""The step budget's batch bound: synthetic steps from a known cost law give the row limit a
brute-force scan of that law finds (the knee of tokens/s, or the rows a lower-tier TTFT target
allows), and the worker hands it to its drainer."""

from __future__ import annotations

from typing import Any

from gateway.worker.step_budget import StepBudget
from policies.batch_bound import MIN_ROW_LIMIT, STEPS_PER_FIRST_TOKEN, THROUGHPUT_FRACTION
from tests.gateway.worker.test_step_budget import (
    MAX_SEQS,
    RecordingEngine,
    feed,
    true_cost,
)


def decode_step(rows: int, kv: float) -> float:
    return true_cost(rows, rows, 0) + (true_cost(0, 0, 1) - true_cost(0, 0, 0)) * rows * kv


def scan_limit(kv: float, ttft_s: float | None) -> int | None:
    asymptote = 1 / (decode_step(2, kv) - decode_step(1, kv))
    knee = next(r for r in range(1, 10_000)
                if r / decode_step(r, kv) >= THROUGHPUT_FRACTION * asymptote * (1 - 1e-9))
    if ttft_s is not None:
        knee = min(knee, max([0] + [r for r in range(1, 10_000) if decode_step(r, kv)
                                    <= ttft_s / STEPS_PER_FIRST_TOKEN * (1 + 1e-9)]))
    limit = max(MIN_ROW_LIMIT, knee)
    return None if limit >= MAX_SEQS else limit


def test_the_bound_is_the_knee_of_the_fitted_law_or_the_ttft_rows() -> None:
    for ttft in (None, 0.6):
        engine = RecordingEngine()
        budget = StepBudget(engine)  # type: ignore[arg-type]
        budget.lower_ttft_s = ttft
        budget.attach()
        assert budget.row_limit is None  # no data, no bound
        feed(budget, engine, 200)
        budget.update()
        kv = budget.model.mean_kv_per_row()
        assert budget.row_limit == scan_limit(kv, ttft) and budget.row_limit is not None
    assert scan_limit(kv, None) != scan_limit(kv, 0.6)  # the target did bind


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
