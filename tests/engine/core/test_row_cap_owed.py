"""Seats owed past the urgent row cap, in the scheduler with the fake runner: the total is
floored once and spread by the weighted round-robin (best-effort gets its fraction over
time), and the owed seats bring as many prompt tokens to the lower prefill allowance. The
references are straightforward: ``policies.wrr.wrr_sequence`` for the spread, arithmetic for
the counts; every request's tokens stay what they would be alone."""

from __future__ import annotations

from engine.core.request import Request
from engine.core.scheduler import Scheduler
from policies.wrr import wrr_sequence
from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    step,
)

WEIGHTS = {0: 6, 1: 3, 2: 1}  # interactive, batch, best-effort (the default drain weights)
ALLOWANCE = 16


def decoding(sched: Scheduler, runner: FakeRunner, reqs: list[Request]) -> None:
    for r in reqs:
        sched.add_request(r)
    for _ in range(2):
        step(sched, runner)
    assert all(r.num_output_tokens == 2 for r in reqs)


def rows_by_priority(sched: Scheduler, runner: FakeRunner) -> dict[int, dict[str, int]]:
    """One step: priority -> request id -> tokens scheduled."""
    out, _ = step(sched, runner)
    rows: dict[int, dict[str, int]] = {}
    for s in out.scheduled:
        req = sched.get_request(s.request_id)
        assert req is not None
        rows.setdefault(req.priority, {})[s.request_id] = len(s.token_ids)
    return rows


def test_three_rows_past_the_cap_owe_two_seats_shared_three_to_one() -> None:
    """Eight urgent rows beside a cap of five: batch is owed 1.5 seats and best-effort 0.5,
    2 a step in all (per-tier floors gave 1), spread 3:1 over the steps by smooth WRR."""
    sched = make_scheduler(num_blocks=1024, max_num_seqs=64, max_num_batched_tokens=256)
    runner = FakeRunner(sched)
    urgent = make_requests(8, prompt_len=4, max_tokens=200, priority=0)
    batch = make_requests(8, prompt_len=4, max_tokens=200, priority=1, start_time=1.0)
    best_effort = make_requests(8, prompt_len=4, max_tokens=200, priority=2, start_time=2.0)
    decoding(sched, runner, urgent + batch + best_effort)
    sched.set_urgent_row_cap(5, urgent_priority=0, weights=WEIGHTS)
    seats = {1: 0, 2: 0}
    steps = 40
    for _ in range(steps):
        rows = rows_by_priority(sched, runner)
        assert len(rows[0]) == 8 and len(rows.get(1, {})) + len(rows.get(2, {})) == 2
        for p in seats:
            seats[p] += len(rows.get(p, {}))
    want = wrr_sequence({"1": 3, "2": 1}, 2 * steps)
    assert seats == {1: want.count("1"), 2: want.count("2")} == {1: 60, 2: 20}
    run_to_completion(sched, runner)
    for r in urgent + batch + best_effort:
        assert r.output_token_ids == reference_tokens(r)


def test_owed_seats_bring_their_prompt_tokens() -> None:
    """30 urgent rows beside a cap of five (six caps: every urgent row counts) owe the lower
    tiers 30 * 4 / 6 = 20 seats, and the prefill allowance grows by as many tokens: 16 + 20
    a step, split 3:1 between batch's and best-effort's long prompts (27 and 9)."""
    sched = make_scheduler(num_blocks=2048, max_num_seqs=128, max_num_batched_tokens=512)
    runner = FakeRunner(sched)
    urgent = make_requests(30, prompt_len=4, max_tokens=40, priority=0)
    decoding(sched, runner, urgent)
    sched.set_urgent_row_cap(5, urgent_priority=0, weights=WEIGHTS,
                             lower_prefill_tokens=ALLOWANCE)
    # more requests queued than the seats owed to each tier (15 and 5)
    batch = make_requests(16, prompt_len=200, max_tokens=4, priority=1, start_time=5.0)
    best_effort = make_requests(6, prompt_len=200, max_tokens=4, priority=2, start_time=6.0)
    for r in batch + best_effort:
        sched.add_request(r)
    total = ALLOWANCE + 30 * (3 + 1) // 6
    for _ in range(4):
        rows = rows_by_priority(sched, runner)
        assert len(rows[0]) == 30  # every urgent decode runs
        assert sum(rows[1].values()) == total * 3 // 4
        assert sum(rows[2].values()) == total // 4
    run_to_completion(sched, runner)
    for r in urgent + batch + best_effort:
        assert r.output_token_ids == reference_tokens(r)


def test_an_urgent_backlog_owes_seats_for_every_urgent_row() -> None:
    """Twelve urgent rows beside a cap of twelve, every tier with work: within the cap no
    seat is owed and the lower tiers sit out (the row cap's promise to an interactive tier
    that is not backlogged); with the urgent tier backlogged they are owed 12 * 4 / 6 = 8
    seats a step, shared 3:1 by smooth WRR, so the rows follow the weights 6:3:1."""
    def lower_rows(backlogged: bool, steps: int) -> dict[int, int]:
        sched = make_scheduler(num_blocks=1024, max_num_seqs=64, max_num_batched_tokens=256)
        runner = FakeRunner(sched)
        urgent = make_requests(12, prompt_len=4, max_tokens=200, priority=0)
        batch = make_requests(10, prompt_len=4, max_tokens=200, priority=1, start_time=1.0)
        best_effort = make_requests(10, prompt_len=4, max_tokens=200, priority=2,
                                    start_time=2.0)
        decoding(sched, runner, urgent + batch + best_effort)
        sched.set_urgent_row_cap(12, urgent_priority=0, weights=WEIGHTS,
                                 urgent_backlogged=backlogged)
        seats = {1: 0, 2: 0}
        for _ in range(steps):
            rows = rows_by_priority(sched, runner)
            assert len(rows[0]) == 12  # every urgent row runs either way
            for p in seats:
                seats[p] += len(rows.get(p, {}))
        run_to_completion(sched, runner)
        for r in urgent + batch + best_effort:
            assert r.output_token_ids == reference_tokens(r)
        return seats

    steps = 20
    assert lower_rows(False, steps) == {1: 0, 2: 0}
    want = wrr_sequence({"1": 3, "2": 1}, 12 * (3 + 1) // 6 * steps)
    assert lower_rows(True, steps) == {1: want.count("1"), 2: want.count("2")}
    assert want.count("1") == 3 * want.count("2")  # batch : best-effort = 3 : 1
