from __future__ import annotations

from engine.bench.scheduler import measure_scheduler_step_ms


def test_measure_scheduler_step_runs_and_reports_milliseconds() -> None:
    ms = measure_scheduler_step_ms(num_running=16, steps=5)
    assert 0.0 < ms < 1000.0
