"""The engine behind an asyncio front: the step loop runs in its own thread.

Callers on the event loop add requests and aborts through a thread-safe inbox; the step
thread applies them at the step boundary (so the scheduler is only ever touched by one
thread), runs ``LLMEngine.step()``, and hands each step's outputs back to the loop, where
they fan out to per-request queues (``generate``) and to step callbacks (the worker's
pipelined Redis write). The mechanism is ``engine.frontend.threaded.ThreadedEngine``; this
class adds the real engine's steps, prompt checks, load and stats.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from engine.core.config import EngineConfig
from engine.core.outputs import RequestOutput
from engine.core.row_cap import RowCap
from engine.core.sampling_params import SamplingParams
from engine.core.stats import EngineStats
from engine.frontend.threaded import ThreadedEngine
from engine.llm_engine import LLMEngine
from engine.runner.fresh_thread import run_on_fresh_thread
from engine.runner.step_threads import StepThreads
from policies.admission import EngineLoad

_IDLE_WAIT_S = 0.05
_HOLD_WAIT_S = 0.002


class AsyncEngine(ThreadedEngine):
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None):
        if engine is None:  # built off this thread: see engine.runner.fresh_thread
            engine = run_on_fresh_thread(lambda: LLMEngine(config or EngineConfig()), "carpool-load")
        super().__init__()
        self.engine = engine
        self.model_name: str = self.engine.model_name
        self.max_model_len: int = self.engine.max_model_len
        self.tokenizer: Any = self.engine.tokenizer
        # One list: LLMEngine.step() calls the observers itself, right after each step.
        self.step_observers = self.engine.step_observers
        self.step_threads = StepThreads(self.engine.config.adaptive_threads)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> AsyncEngine:
        return cls(EngineConfig.from_kwargs(**kwargs))

    def _check_prompt(self, token_ids: list[int]) -> None:
        self.engine.check_prompt(token_ids)

    def _prepare(self, params: SamplingParams) -> Future[None] | None:
        if params.structured is None:
            return None
        return self.engine.runner.grammars.submit(params.structured)

    # -- load -----------------------------------------------------------------------------

    def load(self) -> EngineLoad:
        """The scheduler's counts plus the requests posted and not yet placed, by priority
        (``Inbox.pending``: counted as urgent, a burst of lower ones closed interactive)."""
        s = self.engine.stats
        posted = self._inbox.pending()
        waiting = Counter(dict(s.waiting_by_priority)) + Counter(dict(posted))
        return EngineLoad(
            num_running=s.num_running,
            num_waiting=s.num_waiting + sum(n for _, n in posted),
            num_swapped=s.num_swapped,
            num_free_blocks=s.num_free_blocks,
            num_total_blocks=s.num_total_blocks,
            max_num_seqs=self.engine.config.scheduler.max_num_seqs,
            lowest_running_priority=s.lowest_running_priority,
            waiting_by_priority=tuple(sorted(waiting.items())),
            swapped_by_priority=s.swapped_by_priority,
        )

    def set_urgent_row_cap(self, cap: int | None, urgent_priority: int = 0,
                           weights: Mapping[int, int] | None = None,
                           lower_prefill_tokens: int | None = None,
                           urgent_backlogged: bool = False,
                           lower_prefill_chunk: int = 1) -> None:
        """Applied on the step thread at the next step boundary (through the inbox)."""
        shares = dict(weights or {})
        if cap is not None:  # checked here: a ValueError on the step thread would kill it
            RowCap(cap, urgent_priority, shares, lower_prefill_tokens,
                   lower_prefill_chunk=lower_prefill_chunk)
        self._inbox.post("call", lambda: self.engine.set_urgent_row_cap(
            cap, urgent_priority, shares, lower_prefill_tokens, urgent_backlogged,
            lower_prefill_chunk))

    def stats(self) -> EngineStats:
        seconds = self.engine.last_step_seconds if self.engine.step_count else None
        return EngineStats(self.engine.stats, seconds, self.engine.step_count)

    # -- step thread ----------------------------------------------------------------------

    def _steps(self) -> None:
        try:
            self._step_loop()
        finally:
            self.step_threads.restore()

    def _step_loop(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox()
            if not self.engine.has_unfinished_requests():
                self._inbox.wait(_IDLE_WAIT_S)
                continue
            self.step_threads.before_step()  # torch threads for this step, if adaptive
            outputs = self.engine.step()
            if outputs:
                self._publish(outputs)
            elif self.engine.stats.num_scheduled_tokens == 0:
                # e.g. dynamic batching holding requests for max_wait_ms: don't spin
                self._inbox.wait(_HOLD_WAIT_S)

    def _add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
             priority: int, first_token_urgent: bool) -> None:
        self.engine.add_request(prompt_token_ids, params, request_id=request_id,
                                priority=priority, first_token_urgent=first_token_urgent)

    def _abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def _abort_all(self) -> list[RequestOutput]:
        return self.engine.abort_all()
