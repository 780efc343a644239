"""Helpers for driving ``ModelRunner`` by hand: a trivial block allocator, scheduled-request
builders, and transformers' own logits as the independent reference."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any, cast

import torch

from engine.core.config import CacheConfig, DType, ModelConfig
from engine.core.outputs import ScheduledRequest, SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.runner.model_runner import ModelRunner


def make_runner(model_dir: Path | None, dtype: str = "float64", **overrides: Any) -> ModelRunner:
    cache: dict[str, Any] = {"block_size": 4, "num_blocks": 64, "num_cpu_blocks": 16}
    fields = {f.name for f in dataclasses.fields(CacheConfig)}
    cache.update({k: overrides.pop(k) for k in list(overrides) if k in fields})
    model = ModelConfig(
        model=None if model_dir is None else str(model_dir), dtype=cast(DType, dtype),
        quantization=overrides.pop("quantization", None),
    )
    return ModelRunner(model, CacheConfig(**cache), **overrides)  # type: ignore[arg-type]


class BlockTables:
    """Hands out shuffled (non-contiguous) blocks so block tables are really exercised."""

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.block_size = block_size
        self.tables: dict[str, list[int]] = {}

    def ensure(self, rid: str, num_tokens: int) -> list[int]:
        table = self.tables.setdefault(rid, [])
        while len(table) * self.block_size < num_tokens:
            table.append(self.free.pop())
        return table


def chunk(
    rid: str, tokens: list[int], start: int, blocks: BlockTables, sample: bool = True,
    params: SamplingParams | None = None, output_index: int = 0,
) -> ScheduledRequest:
    table = blocks.ensure(rid, start + len(tokens))
    return ScheduledRequest(
        rid, list(tokens), start, list(table), sample, params or SamplingParams(), output_index
    )


def step_logits(runner: ModelRunner, scheduled: list[ScheduledRequest]) -> list[torch.Tensor]:
    """Run one flattened forward; return every token's logits, split per request."""
    step = runner.prepare_inputs(scheduled)
    with torch.inference_mode():
        hidden = runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
        logits = runner.model.compute_logits(hidden)
    return list(logits.split([len(s.token_ids) for s in scheduled]))


def hf_model(model_dir: Path, dtype: torch.dtype = torch.float64) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                 local_files_only=True)
    return model.eval()


def hf_logits(model: Any, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0]


def execute(runner: ModelRunner, scheduled: list[ScheduledRequest]) -> dict[str, int]:
    return runner.execute(SchedulerOutput(scheduled=scheduled)).sampled


TokensAndLogprobs = tuple[list[int], list[tuple[float, object]]]


def tokens_and_logprobs(engine: Any, prompts: list[list[int]],
                        max_tokens: int = 12) -> list[TokensAndLogprobs]:
    """Each prompt's greedy tokens and top-2 logprobs, the prompts run together on ``engine``
    (an ``LLMEngine``) until all finish."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    ids = [engine.add_request(p, params) for p in prompts]
    got: dict[str, TokensAndLogprobs] = {i: ([], []) for i in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens, logprobs = got[out.request_id]
            tokens += out.new_token_ids
            logprobs += [(x.logprob, x.top) for x in out.logprobs or ()]
    return [got[i] for i in ids]
