"""The FAKE echo engine: what it echoes, how it ends requests, and that its step thread runs
at most MAX_AHEAD steps ahead of the event loop that takes its outputs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from engine.core.outputs import RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.frontend.echo import MAX_AHEAD, FakeEchoEngine
from engine.runner.loader import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return load_tokenizer(tiny_model_dir)


def make_engine(tokenizer: Any, **overrides: Any) -> FakeEchoEngine:
    return FakeEchoEngine(tokenizer, **{"step_ms": 0.0, **overrides})


async def collect(engine: FakeEchoEngine, rid: str, prompt: list[int],
                  max_tokens: int) -> list[RequestOutput]:
    return [out async for out in engine.generate(rid, prompt, SamplingParams(max_tokens=max_tokens))]


async def test_echoes_the_prompt_cycling_and_ends_on_length(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)
    await engine.start()
    try:
        outs = await collect(engine, "a", [5, 6, 7], max_tokens=5)
    finally:
        await engine.shutdown()
    assert [t for o in outs for t in o.new_token_ids] == [5, 6, 7, 5, 6]
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].finish_reason == "length" and outs[-1].num_output_tokens == 5
    assert "".join(o.text_delta for o in outs) == tokenizer.decode([5, 6, 7, 5, 6])


async def test_requests_share_steps_and_callbacks_see_every_output(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, step_ms=2.0)
    seen: list[str] = []
    engine.add_step_callback(lambda outs: seen.extend(o.request_id for o in outs))
    await engine.start()
    try:
        a, b = await asyncio.gather(collect(engine, "a", [1, 2], 6), collect(engine, "b", [3], 6))
        assert engine.load().num_running == 0 and engine.has_capacity(0)
    finally:
        await engine.shutdown()
    assert len(a) == len(b) == 6
    assert seen.count("a") == seen.count("b") == 6
    assert engine.stats().scheduler.num_steps < 12  # batched together, not one after the other
    assert not engine.has_capacity(0)  # a stopped engine takes nothing


async def test_abort_and_shutdown_end_requests(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, step_ms=5.0)
    await engine.start()
    gen = engine.generate("a", [1], SamplingParams(max_tokens=1000))
    first = await gen.__anext__()
    assert not first.finished
    engine.abort("a")
    rest = [out async for out in gen]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    engine.add_request("b", [1], SamplingParams(max_tokens=1000))
    with pytest.raises(ValueError, match="duplicate"):
        engine.add_request("b", [1], SamplingParams(max_tokens=1))
    ended: list[RequestOutput] = []
    engine.add_step_callback(ended.extend)
    await engine.shutdown()
    assert [(o.request_id, o.finish_reason) for o in ended if o.finished] == [("b", "abort")]
    assert engine.load().num_running == 0


async def test_never_more_than_max_ahead_steps_ahead_of_the_loop(tokenizer: Any) -> None:
    engine = make_engine(tokenizer)  # step_ms=0: as fast as the loop takes outputs
    await engine.start()
    try:
        engine.add_request("a", [1], SamplingParams(max_tokens=10_000))
        # The loop is blocked on purpose (nobody hands the outputs out) while we watch.
        deadline = time.monotonic() + 5
        while engine.stats().scheduler.num_steps < MAX_AHEAD and time.monotonic() < deadline:
            time.sleep(0.01)  # noqa: ASYNC251
        time.sleep(0.1)  # noqa: ASYNC251  (time for a step too many, if it would take one)
        assert engine.stats().scheduler.num_steps == MAX_AHEAD
        await asyncio.sleep(0.05)
        assert engine.stats().scheduler.num_steps > MAX_AHEAD
    finally:
        await engine.shutdown()


def test_the_step_thread_ends_when_its_loop_closes_without_shutdown(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, step_ms=1.0)

    async def forgets_shutdown() -> None:  # a test that failed early, a crash
        await engine.start()
        engine.add_request("a", [1], SamplingParams(max_tokens=100_000))
        await asyncio.sleep(0.05)

    asyncio.run(forgets_shutdown())
    assert engine._thread is not None
    engine._thread.join(5.0)
    assert not engine._thread.is_alive()


async def test_a_restart_runs_only_requests_added_after_it(tokenizer: Any) -> None:
    engine = make_engine(tokenizer, step_ms=1.0)
    await engine.start()
    await engine.shutdown()
    engine.add_request("stale", [1], SamplingParams(max_tokens=3))  # added while stopped
    await engine.shutdown()  # ends it
    seen: list[RequestOutput] = []
    engine.add_step_callback(seen.extend)
    await engine.start()
    outs = await collect(engine, "new", [1], max_tokens=2)
    await engine.shutdown()
    assert len(outs) == 2
    assert {o.request_id for o in seen if o.new_token_ids} == {"new"}  # "stale" never ran
