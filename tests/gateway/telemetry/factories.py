"""Factories for telemetry tests: a Telemetry wired to an in-memory span exporter."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry import RequestInfo, Telemetry, TelemetryConfig


def make_telemetry(**config: Any) -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(
        TelemetryConfig(**config), span_processors=[SimpleSpanProcessor(exporter)]
    )
    return telemetry, exporter


def make_info(**overrides: Any) -> RequestInfo:
    values: dict[str, Any] = {
        "request_id": "req-1",
        "tenant_id": "acme",
        "tier": "interactive",
        "model": "tiny",
        "prompt_tokens": 7,
        "max_tokens": 16,
    }
    values.update(overrides)
    return RequestInfo(**values)


def spans_by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    spans = exporter.get_finished_spans()
    out = {s.name: s for s in spans}
    assert len(out) == len(spans), f"duplicate span names: {[s.name for s in spans]}"
    return out


def sample_value(telemetry: Telemetry, name: str, **labels: str) -> float:
    value = telemetry.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
