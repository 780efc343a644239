"""Telemetry through the real gateway: uvicorn, embedded Redis, the engine on a tiny random
model; spans read from an in-memory exporter, metrics from the process's registry."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry import names
from gateway.telemetry.gateway_events import TelemetryEvents
from tests.gateway.harness import RunningGateway, make_config, make_tenant, run_gateway
from tests.gateway.telemetry.factories import make_telemetry, sample_value

ENGINE = {"num_blocks": 256, "num_cpu_blocks": 32, "max_num_seqs": 8, "block_size": 16}


@pytest.fixture(scope="module")
def served(redis_url: str, tiny_model_dir: Path) -> Iterator[tuple[RunningGateway, Any, Any, str]]:
    telemetry, exporter = make_telemetry()
    events = TelemetryEvents(telemetry)
    config = make_config(engine="real", model=str(tiny_model_dir), engine_options=ENGINE)
    with run_gateway(config, redis_url, events=events) as gw:
        key = make_tenant(redis_url, config.namespace, "acme")
        yield gw, telemetry, exporter, key
    telemetry.shutdown()


def _stream(gw: RunningGateway, key: str, max_tokens: int) -> tuple[str, dict[str, Any], str]:
    """One streamed chat request; returns (request id, usage, finish reason)."""
    body = {"model": gw.services.model.name, "messages": [{"role": "user", "content": "Tell me about rivers."}],
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "service_tier": "interactive"}
    usage: dict[str, Any] = {}
    finish = ""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, headers=headers,
                      timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        rid = resp.headers["x-request-id"]
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                finish = choice.get("finish_reason") or finish
    return rid, usage, finish


def _trace_of(exporter: Any, rid: str, timeout: float = 10.0) -> list[Any]:
    """Every finished span of the trace whose root carries ``rid`` (waits for the root)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = exporter.get_finished_spans()
        roots = [s for s in spans if (s.attributes or {}).get(names.RESPONSE_ID) == rid]
        if roots:
            trace_id = roots[0].context.trace_id
            return [s for s in spans if s.context.trace_id == trace_id]
        time.sleep(0.02)
    raise AssertionError(f"no root span for {rid}")


def test_streamed_request_is_one_connected_trace(served: Any) -> None:
    gw, telemetry, exporter, key = served
    rid, usage, finish = _stream(gw, key, max_tokens=12)
    spans = _trace_of(exporter, rid)
    root = next(s for s in spans if s.parent is None)
    by_name = {s.name: s for s in spans}
    for name in (names.SPAN_QUEUE, names.SPAN_PREFILL, names.SPAN_DECODE):
        assert name in by_name, sorted(by_name)
        assert by_name[name].parent.span_id == root.context.span_id
    a = root.attributes or {}
    assert a[names.TENANT_ID] == "acme" and a[names.TIER] == "interactive"
    assert "cp-" not in json.dumps(dict(a))  # never the key
    assert 0 < a[names.TTFT_MS] <= a[names.E2E_MS]
    assert a[names.TPOT_MS] > 0
    assert a[names.OUTPUT_TOKENS] == usage["completion_tokens"]
    assert a[names.INPUT_TOKENS] == usage["prompt_tokens"]
    assert tuple(a[names.FINISH_REASONS]) == (finish,)
    queue_ms = (by_name[names.SPAN_QUEUE].attributes or {})[names.QUEUE_WAIT_MS]
    # one process: on the root too (the span is built on integer nanoseconds: 1 ns apart)
    assert a[names.QUEUE_WAIT_MS] == pytest.approx(queue_ms, abs=1e-5)
    assert 0 <= queue_ms <= a[names.TTFT_MS]
    assert a[names.NUM_PREEMPTIONS] == 0
    decode = by_name[names.SPAN_DECODE]
    assert (decode.attributes or {})[names.OUTPUT_TOKENS] == usage["completion_tokens"]
    chunks = [e for e in by_name[names.SPAN_PREFILL].events
              if e.name == names.EVENT_PREFILL_CHUNK]  # from the engine's step observer
    assert sum(e.attributes[names.CHUNK_TOKENS] for e in chunks) == usage["prompt_tokens"]
    # the children lie inside the root's interval, in order (the envelope's enqueue stamp is
    # taken a few microseconds before the root span opens: allow 1 ms)
    assert root.start_time <= by_name[names.SPAN_QUEUE].start_time + 1_000_000
    assert by_name[names.SPAN_PREFILL].end_time <= decode.start_time + 1
    assert decode.end_time <= root.end_time
    assert sample_value(telemetry, "gen_ai_server_time_to_first_token_seconds_count",
                        tier="interactive") >= 1
    assert sample_value(telemetry, "carpool_queue_wait_seconds_count", tier="interactive") >= 1
    # every engine step is observed (a 12-token request takes >= 12 steps; exact counts are
    # checked in test_telemetry_engine_steps)
    steps = sample_value(telemetry, "carpool_engine_batch_size_count")
    assert steps >= usage["completion_tokens"]
    assert sample_value(telemetry, "carpool_engine_step_tokens_sum") >= steps


def test_client_disconnect_ends_the_span_as_abort(served: Any) -> None:
    gw, telemetry, exporter, key = served
    before = sample_value(telemetry, "carpool_aborts_total", tier="batch", cause="client_gone")
    body = {"model": gw.services.model.name, "messages": [{"role": "user", "content": "Go on forever."}],
            "max_tokens": 1500, "stream": True, "service_tier": "batch"}
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=60) as resp:
        rid = resp.headers["x-request-id"]
        seen = 0
        for line in resp.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 4:
                break  # leave mid-stream: the connection closes
    spans = _trace_of(exporter, rid)
    root = next(s for s in spans if s.parent is None)
    a = root.attributes or {}
    assert a[names.FINISH_REASON] == "abort"
    assert a[names.ABORT_CAUSE] == "client_gone"
    assert 0 < a[names.OUTPUT_TOKENS] < 1500
    # the worker's side ends too, once the abort reached the engine: decode ends as abort
    deadline = time.monotonic() + 10
    while True:
        decode = [s for s in _trace_of(exporter, rid) if s.name == names.SPAN_DECODE]
        if decode or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert decode, "the worker's decode span never ended"
    assert (decode[0].attributes or {})[names.FINISH_REASON] == "abort"
    assert names.EVENT_ABORT in [e.name for e in decode[0].events]
    assert sample_value(telemetry, "carpool_aborts_total", tier="batch",
                        cause="client_gone") == before + 1


def test_explicit_cancel_is_counted_as_cancel(served: Any) -> None:
    gw, telemetry, exporter, key = served
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": gw.services.model.name, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1500, "stream": True, "service_tier": "interactive"}
    finish = None
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, headers=headers,
                      timeout=60) as resp:
        rid = resp.headers["x-request-id"]
        cancelled = False
        for line in resp.iter_lines():
            if line.startswith("data: {") and not cancelled:
                r = httpx.post(f"{gw.url}/v1/requests/{rid}/cancel", headers=headers, timeout=10)
                assert r.status_code == 200
                cancelled = True
            elif line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    finish = choice.get("finish_reason") or finish
    assert finish == "abort"
    root = next(s for s in _trace_of(exporter, rid) if s.parent is None)
    a = root.attributes or {}
    assert (a[names.FINISH_REASON], a[names.ABORT_CAUSE]) == ("abort", "cancel")
    assert sample_value(telemetry, "carpool_aborts_total", tier="interactive",
                        cause="cancel") >= 1


def test_metrics_text_parses_and_moves(served: Any) -> None:
    gw, telemetry, _, key = served
    before = sample_value(telemetry, "carpool_requests_total", tier="interactive",
                          tenant="acme", finish_reason="length")
    _stream(gw, key, max_tokens=3)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sample_value(
        telemetry, "carpool_requests_total", tier="interactive", tenant="acme",
        finish_reason="length") == before:
        time.sleep(0.02)
    text = telemetry.metrics.render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {tuple(sorted(s.labels.items())): s.value for s in families["carpool_requests"].samples
                if s.name == "carpool_requests_total"}
    key_ = (("finish_reason", "length"), ("tenant", "acme"), ("tier", "interactive"))
    assert requests[key_] == before + 1
    tokens = [s for s in families["carpool_tokens"].samples if s.name == "carpool_tokens_total"
              and s.labels == {"tier": "interactive", "type": "completion"}]
    assert tokens and tokens[0].value >= 3


def _families(url: str) -> dict[str, Any]:
    resp = httpx.get(f"{url}/metrics", timeout=10)  # no key: scrapers have none
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(resp.text)}


def _value(families: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    for s in families[family].samples:
        if s.name == sample and s.labels == labels:
            return float(s.value)
    return 0.0


def test_default_app_serves_prometheus_metrics(redis_url: str) -> None:
    config = make_config()  # echo engine: the default telemetry, no test wiring
    with run_gateway(config, redis_url) as gw:
        key = make_tenant(redis_url, config.namespace, "acme", rpm=1)
        before = _families(gw.url)
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "echo", "prompt": "one two three", "max_tokens": 4}
        assert httpx.post(f"{gw.url}/v1/completions", json=body, headers=headers,
                          timeout=30).status_code == 200
        assert httpx.post(f"{gw.url}/v1/completions", json=body, headers=headers,
                          timeout=30).status_code == 429
        deadline = time.monotonic() + 5
        while True:
            after = _families(gw.url)
            done = _value(after, "carpool_requests", "carpool_requests_total", tier="interactive",
                          tenant="acme", finish_reason="length")
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert done == 1
        assert _value(after, "carpool_quota_rejections", "carpool_quota_rejections_total",
                      limit="rpm") == 1 + _value(before, "carpool_quota_rejections",
                                                 "carpool_quota_rejections_total", limit="rpm")
        assert _value(after, "gen_ai_server_time_to_first_token_seconds",
                      "gen_ai_server_time_to_first_token_seconds_count", tier="interactive") == 1
        time.sleep(1.2)  # the sampler's period: queue depth and engine gauges appear
        sampled = _families(gw.url)
        assert {s.labels["tier"] for s in sampled["carpool_queue_depth"].samples} == {
            "interactive", "batch", "best-effort"}
        assert {s.labels["state"] for s in sampled["carpool_engine_requests"].samples} >= {
            "running", "waiting", "swapped"}
