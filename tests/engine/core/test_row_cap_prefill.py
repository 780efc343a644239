"""The urgent row cap's prefill allowance: while urgent work is present, lower-priority prompts
compute at most ``lower_prefill_tokens`` a step (chunked), urgent prompts and every decode row
are untouched, and without urgent work (or without chunked prefill) prompts run whole; every
request's tokens stay what they would be alone."""

from __future__ import annotations

import pytest

from engine.core.request import Request
from engine.core.scheduler import Scheduler
from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    step,
)

ALLOWANCE = 16


def prompt_tokens(out_rows: dict[str, int], reqs: list[Request]) -> int:
    """Tokens the step computed for ``reqs`` beyond one per decode row."""
    ids = {r.request_id for r in reqs}
    return sum(n for rid, n in out_rows.items() if rid in ids and n > 1)


def scheduled(sched: Scheduler, runner: FakeRunner) -> dict[str, int]:
    out, _ = step(sched, runner)
    return {s.request_id: len(s.token_ids) for s in out.scheduled}


def test_lower_prompts_are_chunked_to_the_allowance_while_urgent_work_runs() -> None:
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    inter = make_requests(2, prompt_len=5, max_tokens=40, priority=0)
    for r in inter:
        sched.add_request(r)
    step(sched, runner)
    sched.set_urgent_row_cap(12, urgent_priority=0, lower_prefill_tokens=ALLOWANCE)
    bulk = make_requests(4, prompt_len=[40, 23, 9, 30], max_tokens=6, priority=[1, 2, 1, 1],
                         start_time=5.0)
    (late,) = make_requests(1, prompt_len=37, max_tokens=4, priority=0, start_time=6.0)
    for r in [*bulk, late]:
        sched.add_request(r)
    total = sum(len(r.prompt_token_ids) for r in bulk)
    done = 0
    while any(r.num_computed_tokens < len(r.prompt_token_ids) for r in bulk):
        rows = scheduled(sched, runner)
        assert all(r.request_id in rows for r in inter)  # urgent decodes never wait
        spent = prompt_tokens(rows, bulk)
        assert spent <= ALLOWANCE
        done += spent
    assert total - done <= len(bulk)  # a lone last prompt token may run as one token
    # the urgent newcomer's 37-token prompt ran whole in its first step
    assert late.num_computed_tokens >= len(late.prompt_token_ids)
    run_to_completion(sched, runner)
    for r in inter + bulk + [late]:
        assert r.output_token_ids == reference_tokens(r)


def test_the_allowance_is_split_by_weight_so_every_lower_tier_starts() -> None:
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    (inter,) = make_requests(1, prompt_len=5, max_tokens=60, priority=0)
    sched.add_request(inter)
    step(sched, runner)
    sched.set_urgent_row_cap(8, urgent_priority=0, weights={1: 3, 2: 1},
                             lower_prefill_tokens=ALLOWANCE)
    batch = make_requests(4, prompt_len=48, max_tokens=4, priority=1, start_time=2.0)
    best = make_requests(2, prompt_len=48, max_tokens=4, priority=2, start_time=3.0)
    for r in batch + best:
        sched.add_request(r)
    for _ in range(4):
        rows = scheduled(sched, runner)
        # best-effort is not starved of prompt tokens by batch's always-waiting backlog:
        # the 16 tokens go 3:1 (12 and 4) while both have prompts to compute
        assert prompt_tokens(rows, batch) == ALLOWANCE * 3 // 4
        assert prompt_tokens(rows, best) == ALLOWANCE // 4
    run_to_completion(sched, runner)
    for r in [inter, *batch, *best]:
        assert r.output_token_ids == reference_tokens(r)


def test_no_allowance_without_urgent_work() -> None:
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    sched.set_urgent_row_cap(4, urgent_priority=0, lower_prefill_tokens=ALLOWANCE)
    bulk = make_requests(3, prompt_len=40, max_tokens=3, priority=1)
    for r in bulk:
        sched.add_request(r)
    rows = scheduled(sched, runner)
    assert rows == {r.request_id: 40 for r in bulk}  # whole prompts: no cap applies


def test_no_allowance_without_chunked_prefill() -> None:
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512,
                           enable_chunked_prefill=False)
    runner = FakeRunner(sched)
    (inter,) = make_requests(1, prompt_len=5, max_tokens=20, priority=0)
    sched.add_request(inter)
    step(sched, runner)
    sched.set_urgent_row_cap(8, urgent_priority=0, lower_prefill_tokens=ALLOWANCE)
    (bulk,) = make_requests(1, prompt_len=40, max_tokens=3, priority=1, start_time=3.0)
    sched.add_request(bulk)
    rows = scheduled(sched, runner)
    assert rows[bulk.request_id] == 40  # unchunked prompts could never fit an allowance


def test_allowance_must_be_positive() -> None:
    sched = make_scheduler()
    with pytest.raises(ValueError, match="prefill"):
        sched.set_urgent_row_cap(4, lower_prefill_tokens=0)


def _urgent_arrivals(sched: Scheduler, runner: FakeRunner, urgent: list[Request],
                     bulk: list[Request], steps: int, every: int, max_tokens: int = 4
                     ) -> list[tuple[int, int, int]]:
    """Step ``steps`` times, an urgent request with a 9-token prompt arriving every ``every``
    steps; per step: (urgent rows, urgent prompt tokens, lower prompt tokens)."""
    seen = []
    for i in range(steps):
        if i % every == 1:
            (u,) = make_requests(1, prompt_len=9, max_tokens=max_tokens, priority=0,
                                 start_time=10.0 + i)
            sched.add_request(u)
            urgent.append(u)
        rows = scheduled(sched, runner)
        urgent_rows = sum(r.request_id in rows for r in urgent)
        seen.append((urgent_rows, prompt_tokens(rows, urgent), prompt_tokens(rows, bulk)))
    return seen


def test_a_step_computing_an_urgent_prompt_carries_no_lower_prompt_tokens() -> None:
    # That step is the urgent request's first token (bench sla's 32-seat row: its TTFT tail
    # was those steps carrying lower chunks); the lower prompts run in the other steps.
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    (first,) = make_requests(1, prompt_len=5, max_tokens=60, priority=0)
    sched.add_request(first)
    step(sched, runner)
    sched.set_urgent_row_cap(12, urgent_priority=0, weights={1: 3, 2: 1},
                             lower_prefill_tokens=ALLOWANCE)
    bulk = make_requests(4, prompt_len=40, max_tokens=5, priority=[1, 2], start_time=2.0)
    for r in bulk:
        sched.add_request(r)
    urgent = [first]
    seen = _urgent_arrivals(sched, runner, urgent, bulk, steps=40, every=3)
    beside = [lower for _, urgent_prompt, lower in seen if urgent_prompt]
    alone = [lower for _, urgent_prompt, lower in seen if not urgent_prompt]
    assert len(beside) >= 10 and not any(beside)
    assert sum(1 for lower in alone if lower) >= 5  # the lower prompts still ran
    assert max(alone) <= ALLOWANCE
    run_to_completion(sched, runner)
    for r in urgent + bulk:
        assert r.output_token_ids == reference_tokens(r)


def test_no_lower_prompt_beside_an_urgent_prompt_without_an_allowance_either() -> None:
    # The worker sets no allowance when its step-cost fit prices no token (bench sla's
    # 32-seat row: interactive's prompt steps then carried whole lower prompts).
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    (first,) = make_requests(1, prompt_len=5, max_tokens=20, priority=0)
    sched.add_request(first)
    step(sched, runner)
    sched.set_urgent_row_cap(12, urgent_priority=0, weights={1: 3, 2: 1})
    (urgent,) = make_requests(1, prompt_len=9, max_tokens=4, priority=0, start_time=2.0)
    bulk = make_requests(2, prompt_len=40, max_tokens=4, priority=[1, 2], start_time=1.0)
    for r in (*bulk, urgent):  # the bulk requests came first
        sched.add_request(r)
    rows = scheduled(sched, runner)
    assert rows[urgent.request_id] == 9 and prompt_tokens(rows, bulk) == 0
    rows = scheduled(sched, runner)  # the next step: the bulk prompts run whole
    assert prompt_tokens(rows, bulk) == 80
    run_to_completion(sched, runner)
    for r in (first, urgent, *bulk):
        assert r.output_token_ids == reference_tokens(r)


def test_lower_prompts_still_run_beside_an_urgent_prompt_while_seats_are_owed() -> None:
    # Urgent rows past the cap owe the lower tiers seats (policies.owed_seats): those need
    # prompts, so the allowance stays even in a step that computes an urgent prompt.
    cap = 2
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    first = make_requests(4, prompt_len=5, max_tokens=60, priority=0)
    for r in first:
        sched.add_request(r)
    step(sched, runner)
    sched.set_urgent_row_cap(cap, urgent_priority=0, weights={0: 6, 1: 3, 2: 1},
                             lower_prefill_tokens=ALLOWANCE)
    bulk = make_requests(4, prompt_len=80, max_tokens=5, priority=[1, 2], start_time=2.0)
    for r in bulk:
        sched.add_request(r)
    urgent = list(first)
    seen = _urgent_arrivals(sched, runner, urgent, bulk, steps=12, every=3, max_tokens=20)
    # four urgent rows and more beside a cap of 2: at least one lower seat owed every step
    beside = [lower for rows, urgent_prompt, lower in seen if urgent_prompt and rows >= cap + 2]
    assert len(beside) >= 3 and sum(1 for lower in beside if lower) >= 2
    run_to_completion(sched, runner)
    for r in urgent + bulk:
        assert r.output_token_ids == reference_tokens(r)


@pytest.mark.parametrize(("allowance", "chunk"), [(3, 16), (5, 16), (16, 16), (7, 1)])
def test_an_allowance_under_the_chunk_is_banked_and_computed_a_chunk_at_once(
        allowance: int, chunk: int) -> None:
    """``lower_prefill_chunk``: each step with a lower prompt waiting banks the allowance;
    once the bank holds a chunk, that step computes all of it. Against a plain bank kept
    here: the lower prompt tokens of every step, and the same tokens as alone."""
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    (inter,) = make_requests(1, prompt_len=5, max_tokens=200, priority=0)
    sched.add_request(inter)
    step(sched, runner)
    sched.set_urgent_row_cap(8, urgent_priority=0, lower_prefill_tokens=allowance,
                             lower_prefill_chunk=chunk)
    (bulk,) = make_requests(1, prompt_len=150, max_tokens=3, priority=1, start_time=2.0)
    sched.add_request(bulk)
    bank, seen, want = 0, [], []
    while bulk.num_computed_tokens < len(bulk.prompt_token_ids):
        left = len(bulk.prompt_token_ids) - bulk.num_computed_tokens
        bank = min(bank + allowance, max(allowance, chunk))
        release = bank if bank >= chunk else 0
        # a prompt's last token computes with its first decode: at most what is left
        want.append(min(release, left) if release else 0)
        bank -= want[-1]
        rows = scheduled(sched, runner)
        assert inter.request_id in rows  # the urgent decode never waits
        seen.append(prompt_tokens(rows, [bulk]) if rows.get(bulk.request_id, 0) > 1
                    else rows.get(bulk.request_id, 0))
    assert seen == want
    assert sum(t > 0 for t in seen) == len(seen) if chunk <= allowance else any(
        t == 0 for t in seen)
    run_to_completion(sched, runner)
    for r in (inter, bulk):
        assert r.output_token_ids == reference_tokens(r)


def test_a_step_beside_an_urgent_prompt_banks_the_allowance_it_gives_none_of() -> None:
    """An urgent prompt's step computes no lower prompt token, but its allowance is banked:
    with 4 tokens a step in chunks of 16 and an urgent arrival in the second step, the chunk
    comes in the fourth step, as without the arrival."""
    sched = make_scheduler(num_blocks=256, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    (inter,) = make_requests(1, prompt_len=5, max_tokens=200, priority=0)
    sched.add_request(inter)
    step(sched, runner)
    sched.set_urgent_row_cap(8, urgent_priority=0, lower_prefill_tokens=4,
                             lower_prefill_chunk=16)
    (bulk,) = make_requests(1, prompt_len=150, max_tokens=3, priority=1, start_time=2.0)
    sched.add_request(bulk)
    got = [prompt_tokens(scheduled(sched, runner), [bulk])]
    (late,) = make_requests(1, prompt_len=30, max_tokens=40, priority=0, start_time=3.0)
    sched.add_request(late)
    rows = scheduled(sched, runner)  # the urgent prompt runs whole, no lower prompt beside it
    assert rows[late.request_id] == 30
    got.append(prompt_tokens(rows, [bulk]))
    got += [prompt_tokens(scheduled(sched, runner), [bulk]) for _ in range(2)]
    assert got == [0, 0, 0, 16]
    run_to_completion(sched, runner)
    for r in (inter, bulk, late):
        assert r.output_token_ids == reference_tokens(r)


def test_each_banked_chunk_goes_whole_to_one_tier_by_weight() -> None:
    """With a chunk, one lower tier computes the whole release (one prefill row, not one a
    tier), the tiers taking turns by weight: 3:1 over the chunks, every chunk 16 tokens."""
    sched = make_scheduler(num_blocks=512, max_num_seqs=16, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    (inter,) = make_requests(1, prompt_len=5, max_tokens=400, priority=0)
    sched.add_request(inter)
    step(sched, runner)
    sched.set_urgent_row_cap(8, urgent_priority=0, weights={0: 6, 1: 3, 2: 1},
                             lower_prefill_tokens=4, lower_prefill_chunk=16)
    batch = make_requests(2, prompt_len=400, max_tokens=2, priority=1, start_time=2.0)
    best = make_requests(2, prompt_len=400, max_tokens=2, priority=2, start_time=3.0)
    for r in batch + best:
        sched.add_request(r)
    chunks: list[tuple[int, int]] = []  # (tier, tokens) of each step with lower prompt work
    for _ in range(64):
        rows = scheduled(sched, runner)
        got = {p: prompt_tokens(rows, reqs) for p, reqs in ((1, batch), (2, best))}
        given = [(p, n) for p, n in got.items() if n]
        assert len(given) <= 1  # never both tiers in one step
        chunks += given
    assert len(chunks) == 16 and all(n == 16 for _, n in chunks)
    assert [p for p, _ in chunks].count(1) == 12  # 3:1, by smooth WRR
    run_to_completion(sched, runner)
    for r in [inter, *batch, *best]:
        assert r.output_token_ids == reference_tokens(r)
