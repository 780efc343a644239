"""Telemetry configuration: one frozen dataclass, the only place telemetry looks at the
environment.

Exporting follows the standard OpenTelemetry variables, which the SDK's exporter reads itself
(endpoint, headers, timeouts): Carpool only checks whether an OTLP endpoint is set at all, so
that nothing is exported, and no exporter thread runs, unless someone asked for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

OTLP_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@dataclass(frozen=True)
class TelemetryConfig:
    """How one process (gateway, worker or both) reports.

    ``otlp``: export spans over OTLP/HTTP (endpoint and headers from the OTel env vars).
    ``console``: print finished spans to stdout (``--trace-console``).
    ``tenant_labels``: label per-request counters with the tenant id; tenants come from
    config, so cardinality is bounded there; turn off for very many tenants.
    """

    service_name: str = "carpool"
    otlp: bool = False
    console: bool = False
    tenant_labels: bool = True

    def __post_init__(self) -> None:
        if not self.service_name:
            raise ValueError("service_name must not be empty")

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        service_name: str = "carpool",
        console: bool = False,
        tenant_labels: bool = True,
    ) -> TelemetryConfig:
        env = os.environ if environ is None else environ
        otlp = any(env.get(name) for name in OTLP_ENDPOINT_VARS)
        return cls(
            service_name=service_name, otlp=otlp, console=console, tenant_labels=tenant_labels
        )
