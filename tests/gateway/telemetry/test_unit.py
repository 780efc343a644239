"""Telemetry modules alone: request span, worker child spans, trace propagation, metrics."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client.parser import text_string_to_metric_families

from engine.core.outputs import RequestOutput
from engine.core.stats import SchedulerStats
from gateway.telemetry import TelemetryConfig, extract_context, names
from gateway.telemetry.gateway_events import TelemetryEvents
from gateway.telemetry.telemetry import Telemetry
from gateway.telemetry.tracing import (
    build_tracer_provider,
    monotonic_to_epoch_ns,
    stream_id_to_epoch_ns,
)
from tests.gateway.telemetry.factories import (
    make_info,
    make_telemetry,
    sample_value,
    spans_by_name,
)


def test_request_span_timings_and_metrics() -> None:
    tel, exporter = make_telemetry()
    t0 = time.monotonic()
    rec = tel.start_request(make_info(), started_at=t0)
    rec.on_tokens(1, now=t0 + 0.100)  # TTFT 100 ms
    rec.on_tokens(1, now=t0 + 0.120)
    rec.on_tokens(2, now=t0 + 0.160)  # two tokens in one step: 20 ms each
    rec.set_engine_info(queue_wait_s=0.004, num_preemptions=1)
    summary = rec.finish("length", now=t0 + 0.200)

    assert summary.completion_tokens == 4
    assert summary.ttft_ms == pytest.approx(100.0)
    assert summary.tpot_ms == pytest.approx(60.0 / 3)  # (160 - 100) ms over 3 later tokens
    assert summary.e2e_ms == pytest.approx(200.0)
    span = spans_by_name(exporter)["chat tiny"]
    a = span.attributes or {}
    assert a[names.TENANT_ID] == "acme" and a[names.TIER] == "interactive"
    assert a[names.INPUT_TOKENS] == 7 and a[names.OUTPUT_TOKENS] == 4
    assert tuple(a[names.FINISH_REASONS]) == ("length",)
    assert a[names.QUEUE_WAIT_MS] == pytest.approx(4.0)
    assert a[names.NUM_PREEMPTIONS] == 1
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e6 == pytest.approx(200.0, abs=1.0)

    ttft = "gen_ai_server_time_to_first_token_seconds"
    assert sample_value(tel, f"{ttft}_count", tier="interactive") == 1
    assert sample_value(tel, f"{ttft}_sum", tier="interactive") == pytest.approx(0.1)
    itl = "carpool_inter_token_latency_seconds"
    assert sample_value(tel, f"{itl}_count", tier="interactive") == 3
    assert sample_value(tel, f"{itl}_sum", tier="interactive") == pytest.approx(0.060)
    assert sample_value(
        tel, "carpool_requests_total", tier="interactive", tenant="acme", finish_reason="length"
    ) == 1
    assert sample_value(tel, "carpool_tokens_total", tier="interactive", type="completion") == 4


def test_finish_is_idempotent_and_abort_is_counted_by_cause() -> None:
    tel, exporter = make_telemetry(tenant_labels=False)
    rec = tel.start_request(make_info(tier="batch"))
    rec.on_tokens(1)
    first = rec.finish("abort", abort_cause="client_gone")
    again = rec.finish("stop")
    assert again is first
    spans = exporter.get_finished_spans()
    assert len(spans) == 1
    a = spans[0].attributes or {}
    assert a[names.FINISH_REASON] == "abort" and a[names.ABORT_CAUSE] == "client_gone"
    assert [e.name for e in spans[0].events][-1] == names.EVENT_ABORT
    assert sample_value(tel, "carpool_aborts_total", tier="batch", cause="client_gone") == 1
    assert sample_value(
        tel, "carpool_requests_total", tier="batch", tenant="-", finish_reason="abort"
    ) == 1
    # aborted requests do not pollute the latency distributions of served ones
    assert sample_value(tel, "gen_ai_server_request_duration_seconds_count", tier="batch") == 0


def _output(rid: str, *, sched: float | None, first: float | None, finish: float | None,
            n: int, reason: str | None = None, preempt: int = 0) -> RequestOutput:
    return RequestOutput(
        rid, [1], "x", finished=reason is not None, finish_reason=reason,
        num_prompt_tokens=7, num_output_tokens=n, arrival_time=sched or 0.0,
        first_scheduled_time=sched, first_token_time=first, finish_time=finish,
        num_preemptions=preempt,
    )


def test_worker_spans_are_children_of_the_gateway_span() -> None:
    tel, exporter = make_telemetry()
    rec = tel.start_request(make_info())
    traceparent = rec.traceparent
    assert traceparent is not None and traceparent.startswith("00-")
    wt = tel.worker_trace(
        request_id="req-1", tier="interactive", traceparent=traceparent,
        arrival_unix=time.time() - 0.05,
    )
    now = time.monotonic() + 0.002
    time.sleep(0.05)  # outputs arrive after the engine stamped them
    wt.on_prefill_chunk(0, 4, at_ns=monotonic_to_epoch_ns(now + 0.001))
    wt.on_output(_output("req-1", sched=now, first=now + 0.01, finish=None, n=1))
    wt.on_output(_output("req-1", sched=now, first=now + 0.01, finish=None, n=2, preempt=1))
    wt.on_output(_output("req-1", sched=now, first=now + 0.01, finish=now + 0.03, n=3,
                         reason="stop", preempt=1))
    rec.finish("stop", completion_tokens=3)

    spans = spans_by_name(exporter)
    root = spans["chat tiny"]
    assert root.parent is None
    for name in (names.SPAN_QUEUE, names.SPAN_ENGINE_WAIT, names.SPAN_PREFILL, names.SPAN_DECODE):
        child = spans[name]
        assert child.context.trace_id == root.context.trace_id, name
        assert child.parent is not None and child.parent.span_id == root.context.span_id, name
    queue = spans[names.SPAN_QUEUE]
    assert (queue.attributes or {})[names.QUEUE_WAIT_MS] == pytest.approx(50.0, abs=20.0)
    assert [e.name for e in spans[names.SPAN_PREFILL].events] == [names.EVENT_PREFILL_CHUNK]
    decode = spans[names.SPAN_DECODE]
    assert [e.name for e in decode.events] == [names.EVENT_PREEMPTION]
    assert (decode.attributes or {})[names.OUTPUT_TOKENS] == 3
    assert (decode.attributes or {})[names.FINISH_REASON] == "stop"
    assert decode.end_time - decode.start_time == pytest.approx(20e6, abs=1e6)  # type: ignore[operator]
    assert sample_value(tel, "carpool_queue_wait_seconds_count", tier="interactive") == 1


def test_worker_abort_before_the_engine_ends_the_trace() -> None:
    tel, exporter = make_telemetry()
    wt = tel.worker_trace(request_id="r", tier="batch", traceparent=None, arrival_unix=0)
    wt.abort("client_gone")
    wt.abort("client_gone")  # second call changes nothing
    spans = spans_by_name(exporter)
    assert set(spans) == {names.SPAN_QUEUE, names.SPAN_ENGINE_WAIT}
    wait = spans[names.SPAN_ENGINE_WAIT]
    assert (wait.attributes or {})[names.FINISH_REASON] == "abort"
    assert [e.name for e in wait.events] == [names.EVENT_ABORT]


def test_bad_traceparent_starts_a_new_trace() -> None:
    tel, exporter = make_telemetry()
    wt = tel.worker_trace(request_id="r", tier="batch", traceparent="garbage", arrival_unix=0)
    wt.abort("cancel")
    for span in exporter.get_finished_spans():
        assert span.parent is None
    assert extract_context(None) is not None


def test_prometheus_text_parses_and_counters_move() -> None:
    tel, _ = make_telemetry()
    tel.quota_rejected("rpm")
    tel.quota_rejected("rpm")
    tel.engine_sampler.sample_queues({"interactive": 3, "batch": 0})
    text = tel.metrics.render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("gen_ai_server_time_to_first_token_seconds", "carpool_queue_depth",
                 "carpool_quota_rejections", "carpool_preemptions", "carpool_kv_blocks"):
        assert name in families, name
    rejections = [s for s in families["carpool_quota_rejections"].samples
                  if s.name == "carpool_quota_rejections_total"]
    assert [(s.labels["limit"], s.value) for s in rejections] == [("rpm", 2.0)]
    depth = {s.labels["tier"]: s.value for s in families["carpool_queue_depth"].samples}
    assert depth == {"interactive": 3.0, "batch": 0.0}


def test_engine_sampler_turns_counter_snapshots_into_increments() -> None:
    tel, _ = make_telemetry()
    s = tel.engine_sampler
    first = SchedulerStats(num_steps=1, num_scheduled_requests=3, num_scheduled_tokens=40,
                           preemptions_recompute=2, prefix_cache_hits=16,
                           prefix_cache_queries=32, device_blocks_used=5,
                           device_blocks_free=11, num_running=3)
    s.sample(first, step_seconds=0.01)
    s.sample(first)  # the same step seen twice counts once
    s.sample(SchedulerStats(num_steps=2, num_scheduled_requests=1, num_scheduled_tokens=1,
                            preemptions_recompute=3, preemptions_swap=1,
                            prefix_cache_hits=16, prefix_cache_queries=48))
    assert sample_value(tel, "carpool_preemptions_total", mode="recompute") == 3
    assert sample_value(tel, "carpool_preemptions_total", mode="swap") == 1
    assert sample_value(tel, "carpool_prefix_cache_hit_tokens_total") == 16
    assert sample_value(tel, "carpool_prefix_cache_query_tokens_total") == 48
    assert sample_value(tel, "carpool_engine_batch_size_count") == 2
    assert sample_value(tel, "carpool_kv_blocks", state="free") == 0  # last snapshot's gauge
    assert sample_value(tel, "carpool_engine_step_tokens_sum") == 41
    s.sample(SchedulerStats(num_steps=1, preemptions_recompute=1))  # engine restarted
    assert sample_value(tel, "carpool_preemptions_total", mode="recompute") == 4


def test_two_telemetries_in_one_process_do_not_share_metrics() -> None:
    a, _ = make_telemetry()
    b, _ = make_telemetry()
    a.quota_rejected("tpm")
    assert sample_value(a, "carpool_quota_rejections_total", limit="tpm") == 1
    assert sample_value(b, "carpool_quota_rejections_total", limit="tpm") == 0


def test_an_otlp_endpoint_adds_the_exporter() -> None:
    assert not TelemetryConfig().otlp
    cfg = TelemetryConfig(otlp_endpoint="http://127.0.0.1:1/v1/traces")
    assert cfg.otlp
    provider = build_tracer_provider(cfg)
    processors = provider._active_span_processor._span_processors
    assert any(isinstance(p, BatchSpanProcessor) for p in processors)
    provider.shutdown()
    assert not build_tracer_provider(TelemetryConfig())._active_span_processor._span_processors


def test_spans_are_only_built_when_something_receives_them() -> None:
    quiet = Telemetry(TelemetryConfig())  # no exporter: a no-op tracer, no span is built
    assert not quiet.tracing
    rec = quiet.start_request(make_info())
    assert not rec.span.is_recording() and rec.traceparent is None
    rec.finish("stop", completion_tokens=1)
    assert sample_value(quiet, "carpool_requests_total", tier="interactive", tenant="acme",
                        finish_reason="stop") == 1  # the metrics are still kept
    tel, _ = make_telemetry()  # an in-memory exporter listens
    assert tel.tracing
    rec = tel.start_request(make_info())
    assert rec.span.is_recording() and rec.traceparent is not None


def test_without_tracing_the_clients_trace_context_goes_on_to_the_worker() -> None:
    events = TelemetryEvents(Telemetry(TelemetryConfig()))
    theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert events.request_started("r", "acme", "interactive", "m", 3, 4, False, theirs) == theirs
    assert events.request_started("r2", "acme", "interactive", "m", 3, 4, False, None) is None


def test_stream_id_gives_the_enqueue_time() -> None:
    assert stream_id_to_epoch_ns(b"1700000000123-4") == 1_700_000_000_123_000_000
    assert stream_id_to_epoch_ns("*") is None


def test_hooks_never_raise_into_the_request_path(caplog: pytest.LogCaptureFixture) -> None:
    from gateway.telemetry.gateway_events import TelemetryEvents
    from policies.admission import EngineLoad

    tel, _ = make_telemetry()
    events = TelemetryEvents(tel)
    events.dispatched("batch", "r1", 0.01, traceparent=None)
    load = EngineLoad(0, 0, 0, 10, 10, 4, None)
    events.engine_step(1, load, [object()])  # type: ignore[list-item]
    assert "telemetry hook engine_step failed" in caplog.text
    assert events.request_started("cmpl-1", "t", "batch", "m", 3, 4, False, "bad") is not None


def test_a_non_streaming_request_records_ttft_and_tpot_but_no_inter_token_gaps() -> None:
    tel, _ = make_telemetry()
    t0 = time.monotonic()
    rec = tel.start_request(make_info(stream=False), started_at=t0)
    rec.on_tokens(1, now=t0 + 1.0)  # the first tokens, written at once
    rec.on_tokens(4, now=t0 + 3.0)  # the rest, held back and sent with the finish
    summary = rec.finish("length", now=t0 + 3.0)
    assert summary.ttft_ms == pytest.approx(1000.0) and summary.tpot_ms == pytest.approx(500.0)
    assert sample_value(tel, "carpool_inter_token_latency_seconds_count",
                        tier="interactive") == 0
    streamed = tel.start_request(make_info(request_id="req-2"), started_at=t0)
    streamed.on_tokens(1, now=t0 + 1.0)
    streamed.on_tokens(2, now=t0 + 1.2)
    assert sample_value(tel, "carpool_inter_token_latency_seconds_count",
                        tier="interactive") == 2
