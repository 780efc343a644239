"""Preemption shows in the trace and the metrics: two long requests on a KV cache that only
holds one of them, in recompute and in swap mode (real engine, tiny random model)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.telemetry import names
from gateway.telemetry.gateway_events import TelemetryEvents
from tests.gateway.harness import make_config, make_tenant, run_gateway
from tests.gateway.telemetry_factories import make_telemetry, sample_value


def _complete(url: str, key: str, model: str, out: list[int]) -> None:
    body = {"model": model, "prompt": "count with me: one two three four five six seven",
            "max_tokens": 90, "temperature": 0.0}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}", "X-Carpool-Tier": "batch"})
    out.append(resp.status_code)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_event_and_counter(mode: str, redis_url: str, tiny_model_dir: Path) -> None:
    telemetry, exporter = make_telemetry()
    # 9 blocks of 16 = 144 slots: one request (~12 + 90 tokens) fits, two do not
    engine = {"num_blocks": 9, "num_cpu_blocks": 16, "block_size": 16, "max_num_seqs": 4,
              "preemption_mode": mode, "enable_prefix_caching": False}
    config = make_config(engine="real", model=str(tiny_model_dir), engine_options=engine)
    with run_gateway(config, redis_url, events=TelemetryEvents(telemetry)) as gw:
        key = make_tenant(redis_url, config.namespace, "acme")
        codes: list[int] = []
        threads = [threading.Thread(target=_complete,
                                    args=(gw.url, key, gw.services.model.name, codes))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert codes == [200, 200]
        deadline = time.monotonic() + 5
        while sample_value(telemetry, "carpool_preemptions_total", mode=mode) == 0:
            assert time.monotonic() < deadline, "no preemption counted"
            time.sleep(0.05)
    events: list[Any] = [e for s in exporter.get_finished_spans() for e in s.events
                         if e.name == names.EVENT_PREEMPTION]
    assert events, "no preemption event on any worker span"
    assert {e.attributes[names.PREEMPTION_MODE] for e in events} == {mode}
    ended = [s for s in exporter.get_finished_spans()
             if (s.attributes or {}).get(names.NUM_PREEMPTIONS, 0) > 0]
    assert ended, "the preempted request's last span does not count its preemptions"
    telemetry.shutdown()
