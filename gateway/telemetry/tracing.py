"""Tracer provider set-up, W3C trace-context carriage through the queue envelope, and clocks.

No global provider is installed: the provider lives on the process's ``Telemetry`` object and
is passed to whoever makes spans, so tests can run several in one process.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry.config import TelemetryConfig

_PROPAGATOR = TraceContextTextMapPropagator()  # stateless


def receives_spans(config: TelemetryConfig, extra_processors: Sequence[SpanProcessor] = ()) -> bool:
    """Whether anything would ever see a span: an exporter ``config`` asks for, or a processor
    a test passes. Without one, ``Telemetry`` traces with a no-op tracer: building and
    dropping a request's five spans cost ~0.2 ms of CPU on its path."""
    return config.otlp or config.console or bool(extra_processors)


def build_tracer_provider(
    config: TelemetryConfig, extra_processors: Sequence[SpanProcessor] = ()
) -> TracerProvider:
    """A provider with the exporters ``config`` asks for (OTLP/HTTP, console) plus
    ``extra_processors`` (tests pass an in-memory exporter's processor)."""
    provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
    if config.otlp_endpoint is not None:
        # Imported only when used; headers and timeouts: the exporter's own OTEL_* variables.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if config.console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stdout)))
    for processor in extra_processors:
        provider.add_span_processor(processor)
    return provider


def inject_traceparent(span: trace.Span | None = None) -> str | None:
    """The W3C ``traceparent`` of ``span`` (default: the current span), for the envelope.

    None when there is nothing to propagate (no valid span), so callers can leave the field
    empty rather than send an invalid header.
    """
    ctx = trace.set_span_in_context(span) if span is not None else otel_context.get_current()
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier.get("traceparent")


def extract_context(traceparent: str | None) -> otel_context.Context:
    """The parent context a worker's spans hang from; an empty context if the envelope had
    no (or a malformed) traceparent, so spans then start a trace of their own."""
    if not traceparent:
        return otel_context.Context()
    return _PROPAGATOR.extract({"traceparent": traceparent})


def now_ns() -> int:
    return time.time_ns()


def monotonic_to_epoch_ns(stamp: float, *, now_mono: float | None = None,
                          now_wall_ns: int | None = None) -> int:
    """Convert a ``time.monotonic()`` stamp (what the engine records) to epoch nanoseconds
    (what spans carry), by its distance from now on both clocks."""
    mono = time.monotonic() if now_mono is None else now_mono
    wall = time.time_ns() if now_wall_ns is None else now_wall_ns
    return wall - int((mono - stamp) * 1e9)


def stream_id_to_epoch_ns(entry_id: str | bytes) -> int | None:
    """A Redis stream entry id (``<ms>-<seq>``) is the enqueue time on Redis's clock; a
    worker can read queue wait from it when the envelope carries no timestamp."""
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    head = raw.split("-", 1)[0]
    return int(head) * 1_000_000 if head.isdigit() else None
