from __future__ import annotations

from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    step,
)

PREFIX = list(range(20, 32))  # 3 full blocks of 4


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
    # 12 tokens = 3 full blocks, but the last block holds the last token: recompute it
    assert s.start_pos == 8 and len(s.token_ids) == 4 and s.sample
    assert sched.block_manager.get_block_ids(b.request_id)[2] != sched.block_manager.get_block_ids(a.request_id)[2]
    run_to_completion(sched, runner)
    assert b.output_token_ids == reference_tokens(b) == a.output_token_ids
