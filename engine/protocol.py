"""The interface the gateway's worker (and its telemetry) uses to drive an engine.

``AsyncEngine`` (the real engine, step loop in its own thread) implements it; so does the
FAKE echo engine (``engine.frontend.echo``) used only to measure the gateway itself.
Everything outside ``engine/`` reads an engine through this protocol alone: load and stats
snapshots, outputs per step (callbacks, on the event loop) and each step's
``SchedulerOutput`` (observers, on the step thread). Torch-free.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from engine.core.outputs import RequestOutput, SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.stats import EngineStats
from policies.admission import EngineLoad

__all__ = ["EngineClient", "EngineLoad", "EngineStats", "StepCallback", "StepObserverFn"]

StepCallback = Callable[[list[RequestOutput]], None]
# (the step's SchedulerOutput, the step's wall seconds); runs on the engine's step thread
StepObserverFn = Callable[[SchedulerOutput, float], None]


class EngineClient(Protocol):
    model_name: str
    max_model_len: int
    tokenizer: Any  # a transformers tokenizer (chat template, encode/decode)

    async def start(self) -> None:
        """Start the step loop (idempotent)."""

    async def shutdown(self) -> None:
        """Stop the loop; abort what is left."""

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        first_token_urgent: bool = False,
    ) -> None:
        """Queue a request; its outputs go to the step callbacks (and to generate()).
        ``first_token_urgent``: the step computing its first token is capped as an urgent
        arrival's (``engine.core.row_cap``)."""

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Add a request and yield its incremental outputs until finished."""

    def abort(self, request_id: str) -> None:
        """Thread-safe; takes effect at the next step boundary (blocks freed there)."""

    def add_step_callback(self, callback: StepCallback) -> None:
        """Called on the event loop once per engine step with every output of that step."""

    def add_step_observer(self, observer: StepObserverFn) -> Callable[[], None]:
        """Called on the step thread right after each step with that step's
        ``SchedulerOutput`` (preemptions, swaps, chunks) and its wall seconds: keep it to a
        few appends. Returns a function that removes the observer again."""

    def set_urgent_row_cap(self, cap: int | None, urgent_priority: int = 0,
                           weights: Mapping[int, int] | None = None,
                           lower_prefill_tokens: int | None = None,
                           urgent_backlogged: bool = False,
                           lower_prefill_chunk: int = 1) -> None:
        """While a request of priority <= ``urgent_priority`` is present, run at most ``cap``
        rows a step, urgent ones first, the lower seats shared by ``weights`` (priority ->
        weight; strict priority without); the other rows pause, keeping their KV (None: no cap).
        Lower-priority prompts compute at most ``lower_prefill_tokens`` a step meanwhile
        (chunked; None: no such bound), on average: tokens a step leaves unused are banked
        and released in chunks of at least ``lower_prefill_chunk`` (``engine.core.row_cap``).
        ``urgent_backlogged``: the urgent tier asks for more
        than its weight's share, so the lower ones are owed seats by weight for every urgent
        row (``policies.owed_seats``). Thread-safe; takes effect at the next step boundary."""

    def load(self) -> EngineLoad:
        """Current load snapshot."""

    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters and gauges (any thread; torch-free)."""

    def has_capacity(self, priority: int) -> bool:
        """True when a request of this priority would be scheduled soon: a free seat and
        free blocks, or lower-priority running work it may preempt."""
