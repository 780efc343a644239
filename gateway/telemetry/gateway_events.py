"""``TelemetryEvents``: the gateway's observability hooks (``gateway.telemetry.events.GatewayEvents``)
implemented with this package's spans and metrics.

The same object serves the gateway side (request spans, latency histograms, rejections) and the
worker side (queue/prefill/decode child spans, engine and queue sampling); in ``--role all``
one instance does both, in split roles each process has its own. Hooks never raise into the
request path: a telemetry bug must not fail a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from engine.protocol import EngineClient
from gateway.bus.backoff import stop_tasks
from gateway.bus.keys import RedisKeys
from gateway.bus.messages import reason_of_outcome
from gateway.config import GatewayConfig
from gateway.telemetry.config import TelemetryConfig
from gateway.telemetry.events import GatewayEvents
from gateway.telemetry.request_span import RequestInfo, RequestRecorder
from gateway.telemetry.stats_publish import MetricsPublisher
from gateway.telemetry.stats_snapshot import StatsHistory
from gateway.telemetry.step_observer import StepFact, StepObserver
from gateway.telemetry.telemetry import Telemetry
from gateway.telemetry.worker_trace import WorkerRequestTrace
from policies.admission import EngineLoad
from policies.ttft_split import WorkerMarks

log = logging.getLogger("carpool.telemetry")


# The gateway's cancel sources -> the abort causes operators see.
CAUSES = {"disconnect": "client_gone", "explicit": "cancel", "deadline": "timeout",
          "stalled": "client_stalled"}
# The worker's drop statuses we label by; anything else (free-text errors) is "other".
DROP_REASONS = ("cancelled", "finished", "gone", "lost", "deadline")
SAMPLE_INTERVAL_S = 1.0
MAX_OPEN = 50_000  # open request records kept; far above any real concurrency

F = TypeVar("F", bound=Callable[..., Any])


def _safe(hook: F) -> F:
    """Hooks run inside the request path and the engine's step callback: log, never raise."""

    @functools.wraps(hook)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except Exception:
            log.exception("telemetry hook %s failed", hook.__name__)
            return None

    return wrapper  # type: ignore[return-value]


def events_for(role: str, config: GatewayConfig) -> TelemetryEvents:
    """The events a serving process uses by default: its own Telemetry (OTLP export only when
    ``config`` names an endpoint), shut down with the process."""
    telemetry = TelemetryConfig(service_name=f"carpool-{role}", console=config.trace_console,
                                otlp_endpoint=config.otlp_endpoint)
    return TelemetryEvents(Telemetry(telemetry), owns_telemetry=True)


class TelemetryEvents(GatewayEvents):
    def __init__(self, telemetry: Telemetry, *, owns_telemetry: bool = False) -> None:
        self.telemetry = telemetry
        self._owns_telemetry = owns_telemetry  # then stop() flushes and shuts it down
        self._recorders: dict[str, RequestRecorder] = {}
        self._causes: dict[str, str] = {}
        self._traces: dict[str, WorkerRequestTrace] = {}
        self._engine: EngineClient | None = None
        self._observer: StepObserver | None = None
        self._remove_observer: Callable[[], None] | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._stats_tasks: list[asyncio.Task[None]] = []
        self.stats_publisher: MetricsPublisher | None = None
        self.stats_history: StatsHistory | None = None  # HTTP processes: /admin/stats reads it

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, services: Any) -> None:
        """Bind to the process's ``Services`` (or, in a worker-only process, its ``Worker``):
        sample its engine and queues while it runs."""
        worker = getattr(services, "worker", None)
        if worker is None and hasattr(services, "queues"):
            worker = services
        self._engine = getattr(services, "engine", None) or getattr(worker, "engine", None)
        queues = getattr(worker, "queues", None)
        if self._engine is not None:
            self._attach_step_observer(self._engine)
        if queues is not None or self._engine is not None:
            self._sampler = asyncio.create_task(self._sample_forever(queues), name="telemetry")
        if self._engine is not None:
            self.telemetry.metrics.engine_seats.set(self._engine.load().max_num_seqs)
        self._start_stats(services)

    def _start_stats(self, services: Any) -> None:
        """Publish this process's metrics for the deployment-wide view; an HTTP process also
        keeps that view's history for ``GET /admin/stats`` (``stats_snapshot.py``)."""
        redis, config = getattr(services, "redis", None), getattr(services, "config", None)
        if redis is None or config is None:
            return
        keys = RedisKeys(config.namespace)
        self.stats_publisher = MetricsPublisher(redis, keys, self.telemetry.metrics.registry,
                                                config.role)
        self._stats_tasks.append(asyncio.create_task(self.stats_publisher.run(),
                                                     name="metrics-publish"))
        if config.role != "worker":
            self.stats_history = StatsHistory(
                redis, keys, tuple(config.tier_weights),
                ttft_targets={t: slo.ttft_p99_s for t, slo in config.tier_slos.items()})
            self._stats_tasks.append(asyncio.create_task(self.stats_history.run(),
                                                         name="stats-history"))

    def _attach_step_observer(self, engine: EngineClient) -> None:
        """Per-step facts straight from the engine thread: every step is seen exactly, so
        the observer owns the step histograms (the sampler keeps gauges and counters)."""
        self._observer = StepObserver(self.telemetry.metrics)
        self._remove_observer = engine.add_step_observer(self._observer)
        self.telemetry.engine_sampler.observe_steps = False

    async def stop(self) -> None:
        await stop_tasks(self._stats_tasks, log)
        self._stats_tasks.clear()
        if self.stats_publisher is not None:
            with contextlib.suppress(Exception):  # Redis already gone: the field expires
                await self.stats_publisher.withdraw()
        if self._remove_observer is not None:
            self._remove_observer()
            self._remove_observer = None
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        for rid in list(self._recorders):
            self._recorders.pop(rid).finish(FinishReason.ABORT, abort_cause="shutdown")
        self._traces.clear()
        if self._owns_telemetry:
            self.telemetry.shutdown()

    async def _sample_forever(self, queues: Any) -> None:
        sampler = self.telemetry.engine_sampler
        while True:
            try:
                if queues is not None:
                    sampler.sample_queues(await queues.backlogs())
                if self._engine is not None:
                    sampler.sample_engine(self._engine)
            except Exception:  # Redis hiccup: keep the last values, try again
                log.debug("telemetry sampling failed", exc_info=True)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    # -- gateway side -----------------------------------------------------------------------

    def request_started(
        self, request_id: str, tenant_id: str, tier: str, model: str, prompt_tokens: int,
        max_tokens: int | None, stream: bool, incoming_traceparent: str | None,
    ) -> str | None:
        info = RequestInfo(
            request_id=request_id, tenant_id=tenant_id, tier=tier, model=model,
            prompt_tokens=prompt_tokens, max_tokens=max_tokens, stream=stream,
            operation="chat" if request_id.startswith("chatcmpl") else "text_completion",
        )
        try:
            rec = self.telemetry.start_request(info, parent_traceparent=incoming_traceparent)
        except Exception:  # never fail a request over telemetry: pass the client's through
            log.exception("telemetry hook request_started failed")
            return incoming_traceparent
        self._recorders[request_id] = rec
        if len(self._recorders) > MAX_OPEN:  # a path that never finished its request: end it
            oldest = next(iter(self._recorders))
            self._recorders.pop(oldest).finish(FinishReason.ERROR, error="telemetry lost track")
        # not tracing here (no exporter): the client's own trace context goes on to the worker
        return rec.traceparent or incoming_traceparent

    @_safe
    def request_rejected(self, tenant_id: str | None, status: int, reason: str,
                         request_id: str | None = None, tier: str | None = None) -> None:
        if status == 429:
            self.telemetry.quota_rejected(reason)
        else:
            self.telemetry.metrics.rejections.labels(str(status), reason).inc()
        rec = self._recorders.pop(request_id, None) if request_id else None
        if tier is None and rec is not None:
            tier = rec.info.tier
        self.telemetry.metrics.request_rejections.labels(
            tier or "-", self._tenant(tenant_id or "-"), reason, str(status)).inc()
        if rec is not None:
            rec.finish("rejected", completion_tokens=0, error=f"{status} {reason}")

    @_safe
    def request_admitted(self, tenant_id: str, tier: str, request_id: str,
                         prompt_tokens: int, traceparent: str | None) -> None:
        self.telemetry.metrics.admissions.labels(tier, self._tenant(tenant_id)).inc()

    def _tenant(self, tenant_id: str) -> str:
        return tenant_id if self.telemetry.config.tenant_labels else "-"

    @_safe
    def tokens(self, request_id: str, count: int) -> None:
        rec = self._recorders.get(request_id)
        if rec is not None:
            rec.on_tokens(count)

    @_safe
    def first_token(self, request_id: str, tier: str, ttft_s: float,
                    split: Mapping[str, float] | None = None,
                    marks: WorkerMarks | None = None) -> None:
        rec = self._recorders.get(request_id)
        if rec is not None and split is not None:
            rec.on_ttft_split(split, marks.steps if marks else None,
                              marks.prefill_steps if marks else None)

    @_safe
    def request_cancelled(self, request_id: str, source: str) -> None:
        self._causes[request_id] = CAUSES.get(source, source)
        if len(self._causes) > 10_000:  # cancels for requests relayed elsewhere never finish here
            self._causes.clear()

    @_safe
    def request_finished(self, tenant_id: str, tier: str, request_id: str, finish_reason: str,
                         prompt_tokens: int, completion_tokens: int, total_s: float,
                         engine_finish_reason: str | None = None,
                         queue_wait_s: float | None = None,
                         num_preemptions: int | None = None) -> None:
        """``finish_reason`` here is the relay's outcome (completed | aborted | errored);
        ``engine_finish_reason`` the engine's own (stop | length | abort | error) if known;
        ``queue_wait_s``/``num_preemptions`` from the worker's FinishMsg (split roles)."""
        rec = self._recorders.pop(request_id, None)
        cause = self._causes.pop(request_id, None)
        if rec is None:
            return
        rec.set_engine_info(queue_wait_s=queue_wait_s, num_preemptions=num_preemptions)
        reason = engine_finish_reason or reason_of_outcome(finish_reason)
        if cause is not None and reason != FinishReason.ERROR:
            reason = FinishReason.ABORT
        rec.finish(reason, completion_tokens=completion_tokens, prompt_tokens=prompt_tokens,
                   abort_cause=(cause or "cancel") if reason == FinishReason.ABORT else None)

    # -- worker side ------------------------------------------------------------------------

    @_safe
    def dispatched(self, tier: str, request_id: str, queue_wait_s: float,
                   traceparent: str | None = None) -> None:
        self._traces[request_id] = self.telemetry.worker_trace(
            request_id=request_id, tier=tier, traceparent=traceparent,
            queue_wait_s=queue_wait_s,
        )
        if len(self._traces) > MAX_OPEN:
            self._traces.pop(next(iter(self._traces))).abort("lost")
        rec = self._recorders.get(request_id)
        if rec is not None:  # gateway and worker in one process: the root span gets it too
            rec.set_engine_info(queue_wait_s=queue_wait_s)

    @_safe
    def dropped(self, request_id: str, reason: str) -> None:
        label = next((r for r in DROP_REASONS if r in reason), "other")
        self.telemetry.metrics.dropped.labels(label).inc()
        trace = self._traces.pop(request_id, None)
        if trace is not None:
            trace.abort(label)

    @_safe
    def engine_step(self, num_outputs: int, load: EngineLoad,
                    outputs: Sequence[RequestOutput] = ()) -> None:
        if self._observer is not None:  # facts of this step (and any before it) first
            for fact in self._observer.drain():
                self._route(fact)
        for out in outputs:
            trace = self._traces.get(out.request_id)
            if trace is None:
                continue
            if out.finished and out.finish_reason == FinishReason.ABORT:
                trace.note_abort("cancelled")  # the engine aborts only on a cancel
            trace.on_output(out)
            if out.finished:
                del self._traces[out.request_id]
                rec = self._recorders.get(out.request_id)
                if rec is not None:
                    rec.set_engine_info(num_preemptions=trace.num_preemptions)
        # Gauges and counters on every step we hear of (the 1 s sampler covers idle times).
        if self._engine is not None:
            self.telemetry.engine_sampler.sample_engine(self._engine)

    def _route(self, fact: StepFact) -> None:
        trace = self._traces.get(fact.request_id)
        if trace is None:
            return
        if fact.kind == "prefill_chunk":
            trace.on_prefill_chunk(fact.attrs["start"], fact.attrs["tokens"], at_ns=fact.at_ns)
        elif fact.kind == "preempted":
            trace.on_preempted(fact.attrs["mode"], at_ns=fact.at_ns)
        elif fact.kind == "swap":
            trace.on_swap(fact.attrs["direction"], fact.attrs["blocks"], at_ns=fact.at_ns)
