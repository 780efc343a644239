"""Scheduler behaviour with the fake runner: steps, chunking, stops, stats, admission."""

from __future__ import annotations

import pytest

from engine.core.request import Request, RequestStatus
from engine.core.sampling_params import SamplingParams
from tests.engine.fakes import (
    FakeClock,
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    shares,
    step,
)


def test_chunks_then_decodes_with_documented_fields() -> None:
    sched = make_scheduler(max_num_batched_tokens=4)
    (req,) = make_requests(1, prompt_len=10, max_tokens=3)
    sched.add_request(req)
    runner = FakeRunner(sched)
    seen = []
    for _ in range(5):
        out, _ = step(sched, runner)
        (s,) = out.scheduled
        assert len(s.block_ids) * 4 >= s.start_pos + len(s.token_ids)
        if not req.is_finished:
            assert s.block_ids == sched.block_manager.get_block_ids(req.request_id)
        seen.append((s.start_pos, len(s.token_ids), s.sample, s.output_index))
    assert seen == [(0, 4, False, 0), (4, 4, False, 0), (8, 2, True, 0), (10, 1, True, 1), (11, 1, True, 2)]
    assert req.output_token_ids == reference_tokens(req)
    assert req.status == RequestStatus.FINISHED_LENGTH
    assert not sched.has_unfinished_requests()


def test_decode_token_is_the_last_sampled_one() -> None:
    sched = make_scheduler()
    (req,) = make_requests(1, prompt_len=3, max_tokens=3)
    sched.add_request(req)
    runner = FakeRunner(sched)
    step(sched, runner)
    out, _ = step(sched, runner)
    assert out.scheduled[0].token_ids == [req.output_token_ids[0]]


def test_chunked_prefill_while_others_keep_decoding() -> None:
    sched = make_scheduler(max_num_batched_tokens=8, num_blocks=64)
    runner = FakeRunner(sched)
    short = make_requests(2, prompt_len=3, max_tokens=30)
    for r in short:
        sched.add_request(r)
    step(sched, runner)
    (long,) = make_requests(1, prompt_len=40, max_tokens=2, start_time=1.0)
    sched.add_request(long)
    chunks = []
    while long.num_output_tokens == 0:
        out, _ = step(sched, runner)
        got = shares(out)
        assert got[short[0].request_id] == 1 and got[short[1].request_id] == 1
        chunks.append(got[long.request_id])
    assert chunks == [6] * 6 + [4]
    run_to_completion(sched, runner)
    for r in short + [long]:
        assert r.output_token_ids == reference_tokens(r)


def test_token_budget_and_max_num_seqs_are_respected() -> None:
    sched = make_scheduler(max_num_batched_tokens=10, max_num_seqs=3)
    runner = FakeRunner(sched)
    for r in make_requests(7, prompt_len=[2, 7, 4], max_tokens=[3, 9]):
        sched.add_request(r)
    while sched.has_unfinished_requests():
        out, _ = step(sched, runner)
        assert out.num_batched_tokens <= 10 and len(out.scheduled) <= 3
        assert sched.stats.num_running <= 3


def test_stop_token_eos_and_ignore_eos() -> None:
    (probe,) = make_requests(1, prompt_len=5, max_tokens=6)
    ref = reference_tokens(probe)
    stop_at = ref[2]
    first = ref.index(stop_at)

    def run(**params: object) -> Request:
        sched = make_scheduler()
        eos = params.pop("eos", None)
        req = Request("x", probe.prompt_token_ids, SamplingParams(max_tokens=6, **params), eos_token_id=eos)  # type: ignore[arg-type]
        sched.add_request(req)
        run_to_completion(sched, FakeRunner(sched))
        return req

    r = run(stop_token_ids=[stop_at])
    assert r.status == RequestStatus.FINISHED_STOPPED and r.output_token_ids == ref[: first + 1]
    r = run(eos=stop_at)
    assert r.status == RequestStatus.FINISHED_STOPPED and r.output_token_ids == ref[: first + 1]
    r = run(eos=stop_at, ignore_eos=True)
    assert r.status == RequestStatus.FINISHED_LENGTH and r.output_token_ids == ref


def test_max_model_len_caps_generation() -> None:
    sched = make_scheduler(max_model_len=9)
    (req,) = make_requests(1, prompt_len=6, max_tokens=50)
    sched.add_request(req)
    run_to_completion(sched, FakeRunner(sched))
    assert req.status == RequestStatus.FINISHED_LENGTH
    assert req.num_tokens == 9 and req.output_token_ids == reference_tokens(req)[:3]


def test_times_and_returned_requests() -> None:
    clock = FakeClock(50.0)
    sched = make_scheduler(clock=clock, max_num_batched_tokens=4)
    (req,) = make_requests(1, prompt_len=6, max_tokens=2, start_time=49.0)
    sched.add_request(req)
    runner = FakeRunner(sched)
    clock.advance(1)
    _, changed = step(sched, runner)
    assert changed == [] and req.times.first_scheduled == 51.0 and req.times.first_token is None
    clock.advance(1)
    _, changed = step(sched, runner)
    assert changed == [req] and req.times.first_token == 52.0
    clock.advance(1)
    _, changed = step(sched, runner)
    assert changed == [req] and req.is_finished and req.times.finished == 53.0
    assert req.times.first_scheduled == 51.0 and req.times.arrival == 49.0
    assert sched.get_request(req.request_id) is None  # forgotten once returned finished


def test_finished_ids_reach_the_next_output() -> None:
    sched = make_scheduler()
    a, b = make_requests(2, prompt_len=3, max_tokens=[1, 5])
    sched.add_request(a)
    sched.add_request(b)
    runner = FakeRunner(sched)
    step(sched, runner)
    sched.abort_request(b.request_id)
    out, _ = step(sched, runner)
    assert set(out.finished_ids) == {a.request_id, b.request_id}
    out, _ = step(sched, runner)
    assert out.finished_ids == []


def test_finish_request_frees_blocks_and_is_not_returned_again() -> None:
    sched = make_scheduler()
    (req,) = make_requests(1, prompt_len=9, max_tokens=20)
    sched.add_request(req)
    runner = FakeRunner(sched)
    step(sched, runner)
    sched.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED)
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert sched.block_manager.num_used_blocks == 0 and not sched.has_unfinished_requests()
    _, changed = step(sched, runner)
    assert changed == []
    sched.finish_request("nope", RequestStatus.FINISHED_STOPPED)  # unknown: no-op
    with pytest.raises(ValueError):
        sched.finish_request(req.request_id, RequestStatus.RUNNING)


def test_duplicate_request_id_is_rejected() -> None:
    sched = make_scheduler()
    (req,) = make_requests(1)
    sched.add_request(req)
    with pytest.raises(ValueError, match="duplicate"):
        sched.add_request(req)


def test_stats_after_a_run() -> None:
    sched = make_scheduler(num_blocks=10, preemption_mode="swap", num_cpu_blocks=32)
    reqs = make_requests(6, prompt_len=7, max_tokens=12)
    for r in reqs:
        sched.add_request(r)
    runner = FakeRunner(sched)
    out, _ = step(sched, runner)
    st = sched.stats
    assert st.num_scheduled_tokens == out.num_batched_tokens == 35  # 5 prompts (10 blocks)
    assert st.num_running == 5 and st.num_waiting == 1
    assert st.device_blocks_used == 10 and st.device_blocks_free == 0
    sched.abort_request(reqs[-1].request_id)
    run_to_completion(sched, runner)
    st = sched.stats
    assert st.preemptions_swap > 0 and st.preemptions_recompute == 0
    assert st.aborts == 1 and st.finished == 6 and st.errors == 0
    assert st.device_blocks_used == 0 and st.cpu_blocks_used == 0
    assert st.num_running == st.num_waiting == st.num_swapped == 0


def _admissions(batching: str) -> list[tuple[int, int]]:
    """(running before the step, requests started in it) for every step of a 6-request run."""
    sched = make_scheduler(batching=batching, max_num_seqs=2)
    reqs = make_requests(6, prompt_len=3, max_tokens=[2, 8])
    for r in reqs:
        sched.add_request(r)
    runner = FakeRunner(sched)
    rows = []
    while sched.has_unfinished_requests():
        before = sched.stats.num_running
        started = sum(r.times.first_scheduled is None for r in reqs)
        step(sched, runner)
        started -= sum(r.times.first_scheduled is None for r in reqs)
        rows.append((before, started))
    for r in reqs:
        assert r.output_token_ids == reference_tokens(r)
    return rows


def test_static_admits_a_new_batch_only_when_the_last_one_is_done() -> None:
    static = _admissions("static")
    assert [started for _, started in static if started] == [2, 2, 2]
    assert all(before == 0 for before, started in static if started)
    continuous = _admissions("continuous")
    # continuous refills the seat of the short request while the long one still runs
    assert any(before > 0 for before, started in continuous if started)
    assert len(continuous) < len(static)


def test_static_batch_fills_across_steps_when_the_budget_is_short() -> None:
    sched = make_scheduler(batching="static", max_num_seqs=4, max_num_batched_tokens=8)
    for r in make_requests(6, prompt_len=6, max_tokens=20):
        sched.add_request(r)
    runner = FakeRunner(sched)
    counts = []
    for _ in range(5):
        step(sched, runner)
        counts.append(sched.stats.num_running)
    assert counts[-1] == 4 and counts[0] < 4


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_fixed_shape_batch_keeps_finished_seats_as_padding_until_it_ends(mode: str) -> None:
    sched = make_scheduler(batching=mode, max_num_seqs=3, max_wait_ms=0)
    first = make_requests(3, prompt_len=4, max_tokens=[2, 5, 9])
    second = make_requests(2, prompt_len=4, max_tokens=3, start_time=1.0)
    for r in first + second:
        sched.add_request(r)
    runner = FakeRunner(sched)
    rows = []
    while sched.has_unfinished_requests():
        out, _ = step(sched, runner)
        rows.append((len(out.scheduled), out.num_padding_rows))
    # batch 1: 3 seats for 9 steps, members leave after 2 and 5; batch 2 starts with 2 seats
    assert rows == [(3, 0)] * 2 + [(2, 1)] * 3 + [(1, 2)] * 4 + [(2, 0)] * 3
    for r in first + second:
        assert r.output_token_ids == reference_tokens(r)


def test_continuous_refills_seats_and_never_pads() -> None:
    sched = make_scheduler(max_num_seqs=3)
    for r in make_requests(5, prompt_len=4, max_tokens=[2, 5, 9]):
        sched.add_request(r)
    runner = FakeRunner(sched)
    while sched.has_unfinished_requests():
        out, _ = step(sched, runner)
        assert out.num_padding_rows == 0


def test_dynamic_starts_when_full_or_after_max_wait() -> None:
    clock = FakeClock(10.0)
    sched = make_scheduler(batching="dynamic", max_num_seqs=3, max_wait_ms=100, clock=clock)
    runner = FakeRunner(sched)
    for r in make_requests(2, start_time=10.0):
        sched.add_request(r)
    out, _ = step(sched, runner)
    assert out.scheduled == []
    clock.advance(0.099)
    out, _ = step(sched, runner)
    assert out.scheduled == []
    clock.advance(0.002)
    out, _ = step(sched, runner)
    assert len(out.scheduled) == 2
    run_to_completion(sched, runner)
    for r in make_requests(3, start_time=clock.now):
        sched.add_request(r)
    out, _ = step(sched, runner)
    assert len(out.scheduled) == 3  # full: no waiting for the timeout


def test_stats_report_the_lowest_running_priority_and_block_counts() -> None:
    sched = make_scheduler(num_blocks=20)
    assert sched.stats.lowest_running_priority is None
    for r in make_requests(3, prompt_len=5, max_tokens=4, priority=[0, 3, 1]):
        sched.add_request(r)
    step(sched, FakeRunner(sched))
    st = sched.stats
    assert st.lowest_running_priority == 3
    assert st.num_total_blocks == 20 and st.num_free_blocks == 20 - 6 == st.device_blocks_free
    assert st.kv_usage == pytest.approx(6 / 20)


def test_stats_count_queued_requests_by_priority() -> None:
    sched = make_scheduler(max_num_seqs=2, preemption_mode="swap")
    runner = FakeRunner(sched)
    running = make_requests(2, priority=[1, 2], max_tokens=20)
    for r in running:
        sched.add_request(r)
    step(sched, runner)
    for r in make_requests(4, priority=[2, 1, 2, 2], start_time=5.0):
        sched.add_request(r)
    assert sched.stats.waiting_by_priority == ((1, 1), (2, 3))
    assert sched.preempt_request(running[1].request_id)  # priority 2, swapped out
    stats = sched.stats
    assert stats.swapped_by_priority == ((2, 1),) and stats.num_swapped == 1
    assert sum(n for _, n in stats.waiting_by_priority) == stats.num_waiting == 4
    run_to_completion(sched, runner)
    assert sched.stats.waiting_by_priority == () and sched.stats.swapped_by_priority == ()


def test_first_scheduled_and_first_token_steps_count_the_steps_that_ran_them() -> None:
    """A request's step numbers (the TTFT budget's steps) against a count kept here: the step
    that first scheduled it, and the one that gave its first token (a chunked prompt spans
    several), numbered as ``SchedulerStats.num_steps`` counts them."""
    sched = make_scheduler(max_num_batched_tokens=8, num_blocks=64)
    runner = FakeRunner(sched)
    (early,) = make_requests(1, prompt_len=3, max_tokens=20)
    sched.add_request(early)
    n = 0
    for _ in range(3):
        step(sched, runner)
        n += 1
    (late,) = make_requests(1, prompt_len=20, max_tokens=2, start_time=1.0)
    sched.add_request(late)  # between steps: the next one, n + 1, schedules it
    steps_with_prompt = []
    while late.num_output_tokens == 0:
        out, _ = step(sched, runner)
        n += 1
        if any(s.request_id == late.request_id for s in out.scheduled):
            steps_with_prompt.append(n)
    assert sched.stats.num_steps == n
    assert early.times.first_scheduled_step == 1 and early.times.first_token_step == 1
    assert late.times.first_scheduled_step == steps_with_prompt[0] == 4
    assert late.times.first_token_step == steps_with_prompt[-1] == n
    assert len(steps_with_prompt) >= 3  # 20 prompt tokens in 8-token steps beside a decode
