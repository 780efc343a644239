"""Steady-state batching figures for ``carpool bench engine``: continuous vs static batching
with few slots while the queue is kept fed (the restated seed 000 target).

A finite workload's tail (the last long requests finishing with seats empty) weighs on both
modes; the steady state is what a busy server lives in. So: ``n`` requests (400 by default)
queued at once, useful tokens counted from the start until the waiting queue first empties
(every request admitted: until then no seat ever lacked work) or ``budget_s`` passes, whichever
comes first; the queue is still non-empty during the whole window. The window then ends just
before the last step that admitted requests, so it holds whole admission cycles: a static
batch cut in its middle would count its first steps, where every seat is still busy, and not
the padded tail (in one 60 s run static's 2.25 useful tokens a step were 2.19 over whole
batches). Reported beside the finite
100-request ratio of the same run, with the ratio's two factors: useful tokens per step (what
the seats buy) and milliseconds per step (what a step costs; matmul rows per step beside it,
padding rows included, since a static batch keeps its finished seats as padding).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine


@dataclass
class SteadyRow:
    name: str
    seconds: float
    tokens: int
    steps: int
    queue_emptied: bool  # False: the budget ended the window first
    matmul_rows: int = 0  # scheduled tokens + padding rows, summed over the window's steps

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / max(1, self.steps)

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / max(1, self.steps)

    @property
    def rows_per_step(self) -> float:
        return self.matmul_rows / max(1, self.steps)


def run_steady(name: str, prompts: list[list[int]], output_lens: list[int], model: str | None,
               budget_s: float, **kw: Any) -> SteadyRow:
    engine = LLMEngine.from_kwargs(model=model, dtype="float32", **kw)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    while engine.has_unfinished_requests():
        engine.step()
    rows: list[int] = []
    engine.step_observers.append(
        lambda out, _s: rows.append(out.num_batched_tokens + out.num_padding_rows))
    start = time.monotonic()
    for i, (p, n) in enumerate(zip(prompts, output_lens)):
        engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True),
                           request_id=f"s{i}", arrival_time=start)
    tokens = steps = 0
    waiting = engine.stats.num_waiting
    cut = (0.0, 0, 0, 0)  # (seconds, tokens, steps, len(rows)) before the last admission step
    while engine.has_unfinished_requests():
        before = (time.monotonic() - start, tokens, steps, len(rows))
        outs = engine.step()
        steps += 1
        tokens += sum(len(o.new_token_ids) for o in outs)
        if engine.stats.num_waiting < waiting:  # this step admitted: the cycles before are whole
            cut = before
        waiting = engine.stats.num_waiting
        if waiting == 0 or time.monotonic() - start >= budget_s:
            break
    if cut[2] == 0:  # no whole cycle yet: the window as it is
        cut = (time.monotonic() - start, tokens, steps, len(rows))
    seconds, tokens, steps, n = cut
    return SteadyRow(name, seconds, tokens, steps, waiting == 0, sum(rows[:n]))


def steady_lines(rows: list[SteadyRow], finite_ratio: float) -> list[str]:
    """The two rows, then continuous/static beside the finite workload's ratio."""
    lines = []
    for r in rows:
        end = "queue first emptied" if r.queue_emptied else "budget reached, queue still fed"
        lines.append(f"  {r.name:<44} {r.tok_s:7.1f} tok/s ({r.tokens} tokens, {r.steps} steps, "
                     f"{r.seconds:.1f} s, {end}): {r.tokens_per_step:.2f} tokens/step, "
                     f"{r.ms_per_step:.1f} ms/step, {r.rows_per_step:.2f} matmul rows/step")
    c, s = rows[0], rows[1]
    lines.append(f"steady-state continuous/static (4 slots, queue kept fed) = "
                 f"{c.tok_s / s.tok_s:.2f}  (target >= 1.8); finite 100-request ratio in this "
                 f"run = {finite_ratio:.2f}")
    lines.append(f"  = tokens/step ratio {c.tokens_per_step / s.tokens_per_step:.2f} x step-cost "
                 f"ratio (static ms / continuous ms) {s.ms_per_step / c.ms_per_step:.2f}")
    return lines
