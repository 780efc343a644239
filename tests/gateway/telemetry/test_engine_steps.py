"""Per-step telemetry from the real engine's step hook: a prompt longer than the step's token
budget is prefilled in chunks, each one an event on the request's prefill span, and the
per-step histograms see every engine step exactly once (tiny random model)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.telemetry import names
from gateway.telemetry.gateway_events import TelemetryEvents
from tests.gateway.harness import RunningGateway, make_config, make_tenant, run_gateway
from tests.gateway.telemetry.factories import make_telemetry, sample_value

BUDGET = 16  # max_num_batched_tokens: a prompt of ~60 tokens takes four chunks
ENGINE = {"num_blocks": 64, "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": BUDGET,
          "enable_prefix_caching": False}
PROMPT = " ".join(f"word{i}" for i in range(24))


@pytest.fixture(scope="module")
def served(redis_url: str, tiny_model_dir: Path) -> Iterator[tuple[RunningGateway, Any, Any, str]]:
    telemetry, exporter = make_telemetry()
    config = make_config(engine="real", model=str(tiny_model_dir), engine_options=ENGINE)
    with run_gateway(config, redis_url, events=TelemetryEvents(telemetry)) as gw:
        yield gw, telemetry, exporter, make_tenant(redis_url, config.namespace, "acme")
    telemetry.shutdown()


def _stream(gw: RunningGateway, key: str) -> tuple[str, dict[str, Any]]:
    body = {"model": gw.services.model.name, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status_code == 200, resp.read()
        rid = resp.headers["x-request-id"]
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    return rid, usage


def _trace(exporter: Any, rid: str) -> list[Any]:
    """The request's spans once its root and its decode span have ended."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        spans = exporter.get_finished_spans()
        root = [s for s in spans if (s.attributes or {}).get(names.RESPONSE_ID) == rid]
        if root:
            mine = [s for s in spans if s.context.trace_id == root[0].context.trace_id]
            if any(s.name == names.SPAN_DECODE for s in mine):
                return mine
        time.sleep(0.02)
    raise AssertionError(f"no complete trace for {rid}")


def test_each_prefill_chunk_is_an_event_with_its_token_count(served: Any) -> None:
    gw, _, exporter, key = served
    rid, usage = _stream(gw, key)
    prompt = usage["prompt_tokens"]
    assert prompt > 2 * BUDGET  # else the test proves nothing about chunking
    spans = _trace(exporter, rid)
    assert len({s.context.trace_id for s in spans}) == 1
    prefill = next(s for s in spans if s.name == names.SPAN_PREFILL)
    chunks = [(e.attributes[names.CHUNK_START], e.attributes[names.CHUNK_TOKENS])
              for e in prefill.events if e.name == names.EVENT_PREFILL_CHUNK]
    # alone in the engine, every chunk but the last fills the budget
    expected = [(start, min(BUDGET, prompt - start)) for start in range(0, prompt, BUDGET)]
    assert chunks == expected
    others = [e for s in spans if s.name != names.SPAN_PREFILL for e in s.events
              if e.name == names.EVENT_PREFILL_CHUNK]
    assert others == []  # no preemption here, so no re-prefill elsewhere


def test_step_histograms_count_every_engine_step(served: Any) -> None:
    gw, telemetry, exporter, key = served
    engine = gw.engine

    def counts() -> tuple[float, float, float]:
        return (sample_value(telemetry, "carpool_engine_batch_size_count"),
                sample_value(telemetry, "carpool_engine_step_tokens_sum"),
                sample_value(telemetry, "carpool_engine_step_seconds_count"))

    steps0, (batches0, tokens0, timed0) = engine.stats().scheduler.num_steps, counts()
    rid, usage = _stream(gw, key)
    _trace(exporter, rid)
    steps = engine.stats().scheduler.num_steps - steps0
    batches, tokens, timed = counts()
    assert steps >= usage["completion_tokens"] + 2  # >= 3 prefill steps, then decode steps
    assert batches - batches0 == steps
    assert timed - timed0 == steps
    # every prompt token is computed once, then each sampled token but the last one
    assert tokens - tokens0 == usage["prompt_tokens"] + usage["completion_tokens"] - 1
