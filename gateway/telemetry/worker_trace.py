"""The worker's side of one request: child spans under the gateway's request span.

    gateway span  chat <model>  ─────────────────────────────────────────────────
      carpool.queue         enqueue ─ taken by a worker
      carpool.engine.wait                added ─ first scheduled
      carpool.prefill                            first scheduled ─ first token
                                                   (one event per prefill chunk)
      carpool.decode                                              first token ─ end
                                                   (preemption / swap / abort events)

The engine stamps requests with ``time.monotonic``; they are converted to epoch time when the
worker sees them (same process, same clock). Spans are built when the request ends, because
their boundaries are only known then; events seen earlier are kept and placed in the span whose
interval holds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from gateway.telemetry import names
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import extract_context, monotonic_to_epoch_ns, now_ns


@dataclass
class _Event:
    name: str
    at_ns: int
    attrs: dict[str, Any] = field(default_factory=dict)
    span: str | None = None  # the span it belongs to regardless of its stamp


class WorkerRequestTrace:
    """Create when the worker takes the envelope; feed it the request's engine outputs (and
    step-level facts when known); it ends its spans when a finished output arrives or
    ``abort()`` is called for a request that never reached the engine."""

    def __init__(
        self, tracer: trace.Tracer, metrics: Metrics, *, request_id: str, tier: str,
        traceparent: str | None, enqueued_ns: int | None, taken_ns: int | None = None,
    ) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self.request_id = request_id
        self.tier = tier
        self._parent = extract_context(traceparent)
        self.taken_ns = now_ns() if taken_ns is None else taken_ns
        start = self.taken_ns if enqueued_ns is None else min(enqueued_ns, self.taken_ns)
        self.queue_wait_s = (self.taken_ns - start) / 1e9
        metrics.queue_wait.labels(tier).observe(self.queue_wait_s)
        self._span(names.SPAN_QUEUE, start, {names.QUEUE_WAIT_MS: self.queue_wait_s * 1000}).end(
            end_time=self.taken_ns
        )
        self._events: list[_Event] = []
        self._first_scheduled_ns: int | None = None
        self._first_token_ns: int | None = None
        self._preemptions = 0
        self.done = False

    # -- what the worker feeds in ----------------------------------------------------------

    def on_output(self, out: RequestOutput) -> None:
        """One engine output delta for this request."""
        if self.done:
            return
        if self._first_scheduled_ns is None and out.first_scheduled_time is not None:
            self._first_scheduled_ns = monotonic_to_epoch_ns(out.first_scheduled_time)
        if self._first_token_ns is None and out.first_token_time is not None:
            self._first_token_ns = monotonic_to_epoch_ns(out.first_token_time)
        if out.num_preemptions > self._preemptions:
            # Preemptions no step fact told of: the output carries their count, neither the
            # moment (stamped now) nor the mode (left off rather than guessed).
            for _ in range(out.num_preemptions - self._preemptions):
                self._note_preemption({})
        if out.finished:
            end = monotonic_to_epoch_ns(out.finish_time) if out.finish_time else now_ns()
            reason = out.finish_reason or FinishReason.STOP
            self._finish(reason, end, out.num_output_tokens, out.error)

    # on_prefill_chunk / on_preempted / on_swap take per-step facts, which the StepObserver
    # hands over (drained on the event loop) (every EngineClient offers step observers).
    def on_prefill_chunk(self, start_pos: int, num_tokens: int, at_ns: int | None = None) -> None:
        """A chunk computed for this request. Until the first token is seen it is part of the
        initial prefill (stamps taken at step end can lie a hair past the first token's);
        later ones are re-prefills after a recompute preemption and go by their time."""
        initial = names.SPAN_PREFILL if self._first_token_ns is None else None
        self._add(names.EVENT_PREFILL_CHUNK, at_ns,
                  {names.CHUNK_START: start_pos, names.CHUNK_TOKENS: num_tokens}, initial)

    def on_preempted(self, mode: str, at_ns: int | None = None) -> None:
        """A preemption the step observer saw, with its mode ("recompute" | "swap")."""
        self._note_preemption({names.PREEMPTION_MODE: mode}, at_ns)

    def _note_preemption(self, attrs: dict[str, Any], at_ns: int | None = None) -> None:
        self._preemptions += 1
        self._add(names.EVENT_PREEMPTION, at_ns, attrs)

    def on_swap(self, direction: str, num_blocks: int, at_ns: int | None = None) -> None:
        name = names.EVENT_SWAP_OUT if direction == "out" else names.EVENT_SWAP_IN
        self._add(name, at_ns, {names.NUM_BLOCKS: num_blocks})

    def abort(self, cause: str, at_ns: int | None = None) -> None:
        """Record why the request was cut short. If it never reached the engine (dropped from
        the queue), this also ends the trace; otherwise the engine's final output does."""
        self.note_abort(cause, at_ns)
        if self._first_scheduled_ns is None and not self.done:
            self._finish(FinishReason.ABORT, at_ns or now_ns(), 0, None)

    def note_abort(self, cause: str, at_ns: int | None = None) -> None:
        """An abort event only; the final output that follows ends the spans."""
        self._add(names.EVENT_ABORT, at_ns, {names.ABORT_CAUSE: cause})

    @property
    def num_preemptions(self) -> int:
        return self._preemptions

    # -- building the spans ----------------------------------------------------------------

    def _add(self, name: str, at_ns: int | None, attrs: dict[str, Any],
             span: str | None = None) -> None:
        if not self.done:
            self._events.append(_Event(name, now_ns() if at_ns is None else at_ns, attrs, span))

    def _finish(self, reason: str, end_ns: int, num_output: int, error: str | None) -> None:
        self.done = True
        sched, first = self._first_scheduled_ns, self._first_token_ns
        parts: list[tuple[str, int, int, dict[str, Any]]] = [
            (names.SPAN_ENGINE_WAIT, self.taken_ns, sched if sched is not None else end_ns, {})
        ]
        if sched is not None:
            parts.append((names.SPAN_PREFILL, sched, first if first is not None else end_ns, {}))
        if first is not None:
            parts.append((names.SPAN_DECODE, first, end_ns, {names.OUTPUT_TOKENS: num_output}))
        built = {p[0] for p in parts}
        events = sorted(self._events, key=lambda e: e.at_ns)
        self._events = []
        for i, (name, start, end, attrs) in enumerate(parts):
            end = max(start, end)
            last = i == len(parts) - 1
            # An event goes to its named span, else to the span whose interval holds it;
            # the last span takes the rest.
            def here(e: _Event, name: str = name, end: int = end) -> bool:
                if e.span in built:
                    return e.span == name
                return e.at_ns <= end
            mine = events if last else [e for e in events if here(e)]
            events = [] if last else [e for e in events if not here(e)]
            if last:  # the outcome goes on the span where the request ended
                attrs = {**attrs, names.FINISH_REASON: reason,
                         names.NUM_PREEMPTIONS: self._preemptions}
            span = self._span(name, start, attrs, mine)
            if last and reason == FinishReason.ERROR:
                span.set_status(Status(StatusCode.ERROR, error or "engine error"))
            span.end(end_time=end)

    def _span(
        self, name: str, start_ns: int, attrs: dict[str, Any], events: Sequence[_Event] = ()
    ) -> trace.Span:
        attrs = {names.REQUEST_ID: self.request_id, names.TIER: self.tier, **attrs}
        span = self._tracer.start_span(
            name, context=self._parent, attributes=attrs, start_time=start_ns
        )
        for ev in events:
            span.add_event(ev.name, ev.attrs, timestamp=ev.at_ns)
        return span
