"""Gateway configuration: one frozen dataclass, validated once.

Environment variables are read here and nowhere else: ``CARPOOL_*``, ``REDIS_URL`` and the
OpenTelemetry endpoint variables (whether spans are exported, and where). CLI flags and tests
pass explicit values, which win over the environment. The per-tier service objectives
(``tier_slos``) also come from the tenants file's ``[tiers.<name>]`` tables, which the
environment's ``CARPOOL_TIER_SLOS`` overrides field by field, and a flag's string of the same
form (``--tier-slos``) overrides both. (The OTel SDK's exporter still reads its
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

from gateway.tenancy.tenants import read_tenants_doc
from policies.budget import Price, parse_prices
from policies.tiers import (
    DEFAULT_TIER_SLOS,
    DEFAULT_TIER_WEIGHTS,
    OVERLOAD_ACTIONS,
    TIERS,
    TierSLO,
    normalize_tier,
)

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
    # TLS to Redis (a rediss:// URL): the CA that signed the server's certificate, and a client
    # certificate and its key when the server asks for one (``redis_connection_url``)
    redis_ca: str | None = None
    redis_cert: str | None = None
    redis_key: str | None = None
    namespace: str = "carpool"  # Redis key prefix (several deployments/tests on one server)
    secret: str | None = None  # HMAC key for API keys; None = <state_dir>/secret
    admin_key: str | None = None  # registered as an admin key at start when set
    state_dir: str = str(Path.home() / ".local" / "state" / "carpool")
    create_demo_tenant: bool = True
    max_body_bytes: int = 1 << 20
    tier_weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
    # per tier: TTFT/TPOT p99 targets and the overload action (shed | queue); every tier has
    # one (missing ones get policies.tiers.DEFAULT_TIER_SLOS)
    tier_slos: Mapping[str, TierSLO] = field(default_factory=lambda: dict(DEFAULT_TIER_SLOS))
    queue_max_len: int = 1000  # per tier: queued + running entries before 429
    default_max_tokens: int = 256
    request_timeout_s: float = 600.0  # total server-side deadline per request
    stall_timeout_s: float = 30.0  # a client that stops reading for this long is cancelled
    # a connection whose request headers are not complete this long after it opened (or after
    # its next request's first byte) is closed (``http/conn_limits.py``)
    header_timeout_s: float = 10.0
    max_connections: int = 4096  # open HTTP connections per process; more get a 503 at once
    visibility_timeout_s: float = 30.0  # pending entries of a silent worker are reclaimed
    # on SIGTERM: how long a worker lets its requests finish before it hands the rest to
    # another worker (0: at once), and how long a gateway lets its open streams finish
    drain_timeout_s: float = 30.0
    # prefix-aware placement (``policies/placement.py``, docs/fleet.md): a gateway tags each
    # entry with the worker its prompt's leading KV blocks hash to; workers leave it to that
    # worker this long before any may take it. 0 = off (every worker takes any entry).
    placement_wait_ms: float = 0.0
    placement_blocks: int = 16  # leading KV blocks of a prompt that choose its worker
    # a worker past this x the mean of a gateway's recent placements is passed over for the
    # next in the prompt's order (a hot prefix spills); 0 = no bound
    placement_load_factor: float = 1.25
    stream_ttl_s: int = 300  # out:{id} streams expire after this even if nobody reads them
    auth_cache_s: float = 0.5  # key->tenant cache; revocation is visible within this
    # the usage ledger (``tenancy/ledger.py``): hourly rows per tenant, kept this many days
    # after their last write; ledger=False writes none (the bench's ledger-off row)
    ledger: bool = True
    usage_retention_days: int = 90
    audit_max_entries: int = 10_000  # the audit stream keeps about this many (tenancy/audit.py)
    # per model: price per 1M prompt / cached / completion tokens (``policies.budget``), for
    # the ledger's cost and cost budgets. CARPOOL_PRICES="model=0.15/0.075/0.6;..."
    prices: Mapping[str, Price] = field(default_factory=dict)
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
    # unknown top-level request fields: False = ignored (as OpenAI does), True = 400
    strict_api: bool = False
    max_n: int = 8  # the most choices (``n``) one request may ask for
    # structured outputs: the largest schema/regex/grammar a request may send (bytes), and
    # how long the gateway waits for it to compile before a 400 (docs/structured-outputs.md)
    max_grammar_bytes: int = 32768
    grammar_compile_timeout_s: float = 2.0
    # the engine's step thread picks its torch thread count each step by contention
    # (CARPOOL_ADAPTIVE_THREADS=1: opt-in; gateway/cli/main.py then spins OpenMP)
    adaptive_threads: bool = False

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
        if set(self.tier_slos) - set(TIERS) or not all(
                isinstance(v, TierSLO) for v in self.tier_slos.values()):
            raise ValueError(f"tier_slos must map tiers {TIERS} to TierSLO: {self.tier_slos}")
        object.__setattr__(self, "tier_slos",
                           {t: self.tier_slos.get(t, DEFAULT_TIER_SLOS[t]) for t in TIERS})
        for name in ("request_timeout_s", "stall_timeout_s", "visibility_timeout_s",
                     "header_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if min(self.queue_max_len, self.max_body_bytes, self.default_max_tokens,
               self.max_connections) < 1:
            raise ValueError("queue_max_len, max_body_bytes, default_max_tokens, max_connections "
                             "must be >= 1")
        if self.max_n < 1:
            raise ValueError("max_n must be >= 1")
        if not all(isinstance(p, Price) for p in self.prices.values()):
            raise ValueError(f"prices must map model names to Price: {self.prices}")
        if self.audit_max_entries < 100:
            raise ValueError("audit_max_entries must be >= 100")
        if not 1 <= self.usage_retention_days <= 3660:
            raise ValueError("usage_retention_days must be in 1..3660")
        if self.max_grammar_bytes < 1 or self.grammar_compile_timeout_s <= 0:
            raise ValueError("max_grammar_bytes must be >= 1, grammar_compile_timeout_s > 0")
        if not 0 <= self.placement_wait_ms <= 10_000 or self.placement_blocks < 1 or not (
                self.placement_load_factor == 0 or self.placement_load_factor >= 1):
            raise ValueError("placement_wait_ms must be in [0, 10000], placement_blocks >= 1, "
                             "placement_load_factor 0 or >= 1")
        if not 0 <= self.drain_timeout_s <= 3600:
            raise ValueError(f"drain_timeout_s must be in [0, 3600], got {self.drain_timeout_s}")
        if not self.namespace or ":" in self.namespace:
            raise ValueError("namespace must be non-empty and contain no ':'")
        self._check_tls_files()

    def _check_tls_files(self) -> None:
        files = {"redis_ca": self.redis_ca, "redis_cert": self.redis_cert,
                 "redis_key": self.redis_key}
        given = {k: v for k, v in files.items() if v}
        if not given:
            return
        if not (self.redis_url or "").startswith("rediss://"):
            raise ValueError(f"{', '.join(given)} need a rediss:// REDIS_URL (TLS)")
        if bool(self.redis_cert) != bool(self.redis_key):
            raise ValueError("redis_cert and redis_key go together")
        for name, path in given.items():
            if not Path(path).is_file():
                raise ValueError(f"{name}: no such file: {path}")

    @property
    def redis_connection_url(self) -> str | None:
        """``redis_url`` with the TLS files as its options (``ssl_ca_certs``, ``ssl_certfile``,
        ``ssl_keyfile``), which redis-py's URL parser hands to its TLS connection; every
        client of the process is made from this URL (``bus/client.py``)."""
        if self.redis_url is None:
            return None
        from urllib.parse import urlencode

        opts = [(k, v) for k, v in (("ssl_ca_certs", self.redis_ca),
                                    ("ssl_certfile", self.redis_cert),
                                    ("ssl_keyfile", self.redis_key)) if v]
        if not opts:
            return self.redis_url
        sep = "&" if "?" in self.redis_url else "?"
        return f"{self.redis_url}{sep}{urlencode(opts)}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> GatewayConfig:
        """Defaults, then ``CARPOOL_*``/``REDIS_URL``/OTel endpoints from ``env``, then
        non-None overrides."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in ("otlp_endpoint", "tier_slos"):
                continue
            raw = env.get("REDIS_URL" if f.name == "redis_url" else f"CARPOOL_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _parse(f.name, raw, f.type)
        endpoint = otlp_traces_endpoint(env)
        if endpoint is not None:
            values["otlp_endpoint"] = endpoint
        given = {k: v for k, v in overrides.items() if v is not None}
        tenants_file = given.get("tenants_file", values.get("tenants_file"))
        specs, file_weights = tiers_from_file(tenants_file) if tenants_file else ({}, {})
        if file_weights and "tier_weights" not in values:  # CARPOOL_TIER_WEIGHTS wins
            values["tier_weights"] = {**DEFAULT_TIER_WEIGHTS, **file_weights}
        flag = given.pop("tier_slos", {})  # a flag's string, or TierSLOs (whole tiers)
        for raw in (env.get("CARPOOL_TIER_SLOS", ""), flag if isinstance(flag, str) else ""):
            for tier, spec in parse_tier_slos(raw).items():
                specs[tier] = {**specs.get(tier, {}), **spec}  # later wins, field by field
        values["tier_slos"] = {
            t: dataclasses.replace(DEFAULT_TIER_SLOS[t], **specs.get(t, {})) for t in TIERS}
        if not isinstance(flag, str):
            values["tier_slos"].update(flag)
        values.update(given)
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
    if name == "prices":
        return parse_prices(raw)
    if name == "engine_options":
        raise ValueError("engine options come from CLI flags, not the environment")
    if text.startswith("bool"):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if text.startswith("int"):
        return int(raw)
    if text.startswith("float"):
        return float(raw)
    return raw


# Field names a tier's objective may be given by (file tables and CARPOOL_TIER_SLOS).
_SLO_FIELDS = {"ttft": "ttft_p99_s", "ttft_p99_s": "ttft_p99_s",
               "tpot": "tpot_p99_s", "tpot_p99_s": "tpot_p99_s", "action": "action",
               "tpot_budget": "tpot_budget_x", "tpot_budget_x": "tpot_budget_x"}
_SLO_NUMBERS = ("ttft_p99_s", "tpot_p99_s", "tpot_budget_x")


def _tier_name(name: str) -> str:
    tier = normalize_tier(name)
    if tier is None:
        raise ValueError(f"unknown tier {name!r} (tiers: {', '.join(TIERS)})")
    return tier


def parse_tier_slos(raw: str) -> dict[str, dict[str, Any]]:
    """``"interactive=ttft:2,tpot:0.5,shed;batch=ttft:120,queue"`` -> per tier, the fields
    given (``ttft_p99_s``, ``tpot_p99_s``, ``tpot_budget_x`` as ``tpot_budget:1.5``: the TPOT
    budget in lone steps, ``action``); a tier or field left out keeps its value from
    elsewhere."""
    out: dict[str, dict[str, Any]] = {}
    for item in raw.split(";"):
        if not item.strip():
            continue
        tier, sep, body = item.partition("=")
        if not sep:
            raise ValueError(f"tier objective {item!r}: expected <tier>=ttft:S,tpot:S,shed|queue")
        spec = out.setdefault(_tier_name(tier), {})
        for part in (p.strip() for p in body.split(",")):
            key, sep, value = part.partition(":")
            if part in OVERLOAD_ACTIONS:
                spec["action"] = part
            elif sep and _SLO_FIELDS.get(key.strip()) in _SLO_NUMBERS:
                spec[_SLO_FIELDS[key.strip()]] = float(value)
            elif part:
                raise ValueError(f"tier objective {item!r}: unknown part {part!r}")
    return out


def tiers_from_file(path: str | Path) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """The ``[tiers.<name>]`` tables of a tenants file (TOML, or YAML of the same shape):
    per tier the objective's fields (``ttft_p99_s``, ``tpot_p99_s``, ``action``) and the
    tiers' drain weights (``weight``)."""
    path = Path(path)
    doc = read_tenants_doc(path)
    tables = doc.get("tiers", {})
    if not isinstance(tables, dict):
        raise ValueError(f"{path}: 'tiers' must be a table of tier names")  # noqa: TRY004
    specs: dict[str, dict[str, Any]] = {}
    weights: dict[str, int] = {}
    for name, table in tables.items():
        tier = _tier_name(str(name))
        unknown = set(table) - set(_SLO_FIELDS) - {"weight"}
        if unknown:
            raise ValueError(f"{path}: tier {tier}: unknown fields {sorted(unknown)}")
        specs[tier] = {_SLO_FIELDS[k]: v for k, v in table.items() if k != "weight"}
        if "weight" in table:
            weights[tier] = int(table["weight"])
    return specs, weights


def parse_weights(raw: str) -> dict[str, int]:
    """``"interactive=6,batch=3,best-effort=1"`` -> dict."""
    out: dict[str, int] = {}
    for part in raw.split(","):
        if part.strip():
            tier, _, weight = part.partition("=")
            out[tier.strip()] = int(weight)
    return out
