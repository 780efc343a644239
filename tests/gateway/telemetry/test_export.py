"""Exporters: console output with --trace-console, OTLP/HTTP only when the OTel env says so."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from gateway.config import GatewayConfig
from gateway.telemetry import Telemetry, TelemetryConfig
from tests.gateway.telemetry.factories import make_info


class _Collector(BaseHTTPRequestHandler):
    posts: ClassVar[list[tuple[str, str, int]]] = []

    def do_POST(self) -> None:
        size = int(self.headers.get("content-length", 0))
        body = self.rfile.read(size)
        _Collector.posts.append((self.path, self.headers.get("content-type", ""), len(body)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    _Collector.posts = []
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_otlp_http_export_when_endpoint_is_set(
    collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
    endpoint = GatewayConfig.from_env().otlp_endpoint  # the one place the environment is read
    telemetry = Telemetry(TelemetryConfig(service_name="carpool-test", otlp_endpoint=endpoint))
    telemetry.start_request(make_info()).finish("stop", completion_tokens=1)
    telemetry.shutdown()  # flushes the batch processor
    assert [(p, t) for p, t, _ in _Collector.posts] == [("/v1/traces", "application/x-protobuf")]
    assert _Collector.posts[0][2] > 0


def test_nothing_is_exported_without_the_env(collector: str) -> None:
    telemetry = Telemetry(TelemetryConfig(otlp_endpoint=GatewayConfig.from_env({}).otlp_endpoint))
    telemetry.start_request(make_info()).finish("stop")
    telemetry.shutdown()
    assert _Collector.posts == []


def test_trace_console_prints_spans(capsys: pytest.CaptureFixture[str]) -> None:
    telemetry = Telemetry(TelemetryConfig(console=True))
    telemetry.start_request(make_info(model="tiny")).finish("length", completion_tokens=2)
    telemetry.shutdown()
    out = capsys.readouterr().out
    assert '"name": "chat tiny"' in out
    assert '"carpool.tenant.id": "acme"' in out
