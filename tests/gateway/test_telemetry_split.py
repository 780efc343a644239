"""Split roles: a gateway-only app and a worker in another app (each with its own telemetry,
as two processes would have) still produce one trace, joined by the envelope's traceparent."""

from __future__ import annotations

import time

import httpx

from gateway.telemetry import names
from gateway.telemetry.gateway_events import TelemetryEvents
from tests.gateway.harness import free_port, make_config, make_tenant, run_gateway
from tests.gateway.telemetry_factories import make_telemetry


def test_trace_crosses_from_gateway_to_a_separate_worker(redis_url: str) -> None:
    gw_tel, gw_spans = make_telemetry(service_name="carpool-gateway")
    wk_tel, wk_spans = make_telemetry(service_name="carpool-worker")
    front = make_config(role="gateway")
    back = front.replace(role="all", port=free_port())  # only its worker matters
    with run_gateway(back, redis_url, events=TelemetryEvents(wk_tel)), \
            run_gateway(front, redis_url, events=TelemetryEvents(gw_tel)) as gw:
        key = make_tenant(redis_url, front.namespace, "acme")
        body = {"model": "echo", "prompt": "a b c d", "max_tokens": 3}
        resp = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"})
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
