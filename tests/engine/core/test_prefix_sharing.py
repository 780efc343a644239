from __future__ import annotations

import random

import pytest

from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    step,
)

PREFIX = list(range(20, 32))  # 3 full blocks of 4


def _request(rid: str, prompt: list[int], max_tokens: int, at: float, priority: int = 0) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   priority=priority, arrival_time=at)


def test_followers_share_the_computed_prefix_blocks() -> None:
    sched = make_scheduler(num_blocks=32)
    runner = FakeRunner(sched)
    bm = sched.block_manager
    (first,) = make_requests(1, prompt_len=3, max_tokens=4, prefix=PREFIX)
    sched.add_request(first)
    step(sched, runner)  # prefix computed and registered
    followers = make_requests(3, prompt_len=2, max_tokens=4, prefix=PREFIX, start_time=1.0)
    for r in followers:
        sched.add_request(r)
    out, _ = step(sched, runner)
    shared = bm.get_block_ids(first.request_id)[:3]
    for r in followers:
        assert bm.get_block_ids(r.request_id)[:3] == shared
        (s,) = [s for s in out.scheduled if s.request_id == r.request_id]
        assert s.start_pos == 12 and len(s.token_ids) == 2  # only the new tokens computed
    assert [bm._ref[b] for b in shared] == [4, 4, 4]
    st = sched.stats
    assert st.prefix_cache_hits == 3 * 12
    assert st.prefix_cache_queries == 15 + 3 * 14
    run_to_completion(sched, runner)
    for r in [first] + followers:
        assert r.output_token_ids == reference_tokens(r)
    assert bm.num_used_blocks == 0


def test_finished_request_prefix_is_reused_from_the_lru() -> None:
    sched = make_scheduler(num_blocks=32)
    runner = FakeRunner(sched)
    (a,) = make_requests(1, prompt_len=1, max_tokens=2, prefix=PREFIX)
    sched.add_request(a)
    run_to_completion(sched, runner)
    (b,) = make_requests(1, prompt_len=1, max_tokens=2, prefix=PREFIX, start_time=9.0)
    sched.add_request(b)
    out, _ = step(sched, runner)
    assert out.scheduled[0].start_pos == 12
    run_to_completion(sched, runner)
    assert b.output_token_ids == reference_tokens(b)


def test_identical_prompts_leave_the_last_token_to_compute() -> None:
    sched = make_scheduler(num_blocks=32)
    runner = FakeRunner(sched)
    (a,) = make_requests(1, prompt_len=0, max_tokens=3, prefix=PREFIX)
    sched.add_request(a)
    step(sched, runner)
    (b,) = make_requests(1, prompt_len=0, max_tokens=3, prefix=PREFIX, start_time=1.0)
    sched.add_request(b)
    out, _ = step(sched, runner)
    (s,) = [s for s in out.scheduled if s.request_id == b.request_id]
    # 12 tokens = 3 full blocks, but the last block holds the last token: its first 3 tokens
    # are copied into b's own block and only the last is computed
    assert s.start_pos == 11 and len(s.token_ids) == 1 and s.sample
    a_blocks = sched.block_manager.get_block_ids(a.request_id)
    b_blocks = sched.block_manager.get_block_ids(b.request_id)
    assert b_blocks[:2] == a_blocks[:2] and b_blocks[2] != a_blocks[2]
    assert out.copies == [(a_blocks[2], b_blocks[2])]
    assert b.num_cached_tokens == 11
    run_to_completion(sched, runner)
    assert b.output_token_ids == reference_tokens(b) == a.output_token_ids


def test_a_finished_requests_output_block_serves_the_next_same_prompt() -> None:
    """The served case: a repeated chat prompt whose tail shares a block with the first
    request's output tokens (hashed once full) is computed from its last token only."""
    sched = make_scheduler(num_blocks=32)
    runner = FakeRunner(sched)
    (a,) = make_requests(1, prompt_len=2, max_tokens=6, prefix=PREFIX)  # 14 + 6 tokens
    sched.add_request(a)
    run_to_completion(sched, runner)
    b = _request("again", a.prompt_token_ids, max_tokens=4, at=5.0)  # the same prompt again
    sched.add_request(b)
    out, _ = step(sched, runner)
    (s,) = out.scheduled
    assert s.start_pos == 13 and len(out.copies) == 1
    run_to_completion(sched, runner)
    assert b.output_token_ids == reference_tokens(b) == a.output_token_ids[:4]
    assert sched.block_manager.num_used_blocks == 0
    sched.block_manager.check_integrity()


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_copied_blocks_keep_outputs_exact_under_churn(mode: str) -> None:
    """Many requests over shared heads, with a cache small enough to evict and preempt: every
    output equals its reference (the fake runner reads tokens back from the simulated KV,
    so a copy that ran late, into the wrong block, or not at all changes the output)."""

    rng = random.Random(7)
    sched = make_scheduler(num_blocks=16, preemption_mode=mode)
    runner = FakeRunner(sched)
    heads = [[20, 21, 22, 23, 24, 25, 26], [20, 21, 22, 30, 31], [40, 41, 42, 43, 44, 45]]
    reqs = []
    for i in range(60):
        head = rng.choice(heads)
        tail = [rng.randint(50, 60) for _ in range(rng.randint(0, 3))]
        prompt = head[: rng.randint(2, len(head))] + tail
        reqs.append(_request(f"churn{i}", prompt, rng.randint(4, 12), i // 6, rng.randint(0, 2)))
    copies = 0
    for i in range(0, len(reqs), 6):
        for r in reqs[i : i + 6]:
            sched.add_request(r)
        for _ in range(2):
            out, _ = step(sched, runner)
            copies += len(out.copies)
    run_to_completion(sched, runner)
    assert copies > 0
    st = sched.stats
    assert st.preemptions_swap + st.preemptions_recompute > 0  # the churn the test is about
    for r in reqs:
        assert r.output_token_ids == reference_tokens(r), r.request_id
    assert sched.stats.prefix_cache_hits > 0
    assert sched.block_manager.num_used_blocks == 0


def test_parallel_samples_of_a_one_block_prompt_read_only_written_kv() -> None:
    """n = 2 with a prompt of exactly one block: the child's copy of the parent's (now full,
    cached) block must run before it computes its last token."""
    sched = make_scheduler(num_blocks=32)
    runner = FakeRunner(sched)
    req = Request("pair", [5, 6, 7, 8], SamplingParams(max_tokens=3, ignore_eos=True, n=2,
                                                       temperature=0.0), arrival_time=0.0)
    sched.add_request(req)
    returned = run_to_completion(sched, runner)  # the fake runner asserts every KV read
    assert returned
    assert sched.block_manager.num_used_blocks == 0
