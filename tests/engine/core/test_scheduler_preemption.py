"""Preemption (memory and priority, recompute and swap), abort in every state, failures."""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.request import RequestStatus
from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    shares,
    step,
)

MODES = ["recompute", "swap"]


@pytest.mark.parametrize("mode", MODES)
def test_priority_preemption_when_blocks_run_out(mode: str) -> None:
    sched = make_scheduler(num_blocks=8, preemption_mode=mode)
    runner = FakeRunner(sched)
    low_early, low_late = make_requests(2, prompt_len=14, max_tokens=10, priority=2)
    for r in (low_early, low_late):
        sched.add_request(r)
    step(sched, runner)
    assert sched.block_manager.num_free_blocks == 0
    (urgent,) = make_requests(1, prompt_len=6, max_tokens=3, priority=0, start_time=5.0)
    sched.add_request(urgent)
    out, _ = step(sched, runner)
    assert out.preempted_ids == [low_late.request_id]  # lowest priority, latest arrival
    assert urgent.request_id in shares(out) and low_late.request_id not in shares(out)
    assert low_early.status == RequestStatus.RUNNING
    expected = RequestStatus.SWAPPED if mode == "swap" else RequestStatus.PREEMPTED
    assert low_late.status == expected and low_late.num_preemptions == 1
    assert bool(out.swap_out) == (mode == "swap")
    run_to_completion(sched, runner)
    for r in (low_early, low_late, urgent):
        assert r.output_token_ids == reference_tokens(r)


@pytest.mark.parametrize(("mode", "num_cpu_blocks"), [("recompute", 16), ("swap", 16),
                                                     ("swap", 1)])
def test_output_says_which_preemptions_swapped_and_how_many_blocks(
        mode: str, num_cpu_blocks: int) -> None:
    """``swapped_out`` names the swap preemptions with the blocks that moved (what telemetry
    reports); a swap that falls back to recompute (CPU pool too small) is not in it."""
    sched = make_scheduler(num_blocks=8, num_cpu_blocks=num_cpu_blocks, preemption_mode=mode)
    runner = FakeRunner(sched)
    lows = make_requests(2, prompt_len=14, max_tokens=10, priority=2)
    for r in lows:
        sched.add_request(r)
    step(sched, runner)
    (urgent,) = make_requests(1, prompt_len=6, max_tokens=3, priority=0, start_time=5.0)
    sched.add_request(urgent)
    out, _ = step(sched, runner)
    (victim,) = out.preempted_ids
    swapped = sched.get_request(victim).status == RequestStatus.SWAPPED  # type: ignore[union-attr]
    assert swapped == (mode == "swap" and num_cpu_blocks > 1)
    if swapped:
        assert out.swapped_out == {victim: len(out.swap_out)}
        assert len(out.swap_out) == sched.block_manager.num_cpu_blocks_of(victim)
    else:
        assert out.swapped_out == {} and out.swap_out == []
    run_to_completion(sched, runner)


@pytest.mark.parametrize("mode", MODES)
def test_priority_preemption_when_max_num_seqs_is_reached(mode: str) -> None:
    sched = make_scheduler(num_blocks=64, max_num_seqs=2, preemption_mode=mode)
    runner = FakeRunner(sched)
    lows = make_requests(2, prompt_len=5, max_tokens=20, priority=1)
    for r in lows:
        sched.add_request(r)
    step(sched, runner)
    (urgent,) = make_requests(1, prompt_len=5, max_tokens=2, priority=0, start_time=5.0)
    sched.add_request(urgent)
    out, _ = step(sched, runner)
    assert out.preempted_ids == [lows[1].request_id]
    assert set(shares(out)) == {lows[0].request_id, urgent.request_id}
    run_to_completion(sched, runner)
    for r in lows + [urgent]:
        assert r.output_token_ids == reference_tokens(r)


@pytest.mark.parametrize("limit", ["blocks", "seqs"])
def test_equal_priority_never_preempts(limit: str) -> None:
    kw = {"num_blocks": 8} if limit == "blocks" else {"max_num_seqs": 2}
    sched = make_scheduler(**kw)  # type: ignore[arg-type]
    runner = FakeRunner(sched)
    for r in make_requests(2, prompt_len=14, max_tokens=2, priority=1):
        sched.add_request(r)
    step(sched, runner)
    (peer,) = make_requests(1, prompt_len=6, max_tokens=2, priority=1, start_time=5.0)
    sched.add_request(peer)
    out, _ = step(sched, runner)
    assert out.preempted_ids == [] and peer.status == RequestStatus.WAITING
    run_to_completion(sched, runner)
    assert sched.stats.preemptions == 0
    assert peer.output_token_ids == reference_tokens(peer)


def test_no_priority_preemption_when_it_cannot_make_room() -> None:
    sched = make_scheduler(num_blocks=8)
    runner = FakeRunner(sched)
    (urgent_running,) = make_requests(1, prompt_len=19, max_tokens=2, priority=0)
    (low,) = make_requests(1, prompt_len=10, max_tokens=9, priority=3, start_time=1.0)
    sched.add_request(urgent_running)
    sched.add_request(low)
    step(sched, runner)
    (urgent,) = make_requests(1, prompt_len=20, max_tokens=2, priority=1, start_time=5.0)
    sched.add_request(urgent)
    out, _ = step(sched, runner)
    # Evicting `low` (3 blocks) could never give the 5 blocks needed: keep its work.
    assert out.preempted_ids == [] and low.status == RequestStatus.RUNNING


@pytest.mark.parametrize("mode", MODES)
def test_swapped_urgent_request_preempts_lower_priority_to_resume(mode: str) -> None:
    sched = make_scheduler(num_blocks=8, max_num_batched_tokens=24, preemption_mode=mode)
    runner = FakeRunner(sched)
    (urgent,) = make_requests(1, prompt_len=8, max_tokens=4, priority=0)
    (low,) = make_requests(1, prompt_len=24, max_tokens=4, priority=1, start_time=1.0)
    sched.add_request(urgent)
    sched.add_request(low)
    step(sched, runner)  # urgent prefilled (2 blocks); low got its first 16 tokens (4 blocks)
    assert sched.preempt_request(urgent.request_id, "swap")
    assert urgent.status == RequestStatus.SWAPPED
    out, _ = step(sched, runner)
    # low grew into urgent's old blocks; urgent then needs 3 and preempts low to get them.
    assert out.preempted_ids == [urgent.request_id, low.request_id]
    assert urgent.status == RequestStatus.RUNNING
    assert out.swap_in and urgent.request_id in shares(out)
    assert low.request_id not in shares(out)
    run_to_completion(sched, runner)
    for r in (urgent, low):
        assert r.output_token_ids == reference_tokens(r)


def test_running_victim_is_lowest_priority_even_if_scheduled_earlier_in_step() -> None:
    sched = make_scheduler(num_blocks=6, max_num_batched_tokens=64)
    runner = FakeRunner(sched)
    (low,) = make_requests(1, prompt_len=8, max_tokens=20, priority=5)
    (high,) = make_requests(1, prompt_len=15, max_tokens=20, priority=0, start_time=1.0)
    sched.add_request(low)
    sched.add_request(high)
    out, _ = step(sched, runner)  # low 2 blocks + high 4 blocks = 6
    out, _ = step(sched, runner)  # high's 17th token needs a 5th block
    assert out.preempted_ids == [low.request_id]
    assert set(shares(out)) == {high.request_id}  # low's share was taken back
    assert out.num_batched_tokens == 1


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full() -> None:
    sched = make_scheduler(num_blocks=8, num_cpu_blocks=1, preemption_mode="swap")
    runner = FakeRunner(sched)
    reqs = make_requests(2, prompt_len=14, max_tokens=6)
    for r in reqs:
        sched.add_request(r)
    run_to_completion(sched, runner)
    st = sched.stats
    assert st.preemptions_recompute > 0 and st.preemptions_swap == 0
    for r in reqs:
        assert r.output_token_ids == reference_tokens(r)


def _setup_state(state: str):  # type: ignore[no-untyped-def]
    sched = make_scheduler(num_blocks=32, max_num_seqs=3, max_num_batched_tokens=8)
    runner = FakeRunner(sched)
    others = make_requests(2, prompt_len=3, max_tokens=12)
    (target,) = make_requests(1, prompt_len=20, max_tokens=12, start_time=1.0)
    for r in others:
        sched.add_request(r)
    if state == "waiting":
        (blocker,) = make_requests(1, prompt_len=3, max_tokens=12, start_time=0.5)
        sched.add_request(blocker)
        others.append(blocker)
    sched.add_request(target)
    step(sched, runner)
    if state == "waiting":
        assert target.status == RequestStatus.WAITING
    elif state == "prefill":
        assert target.status == RequestStatus.RUNNING and 0 < target.num_computed_tokens < 20
    else:
        while target.num_output_tokens < 2:
            step(sched, runner)
        if state == "swapped":
            assert sched.preempt_request(target.request_id, "swap")
            assert target.status == RequestStatus.SWAPPED
            assert sched.block_manager.num_cpu_blocks_of(target.request_id) > 0
    return sched, runner, others, target


@pytest.mark.parametrize("state", ["waiting", "prefill", "running", "swapped"])
def test_abort_in_each_state_frees_blocks_and_keeps_tokens(state: str) -> None:
    sched, runner, others, target = _setup_state(state)
    tokens_before = list(target.output_token_ids)
    sched.abort_request(target.request_id)
    bm = sched.block_manager
    assert target.status == RequestStatus.FINISHED_ABORTED
    assert not bm.has_blocks(target.request_id)
    assert bm.num_cpu_blocks_of(target.request_id) == 0 and bm.num_used_cpu_blocks == 0
    bm.check_integrity()
    out, changed = step(sched, runner)
    assert target in changed and target.status.finish_reason == "abort"
    assert target.output_token_ids == tokens_before  # produced tokens are delivered
    assert target.request_id not in shares(out) and target.request_id in out.finished_ids
    sched.abort_request(target.request_id)  # already finished: no-op
    sched.abort_request("unknown")
    run_to_completion(sched, runner)
    assert sched.stats.aborts == 1 and bm.num_used_blocks == 0
    for r in others:
        assert r.output_token_ids == reference_tokens(r)


def test_abort_between_schedule_and_update_drops_the_result() -> None:
    sched = make_scheduler()
    runner = FakeRunner(sched)
    (req,) = make_requests(1, prompt_len=5, max_tokens=5)
    sched.add_request(req)
    out = sched.schedule()
    res = runner.execute(out)
    sched.abort_request(req.request_id)
    changed = sched.update_from_output(out, res)
    assert changed == [req] and req.output_token_ids == []
    assert req.status == RequestStatus.FINISHED_ABORTED
    sched.block_manager.check_integrity()
    assert sched.block_manager.num_used_blocks == 0


@pytest.mark.parametrize(
    ("prompt_len", "kw", "message"),
    [
        (33, {"num_blocks": 8}, "more than the whole cache"),
        (12, {"max_model_len": 10}, "longer than max_model_len"),
        (70, {"enable_chunked_prefill": False}, "chunked prefill disabled"),
    ],
)
def test_never_fitting_request_fails_fast(prompt_len: int, kw: dict, message: str) -> None:
    sched = make_scheduler(**kw)
    runner = FakeRunner(sched)
    (bad,) = make_requests(1, prompt_len=prompt_len)
    (good,) = make_requests(1, prompt_len=4, max_tokens=3)
    sched.add_request(bad)
    sched.add_request(good)
    out, changed = step(sched, runner)
    assert bad in changed and bad.status == RequestStatus.FINISHED_ERROR
    assert bad.error is not None and message in bad.error
    assert bad.request_id not in shares(out) and bad.request_id in out.finished_ids
    run_to_completion(sched, runner)
    assert good.output_token_ids == reference_tokens(good)


def test_lone_request_outgrowing_the_cache_errors_instead_of_hanging() -> None:
    sched = make_scheduler(num_blocks=4)  # 16 token slots
    runner = FakeRunner(sched)
    (req,) = make_requests(1, prompt_len=10, max_tokens=50)
    sched.add_request(req)
    returned = run_to_completion(sched, runner, max_steps=100)
    assert req.status == RequestStatus.FINISHED_ERROR
    assert req.error is not None and "KV cache capacity exceeded" in req.error
    # positions 0..15 were computed; the token at position 16 has no slot
    assert req.num_tokens == 17 and req.output_token_ids == reference_tokens(req)[:7]
    assert returned[-1] is req and sched.stats.errors == 1


def test_preempted_request_longer_than_the_budget_still_resumes_without_chunking() -> None:
    # Regression (found by the property test): prompt + output outgrew the token budget
    # while chunked prefill was off, so the recompute re-prefill could never be scheduled.
    sched = make_scheduler(num_blocks=3, block_size=2, max_num_batched_tokens=2,
                           max_num_seqs=2, enable_chunked_prefill=False)
    runner = FakeRunner(sched)
    a, b = make_requests(2, prompt_len=1, max_tokens=[4, 3])
    sched.add_request(a)
    sched.add_request(b)
    run_to_completion(sched, runner, max_steps=200)
    assert sched.stats.preemptions_recompute > 0
    for r in (a, b):
        assert r.output_token_ids == reference_tokens(r)


@pytest.mark.parametrize("mode", MODES)
def test_preempted_request_that_outgrew_the_cache_errors_instead_of_hanging(mode: str) -> None:
    # Regression (property test): preempted with more tokens than the whole cache can hold,
    # it could never be resumed.
    sched = make_scheduler(num_blocks=2, block_size=1, num_cpu_blocks=4)
    runner = FakeRunner(sched)
    (req,) = make_requests(1, prompt_len=2, max_tokens=2)
    sched.add_request(req)
    step(sched, runner)
    assert sched.preempt_request(req.request_id, mode)  # type: ignore[arg-type]
    run_to_completion(sched, runner, max_steps=20)
    assert req.status == RequestStatus.FINISHED_ERROR
    assert req.error is not None and "KV cache capacity exceeded" in req.error
    assert req.output_token_ids == reference_tokens(req)[:1]


def test_swapped_requests_resume_before_waiting_ones_in_priority_order() -> None:
    sched = make_scheduler(preemption_mode="swap")
    runner = FakeRunner(sched)
    a, b, c = make_requests(3, prompt_len=3, max_tokens=12, priority=[1, 1, 0])
    for r in (a, b, c):
        sched.add_request(r)
    step(sched, runner)
    sched.config = dataclasses.replace(sched.config, max_num_batched_tokens=2)
    assert sched.preempt_request(b.request_id) and sched.preempt_request(c.request_id)
    (waiting,) = make_requests(1, prompt_len=1, max_tokens=2, priority=1, start_time=3.0)
    sched.add_request(waiting)
    out, _ = step(sched, runner)
    # a's decode leaves budget for one more: the more urgent swapped request (c) resumes;
    # b stays swapped and the equal-priority waiting request may not jump ahead of it.
    assert set(shares(out)) == {a.request_id, c.request_id}
    assert c.status == RequestStatus.RUNNING and b.status == RequestStatus.SWAPPED
    assert waiting.status == RequestStatus.WAITING
    assert [d for _, d in out.swap_in] == sched.block_manager.get_block_ids(c.request_id)
    run_to_completion(sched, runner)
    for r in (a, b, c, waiting):
        assert r.output_token_ids == reference_tokens(r)


def test_abort_after_a_between_steps_swap_out_drops_its_copies() -> None:
    # preempt(swap) between steps queues copies into CPU blocks; aborting the request frees
    # those blocks, so its queued copies must go too (else two copies target one CPU block).
    sched = make_scheduler(num_blocks=16, num_cpu_blocks=4, block_size=4)
    a, b = make_requests(2, prompt_len=6, max_tokens=20)
    sched.add_request(a)
    sched.add_request(b)
    runner = FakeRunner(sched)
    out = sched.schedule()
    sched.update_from_output(out, runner.execute(out))
    assert sched.preempt_request(a.request_id, "swap")
    sched.abort_request(a.request_id)
    assert sched.preempt_request(b.request_id, "swap")
    out = sched.schedule()
    cpu_targets = [c for _, c in out.swap_out]
    assert len(cpu_targets) == len(set(cpu_targets)) == 2  # only b's two blocks
    sched.block_manager.check_integrity()
