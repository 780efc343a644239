"""Split roles: a gateway-only app and a worker in another app (each with its own telemetry,
as two processes would have) still produce one trace, joined by the envelope's traceparent;
the worker's FinishMsg brings queue wait and preemption count to the gateway's root span."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.telemetry import names
from gateway.telemetry.gateway_events import TelemetryEvents
from policies.ttft_split import PARTS
from tests.gateway.harness import free_port, make_config, make_tenant, run_gateway
from tests.gateway.telemetry.factories import make_telemetry


def test_trace_crosses_from_gateway_to_a_separate_worker(redis_url: str) -> None:
    gw_tel, gw_spans = make_telemetry(service_name="carpool-gateway")
    wk_tel, wk_spans = make_telemetry(service_name="carpool-worker")
    front = make_config(role="gateway")
    back = front.replace(role="all", port=free_port())  # only its worker matters
    with run_gateway(back, redis_url, events=TelemetryEvents(wk_tel)), \
            run_gateway(front, redis_url, events=TelemetryEvents(gw_tel)) as gw:
        key = make_tenant(redis_url, front.namespace, "acme")
        body = {"model": "echo", "prompt": "a b c d", "max_tokens": 3}
        sent = time.time()
        resp = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"})
        answered = time.time()
        assert resp.status_code == 200
        rid = resp.json()["id"]
        deadline = time.monotonic() + 5
        while not [s for s in gw_spans.get_finished_spans()
                   if (s.attributes or {}).get(names.RESPONSE_ID) == rid]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    root = next(s for s in gw_spans.get_finished_spans()
                if (s.attributes or {}).get(names.RESPONSE_ID) == rid)
    worker = [s for s in wk_spans.get_finished_spans()
              if (s.attributes or {}).get(names.REQUEST_ID) == rid]
    assert {s.name for s in worker} >= {names.SPAN_QUEUE, names.SPAN_ENGINE_WAIT}
    for span in worker:
        assert span.context.trace_id == root.context.trace_id
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.resource.attributes["service.name"] == "carpool-worker"
    assert root.resource.attributes["service.name"] == "carpool-gateway"
    assert not [s for s in gw_spans.get_finished_spans() if s.name == names.SPAN_QUEUE]
    queue = next(s for s in worker if s.name == names.SPAN_QUEUE)
    a = root.attributes or {}
    assert a[names.QUEUE_WAIT_MS] == pytest.approx(  # the span's: integer nanoseconds
        (queue.attributes or {})[names.QUEUE_WAIT_MS], abs=1e-5)
    assert a[names.NUM_PREEMPTIONS] == 0
    # the TTFT budget crossed too (the worker's marks in the first TokenMsg): six parts that
    # fit inside the request's life, and the engine steps to its first token
    parts = [a[names.TTFT_PART_MS.format(part=part)] for part in PARTS]
    assert all(isinstance(v, float) and v >= 0 for v in parts)
    assert sum(parts) <= (answered - sent) * 1000  # all of it inside the client's wait
    assert a[names.TTFT_STEPS] >= a[names.TTFT_PREFILL_STEPS] >= 1


def _complete(url: str, key: str, model: str, rids: list[str]) -> None:
    body = {"model": model, "prompt": "count with me: one two three four five six seven",
            "max_tokens": 90, "temperature": 0.0}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 200
    rids.append(resp.json()["id"])


def test_split_root_span_counts_the_workers_preemptions(redis_url: str,
                                                        tiny_model_dir: Path) -> None:
    gw_tel, gw_spans = make_telemetry(service_name="carpool-gateway")
    wk_tel, wk_spans = make_telemetry(service_name="carpool-worker")
    # a KV cache that holds one of the two requests: one of them is preempted
    engine = {"num_blocks": 9, "block_size": 16, "max_num_seqs": 4,
              "enable_prefix_caching": False}
    back = make_config(engine="real", model=str(tiny_model_dir), engine_options=engine)
    front = back.replace(role="gateway", port=free_port())
    with run_gateway(back, redis_url, events=TelemetryEvents(wk_tel)), \
            run_gateway(front, redis_url, events=TelemetryEvents(gw_tel)) as gw:
        key = make_tenant(redis_url, front.namespace, "acme")
        rids: list[str] = []
        threads = [threading.Thread(target=_complete, args=(gw.url, key, gw.services.model.name, rids)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(rids) == 2
        deadline = time.monotonic() + 5
        while len(_roots(gw_spans, rids)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    total = 0
    for rid, root in _roots(gw_spans, rids).items():
        worker = [s for s in wk_spans.get_finished_spans()
                  if (s.attributes or {}).get(names.REQUEST_ID) == rid]
        preemptions = [e for s in worker for e in s.events if e.name == names.EVENT_PREEMPTION]
        queue = next(s for s in worker if s.name == names.SPAN_QUEUE)
        a = root.attributes or {}
        assert a[names.NUM_PREEMPTIONS] == len(preemptions)
        assert a[names.QUEUE_WAIT_MS] == pytest.approx(  # the span's: integer nanoseconds
            (queue.attributes or {})[names.QUEUE_WAIT_MS], abs=1e-5)
        total += len(preemptions)
    assert total > 0, "nothing was preempted: the test proves nothing"
    gw_tel.shutdown()
    wk_tel.shutdown()


def _roots(exporter: Any, rids: list[str]) -> dict[str, Any]:
    return {rid: s for s in exporter.get_finished_spans() for rid in rids
            if (s.attributes or {}).get(names.RESPONSE_ID) == rid}
