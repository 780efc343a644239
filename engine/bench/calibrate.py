"""Measure the real engine's step cost over a grid of batch shapes, for the simulator's
calibrated cost model (``carpool calibrate``; ``engine.bench.sim_vs_real`` calls it too).

For each (prompt length P, rows R) of the grid, R requests of P random prompt tokens start
together and decode ``decode_steps`` more tokens with ``ignore_eos``: their prefill steps
(R*P tokens, chunked by the token budget) and decode steps (R rows on a growing context)
are timed by the engine's own step observer, which times the whole ``step()`` (schedule,
forward, sampling, update, output processing), i.e. what the simulator's clock stands for.
Shapes whose prefill exceeds ``max_prefill_tokens`` are skipped to keep the run short. On a
GPU the same code profiles the GPU (the engine runs where its config says).
"""

from __future__ import annotations

import platform
import random
import time
from collections.abc import Sequence
from pathlib import Path

from engine.core.outputs import SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.sim.cost import shape_of
from engine.sim.profile import ModelShape, Profile, Sample

ROWS = (1, 2, 4, 8, 16, 32)
PROMPTS = (16, 128, 512)


def measure(engine: LLMEngine, rows_grid: Sequence[int] = ROWS,
            prompt_grid: Sequence[int] = PROMPTS, decode_steps: int = 6,
            max_prefill_tokens: int = 4096, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    vocab = engine.runner.args.vocab_size
    samples: list[Sample] = []

    def observe(out: SchedulerOutput, seconds: float) -> None:
        if out.scheduled:
            s = shape_of(out)
            samples.append((s.rows, s.tokens, s.kv_tokens, seconds))

    _run(engine, [[1, 2, 3]] * 2, 3)  # warm-up, not recorded
    engine.step_observers.append(observe)
    try:
        for p in prompt_grid:
            for r in rows_grid:
                if r * p > max_prefill_tokens:
                    continue
                prompts = [[rng.randrange(100, vocab) for _ in range(p)] for _ in range(r)]
                _run(engine, prompts, decode_steps + 1)
    finally:
        engine.step_observers.remove(observe)
    return samples


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> None:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        engine.step()


def model_shape(engine: LLMEngine) -> ModelShape:
    a = engine.runner.args
    elem = engine.runner.bytes_per_block // (a.num_layers * 2 * engine.runner.block_size
                                             * a.num_kv_heads * a.head_dim)
    return ModelShape(a.num_layers, a.num_kv_heads, a.head_dim, elem)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def calibrate(engine: LLMEngine, **grid: object) -> Profile:
    samples = measure(engine, **grid)  # type: ignore[arg-type]
    return Profile.from_samples(
        samples, model=engine.model_name, shape=model_shape(engine),
        block_size=engine.runner.block_size, device=str(engine.runner.device), cpu=cpu_name(),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
