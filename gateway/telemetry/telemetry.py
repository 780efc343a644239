"""One process's telemetry: tracer provider, tracer and metrics on one object.

Created in the app's lifespan (or at worker start), kept on ``app.state.telemetry`` and passed
to whoever records: no module-level singletons, no global tracer provider, no default registry.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor
from starlette.requests import Request
from starlette.responses import Response

from gateway.telemetry.config import TelemetryConfig
from gateway.telemetry.engine_sampler import EngineSampler
from gateway.telemetry.metrics import CONTENT_TYPE, Metrics
from gateway.telemetry.request_span import RequestInfo, RequestRecorder
from gateway.telemetry.tracing import (
    build_tracer_provider,
    extract_context,
    now_ns,
    receives_spans,
)
from gateway.telemetry.worker_trace import WorkerRequestTrace


class Telemetry:
    def __init__(
        self, config: TelemetryConfig | None = None, *,
        span_processors: Sequence[SpanProcessor] = (),
    ) -> None:
        self.config = config or TelemetryConfig()
        self.tracer_provider = build_tracer_provider(self.config, span_processors)
        # with nobody to receive spans, none are built (the SDK's would be made and dropped)
        self.tracing = receives_spans(self.config, span_processors)
        self.tracer: trace.Tracer = (self.tracer_provider.get_tracer("carpool") if self.tracing
                                     else trace.NoOpTracer())
        self.metrics = Metrics()
        self.engine_sampler = EngineSampler(self.metrics)
        self._metrics_server: Any = None

    # -- gateway ---------------------------------------------------------------------------

    def start_request(
        self, info: RequestInfo, started_at: float | None = None,
        parent_traceparent: str | None = None,
    ) -> RequestRecorder:
        """Open the request's root span (a child of the caller's own trace when the HTTP
        request carried a ``traceparent``); finish the returned recorder (later calls are
        no-ops). ``started_at``: the request's arrival, ``time.monotonic()``."""
        return RequestRecorder(
            self.tracer, self.metrics, info, tenant_labels=self.config.tenant_labels,
            started_at=started_at, parent=extract_context(parent_traceparent),
        )

    def quota_rejected(self, limit: str) -> None:
        """A tenant limit refused a request (``limit``: rpm, tpm, concurrency, queue, ...)."""
        self.metrics.quota_rejections.labels(limit).inc()

    # -- worker ----------------------------------------------------------------------------

    def worker_trace(
        self, *, request_id: str, tier: str, traceparent: str | None,
        queue_wait_s: float | None = None, arrival_unix: float | None = None,
    ) -> WorkerRequestTrace:
        """Child spans for a request a worker has just taken from its queue. The queue span
        starts ``queue_wait_s`` ago, or at ``arrival_unix`` (the envelope's enqueue time,
        seconds since the epoch); with neither it has no length."""
        taken = now_ns()
        enqueued = None
        if queue_wait_s is not None:
            enqueued = taken - int(queue_wait_s * 1e9)
        elif arrival_unix:
            enqueued = int(arrival_unix * 1e9)
        return WorkerRequestTrace(
            self.tracer, self.metrics, request_id=request_id, tier=tier,
            traceparent=traceparent, enqueued_ns=enqueued,
            taken_ns=taken,
        )

    def serve_metrics(self, port: int, host: str = "127.0.0.1") -> None:
        """``/metrics`` on its own port, for a worker-only process that has no HTTP app."""
        from prometheus_client import start_http_server

        server, thread = start_http_server(port, addr=host, registry=self.metrics.registry)
        self._metrics_server = (server, thread)

    def shutdown(self) -> None:
        """Flush and stop exporters; stop the metrics server if one was started."""
        if self._metrics_server is not None:
            server, thread = self._metrics_server
            server.shutdown()
            server.server_close()
            if isinstance(thread, threading.Thread):
                thread.join(timeout=5)
            self._metrics_server = None
        self.tracer_provider.shutdown()


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics``: the process's registry in Prometheus text format."""
    telemetry: Telemetry | None = getattr(request.app.state, "telemetry", None)
    if telemetry is None:  # an app assembled with events that keep no metrics
        return Response("no metrics in this process\n", status_code=404)
    return Response(telemetry.metrics.render(), media_type=CONTENT_TYPE)
