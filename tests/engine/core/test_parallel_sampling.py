"""Parallel sampling (n > 1) in the scheduler, on the fake runner that checks every KV slot a
request reads back holds its own token: the n sequences share the prompt's blocks (far fewer
blocks than n separate requests), each still produces its reference tokens, and aborting or
failing the request ends all n and frees every block."""

from __future__ import annotations

import dataclasses

from engine.core.block_manager import cdiv
from engine.core.parallel_sampling import child_id
from engine.core.request import Request, RequestStatus
from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    step,
)

BS = 4


def _with_n(req: Request, n: int) -> Request:
    return Request(req.request_id, req.prompt_token_ids,
                   dataclasses.replace(req.sampling_params, n=n), arrival_time=req.arrival_time)


def _peak_blocks(reqs: list[Request]) -> tuple[int, list[Request]]:
    sched = make_scheduler(num_blocks=256, block_size=BS, max_num_seqs=16,
                           max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    for r in reqs:
        sched.add_request(r)
    peak, returned = 0, []
    while sched.has_unfinished_requests():
        out = sched.schedule()  # the step's tables are all allocated now
        peak = max(peak, sched.block_manager.num_used_blocks)
        returned += sched.update_from_output(out, runner.execute(out))
        sched.block_manager.check_integrity()
    return peak, returned


def test_n_sequences_share_the_prompt_blocks() -> None:
    n, prompt_len, max_tokens = 8, 37, 5
    [req] = make_requests(1, prompt_len=prompt_len, max_tokens=max_tokens)
    separate = [Request(f"s{i}", req.prompt_token_ids, req.sampling_params) for i in range(n)]
    peak_separate, _ = _peak_blocks(separate)
    peak_n, returned = _peak_blocks([_with_n(req, n)])
    total = cdiv(prompt_len + max_tokens - 1, BS)  # the last token's KV is never computed
    shared = (prompt_len - 1) // BS  # every full block before the one holding the last token
    assert peak_separate == n * total  # admitted together: nothing to share yet
    # the shared blocks once, plus each sequence's own; the parent runs a step ahead of its
    # children, so it may have finished (and freed its own) when they peak
    own = total - shared
    assert shared + (n - 1) * own <= peak_n <= shared + n * own
    assert peak_n * 3 < peak_separate
    finished = {r.request_id: r for r in returned if r.is_finished}
    assert set(finished) == {req.request_id} | {child_id(req.request_id, i) for i in range(1, n)}
    for r in finished.values():  # the fake runner read every shared slot back
        assert r.output_token_ids == reference_tokens(req)
        assert r.status == RequestStatus.FINISHED_LENGTH


def test_children_queue_behind_the_parent_and_respect_max_num_seqs() -> None:
    [req] = make_requests(1, prompt_len=9, max_tokens=3)
    sched = make_scheduler(num_blocks=64, block_size=BS, max_num_seqs=3)
    runner = FakeRunner(sched)
    sched.add_request(_with_n(req, 5))
    _, changed = step(sched, runner)  # the prefill: the parent alone
    assert [r.request_id for r in changed] == [req.request_id]
    assert len(sched.waiting) == 4 and len(sched.running) == 1
    out, _ = step(sched, runner)
    assert len(sched.running) == 3  # two children joined, the seat cap holds
    child = next(s for s in out.scheduled if s.request_id != req.request_id)
    assert child.start_pos == (9 - 1) // BS * BS  # recomputes only the diverging block
    returned = run_to_completion(sched, runner)
    assert len({r.request_id for r in returned if r.is_finished}) == 5
    assert sched.block_manager.num_used_blocks == 0


def test_abort_after_the_fork_frees_all_n() -> None:
    [req] = make_requests(1, prompt_len=11, max_tokens=20)
    sched = make_scheduler(num_blocks=64, block_size=BS)
    runner = FakeRunner(sched)
    sched.add_request(_with_n(req, 4))
    for _ in range(3):
        step(sched, runner)
    assert len(sched.running) == 4
    sched.abort_request(req.request_id)
    _, changed = step(sched, runner)
    assert sorted(r.request_id for r in changed) == sorted(
        [req.request_id] + [child_id(req.request_id, i) for i in range(1, 4)])
    assert all(r.status == RequestStatus.FINISHED_ABORTED for r in changed)
    assert sched.block_manager.num_used_blocks == 0 and not sched.has_unfinished_requests()
    sched.block_manager.check_integrity()


def test_abort_after_the_parent_finished_still_ends_the_others() -> None:
    [req] = make_requests(1, prompt_len=6, max_tokens=30)
    sched = make_scheduler(num_blocks=64, block_size=BS)
    runner = FakeRunner(sched)
    sched.add_request(_with_n(req, 3))
    step(sched, runner)
    step(sched, runner)
    sched.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED)  # a stop string
    sched.abort_request(req.request_id)
    _, changed = step(sched, runner)
    assert {r.request_id for r in changed} == {child_id(req.request_id, i) for i in (1, 2)}
    assert sched.block_manager.num_used_blocks == 0


def test_abort_or_error_before_the_fork_ends_the_unforked_children() -> None:
    [req] = make_requests(1, prompt_len=10, max_tokens=5)
    sched = make_scheduler(num_blocks=64, block_size=BS)
    sched.add_request(_with_n(req, 3))
    sched.abort_request(req.request_id)  # still waiting: nothing forked yet
    _, changed = step(sched, FakeRunner(sched))
    assert len(changed) == 3 and all(r.status == RequestStatus.FINISHED_ABORTED for r in changed)
    [big] = make_requests(1, prompt_len=300, max_tokens=5)  # can never fit 16 blocks of 4
    sched = make_scheduler(num_blocks=16, block_size=BS)
    sched.add_request(_with_n(big, 2))
    _, changed = step(sched, FakeRunner(sched))
    assert len(changed) == 2 and all(r.status == RequestStatus.FINISHED_ERROR for r in changed)
    assert all(r.error for r in changed)


def test_preempted_children_recompute_and_still_match() -> None:
    [req] = make_requests(1, prompt_len=13, max_tokens=12)
    sched = make_scheduler(num_blocks=14, block_size=BS, preemption_mode="recompute")
    sched.add_request(_with_n(req, 4))
    returned = run_to_completion(sched, FakeRunner(sched))
    finished = list({r.request_id: r for r in returned if r.is_finished}.values())
    assert len(finished) == 4 and sched.stats.preemptions_recompute > 0
    assert all(r.output_token_ids == reference_tokens(req) for r in finished)


def test_a_parked_fork_gives_its_blocks_to_a_more_urgent_request() -> None:
    # 11 blocks of 2: a 21-token n=2 request finishes at its first token, its child waits
    # holding the 10 shared prompt blocks; a more urgent 3-token request then needs a second
    # block. Before, it preempted itself for it at every third step, forever.
    sched = make_scheduler(num_blocks=11, block_size=2, max_num_seqs=1, max_num_batched_tokens=1,
                           num_cpu_blocks=0, enable_prefix_caching=False)
    runner = FakeRunner(sched)
    [big] = make_requests(1, prompt_len=21, max_tokens=1)
    big = _with_n(big, 2)
    big.priority = 1
    sched.add_request(big)
    while not sched.waiting or next(iter(sched.waiting)).request_id != child_id(big.request_id, 1):
        step(sched, runner)
    child = sched.get_request(child_id(big.request_id, 1))
    assert child is not None and sched.block_manager.num_device_blocks_of(child.request_id) == 10
    urgent = Request("urgent", [5], dataclasses.replace(big.sampling_params, n=1, max_tokens=3),
                     priority=0)
    sched.add_request(urgent)
    for _ in range(30):
        step(sched, runner)
    assert urgent.status == RequestStatus.FINISHED_LENGTH
    assert child.status == RequestStatus.FINISHED_LENGTH  # it recomputed its prompt, then ran
    assert child.output_token_ids == reference_tokens(big)
    assert sched.block_manager.num_used_blocks == 0
