"""Telemetry configuration: one frozen dataclass. Telemetry reads no environment: the OTLP
endpoint comes from ``gateway.config.GatewayConfig`` (which resolves the standard OTel
endpoint variables), so nothing is exported, and no exporter thread runs, unless someone
asked for it. The SDK's exporter still reads its own ``OTEL_EXPORTER_OTLP_*`` headers and
timeouts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TelemetryConfig:
    """How one process (gateway, worker or both) reports.

    ``otlp_endpoint``: export spans over OTLP/HTTP to this traces URL (None: no export).
    ``console``: print finished spans to stdout (``--trace-console``).
    ``tenant_labels``: label per-request counters with the tenant id; tenants come from
    config, so cardinality is bounded there; turn off for very many tenants.
    """

    service_name: str = "carpool"
    otlp_endpoint: str | None = None
    console: bool = False
    tenant_labels: bool = True

    def __post_init__(self) -> None:
        if not self.service_name:
            raise ValueError("service_name must not be empty")

    @property
    def otlp(self) -> bool:
        return self.otlp_endpoint is not None
