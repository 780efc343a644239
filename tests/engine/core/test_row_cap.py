"""The urgent row cap (``Scheduler.set_urgent_row_cap``) with the fake runner: lower-tier rows
leave an over-budget batch while urgent work is present, keep their KV blocks, and come back
when it is gone; every request's tokens stay what they would be alone."""

from __future__ import annotations

import pytest

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


def decoding(sched: Scheduler, runner: FakeRunner, reqs: list[Request], steps: int = 2) -> None:
    for r in reqs:
        sched.add_request(r)
    for _ in range(steps):
        step(sched, runner)
    assert all(r.num_output_tokens == steps for r in reqs)  # prefilled, now decoding


def progress(reqs: list[Request]) -> dict[str, tuple[int, int]]:
    return {r.request_id: (r.num_computed_tokens, r.num_output_tokens) for r in reqs}


def test_interactive_arrival_makes_batch_rows_leave_the_batch() -> None:
    sched = make_scheduler(num_blocks=128, max_num_seqs=16)
    runner = FakeRunner(sched)
    batch = make_requests(8, prompt_len=6, max_tokens=30, priority=1)
    decoding(sched, runner, batch)
    sched.set_urgent_row_cap(4, urgent_priority=0)
    out, _ = step(sched, runner)
    assert len(out.scheduled) == 8  # no urgent work: no cap, the batch runs at full size

    (inter,) = make_requests(1, prompt_len=5, max_tokens=4, priority=0, start_time=10.0)
    sched.add_request(inter)
    blocks = {r.request_id: sched.block_manager.get_block_ids(r.request_id) for r in batch}
    before = progress(batch)
    held_before = sched.stats.rows_held_back
    steps = 0
    while not inter.is_finished:
        was = progress(batch)
        out, _ = step(sched, runner)
        steps += 1
        ran = {s.request_id for s in out.scheduled}
        # the interactive request and three batch rows, nothing else ...
        assert inter.request_id in ran and len(ran) == 4
        now = progress(batch)
        for r in batch:
            if r.request_id not in ran:  # ... the others do not advance and keep their KV
                assert now[r.request_id] == was[r.request_id]
                held_blocks = sched.block_manager.get_block_ids(r.request_id)
                assert held_blocks[:len(blocks[r.request_id])] == blocks[r.request_id]
                assert r.request_id in sched.running  # paused, not preempted
    assert steps == 4 and sched.stats.rows_held_back - held_before == 5 * steps
    assert sched.stats.preemptions == 0
    # the batch rows took turns: 12 row-steps over 8 rows, none ran twice before all ran once
    gained = sorted(r.num_output_tokens - before[r.request_id][1] for r in batch)
    assert sum(gained) == 3 * steps and gained[-1] - gained[0] <= 1

    out, _ = step(sched, runner)
    assert {s.request_id for s in out.scheduled} == {r.request_id for r in batch}
    run_to_completion(sched, runner)
    for r in batch + [inter]:
        assert r.output_token_ids == reference_tokens(r)


def test_held_back_rows_take_turns_while_urgent_work_stays() -> None:
    """No lower row is held back for ever: with urgent work always present, every batch row
    keeps advancing (a straightforward round-robin is the reference)."""
    sched = make_scheduler(num_blocks=256, max_num_seqs=16)
    runner = FakeRunner(sched)
    batch = make_requests(6, prompt_len=4, max_tokens=200, priority=1)
    decoding(sched, runner, batch)
    sched.set_urgent_row_cap(3)
    urgent = make_requests(1, prompt_len=4, max_tokens=60, priority=0, start_time=10.0)
    sched.add_request(urgent[0])
    ran_count = {r.request_id: 0 for r in batch}
    for _ in range(30):
        out, _ = step(sched, runner)
        for s in out.scheduled:
            if s.request_id in ran_count:
                ran_count[s.request_id] += 1
    # 2 lower seats a step over 6 rows: each row runs every third step
    assert sorted(ran_count.values()) == [10] * 6
    run_to_completion(sched, runner)
    for r in batch + urgent:
        assert r.output_token_ids == reference_tokens(r)


def test_lower_rows_run_in_priority_then_arrival_order() -> None:
    sched = make_scheduler(num_blocks=128, max_num_seqs=16)
    runner = FakeRunner(sched)
    # arrival order: best-effort first, then batch; the batch rows still go first
    best_effort = make_requests(3, max_tokens=20, priority=2, start_time=0.0)
    batch = make_requests(3, max_tokens=20, priority=1, start_time=1.0)
    decoding(sched, runner, best_effort + batch)
    inter = make_requests(2, max_tokens=3, priority=0, start_time=5.0)
    for r in inter:
        sched.add_request(r)
    sched.set_urgent_row_cap(6)
    out, _ = step(sched, runner)
    expected = inter + batch + best_effort[:1]
    assert {s.request_id for s in out.scheduled} == {r.request_id for r in expected}
    run_to_completion(sched, runner)
    for r in best_effort + batch + inter:
        assert r.output_token_ids == reference_tokens(r)


def test_lower_seats_follow_the_tier_weights_while_urgent_work_stays() -> None:
    """Weighted: the seats under the cap go to batch and best-effort 3:1 over time (the
    reference is a straightforward count of smooth WRR picks), so best-effort is not starved
    behind batch while interactive work is present."""
    sched = make_scheduler(num_blocks=512, max_num_seqs=32)
    runner = FakeRunner(sched)
    batch = make_requests(6, prompt_len=4, max_tokens=300, priority=1)
    best_effort = make_requests(6, prompt_len=4, max_tokens=300, priority=2, start_time=1.0)
    decoding(sched, runner, batch + best_effort)
    sched.set_urgent_row_cap(5, urgent_priority=0, weights={1: 3, 2: 1})
    (urgent,) = make_requests(1, prompt_len=4, max_tokens=100, priority=0, start_time=10.0)
    sched.add_request(urgent)
    seats = {1: 0, 2: 0}
    steps = 40
    for _ in range(steps):
        out, _ = step(sched, runner)
        for s in out.scheduled:
            req = sched.get_request(s.request_id)
            if req is not None and req.priority in seats:
                seats[req.priority] += 1
    want = wrr_sequence({1: 3, 2: 1}, 4 * steps)  # 4 lower seats a step
    assert seats == {1: want.count(1), 2: want.count(2)} == {1: 120, 2: 40}
    run_to_completion(sched, runner)
    for r in batch + best_effort + [urgent]:
        assert r.output_token_ids == reference_tokens(r)


def test_urgent_rows_all_run_even_past_the_cap() -> None:
    sched = make_scheduler(num_blocks=128, max_num_seqs=16)
    runner = FakeRunner(sched)
    batch = make_requests(3, max_tokens=20, priority=1)
    decoding(sched, runner, batch)
    inter = make_requests(3, max_tokens=5, priority=0, start_time=5.0)
    for r in inter:
        sched.add_request(r)
    sched.set_urgent_row_cap(2)
    out, _ = step(sched, runner)
    assert {s.request_id for s in out.scheduled} == {r.request_id for r in inter}


def test_no_new_lower_request_is_admitted_past_the_cap() -> None:
    sched = make_scheduler(num_blocks=128, max_num_seqs=16)
    runner = FakeRunner(sched)
    (inter,) = make_requests(1, max_tokens=6, priority=0)
    batch = make_requests(2, max_tokens=20, priority=1, start_time=1.0)
    decoding(sched, runner, [inter] + batch)
    sched.set_urgent_row_cap(4)
    late = make_requests(3, max_tokens=20, priority=[1, 2, 1], start_time=9.0)
    for r in late:
        sched.add_request(r)
    out, _ = step(sched, runner)
    # one seat under the cap: the most urgent, earliest newcomer takes it
    assert {s.request_id for s in out.scheduled} == {inter.request_id, late[0].request_id} | {
        r.request_id for r in batch}
    assert [r.request_id for r in sched.waiting] == [late[2].request_id, late[1].request_id]
    while not inter.is_finished:
        out, _ = step(sched, runner)
        assert len(out.scheduled) <= 4
    out, _ = step(sched, runner)  # the urgent request is gone: everyone runs
    assert {s.request_id for s in out.scheduled} == {r.request_id for r in batch + late}
    sched.set_urgent_row_cap(None)
    run_to_completion(sched, runner)
    for r in [inter] + batch + late:
        assert r.output_token_ids == reference_tokens(r)


def test_cap_must_not_be_negative() -> None:
    sched = make_scheduler()
    with pytest.raises(ValueError):
        sched.set_urgent_row_cap(-1)
    sched.set_urgent_row_cap(3, urgent_priority=1)
    assert sched.urgent_row_cap is not None and sched.urgent_row_cap.cap == 3
    sched.set_urgent_row_cap(None)
    assert sched.urgent_row_cap is None


# ---- every tier backlogged: the seats follow the weights, interactive included ----------

WEIGHTS = {0: 6, 1: 3, 2: 1}  # interactive, batch, best-effort (the default drain weights)


def _reference_seats(cap: int, urgent: int, steps: int) -> dict[int, int]:
    """Row-steps per priority when every priority has more demand than seats: the urgent
    rows all run; the lower tiers get the cap's rest or, when more, what the weights owe
    them for the urgent rows past the cap (every urgent row from three caps on), floored
    once, spread 3:1 by smooth WRR."""
    past = max(0, urgent - cap)
    counted = urgent if urgent >= 3 * cap else past if urgent <= 2 * cap else 2 * past - cap
    owed = counted * (WEIGHTS[1] + WEIGHTS[2]) // WEIGHTS[0]
    lower = max(cap - urgent, owed)
    picks = wrr_sequence({"1": WEIGHTS[1], "2": WEIGHTS[2]}, lower * steps)
    return {0: urgent * steps, 1: picks.count("1"), 2: picks.count("2")}


def test_interactive_alone_past_the_cap_does_not_starve_the_other_tiers() -> None:
    """Interactive alone fills the cap (30 rows, cap 5): batch and best-effort are still
    owed seats by the weights, for every urgent row since they are six caps, so best-effort's
    share of the rows is over half its WRR share; the old rule (urgent first, lower only
    under the cap) gave them none."""
    sched = make_scheduler(num_blocks=1024, max_num_seqs=64, max_num_batched_tokens=256)
    runner = FakeRunner(sched)
    urgent = make_requests(30, prompt_len=4, max_tokens=120, priority=0)
    batch = make_requests(16, prompt_len=4, max_tokens=120, priority=1, start_time=1.0)
    best_effort = make_requests(8, prompt_len=4, max_tokens=120, priority=2, start_time=2.0)
    decoding(sched, runner, urgent + batch + best_effort)
    sched.set_urgent_row_cap(5, urgent_priority=0, weights=WEIGHTS)
    seats = {0: 0, 1: 0, 2: 0}
    steps = 30
    for _ in range(steps):
        out, _ = step(sched, runner)
        for s in out.scheduled:
            req = sched.get_request(s.request_id)
            assert req is not None
            seats[req.priority] += 1
    assert seats == _reference_seats(5, 30, steps)
    share = seats[2] / sum(seats.values())
    assert share >= 0.5 * WEIGHTS[2] / sum(WEIGHTS.values())
    assert sched.stats.preemptions == 0
    run_to_completion(sched, runner)
    for r in urgent + batch + best_effort:
        assert r.output_token_ids == reference_tokens(r)


def test_interactive_under_its_share_still_jumps_the_queue() -> None:
    """Two interactive rows beside a backlog of batch and best-effort: the cap bounds the
    step (5 rows: no urgent row is past the cap, so nothing more is owed), and a new
    interactive request starts in the very next step."""
    sched = make_scheduler(num_blocks=1024, max_num_seqs=64, max_num_batched_tokens=256)
    runner = FakeRunner(sched)
    urgent = make_requests(2, prompt_len=4, max_tokens=300, priority=0)
    bulk = make_requests(12, prompt_len=4, max_tokens=300, priority=[1, 2], start_time=1.0)
    decoding(sched, runner, urgent + bulk)
    sched.set_urgent_row_cap(5, urgent_priority=0, weights=WEIGHTS)
    for _ in range(3):
        out, _ = step(sched, runner)
        assert len(out.scheduled) == 5
    (late,) = make_requests(1, prompt_len=4, max_tokens=10, priority=0, start_time=9.0)
    sched.add_request(late)
    out, _ = step(sched, runner)
    ran = {s.request_id for s in out.scheduled}
    assert {r.request_id for r in urgent + [late]} <= ran and len(ran) == 5
    run_to_completion(sched, runner)
    for r in urgent + bulk + [late]:
        assert r.output_token_ids == reference_tokens(r)


def test_a_tier_with_only_queued_work_gets_its_seats_under_the_cap() -> None:
    """Batch rows fill the cap and best-effort has only waiting requests: best-effort's share
    of the seats lets one of them start (the old rule admitted no lower request while the
    running rows filled the cap, so a tier with nothing running never got in)."""
    sched = make_scheduler(num_blocks=1024, max_num_seqs=64, max_num_batched_tokens=256)
    runner = FakeRunner(sched)
    (inter,) = make_requests(1, prompt_len=4, max_tokens=300, priority=0)
    batch = make_requests(6, prompt_len=4, max_tokens=300, priority=1, start_time=1.0)
    decoding(sched, runner, [inter] + batch)
    sched.set_urgent_row_cap(5, urgent_priority=0, weights={1: 3, 2: 1})
    best_effort = make_requests(3, prompt_len=4, max_tokens=300, priority=2, start_time=5.0)
    for r in best_effort:
        sched.add_request(r)
    out, _ = step(sched, runner)
    # 4 lower seats, 3:1 by smooth WRR: 3 batch rows run, 1 best-effort request starts
    want = wrr_sequence({"1": 3, "2": 1}, 4)
    ran = [sched.get_request(s.request_id) for s in out.scheduled]
    assert sorted(r.priority for r in ran if r is not None) == sorted(
        [0] + [int(p) for p in want])
    assert len(sched.waiting) == 2
    run_to_completion(sched, runner)
    for r in [inter] + batch + best_effort:
        assert r.output_token_ids == reference_tokens(r)
