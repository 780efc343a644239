"""Steady-state batching figures for ``carpool bench engine``: continuous vs static batching
with few slots while the queue is kept fed (the restated seed 000 target).

A finite workload's tail (the last long requests finishing with seats empty) weighs on both
modes; the steady state is what a busy server lives in. So: ``n`` requests (400 by default)
queued at once, useful tokens counted from the start until the waiting queue first empties
(every request admitted: until then no seat ever lacked work) or its own steps have taken
``budget_s``, whichever comes first; the queue is still non-empty during the whole window.
The two modes' engines take their steps in turn (``run_steady_together``), so both meet the
machine in the same seconds. The window then ends just before the last step that admitted
requests, so it holds whole admission cycles: a static batch cut in its middle would count its
first steps, where every seat is still busy, and not the padded tail (in one 60 s run static's
2.25 useful tokens a step were 2.19 over whole batches). Reported beside the finite
100-request ratio of the same run, with the ratio's two factors: useful tokens per step (what
the seats buy) and milliseconds per step (what a step costs; matmul rows per step beside it,
padding rows included, since a static batch keeps its finished seats as padding).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from engine.bench.ceiling import step_rows
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


@dataclass
class _Window:
    """One engine's steady window as it steps (``run_steady_together``)."""

    name: str
    engine: LLMEngine
    budget_s: float
    rows: list[int]
    seconds: float = 0.0  # its own steps' time so far
    tokens: int = 0
    steps: int = 0
    waiting: int = 0
    cut: tuple[float, int, int, int] = (0.0, 0, 0, 0)  # before the last admission step
    done: bool = False

    def step(self) -> None:
        before = (self.seconds, self.tokens, self.steps, len(self.rows))
        t0 = time.perf_counter()
        outs = self.engine.step()
        self.seconds += time.perf_counter() - t0
        self.steps += 1
        self.tokens += sum(len(o.new_token_ids) for o in outs)
        waiting = self.engine.stats.num_waiting
        if waiting < self.waiting:  # this step admitted: the cycles before are whole
            self.cut = before
        self.waiting = waiting
        self.done = (waiting == 0 or self.seconds >= self.budget_s
                     or not self.engine.has_unfinished_requests())

    def row(self) -> SteadyRow:
        cut = self.cut if self.cut[2] else (  # no whole cycle yet: the window as it is
            self.seconds, self.tokens, self.steps, len(self.rows))
        seconds, tokens, steps, n = cut
        return SteadyRow(self.name, seconds, tokens, steps, self.waiting == 0,
                         sum(self.rows[:n]))


def _start(name: str, prompts: list[list[int]], output_lens: list[int], model: str | None,
           budget_s: float, kw: dict[str, Any]) -> _Window:
    engine = LLMEngine.from_kwargs(model=model, dtype="float32", **kw)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    while engine.has_unfinished_requests():
        engine.step()
    rows: list[int] = []
    engine.step_observers.append(
        lambda out, _s: rows.append(step_rows(out)[0]))
    start = time.monotonic()
    for i, (p, n) in enumerate(zip(prompts, output_lens)):
        engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True),
                           request_id=f"s{i}", arrival_time=start)
    return _Window(name, engine, budget_s, rows, waiting=engine.stats.num_waiting)


def run_steady_together(runs: list[tuple[str, dict[str, Any]]], prompts: list[list[int]],
                        output_lens: list[int], model: str | None, budget_s: float
                        ) -> list[SteadyRow]:
    """Each (name, engine kwargs) run on its own engine, their steps taken in turn (one of
    each, round and round) until each window ends; a window's seconds are its own steps'.

    Why in turn: run one after the other, the two modes met this machine in different
    phases (its speed drifts 10-20 % over a minute), and the ratio moved with them: at 4.0
    matmul rows a step in both modes, static's steps cost 0.84-1.00 of continuous' across
    four runs, the ratio 1.53-1.83 with the same tokens per step (1.82). A window that has
    ended still takes its turns, uncounted, while another is open."""
    windows = [_start(name, prompts, output_lens, model, budget_s, kw) for name, kw in runs]
    while not all(w.done for w in windows):
        for w in windows:
            if not w.done:
                w.step()
            elif w.engine.has_unfinished_requests():  # keeps the turns: uncounted
                w.engine.step()
    return [w.row() for w in windows]


def run_steady(name: str, prompts: list[list[int]], output_lens: list[int], model: str | None,
               budget_s: float, **kw: Any) -> SteadyRow:
    """One run alone (``run_steady_together`` with one)."""
    return run_steady_together([(name, kw)], prompts, output_lens, model, budget_s)[0]


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
