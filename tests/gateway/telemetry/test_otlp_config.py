"""Where spans go is configuration: ``GatewayConfig`` resolves the standard OTel endpoint
variables (as the SDK's exporter would), telemetry is handed the result and reads no
environment itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from gateway.config import OTLP_ENDPOINT_ENV, OTLP_TRACES_ENDPOINT_ENV, GatewayConfig
from gateway.telemetry.gateway_events import events_for

ROOT = Path(__file__).resolve().parents[3]
# Modules that may touch os.environ, and why.
ALLOWED = {
    "gateway/config.py": "reads it: the one place",
    "gateway/cli/main.py": "writes OMP_WAIT_POLICY before torch loads",
    "gateway/process.py": "hands it to the server processes the benchmarks start",
}

CASES = [
    {OTLP_ENDPOINT_ENV: "http://collector:4318"},
    {OTLP_ENDPOINT_ENV: "http://collector:4318/"},
    {OTLP_TRACES_ENDPOINT_ENV: "http://traces:9999/custom"},
    {OTLP_ENDPOINT_ENV: "http://collector:4318", OTLP_TRACES_ENDPOINT_ENV: "http://t:1/x"},
]


@pytest.mark.parametrize("env", CASES)
def test_the_endpoint_is_the_one_the_sdk_would_pick(env: dict[str, str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (OTLP_ENDPOINT_ENV, OTLP_TRACES_ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporter = OTLPSpanExporter()  # the SDK resolving the same variables itself
    try:
        assert GatewayConfig.from_env(env).otlp_endpoint == exporter._endpoint
    finally:
        exporter.shutdown()


def test_no_endpoint_variable_means_no_export() -> None:
    assert GatewayConfig.from_env({}).otlp_endpoint is None
    assert GatewayConfig.from_env({"CARPOOL_OTLP_ENDPOINT": "http://x:1"}).otlp_endpoint is None


def test_events_for_takes_the_endpoint_from_the_gateway_config() -> None:
    on = events_for("worker", GatewayConfig(otlp_endpoint="http://127.0.0.1:1/v1/traces",
                                            trace_console=True))
    off = events_for("gateway", GatewayConfig())
    try:
        assert on.telemetry.config.otlp_endpoint == "http://127.0.0.1:1/v1/traces"
        assert on.telemetry.config.console and on.telemetry.config.service_name == "carpool-worker"
        assert not off.telemetry.config.otlp and not off.telemetry.config.console
    finally:
        on.telemetry.shutdown()
        off.telemetry.shutdown()


def _touches_environ(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
               or isinstance(node, ast.alias) and node.name in ("environ", "getenv")
               for node in ast.walk(tree))


def test_the_gateway_reads_its_environment_in_one_place() -> None:
    files = sorted((ROOT / "gateway").rglob("*.py"))
    assert len(files) > 20
    touching = {str(p.relative_to(ROOT)) for p in files if _touches_environ(p)}
    assert touching <= set(ALLOWED), touching - set(ALLOWED)
    assert "gateway/config.py" in touching  # the scan sees a real read
