"""Measure the real engine's step cost, for the simulator's calibrated cost model
(``carpool calibrate``; ``engine.bench.sim_vs_real`` calls it too). Two workloads:

- ``measure`` (the grid): for each (prompt length P, rows R), R requests of P random prompt
  tokens start together and decode ``decode_steps`` more tokens with ``ignore_eos``: their
  prefill steps (R*P tokens, chunked by the token budget) and decode steps (R rows on a
  growing context). Shapes whose prefill exceeds ``max_prefill_tokens`` are skipped.
- ``measure_mixed`` (a served run): requests of random prompt and output lengths arrive one
  every few steps, so the batch fills to ``max_num_seqs``, a queue forms and drains: steps
  that mix one request's prefill with many decodes on unequal contexts, the shapes a serving
  run is made of and a grid of uniform batches never shows.

Every step is timed by the engine's own step observer, which times the whole ``step()``
(schedule, forward, sampling, update, output processing), i.e. what the simulator's clock
stands for. On a GPU the same code profiles the GPU (the engine runs where its config says).
"""

from __future__ import annotations

import contextlib
import json
import platform
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from engine.bench.structured_tpot import SCHEMA
from engine.core.outputs import SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.structured import StructuredSpec
from engine.llm_engine import LLMEngine
from engine.sim.cost import shape_of
from engine.sim.profile import ModelShape, Profile, Sample
from engine.sim.workload import constrained_at

ROWS = (1, 2, 4, 8, 16, 32)
PROMPTS = (16, 128, 512)


def measure(engine: LLMEngine, rows_grid: Sequence[int] = ROWS,
            prompt_grid: Sequence[int] = PROMPTS, decode_steps: int = 6,
            max_prefill_tokens: int = 4096, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    vocab = engine.runner.args.vocab_size
    _run(engine, [[1, 2, 3]] * 2, 3)  # warm-up, not recorded
    with _recording(engine) as samples:
        for p in prompt_grid:
            for r in rows_grid:
                if r * p > max_prefill_tokens:
                    continue
                prompts = [[rng.randrange(100, vocab) for _ in range(p)] for _ in range(r)]
                _run(engine, prompts, decode_steps + 1)
    return samples


def measure_mixed(engine: LLMEngine, requests: int = 32, prompts: tuple[int, int] = (8, 192),
                  outputs: tuple[int, int] = (8, 160), every: int = 3,
                  seed: int = 1, constrained_share: float = 0.0) -> list[Sample]:
    """One request (lengths uniform in ``prompts`` / ``outputs``) arrives every ``every``
    steps until ``requests`` have; then the run drains. Arrivals count steps, not seconds,
    so the shapes do not depend on how fast this machine is."""
    rng = random.Random(seed)
    vocab = engine.runner.args.vocab_size
    spec = StructuredSpec("json_schema", json.dumps(SCHEMA))
    _run(engine, [[1, 2, 3]] * 2, 3, spec if constrained_share > 0 else None)  # warm, unrecorded
    added = step = 0
    with _recording(engine) as samples:
        while added < requests or engine.has_unfinished_requests():
            if added < requests and step % every == 0:
                prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(*prompts))]
                grammar = spec if constrained_at(added, constrained_share) else None
                engine.add_request(prompt, SamplingParams(max_tokens=rng.randint(*outputs),
                                                          ignore_eos=True, structured=grammar))
                added += 1
            engine.step()
            step += 1
    return samples


@contextlib.contextmanager
def _recording(engine: LLMEngine) -> Iterator[list[Sample]]:
    samples: list[Sample] = []

    def observe(out: SchedulerOutput, seconds: float) -> None:
        if out.scheduled:
            s = shape_of(out)
            samples.append((s.rows, s.tokens, s.kv_tokens, s.prefill_rows, s.constrained_rows,
                            seconds))

    engine.step_observers.append(observe)
    try:
        yield samples
    finally:
        engine.step_observers.remove(observe)


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int,
         structured: StructuredSpec | None = None) -> None:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, structured=structured)
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


def calibrate(engine: LLMEngine, mixed_requests: int = 32, grid: bool = True,
              constrained_share: float = 0.0, **grid_kw: object) -> Profile:
    """The grid's steps (unless ``grid`` is False) and a served run's of ``mixed_requests``
    requests (none if 0; ``constrained_share`` of them constrained), fitted together."""
    samples = measure(engine, **grid_kw) if grid else []  # type: ignore[arg-type]
    if mixed_requests:
        samples += measure_mixed(engine, requests=mixed_requests,
                                 constrained_share=constrained_share)
    return Profile.from_samples(
        samples, model=engine.model_name, shape=model_shape(engine),
        block_size=engine.runner.block_size, device=str(engine.runner.device), cpu=cpu_name(),
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
