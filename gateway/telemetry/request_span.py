"""The gateway's side of one request: the root (server) span and the per-request metrics.

The gateway sees what the client sees (arrival, each token event, the end), so TTFT, TPOT,
inter-token latency and end-to-end time are measured here. The worker's spans hang below this
one through the ``traceparent`` the gateway puts in the queue envelope.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from engine.core.finish import COMPLETED, FinishReason
from gateway.telemetry import names
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import inject_traceparent, monotonic_to_epoch_ns


@dataclass(frozen=True)
class RequestInfo:
    """What the gateway knows once a request is authenticated and tokenized."""

    request_id: str
    tenant_id: str
    tier: str
    model: str
    prompt_tokens: int
    operation: str = "chat"  # GenAI operation name: "chat" | "text_completion"
    max_tokens: int | None = None
    stream: bool = True
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class RequestSummary:
    """The numbers put on the span when the request ended (milliseconds)."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float
    queue_wait_ms: float | None


class RequestRecorder:
    """Open at admission, feed it token events, ``finish()`` exactly once (later calls are
    ignored, so the error path and the normal path can both call it)."""

    def __init__(
        self, tracer: trace.Tracer, metrics: Metrics, info: RequestInfo,
        *, tenant_labels: bool = True, started_at: float | None = None,
        parent: Context | None = None,
    ) -> None:
        """``started_at``: when the request arrived (``time.monotonic()``), if earlier than
        now (the handler may open the recorder after parsing and tokenizing)."""
        self.info = info
        self._metrics = metrics
        self._tenant_label = info.tenant_id if tenant_labels else "-"
        self._start = time.monotonic() if started_at is None else started_at
        self._first: float | None = None
        self._last: float | None = None
        self._completion_tokens = 0
        self._queue_wait_s: float | None = None
        self._num_preemptions: int | None = None
        self.summary: RequestSummary | None = None
        self.span = tracer.start_span(
            f"{info.operation} {info.model}", kind=SpanKind.SERVER, attributes=_attrs(info),
            start_time=monotonic_to_epoch_ns(self._start), context=parent,
        )

    @property
    def traceparent(self) -> str | None:
        """The W3C traceparent to put in the queue envelope."""
        return inject_traceparent(self.span)

    def on_tokens(self, count: int, now: float | None = None) -> None:
        """``count`` new tokens reached the gateway (one event may carry several: the worker
        writes once per engine step)."""
        if count <= 0 or self.summary is not None:
            return
        t = time.monotonic() if now is None else now
        tier = self.info.tier
        if self._first is None:
            self._first = t
            self._metrics.ttft.labels(tier).observe(t - self._start)
            self._metrics.tenant_ttft.labels(self._tenant_label).observe(t - self._start)
            self.span.add_event(names.EVENT_FIRST_TOKEN, timestamp=monotonic_to_epoch_ns(t))
        elif self._last is not None and self.info.stream:
            # (a non-streaming answer's tokens come back in two messages: no gaps to see)
            gap = (t - self._last) / count  # tokens of one step arrive together: share the gap
            itl = self._metrics.itl.labels(tier)  # looked up once, not per token
            for _ in range(count):
                itl.observe(gap)
        self._completion_tokens += count
        self._last = t

    def on_ttft_split(self, split: Mapping[str, float], steps: int | None = None,
                      prefill_steps: int | None = None) -> None:
        """The TTFT budget of this request (``policies.ttft_split``): each part on the span
        (ms) and in the per-tier histograms, with the engine steps it took."""
        tier = self.info.tier
        for part, seconds in split.items():
            self.span.set_attribute(names.TTFT_PART_MS.format(part=part), round(seconds * 1000, 3))
            self._metrics.ttft_part.labels(tier, part).observe(seconds)
        for name, kind, count in ((names.TTFT_STEPS, "all", steps),
                                  (names.TTFT_PREFILL_STEPS, "prefill", prefill_steps)):
            if count is not None and count >= 0:
                self.span.set_attribute(name, count)
                self._metrics.ttft_steps.labels(tier, kind).observe(count)

    def set_engine_info(
        self, queue_wait_s: float | None = None, num_preemptions: int | None = None
    ) -> None:
        """What only the worker knows, when its messages carry it back."""
        if queue_wait_s is not None:
            self._queue_wait_s = queue_wait_s
        if num_preemptions is not None:
            self._num_preemptions = num_preemptions

    def finish(
        self, finish_reason: str, *, completion_tokens: int | None = None,
        prompt_tokens: int | None = None, abort_cause: str | None = None,
        error: str | None = None, now: float | None = None,
    ) -> RequestSummary:
        """End the span and record the request's metrics. ``completion_tokens`` and
        ``prompt_tokens`` default to what was counted (pass the response's usage when known)."""
        if self.summary is not None:
            return self.summary
        end = time.monotonic() if now is None else now
        summary = self._summarize(finish_reason, end, completion_tokens, prompt_tokens)
        self.summary = summary
        self._record_metrics(summary, abort_cause)
        self._end_span(summary, abort_cause, error, monotonic_to_epoch_ns(end))
        return summary

    def _summarize(
        self, reason: str, end: float, completion: int | None, prompt: int | None
    ) -> RequestSummary:
        n = self._completion_tokens if completion is None else completion
        ttft = None if self._first is None else (self._first - self._start) * 1000
        tpot = None
        if self._first is not None and self._last is not None and n > 1:
            tpot = (self._last - self._first) * 1000 / (n - 1)
        wait = None if self._queue_wait_s is None else self._queue_wait_s * 1000
        return RequestSummary(
            finish_reason=reason,
            prompt_tokens=self.info.prompt_tokens if prompt is None else prompt,
            completion_tokens=n,
            ttft_ms=ttft,
            tpot_ms=tpot,
            e2e_ms=(end - self._start) * 1000,
            queue_wait_ms=wait,
        )

    def _record_metrics(self, s: RequestSummary, abort_cause: str | None) -> None:
        m, tier = self._metrics, self.info.tier
        m.requests.labels(tier, self._tenant_label, s.finish_reason).inc()
        m.tokens.labels(tier, "prompt").inc(s.prompt_tokens)
        m.tokens.labels(tier, "completion").inc(s.completion_tokens)
        m.tenant_tokens.labels(self._tenant_label, "prompt").inc(s.prompt_tokens)
        m.tenant_tokens.labels(self._tenant_label, "completion").inc(s.completion_tokens)
        if s.finish_reason == FinishReason.ABORT:
            m.aborts.labels(tier, abort_cause or "unknown").inc()
        # Only natural ends describe service quality: aborted/failed requests would skew TPOT
        # and end-to-end time (they are counted in carpool_requests / carpool_aborts).
        if s.finish_reason in COMPLETED:
            m.e2e.labels(tier).observe(s.e2e_ms / 1000)
            if s.tpot_ms is not None:
                m.tpot.labels(tier).observe(s.tpot_ms / 1000)

    def _end_span(
        self, s: RequestSummary, abort_cause: str | None, error: str | None, end_ns: int
    ) -> None:
        span = self.span
        span.set_attribute(names.FINISH_REASONS, [s.finish_reason])
        span.set_attribute(names.FINISH_REASON, s.finish_reason)
        span.set_attribute(names.INPUT_TOKENS, s.prompt_tokens)
        span.set_attribute(names.OUTPUT_TOKENS, s.completion_tokens)
        span.set_attribute(names.E2E_MS, s.e2e_ms)
        for key, value in (
            (names.TTFT_MS, s.ttft_ms), (names.TPOT_MS, s.tpot_ms),
            (names.QUEUE_WAIT_MS, s.queue_wait_ms), (names.NUM_PREEMPTIONS, self._num_preemptions),
        ):
            if value is not None:
                span.set_attribute(key, value)
        if s.finish_reason == FinishReason.ABORT:
            span.add_event(names.EVENT_ABORT, {names.ABORT_CAUSE: abort_cause or "unknown"})
            span.set_attribute(names.ABORT_CAUSE, abort_cause or "unknown")
        if s.finish_reason == FinishReason.ERROR or error:
            span.set_status(Status(StatusCode.ERROR, error or "engine error"))
        span.end(end_time=end_ns)


def _attrs(info: RequestInfo) -> dict[str, str | int | float | bool]:
    attrs: dict[str, str | int | float | bool] = {
        names.OPERATION_NAME: info.operation,
        names.PROVIDER_NAME: names.PROVIDER,
        names.REQUEST_MODEL: info.model,
        names.RESPONSE_MODEL: info.model,
        names.RESPONSE_ID: info.request_id,
        names.REQUEST_ID: info.request_id,
        names.TENANT_ID: info.tenant_id,
        names.TIER: info.tier,
        names.SERVICE_TIER: info.tier,
        names.REQUEST_STREAM: info.stream,
        names.INPUT_TOKENS: info.prompt_tokens,
    }
    optional = (
        (names.REQUEST_MAX_TOKENS, info.max_tokens),
        (names.REQUEST_TEMPERATURE, info.temperature),
        (names.REQUEST_TOP_P, info.top_p),
        (names.REQUEST_SEED, info.seed),
    )
    attrs.update({k: v for k, v in optional if v is not None})
    return attrs
