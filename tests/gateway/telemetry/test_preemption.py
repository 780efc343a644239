"""Preemption shows in the trace and the metrics: two long requests on a KV cache that only
holds one of them, in recompute and in swap mode, and in swap mode with a CPU pool too small to
swap into (the engine falls back to recompute, and the trace says so). Real engine, tiny
random model."""

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
from tests.gateway.telemetry.factories import make_telemetry, sample_value


def _complete(url: str, key: str, model: str, out: list[int]) -> None:
    body = {"model": model, "prompt": "count with me: one two three four five six seven",
            "max_tokens": 90, "temperature": 0.0}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}", "X-Carpool-Tier": "batch"})
    out.append(resp.status_code)


@pytest.mark.parametrize(("configured", "cpu_blocks", "mode"), [
    ("recompute", 16, "recompute"),
    ("swap", 16, "swap"),
    ("swap", 1, "recompute"),  # no room on the CPU: every swap falls back to recompute
])
def test_preemption_event_and_counter(configured: str, cpu_blocks: int, mode: str,
                                      redis_url: str, tiny_model_dir: Path) -> None:
    telemetry, exporter = make_telemetry()
    # 9 blocks of 16 = 144 slots: one request (~12 + 90 tokens) fits, two do not
    engine = {"num_blocks": 9, "num_cpu_blocks": cpu_blocks, "block_size": 16,
              "max_num_seqs": 4, "preemption_mode": configured, "enable_prefix_caching": False}
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
    other = "swap" if mode == "recompute" else "recompute"
    assert sample_value(telemetry, "carpool_preemptions_total", mode=other) == 0
    _check_swap_events(exporter.get_finished_spans(), swapped=mode == "swap")
    telemetry.shutdown()


def _check_swap_events(spans: list[Any], swapped: bool) -> None:
    """Per request: one swap-out per swap preemption, each with the blocks that moved, and a
    swap-in with the same blocks (both requests finished, so each swapped one came back)."""
    by_request: dict[str, list[Any]] = {}
    for span in spans:
        rid = (span.attributes or {}).get(names.REQUEST_ID)
        by_request.setdefault(str(rid), []).extend(span.events)
    seen = 0
    for events in by_request.values():
        pre = [e for e in events if e.name == names.EVENT_PREEMPTION]
        outs = [e.attributes[names.NUM_BLOCKS] for e in events if e.name == names.EVENT_SWAP_OUT]
        ins = [e.attributes[names.NUM_BLOCKS] for e in events if e.name == names.EVENT_SWAP_IN]
        assert len(outs) == (len(pre) if swapped else 0)
        assert sorted(ins) == sorted(outs)
        assert all(n > 0 for n in outs)
        seen += len(outs)
    assert (seen > 0) == swapped
