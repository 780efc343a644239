"""Offline API: ``LLM(model=None, dtype="float32", **engine_config).generate(prompts, params)``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.core.outputs import CompletionOutput
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, dtype: str = "float32", **engine_config: Any):
        self.engine = LLMEngine.from_kwargs(model=model, dtype=dtype, **engine_config)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """All prompts are added at once and run to completion; results in prompt order."""
        prompt_list = _as_prompt_list(prompts)
        param_list = _as_param_list(params, len(prompt_list))
        if any(sp.n > 1 for sp in param_list):  # one CompletionOutput per prompt here
            raise ValueError("LLM.generate takes n=1; drive LLMEngine for n > 1")
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompt_list, param_list)]
        collected: dict[str, CompletionOutput] = {}
        for rid, prompt in zip(ids, prompt_list):
            req = self.engine.scheduler.get_request(rid)
            prompt_ids = req.prompt_token_ids if req else []
            collected[rid] = CompletionOutput(rid, prompt_ids, [], "", None)
        pending = set(ids)
        while pending:
            step_outputs = self.engine.step()
            if not step_outputs and not self.engine.has_unfinished_requests():
                break  # nothing left that could ever report
            for out in step_outputs:
                c = collected[out.request_id]
                c.token_ids.extend(out.new_token_ids)
                c.text += out.text_delta
                if out.finished:
                    c.finish_reason = out.finish_reason
                    c.error = out.error
                    pending.discard(out.request_id)
        return [collected[rid] for rid in ids]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]  # type: ignore[arg-type]
    return list(prompts)  # type: ignore[arg-type]


def _as_param_list(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return list(params)
