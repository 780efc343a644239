"""Prometheus metrics for one process, on a registry object of its own (never the client
library's global one), so that tests and several apps in one process do not collide.

Latency histograms are by tier: seed 004 asks for distributions split by queue, not averages.
Names follow the OpenTelemetry GenAI conventions where they exist (``gen_ai.server.*``, seen
through Prometheus as ``gen_ai_server_*_seconds``) and ``carpool_*`` otherwise.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# From a few ms (tiny models, interactive) to minutes (long summaries queued behind batch work).
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
    120.0, 300.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5,
)
# the TTFT budget's parts: a few ms (Redis, the drainer) up to seconds (a queue under overload)
PART_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.125,
    0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
)
STEP_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Every instrument Carpool exports, created once per process on ``self.registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._request_metrics()
        self._queue_metrics()
        self._engine_metrics()
        self._tenant_metrics()

    def _request_metrics(self) -> None:
        r = self.registry
        self.ttft = Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from request arrival at the gateway to its first output token",
            ["tier"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.tpot = Histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Mean time per output token after the first, per request",
            ["tier"], buckets=TOKEN_LATENCY_BUCKETS, registry=r,
        )
        self.ttft_part = Histogram(
            "carpool_ttft_part_seconds",
            "The TTFT budget: each part of the time to first token (policies/ttft_split.py)",
            ["tier", "part"], buckets=PART_BUCKETS, registry=r,
        )
        self.ttft_steps = Histogram(
            "carpool_ttft_steps",
            "Engine steps from the worker's read of a request to its first token, that one "
            "included (kind=all), and of them its prompt's (kind=prefill)",
            ["tier", "kind"], buckets=STEP_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "carpool_inter_token_latency_seconds",
            "Gap between consecutive output tokens as the gateway streams them",
            ["tier"], buckets=TOKEN_LATENCY_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "gen_ai_server_request_duration_seconds",
            "End-to-end request time at the gateway, arrival to last byte",
            ["tier"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.requests = Counter(
            "carpool_requests", "Finished requests by finish reason",
            ["tier", "tenant", "finish_reason"], registry=r,
        )
        self.tokens = Counter(
            "carpool_tokens", "Tokens processed, by type (prompt | completion)",
            ["tier", "type"], registry=r,
        )
        self.aborts = Counter(
            "carpool_aborts", "Requests cut short, by cause", ["tier", "cause"], registry=r,
        )
        self.quota_rejections = Counter(
            "carpool_quota_rejections", "Requests refused with 429 by a limit (rpm, tpm, "
            "concurrency, queue), by limit", ["limit"], registry=r,
        )
        self.rejections = Counter(
            "carpool_rejections", "Requests refused before admission, by status and code",
            ["status", "code"], registry=r,
        )
        self.dropped = Counter(
            "carpool_dropped", "Envelopes a worker took but did not run, by reason",
            ["reason"], registry=r,
        )

    def _queue_metrics(self) -> None:
        r = self.registry
        self.queue_wait = Histogram(
            "carpool_queue_wait_seconds", "Time an envelope spent in its tier queue",
            ["tier"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.queue_depth = Gauge(
            "carpool_queue_depth", "Envelopes waiting in each tier queue", ["tier"], registry=r,
        )

    def _engine_metrics(self) -> None:
        r = self.registry
        self.engine_requests = Gauge(
            "carpool_engine_requests", "Requests inside the engine by state",
            ["state"], registry=r,
        )
        self.kv_blocks = Gauge(
            "carpool_kv_blocks", "KV-cache blocks on the device by state (used | free)",
            ["state"], registry=r,
        )
        self.batch_size = Histogram(
            "carpool_engine_batch_size", "Requests scheduled per engine step",
            buckets=COUNT_BUCKETS, registry=r,
        )
        self.step_tokens = Histogram(
            "carpool_engine_step_tokens", "Tokens computed per engine step",
            buckets=COUNT_BUCKETS, registry=r,
        )
        self.step_seconds = Histogram(
            "carpool_engine_step_seconds", "Wall time of one engine step",
            buckets=TOKEN_LATENCY_BUCKETS, registry=r,
        )
        self.prefix_cache_hits = Counter(
            "carpool_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
            registry=r,
        )
        self.prefix_cache_queries = Counter(
            "carpool_prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache",
            registry=r,
        )
        self.swap_blocks = Counter(
            "carpool_swap_blocks", "KV blocks copied between device and CPU, by direction",
            ["direction"], registry=r,
        )
        self.preemptions = Counter(
            "carpool_preemptions", "Requests preempted, by mode (recompute | swap)",
            ["mode"], registry=r,
        )

    def _tenant_metrics(self) -> None:
        """Per tier and tenant, for the operator console's admission and tenant panels
        (``gateway/telemetry/stats_snapshot.py``); the tenant label is ``-`` when
        ``TelemetryConfig.tenant_labels`` is off."""
        r = self.registry
        self.admissions = Counter(
            "carpool_admissions", "Requests admitted into a tier queue", ["tier", "tenant"],
            registry=r,
        )
        self.request_rejections = Counter(
            "carpool_request_rejections", "Requests refused (429 limits, sheds, auth), by tier "
            "('-' before a tier is known), tenant, reason and status",
            ["tier", "tenant", "reason", "status"], registry=r,
        )
        self.tenant_tokens = Counter(
            "carpool_tenant_tokens", "Tokens processed per tenant, by type (prompt | completion)",
            ["tenant", "type"], registry=r,
        )
        self.tenant_ttft = Histogram(
            "carpool_tenant_time_to_first_token_seconds",
            "Time to first token per tenant (the tier histograms' per-tenant view)",
            ["tenant"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.engine_seats = Gauge(
            "carpool_engine_max_num_seqs", "Rows an engine may run at once (its max_num_seqs)",
            registry=r,
        )

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)
