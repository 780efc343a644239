"""A first token protected like an urgent arrival's (``Request.first_token_urgent``,
``engine.core.row_cap``): with no urgent work present, the step that computes a marked
request's first token runs at most the cap's rows, no other prompt and no other start; the
rows left out keep their KV; once it has its token it is an ordinary row. With urgent work
present the mark changes nothing."""

from __future__ import annotations

from engine.core.request import Request
from engine.core.scheduler import Scheduler
from tests.engine.core.test_row_cap import decoding, progress
from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    shares,
    step,
)

CAP = 3


def marked(req: Request) -> Request:
    req.first_token_urgent = True
    return req


def heavy_batch(sched: Scheduler, runner: FakeRunner, n: int = 10) -> list[Request]:
    """``n`` batch rows decoding, a cap set (no urgent work: it applies to no step yet)."""
    batch = make_requests(n, prompt_len=6, max_tokens=40, priority=1)
    decoding(sched, runner, batch)
    sched.set_urgent_row_cap(CAP, urgent_priority=0, weights={0: 6, 1: 3, 2: 1})
    return batch


def test_a_marked_first_token_step_is_capped() -> None:
    sched = make_scheduler(num_blocks=256, max_num_seqs=32)
    runner = FakeRunner(sched)
    batch = heavy_batch(sched, runner)
    out, _ = step(sched, runner)
    assert len(out.scheduled) == 10  # no urgent work and no mark: the whole batch runs

    (start,) = make_requests(1, prompt_len=9, max_tokens=5, priority=1, start_time=5.0)
    light = marked(make_requests(1, prompt_len=7, max_tokens=5, priority=1,
                                 start_time=6.0)[0])
    sched.add_request(start)  # another tenant's start, queued ahead of the light request
    sched.add_request(light)
    blocks = {r.request_id: sched.block_manager.get_block_ids(r.request_id) for r in batch}
    was = progress(batch)
    out, _ = step(sched, runner)
    ran = shares(out)
    # the light prompt whole, and CAP - 1 batch rows decoding: nothing else
    assert len(ran) == CAP and ran[light.request_id] == 7
    assert sum(1 for r in batch if r.request_id in ran) == CAP - 1
    assert all(ran[r.request_id] == 1 for r in batch if r.request_id in ran)
    assert start.request_id not in ran and start.num_computed_tokens == 0  # not started
    assert light.num_output_tokens == 1
    now = progress(batch)
    for r in batch:
        if r.request_id not in ran:  # held: no progress, KV kept, still running
            assert now[r.request_id] == was[r.request_id]
            assert sched.block_manager.get_block_ids(r.request_id)[:len(blocks[r.request_id])] \
                == blocks[r.request_id]
            assert r.request_id in sched.running
    assert sched.stats.preemptions == 0

    # it has its token: an ordinary row again, and the queued start goes in
    out, _ = step(sched, runner)
    assert set(shares(out)) == {r.request_id for r in batch + [start, light]}
    run_to_completion(sched, runner)
    for r in batch + [start, light]:
        assert r.output_token_ids == reference_tokens(r)


def test_without_the_mark_the_step_runs_every_row_and_the_start() -> None:
    """The control: the same arrivals unmarked share one full step."""
    sched = make_scheduler(num_blocks=256, max_num_seqs=32)
    runner = FakeRunner(sched)
    batch = heavy_batch(sched, runner)
    (start,) = make_requests(1, prompt_len=9, max_tokens=5, priority=1, start_time=5.0)
    (light,) = make_requests(1, prompt_len=7, max_tokens=5, priority=1, start_time=6.0)
    sched.add_request(start)
    sched.add_request(light)
    out, _ = step(sched, runner)
    assert set(shares(out)) == {r.request_id for r in batch + [start, light]}


def test_the_held_rows_take_turns_over_marked_steps() -> None:
    """Each marked arrival's step keeps the least recently run rows: over several such steps
    every batch row runs as often as the others (a round-robin is the reference)."""
    sched = make_scheduler(num_blocks=512, max_num_seqs=32)
    runner = FakeRunner(sched)
    batch = heavy_batch(sched, runner, n=6)
    ran_count = dict.fromkeys((r.request_id for r in batch), 0)
    lights = []
    for i in range(6):
        (light,) = make_requests(1, prompt_len=5, max_tokens=1, priority=1,
                                 start_time=10.0 + i)  # done at its first token
        lights.append(marked(light))
        sched.add_request(light)
        out, _ = step(sched, runner)
        assert len(out.scheduled) == CAP and light.request_id in shares(out)
        for rid in shares(out):
            if rid in ran_count:
                ran_count[rid] += 1
    # 2 batch seats a step over 6 rows for 6 steps: each ran twice
    assert sorted(ran_count.values()) == [2] * 6
    run_to_completion(sched, runner)
    for r in batch + lights:
        assert r.output_token_ids == reference_tokens(r)


def test_a_chunked_marked_prompt_is_capped_until_its_first_token() -> None:
    """A prompt longer than the step's token budget is computed in chunks: every step of it
    is capped (it waits for its first token all along), the step after it is not."""
    sched = make_scheduler(num_blocks=256, max_num_seqs=32, max_num_batched_tokens=64,
                           enable_chunked_prefill=True)
    runner = FakeRunner(sched)
    batch = heavy_batch(sched, runner)
    light = marked(make_requests(1, prompt_len=150, max_tokens=3, priority=1,
                                 start_time=9.0)[0])
    sched.add_request(light)
    steps = 0
    while not light.output_token_ids:
        out, _ = step(sched, runner)
        steps += 1
        assert len(out.scheduled) == CAP and light.request_id in shares(out)
    assert steps >= 2  # it was chunked
    out, _ = step(sched, runner)
    assert len(out.scheduled) == 11
    run_to_completion(sched, runner)
    for r in batch + [light]:
        assert r.output_token_ids == reference_tokens(r)


def test_with_urgent_work_present_the_mark_changes_nothing() -> None:
    """Interactive stays more urgent: beside an urgent request, a marked lower request is
    scheduled exactly as an unmarked one."""
    outs = []
    for mark in (False, True):
        sched = make_scheduler(num_blocks=256, max_num_seqs=32)
        runner = FakeRunner(sched)
        batch = heavy_batch(sched, runner)
        (inter,) = make_requests(1, prompt_len=5, max_tokens=6, priority=0, start_time=5.0)
        (light,) = make_requests(1, prompt_len=7, max_tokens=5, priority=1, start_time=6.0)
        light.first_token_urgent = mark
        sched.add_request(inter)
        sched.add_request(light)
        name = {r.request_id: i for i, r in enumerate(batch + [inter, light])}
        steps = []
        while not inter.is_finished:
            out, _ = step(sched, runner)
            steps.append(sorted((name[s.request_id], len(s.token_ids)) for s in out.scheduled))
        outs.append(steps)
    assert any(len(s) < 12 for s in outs[0])  # the cap held rows back in these steps
    assert outs[0] == outs[1]


def test_no_cap_set_no_protection() -> None:
    """The mark uses the cap the worker set: without one, nothing is held."""
    sched = make_scheduler(num_blocks=256, max_num_seqs=32)
    runner = FakeRunner(sched)
    batch = make_requests(10, prompt_len=6, max_tokens=40, priority=1)
    decoding(sched, runner, batch)
    light = marked(make_requests(1, prompt_len=7, max_tokens=5, priority=1,
                                 start_time=6.0)[0])
    sched.add_request(light)
    out, _ = step(sched, runner)
    assert len(out.scheduled) == 11


def test_a_marked_request_without_a_seat_caps_nothing() -> None:
    """Every seat taken: the marked request cannot start, so its wait must not cap the
    steps (else every step would run the cap's rows until a seat frees)."""
    sched = make_scheduler(num_blocks=256, max_num_seqs=10)
    runner = FakeRunner(sched)
    heavy_batch(sched, runner)
    light = marked(make_requests(1, prompt_len=7, max_tokens=5, priority=1,
                                 start_time=6.0)[0])
    sched.add_request(light)
    out, _ = step(sched, runner)
    assert len(out.scheduled) == 10 and light.request_id not in shares(out)
