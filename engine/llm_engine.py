"""The synchronous engine: one step is three calls.

    out = scheduler.schedule()          # who runs, which tokens, which blocks
    res = runner.execute(out)           # swap copies, one flattened forward, sampling
    changed = scheduler.update_from_output(out, res)

then the output processor turns the changed requests into ``RequestOutput`` deltas.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from engine.core.config import EngineConfig
from engine.core.output_processor import OutputProcessor
from engine.core.outputs import ModelRunnerOutput, RequestOutput, SchedulerOutput
from engine.core.parallel_sampling import GroupOutputs
from engine.core.request import Request, RequestStatus
from engine.core.request_checks import invalid_prompt_reason
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.stats import SchedulerStats
from engine.runner.model_runner import ModelRunner

log = logging.getLogger("carpool.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.runner = ModelRunner.from_config(config)
        log.info("%s", self.runner.cache_summary())  # `serve` shows carpool's INFO lines
        self.tokenizer: Any = self.runner.tokenizer
        self.max_model_len: int = self.runner.max_model_len
        self.model_name: str = self.runner.model_name
        self.scheduler = Scheduler(
            config.scheduler,
            config.cache,
            num_blocks=self.runner.num_blocks,
            num_cpu_blocks=self.runner.num_cpu_blocks,
            max_model_len=self.max_model_len,
        )
        self.outputs = OutputProcessor(self.tokenizer)
        self.groups = GroupOutputs()  # n > 1: the sequences' outputs under the request's id
        self._ids = itertools.count()
        self.step_count = 0
        self.last_step_seconds = 0.0
        # Called after every step with (SchedulerOutput, step seconds), on the stepping thread;
        # AsyncEngine.add_step_observer adds to this list (telemetry's StepObserver).
        self.step_observers: list[Callable[[SchedulerOutput, float], None]] = []
        self._stats = self.scheduler.stats

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> LLMEngine:
        return cls(EngineConfig.from_kwargs(**kwargs))

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        first_token_urgent: bool = False,
    ) -> str:
        token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.check_prompt(token_ids)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        params = self._with_extra_eos(params or SamplingParams())
        if params.structured is not None:  # a cache hit when a front compiled it already
            self.runner.grammars.compile(params.structured)  # GrammarError: a ValueError
        request = Request(
            rid,
            token_ids,
            params,
            priority=priority,
            arrival_time=arrival_time,
            eos_token_id=self.runner.eos_token_id,
            first_token_urgent=first_token_urgent,
        )
        self.scheduler.add_request(request)  # first: a rejected duplicate must not touch state
        self.outputs.add(request)
        self.groups.register(rid, params.n)
        self._stats = self.scheduler.stats
        return rid

    def _with_extra_eos(self, params: SamplingParams) -> SamplingParams:
        # Request knows one EOS id; models with several (Llama 3) stop on the rest as stop ids.
        extra = [t for t in self.runner.eos_token_ids[1:] if t not in params.stop_token_ids]
        if params.ignore_eos or not extra:
            return params
        return dataclasses.replace(params, stop_token_ids=params.stop_token_ids + tuple(extra))

    def check_prompt(self, token_ids: list[int]) -> None:
        """ValueError for ids the model can't embed; safe to call from any thread."""
        error = invalid_prompt_reason(token_ids, self.runner.args.vocab_size)
        if error is not None:
            raise ValueError(error)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def abort(self, request_id: str) -> None:
        self.scheduler.abort_request(request_id)
        self._stats = self.scheduler.stats

    def abort_all(self) -> list[RequestOutput]:
        """Abort every unfinished request and return, now and without a step, the final output
        of each request that finished since the last step: afterwards the engine holds no
        request and no KV block, and no later step reports one of them."""
        for rid in self.outputs.request_ids():
            self.scheduler.abort_request(rid)
        # An empty step's update hands back what finished between steps: these aborts.
        changed = self.scheduler.update_from_output(SchedulerOutput(), ModelRunnerOutput())
        self.runner.grammar_rows.clear()  # no request left: no grammar state either
        self._stats = self.scheduler.stats
        return [self._emit(r) for r in changed]

    def set_urgent_row_cap(self, cap: int | None, urgent_priority: int = 0,
                           weights: Mapping[int, int] | None = None,
                           lower_prefill_tokens: int | None = None,
                           urgent_backlogged: bool = False,
                           lower_prefill_chunk: int = 1) -> None:
        """While urgent work (priority <= ``urgent_priority``) is present, at most ``cap`` rows
        a step, the lower seats shared by ``weights``, lower prompts chunked to
        ``lower_prefill_tokens`` a step on average (in chunks of ``lower_prefill_chunk``), seats
        owed for every urgent row while ``urgent_backlogged``
        (``Scheduler.set_urgent_row_cap``); None lifts it. On the stepping thread."""
        self.scheduler.set_urgent_row_cap(cap, urgent_priority, weights, lower_prefill_tokens,
                                          urgent_backlogged, lower_prefill_chunk)
        self._stats = self.scheduler.stats

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def stats(self) -> SchedulerStats:
        """A snapshot taken on the stepping thread after the last step/add/abort: safe to read
        from another thread (the scheduler itself is only touched by the stepping thread)."""
        return self._stats

    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        out = self.scheduler.schedule()
        # Readers see what this step placed as running, not as waiting, while it runs (the
        # snapshot from the adds before it counted them waiting for a whole step: the
        # worker's short engine queue looked full and closed its tier to new requests).
        self._stats = self.scheduler.stats
        res = self.runner.execute(out)
        changed = self.scheduler.update_from_output(out, res)
        outputs = [self._emit(r) for r in changed]
        self.step_count += 1
        self.last_step_seconds = time.perf_counter() - start
        self._stats = self.scheduler.stats
        for observe in tuple(self.step_observers):  # a copy: another thread may add one
            observe(out, self.last_step_seconds)
        return outputs

    def _emit(self, request: Request) -> RequestOutput:
        output, stop_hit = self.outputs.process(request)
        if stop_hit and not request.is_finished:
            self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
        if request.sampling_params.structured is not None and request.is_finished:
            self.runner.grammar_rows.free([request.request_id])  # also done at the next step
        return self.groups.merge(output)
