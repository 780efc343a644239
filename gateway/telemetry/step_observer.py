"""Per-step facts from the engine thread: exact batch histograms and per-request prefill-chunk,
preemption (with the mode that really happened) and swap events.

The engine calls the observer right after each step with that step's ``SchedulerOutput``
(``EngineClient.add_step_observer``), on the engine's step thread. Everything it needs is in
that output: which preemptions really swapped and how many blocks moved (``swapped_out``; a
swap falls back to recompute when the CPU pool is full). Thread safety: the observer touches
no span. Histograms are observed at once (prometheus-client metrics are thread-safe);
per-request facts are appended to a deque (``append``/``popleft`` are atomic) that the
worker's step callback drains on the event loop, where the request traces live.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from engine.core.outputs import SchedulerOutput
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
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
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
            self._preempted(rid, out.swapped_out.get(rid), now)
        for rid in out.finished_ids:  # aborted while swapped out: forget it
            self._swapped.pop(rid, None)

    def _preempted(self, rid: str, blocks: int | None, now: int) -> None:
        """``blocks``: how many moved to the CPU pool, None for a recompute preemption."""
        self._fact(rid, "preempted", now, mode="recompute" if blocks is None else "swap")
        if blocks is not None:
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
