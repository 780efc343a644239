"""Gateway configuration: one frozen dataclass, validated once.

Environment variables are read here and nowhere else: ``CARPOOL_*``, ``REDIS_URL`` and the
OpenTelemetry endpoint variables (whether spans are exported, and where). CLI flags and tests
pass explicit values, which win over the environment. (The OTel SDK's exporter still reads its
own standard ``OTEL_EXPORTER_OTLP_*`` variables for headers and timeouts: the library's
documented interface.)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.tiers import DEFAULT_TIER_WEIGHTS, TIERS

ROLES = ("all", "gateway", "worker")
OTLP_TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"  # the traces URL, as is
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"  # a base URL for every signal
ENGINES = ("real", "echo")


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    role: str = "all"  # all = gateway + worker + engine in one process
    engine: str = "real"  # echo = FakeEchoEngine (benchmarks and gateway tests only)
    model: str | None = None  # HF checkpoint dir; None = bundled SmolLM2
    tenants_file: str | None = None
    redis_url: str | None = None  # None = start an embedded server
    namespace: str = "carpool"  # Redis key prefix (several deployments/tests on one server)
    secret: str | None = None  # HMAC key for API keys; None = <state_dir>/secret
    admin_key: str | None = None  # registered as an admin key at start when set
    state_dir: str = str(Path.home() / ".local" / "state" / "carpool")
    create_demo_tenant: bool = True
    max_body_bytes: int = 1 << 20
    tier_weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
    queue_max_len: int = 1000  # per tier: queued + running entries before 429
    default_max_tokens: int = 256
    request_timeout_s: float = 600.0  # total server-side deadline per request
    stall_timeout_s: float = 30.0  # a client that stops reading for this long is cancelled
    visibility_timeout_s: float = 30.0  # pending entries of a silent worker are reclaimed
    stream_ttl_s: int = 300  # out:{id} streams expire after this even if nobody reads them
    auth_cache_s: float = 0.5  # key->tenant cache; revocation is visible within this
    worker_id: str | None = None  # consumer name; None = host-pid-random
    echo_step_ms: float = 0.0  # fake engine: delay per step
    trace_console: bool = False  # print finished spans to stdout
    # OTLP/HTTP traces URL; None = export nothing. From the OTel endpoint variables, not CARPOOL_*.
    otlp_endpoint: str | None = None
    # uvicorn's line per request; off by default: spans and metrics carry the same facts and
    # the log line costs ~40 us of CPU on every response
    access_log: bool = False
    metrics_port: int = 0  # worker-only processes: serve /metrics on this port (0 = off)
    engine_options: Mapping[str, Any] = field(default_factory=dict)  # EngineConfig.from_kwargs

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"bad port {self.port}")
        unknown = set(self.tier_weights) - set(TIERS)
        if unknown or any(w < 0 for w in self.tier_weights.values()):
            raise ValueError(f"tier weights must be >= 0 for tiers {TIERS}: {self.tier_weights}")
        if sum(self.tier_weights.values()) <= 0:
            raise ValueError("at least one tier weight must be positive")
        for name in ("request_timeout_s", "stall_timeout_s", "visibility_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.queue_max_len < 1 or self.max_body_bytes < 1 or self.default_max_tokens < 1:
            raise ValueError("queue_max_len, max_body_bytes, default_max_tokens must be >= 1")
        if not self.namespace or ":" in self.namespace:
            raise ValueError("namespace must be non-empty and contain no ':'")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> GatewayConfig:
        """Defaults, then ``CARPOOL_*``/``REDIS_URL``/OTel endpoints from ``env``, then
        non-None overrides."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "otlp_endpoint":
                continue
            raw = env.get("REDIS_URL" if f.name == "redis_url" else f"CARPOOL_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _parse(f.name, raw, f.type)
        endpoint = otlp_traces_endpoint(env)
        if endpoint is not None:
            values["otlp_endpoint"] = endpoint
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> GatewayConfig:
        return dataclasses.replace(self, **changes)


def otlp_traces_endpoint(env: Mapping[str, str]) -> str | None:
    """The traces URL the standard OTel variables name, resolved as the OTel spec (and the
    SDK's exporter) does: the traces variable as is, else the base URL + ``/v1/traces``;
    None when neither is set (then nothing is exported and no exporter thread runs)."""
    if traces := env.get(OTLP_TRACES_ENDPOINT_ENV):
        return traces
    if base := env.get(OTLP_ENDPOINT_ENV):
        return f"{base.removesuffix('/')}/v1/traces"
    return None


def _parse(name: str, raw: str, type_name: Any) -> Any:
    text = str(type_name)
    if name == "tier_weights":
        return parse_weights(raw)
    if name == "engine_options":
        raise ValueError("engine options come from CLI flags, not the environment")
    if text.startswith("bool"):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if text.startswith("int"):
        return int(raw)
    if text.startswith("float"):
        return float(raw)
    return raw


def parse_weights(raw: str) -> dict[str, int]:
    """``"interactive=6,batch=3,best-effort=1"`` -> dict."""
    out: dict[str, int] = {}
    for part in raw.split(","):
        if part.strip():
            tier, _, weight = part.partition("=")
            out[tier.strip()] = int(weight)
    return out
