"""The async front: incremental outputs, abort from the event loop, consumers that go away."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.frontend.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine


def make_engine(model_dir: Path, **overrides: object) -> AsyncEngine:
    kw: dict[str, object] = {"model": str(model_dir), "dtype": "float32", "num_blocks": 64}
    kw.update(overrides)
    return AsyncEngine.from_kwargs(**kw)


async def wait_idle(engine: AsyncEngine, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        load = engine.load()
        if load.num_running == load.num_waiting == load.num_swapped == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine not idle: {engine.load()}")


async def test_generate_streams_the_same_tokens_as_the_offline_engine(tiny_model_dir: Path) -> None:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    offline = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=64)
    offline.add_request([5, 6, 7, 8], params, request_id="x")
    expected: list[int] = []
    while offline.has_unfinished_requests():
        for out in offline.step():
            expected += out.new_token_ids

    engine = make_engine(tiny_model_dir)
    await engine.start()
    try:
        outs = [o async for o in engine.generate("a", [5, 6, 7, 8], params)]
    finally:
        await engine.shutdown()
    assert len(outs) >= 2  # incremental, not one final blob
    assert [t for o in outs for t in o.new_token_ids] == expected
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert all(not o.finished for o in outs[:-1])


async def test_abort_mid_stream_frees_blocks_and_reports_abort(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    await engine.start()
    seen = []
    try:
        params = SamplingParams(max_tokens=500, ignore_eos=True)
        async for out in engine.generate("long", [1, 2, 3], params):
            seen.append(out)
            if len(seen) == 3:
                engine.abort("long")
        await wait_idle(engine)
        assert engine.load().num_free_blocks == engine.load().num_total_blocks
    finally:
        await engine.shutdown()
    assert seen[-1].finished and seen[-1].finish_reason == "abort"
    assert 3 <= seen[-1].num_output_tokens < 500
    engine.engine.scheduler.block_manager.check_integrity()


async def test_consumer_that_goes_away_aborts_its_request(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    step_outputs: list[str] = []
    engine.add_step_callback(lambda outs: step_outputs.extend(o.request_id for o in outs))
    await engine.start()
    try:
        gen = engine.generate("gone", [4, 4, 4], SamplingParams(max_tokens=500, ignore_eos=True))
        await gen.__anext__()
        await gen.aclose()  # the client disconnected
        await wait_idle(engine)
        assert engine.load().num_free_blocks == engine.load().num_total_blocks
        assert engine.engine.stats.aborts == 1
    finally:
        await engine.shutdown()
    assert "gone" in step_outputs  # step callbacks saw the request's outputs


async def test_never_fitting_request_fails_fast_with_error(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, num_blocks=2, block_size=16)
    await engine.start()
    try:
        params = SamplingParams(max_tokens=4)
        outs = await asyncio.wait_for(
            _collect(engine.generate("big", list(range(1, 100)), params)), timeout=10
        )
    finally:
        await engine.shutdown()
    assert outs[-1].finished and outs[-1].finish_reason == "error"
    assert outs[-1].error


async def _collect(gen):  # type: ignore[no-untyped-def]
    return [o async for o in gen]


async def test_a_dead_step_thread_fails_requests_instead_of_hanging(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)

    def broken_step() -> list:  # type: ignore[type-arg]
        raise RuntimeError("kernel exploded")

    engine.engine.step = broken_step  # type: ignore[method-assign]
    await engine.start()
    try:
        params = SamplingParams(max_tokens=4)
        first = await asyncio.wait_for(_collect(engine.generate("a", [1, 2], params)), 10)
        assert first[-1].finish_reason == "error" and "kernel exploded" in (first[-1].error or "")
        assert not engine.healthy and not engine.has_capacity(0)
        later = await asyncio.wait_for(_collect(engine.generate("b", [1, 2], params)), 10)
        assert later[-1].finish_reason == "error"
    finally:
        await engine.shutdown()


async def test_shutdown_ends_open_streams(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    await engine.start()
    gen = engine.generate("s", [3, 3, 3], SamplingParams(max_tokens=100_000, ignore_eos=True))
    await gen.__anext__()
    await engine.shutdown()
    rest = await asyncio.wait_for(_collect(gen), timeout=5)
    assert rest and rest[-1].finished and rest[-1].finish_reason == "abort"


async def test_a_restart_runs_only_requests_added_after_it(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    seen: list[RequestOutput] = []
    engine.add_step_callback(seen.extend)
    await engine.start()
    gen = engine.generate("old", [3, 3, 3], SamplingParams(max_tokens=100_000, ignore_eos=True))
    await gen.__anext__()
    await engine.shutdown()
    old = await asyncio.wait_for(_collect(gen), timeout=5)
    # Reported by the engine itself (it counted the tokens), not only by shutdown's fallback.
    assert old[-1].finish_reason == FinishReason.ABORT and old[-1].num_output_tokens >= 1
    load = engine.load()
    assert load.num_running == load.num_waiting == load.num_swapped == 0
    assert load.num_free_blocks == load.num_total_blocks
    engine.engine.scheduler.block_manager.check_integrity()

    seen.clear()
    await engine.start()
    try:
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        new = await asyncio.wait_for(_collect(engine.generate("new", [5, 6], params)), 10)
    finally:
        await engine.shutdown()
    assert new[-1].finish_reason == FinishReason.LENGTH
    assert {o.request_id for o in seen} == {"new"}  # nothing of "old" ran again


async def test_a_setting_posted_as_the_engine_stops_is_kept(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    for cap in (2, 3):
        await engine.start()
        engine.set_urgent_row_cap(cap)  # still in the inbox when the stop flag is seen
        await engine.shutdown()
        assert engine.stats().scheduler.urgent_row_cap == cap
    engine.set_urgent_row_cap(4)  # while stopped: applied by the next start
    await engine.start()
    await engine.shutdown()
    assert engine.stats().scheduler.urgent_row_cap == 4


async def test_a_request_added_before_start_runs_once_started(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    task = asyncio.create_task(_collect(engine.generate("early", [5, 6], params)))
    await asyncio.sleep(0.05)  # the add is queued: no step thread yet
    assert not task.done()
    await engine.start()
    try:
        outs = await asyncio.wait_for(task, 10)
    finally:
        await engine.shutdown()
    assert outs[-1].finish_reason == FinishReason.LENGTH
    assert sum(len(o.new_token_ids) for o in outs) == 3


BAD_PROMPTS = [[], [1, 10**9], [1, -1], ["a", "b"], [1, True], [1.0, 2.0]]


def test_offline_engine_rejects_ids_the_model_cannot_embed(tiny_model_dir: Path) -> None:
    offline = LLMEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=64)
    for bad in BAD_PROMPTS:
        with pytest.raises(ValueError, match="prompt"):
            offline.add_request(bad, SamplingParams(max_tokens=2), request_id="bad")  # type: ignore[arg-type]
    assert not offline.has_unfinished_requests()
    offline.add_request([1, 2], SamplingParams(max_tokens=2, ignore_eos=True), request_id="bad")
    assert offline.has_unfinished_requests()  # the id was never taken by a rejected call


async def test_bad_prompt_fails_its_caller_and_the_engine_keeps_serving(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    await engine.start()
    try:
        for i, bad in enumerate(BAD_PROMPTS + ["a string"]):
            with pytest.raises(ValueError, match="prompt"):
                engine.add_request(f"bad{i}", bad, SamplingParams(max_tokens=2))  # type: ignore[arg-type]
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        outs = [o async for o in engine.generate("good", [5, 6], params)]
        assert engine.healthy
        assert outs[-1].finish_reason == "length"
        assert sum(len(o.new_token_ids) for o in outs) == 3
    finally:
        await engine.shutdown()
