"""The step observer: exact per-step histograms and per-request prefill-chunk / preemption
events, from SchedulerOutputs as the engine thread would hand them over."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from engine.core.outputs import RequestOutput, ScheduledRequest, SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.stats import EngineStats
from gateway.telemetry import names
from gateway.telemetry.gateway_events import TelemetryEvents
from gateway.telemetry.step_observer import StepObserver
from gateway.telemetry.tracing import monotonic_to_epoch_ns
from tests.gateway.telemetry.factories import make_telemetry, sample_value, spans_by_name


def _sched(rid: str, start: int, n: int, sample: bool) -> ScheduledRequest:
    return ScheduledRequest(rid, list(range(n)), start, [0], sample, SamplingParams(), 0)


def test_observer_counts_every_step_and_records_chunks() -> None:
    tel, _ = make_telemetry()
    obs = StepObserver(tel.metrics)
    obs(SchedulerOutput(scheduled=[_sched("a", 0, 16, False), _sched("b", 9, 1, True)]), 0.02)
    obs(SchedulerOutput(scheduled=[_sched("a", 16, 4, True)], preempted_ids=["b"],
                        swap_out=[(1, 0), (2, 1)], swapped_out={"b": 2}), 0.01)
    obs(SchedulerOutput(), 0.0)  # an empty step observes nothing
    assert sample_value(tel, "carpool_engine_batch_size_count") == 2
    assert sample_value(tel, "carpool_engine_batch_size_sum") == 3
    assert sample_value(tel, "carpool_engine_step_tokens_sum") == 21
    assert sample_value(tel, "carpool_swap_blocks_total", direction="out") == 2
    facts = obs.drain()
    assert [(f.request_id, f.kind) for f in facts] == [
        ("a", "prefill_chunk"), ("a", "prefill_chunk"), ("b", "preempted"), ("b", "swap")]
    assert facts[0].attrs == {"start": 0, "tokens": 16}
    assert facts[2].attrs == {"mode": "swap"}
    assert facts[3].attrs == {"direction": "out", "blocks": 2}
    assert obs.drain() == []


def test_observer_labels_the_real_preemption_mode_and_swaps() -> None:
    tel, _ = make_telemetry()
    obs = StepObserver(tel.metrics)
    # "s" swapped 3 blocks out; "f" was preempted by recompute (a swap that fell back)
    obs(SchedulerOutput(preempted_ids=["s", "f"], swap_out=[(1, 0), (2, 1), (3, 2)],
                        swapped_out={"s": 3}), 0.01)
    obs(SchedulerOutput(scheduled=[_sched("s", 30, 1, True)], swap_in=[(0, 5)] * 3), 0.01)
    obs(SchedulerOutput(scheduled=[_sched("s", 31, 1, True)]), 0.01)  # no second swap-in
    facts = [(f.request_id, f.kind, f.attrs) for f in obs.drain()]
    assert facts == [
        ("s", "preempted", {"mode": "swap"}),
        ("s", "swap", {"direction": "out", "blocks": 3}),
        ("f", "preempted", {"mode": "recompute"}),
        ("s", "swap", {"direction": "in", "blocks": 3}),
    ]


class _FakeEngine:
    """The part of ``EngineClient`` telemetry uses: observers, load and stats."""

    def __init__(self) -> None:
        self.step_observers: list[Any] = []

    def add_step_observer(self, observer: Any) -> Any:
        self.step_observers.append(observer)
        return lambda: self.step_observers.remove(observer)

    def load(self) -> Any:
        from policies.admission import EngineLoad

        return EngineLoad(0, 0, 0, 8, 8, 4, None)

    def stats(self) -> EngineStats:
        return EngineStats()


async def test_events_route_step_facts_into_the_request_trace() -> None:
    tel, exporter = make_telemetry()
    events = TelemetryEvents(tel)
    engine = _FakeEngine()
    await events.start(type("Svc", (), {"engine": engine, "worker": None})())
    assert len(engine.step_observers) == 1
    observer = engine.step_observers[0]
    events.dispatched("batch", "r", 0.0, traceparent=None)
    t0 = time.monotonic()
    observer(SchedulerOutput(scheduled=[_sched("r", 0, 16, False)]), 0.01)
    await asyncio.sleep(0.005)
    first_token = time.monotonic()  # stamped inside the step, before the observer runs
    await asyncio.sleep(0.005)
    observer(SchedulerOutput(scheduled=[_sched("r", 16, 3, True)]), 0.01)  # the final chunk
    load = engine.load()
    events.engine_step(1, load, [RequestOutput("r", [5], "x", False, None, 19, 1,
                                               first_scheduled_time=t0,
                                               first_token_time=first_token)])
    observer(SchedulerOutput(scheduled=[_sched("r", 19, 1, True)], preempted_ids=["r"]), 0.01)
    events.engine_step(1, load, [RequestOutput("r", [6], "y", True, "length", 19, 2,
                                               first_scheduled_time=t0,
                                               first_token_time=first_token,
                                               finish_time=time.monotonic(),
                                               num_preemptions=1)])
    spans = spans_by_name(exporter)
    prefill = [e.attributes for e in spans[names.SPAN_PREFILL].events]
    assert [(a[names.CHUNK_START], a[names.CHUNK_TOKENS]) for a in prefill] == [(0, 16), (16, 3)]
    decode = spans[names.SPAN_DECODE]
    assert [e.name for e in decode.events] == [names.EVENT_PREEMPTION]  # counted once
    assert (decode.attributes or {})[names.NUM_PREEMPTIONS] == 1
    assert monotonic_to_epoch_ns(first_token) - 1_000_000 <= decode.start_time
    await events.stop()
    assert engine.step_observers == []
