"""``set_urgent_row_cap`` through the async fronts: the real engine applies it on its step
thread (the scheduler's behaviour itself is tested in tests/engine/core/test_row_cap.py); the
echo engine records it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.core.outputs import SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.frontend.async_engine import AsyncEngine
from engine.frontend.echo import FakeEchoEngine


async def test_async_engine_applies_the_cap_on_its_step_thread(tiny_model_dir: Path) -> None:
    engine = AsyncEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=128)
    steps: list[set[str]] = []

    def observe(out: SchedulerOutput, seconds: float) -> None:
        steps.append({s.request_id for s in out.scheduled})

    engine.add_step_observer(observe)
    await engine.start()
    try:
        long = SamplingParams(max_tokens=60, ignore_eos=True)
        for i in range(4):
            engine.add_request(f"b{i}", [3 + i, 4, 5, 6], long, priority=1)
        while not steps or len(steps[-1]) < 4:  # all four batch rows decoding
            await asyncio.sleep(0.005)
        engine.set_urgent_row_cap(2, urgent_priority=0)
        outs = [o async for o in engine.generate(
            "inter", [9, 8, 7], SamplingParams(max_tokens=5, ignore_eos=True), priority=0)]
        stats = engine.stats().scheduler
        assert stats.urgent_row_cap == 2 and stats.rows_held_back > 0
        for rid in [f"b{i}" for i in range(4)]:
            engine.abort(rid)
    finally:
        await engine.shutdown()
    assert outs[-1].finished and sum(len(o.new_token_ids) for o in outs) == 5
    with_inter = [s for s in steps if "inter" in s]
    assert len(with_inter) == 5
    assert all(len(s) == 2 for s in with_inter)  # the interactive row and one batch row
    with pytest.raises(ValueError):
        engine.set_urgent_row_cap(-1)
    with pytest.raises(ValueError):  # refused in the caller, never on the step thread
        engine.set_urgent_row_cap(4, weights={1: -1})


def test_echo_engine_records_the_cap() -> None:
    class Tok:
        def decode(self, ids: list[int]) -> str:
            return ""

    engine = FakeEchoEngine(Tok())
    assert engine.stats().scheduler.urgent_row_cap is None
    engine.set_urgent_row_cap(3, urgent_priority=1)
    assert engine.urgent_row_cap == (3, 1) and engine.stats().scheduler.urgent_row_cap == 3
