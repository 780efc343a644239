"""Telemetry reads an engine through ``EngineClient`` alone: against the FAKE echo engine
(no scheduler, no block manager inside it), the step histograms and the engine gauges move
with the requests it runs, and the observer comes off again at stop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from engine.core.outputs import RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.frontend.echo import FakeEchoEngine
from engine.runner.loader import load_tokenizer
from gateway.telemetry.gateway_events import TelemetryEvents
from tests.gateway.telemetry.factories import make_telemetry, sample_value


async def test_metrics_move_with_requests_on_the_echo_engine(tiny_model_dir: Path) -> None:
    telemetry, _ = make_telemetry()
    events = TelemetryEvents(telemetry)
    engine = FakeEchoEngine(load_tokenizer(tiny_model_dir), step_ms=1.0)
    steps: list[list[RequestOutput]] = []  # every step's outputs, as the worker hears them
    gauges: list[tuple[float, int]] = []  # (running gauge, the engine's own count) per step

    def on_step(outputs: list[RequestOutput]) -> None:  # what the worker's callback does
        steps.append(outputs)
        events.engine_step(len(outputs), engine.load(), outputs)
        running = sample_value(telemetry, "carpool_engine_requests", state="running")
        gauges.append((running, engine.load().num_running))

    engine.add_step_callback(on_step)
    await engine.start()
    await events.start(type("Services", (), {"engine": engine, "worker": None})())
    assert len(engine.step_observers) == 1
    try:
        lengths = {"a": 3, "b": 7, "c": 5}
        params = {rid: SamplingParams(max_tokens=n) for rid, n in lengths.items()}
        await asyncio.gather(*(_drain(engine.generate(rid, [1, 2, 3], params[rid]))
                               for rid in lengths))
        await asyncio.sleep(0.05)  # the last step's callback
    finally:
        await events.stop()
        await engine.shutdown()
    assert engine.step_observers == []
    tokens = sum(len(o.new_token_ids) for outs in steps for o in outs)
    assert tokens == sum(lengths.values())
    batches = [sum(1 for o in outs if o.new_token_ids) for outs in steps]
    assert sample_value(telemetry, "carpool_engine_batch_size_count") == len(steps)
    assert sample_value(telemetry, "carpool_engine_batch_size_sum") == sum(batches)
    assert sample_value(telemetry, "carpool_engine_step_tokens_sum") == tokens
    assert sample_value(telemetry, "carpool_engine_step_seconds_count") == len(steps)
    assert all(gauge == count for gauge, count in gauges), gauges
    assert max(count for _, count in gauges) > 0 and gauges[-1] == (0, 0)
    telemetry.shutdown()


async def _drain(gen: Any) -> None:
    async for _ in gen:
        pass
