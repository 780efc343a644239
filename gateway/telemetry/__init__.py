"""Observability: OpenTelemetry traces (one per request, gateway -> queue -> worker) and
Prometheus metrics (latency distributions by tier, engine and queue state)."""

from __future__ import annotations

from gateway.telemetry.config import TelemetryConfig
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.request_span import RequestInfo, RequestRecorder, RequestSummary
from gateway.telemetry.telemetry import Telemetry, metrics_endpoint
from gateway.telemetry.tracing import extract_context, inject_traceparent
from gateway.telemetry.worker_trace import WorkerRequestTrace

__all__ = [
    "Metrics",
    "RequestInfo",
    "RequestRecorder",
    "RequestSummary",
    "Telemetry",
    "TelemetryConfig",
    "WorkerRequestTrace",
    "extract_context",
    "inject_traceparent",
    "metrics_endpoint",
]
