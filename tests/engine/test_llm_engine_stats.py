"""``LLMEngine.stats`` while a step runs (read from other threads: the worker's drainer
reads it on the event loop during the step): the requests the step placed count as running,
not as waiting. The snapshot taken after the adds counted them waiting for the whole step,
so the drainer's short engine queue per priority looked full and closed the tier to a light
tenant's request until the step ended (bench sla's heavy row, traced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine import LLM, SamplingParams
from engine.core.stats import SchedulerStats


def test_the_stats_read_during_a_step_count_what_it_placed_as_running(
        tiny_model_dir: Path) -> None:
    llm = LLM(model=str(tiny_model_dir), max_num_seqs=4)
    engine = llm.engine
    seen: list[SchedulerStats] = []
    execute = engine.runner.execute

    def spy(out: Any) -> Any:
        seen.append(engine.stats)  # what another thread reads while the step computes
        return execute(out)

    engine.runner.execute = spy  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=3)
    for i in range(6):  # two more than the seats: those two really wait
        engine.add_request([5 + i, 6, 7], params)
    assert engine.stats.num_waiting == 6
    engine.step()
    during = seen[-1]
    placed = engine.scheduler.stats  # the scheduler's own view, for reference
    assert (during.num_running, during.num_waiting) == (4, 2)
    assert (during.num_running, during.num_waiting) == (placed.num_running, placed.num_waiting)
