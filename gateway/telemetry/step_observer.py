"""Per-step facts from the engine thread: exact batch histograms and per-request prefill-chunk
and preemption events.

The engine calls the observer right after each step with that step's ``SchedulerOutput``
(``LLMEngine.step_observers``, when the engine offers the hook). Histograms are observed at
once (prometheus-client is thread-safe); per-request facts go through a thread-safe deque that
the worker's step callback drains on the event loop, where the request traces live.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from engine.outputs import SchedulerOutput
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import now_ns

MAX_PENDING_FACTS = 100_000  # if nobody drains (no worker callback), old facts fall off


@dataclass(frozen=True)
class StepFact:
    request_id: str
    kind: str  # "prefill_chunk" | "preempted"
    at_ns: int
    attrs: dict[str, Any] = field(default_factory=dict)


class StepObserver:
    def __init__(self, metrics: Metrics, preemption_mode: str = "recompute") -> None:
        self._metrics = metrics
        self._mode = preemption_mode
        self._facts: deque[StepFact] = deque(maxlen=MAX_PENDING_FACTS)

    def __call__(self, out: SchedulerOutput, seconds: float) -> None:
        """On the engine thread, once per step: keep it to a few appends."""
        m, now = self._metrics, now_ns()
        if out.scheduled:
            m.batch_size.observe(len(out.scheduled))
            m.step_tokens.observe(out.num_batched_tokens)
            m.step_seconds.observe(seconds)
        for direction, pairs in (("out", out.swap_out), ("in", out.swap_in)):
            if pairs:
                m.swap_blocks.labels(direction).inc(len(pairs))
        for s in out.scheduled:
            # A prefill chunk: more than one token, or a chunk that does not reach the end
            # of the known tokens (so it samples nothing). Decode steps are one sampled token.
            if len(s.token_ids) > 1 or not s.sample:
                self._facts.append(StepFact(s.request_id, "prefill_chunk", now, {
                    "start": s.start_pos, "tokens": len(s.token_ids)}))
        for rid in out.preempted_ids:
            # Labelled with the configured mode: a swap that finds no CPU blocks falls back to
            # recompute, which only the mode-split counters (carpool_preemptions_total) see.
            self._facts.append(StepFact(rid, "preempted", now, {"mode": self._mode}))

    def drain(self) -> list[StepFact]:
        """On the event loop: every fact recorded since the last drain, oldest first."""
        facts = []
        while True:
            try:
                facts.append(self._facts.popleft())
            except IndexError:
                return facts
