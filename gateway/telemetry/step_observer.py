"""Per-step facts from the engine thread: exact batch histograms and per-request prefill-chunk,
preemption (with the mode that really happened) and swap events.

The engine calls the observer right after each step with that step's ``SchedulerOutput``
(``LLMEngine.step_observers``, when the engine offers the hook), on the engine's step thread.
Thread safety: the observer touches no span. Histograms are observed at once (prometheus-client
metrics are thread-safe); per-request facts are appended to a deque (``append``/``popleft`` are
atomic) that the worker's step callback drains on the event loop, where the request traces
live. The scheduler is read only from the step thread, where it is consistent.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from engine.core.outputs import SchedulerOutput
from engine.core.request import RequestStatus
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import now_ns

MAX_PENDING_FACTS = 100_000  # if nobody drains (no worker callback), old facts fall off


@dataclass(frozen=True)
class StepFact:
    request_id: str
    kind: str  # "prefill_chunk" | "preempted" | "swap"
    at_ns: int
    attrs: dict[str, Any] = field(default_factory=dict)


class StepObserver:
    """``scheduler`` (the engine's, read on the step thread) tells which preemptions really
    swapped (a swap falls back to recompute when the CPU pool is full) and how many blocks
    moved; without it preemptions carry the configured mode and no per-request swap events."""

    def __init__(self, metrics: Metrics, preemption_mode: str = "recompute",
                 scheduler: Any = None) -> None:
        self._metrics = metrics
        self._mode = preemption_mode
        self._scheduler = scheduler
        self._facts: deque[StepFact] = deque(maxlen=MAX_PENDING_FACTS)
        self._swapped: dict[str, int] = {}  # request -> blocks on the CPU (step thread only)

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
            blocks = self._swapped.pop(s.request_id, None)
            if blocks is not None:  # scheduled again after a swap-out: it was swapped in
                self._fact(s.request_id, "swap", now, direction="in", blocks=blocks)
            # A prefill chunk: more than one token, or a chunk that does not reach the end
            # of the known tokens (so it samples nothing). Decode steps are one sampled token.
            if len(s.token_ids) > 1 or not s.sample:
                self._fact(s.request_id, "prefill_chunk", now, start=s.start_pos,
                           tokens=len(s.token_ids))
        for rid in out.preempted_ids:
            self._preempted(rid, now)
        for rid in out.finished_ids:  # aborted while swapped out: forget it
            self._swapped.pop(rid, None)

    def _preempted(self, rid: str, now: int) -> None:
        if self._scheduler is None:
            self._fact(rid, "preempted", now, mode=self._mode)
            return
        req = self._scheduler.get_request(rid)
        swapped = req is not None and req.status == RequestStatus.SWAPPED
        self._fact(rid, "preempted", now, mode="swap" if swapped else "recompute")
        if swapped:
            blocks = self._scheduler.block_manager.num_cpu_blocks_of(rid)
            self._swapped[rid] = blocks
            self._fact(rid, "swap", now, direction="out", blocks=blocks)

    def _fact(self, rid: str, kind: str, at_ns: int, **attrs: Any) -> None:
        self._facts.append(StepFact(rid, kind, at_ns, attrs))

    def drain(self) -> list[StepFact]:
        """On the event loop: every fact recorded since the last drain, oldest first."""
        facts = []
        while True:
            try:
                facts.append(self._facts.popleft())
            except IndexError:
                return facts
