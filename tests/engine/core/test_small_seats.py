"""Few seats, every one taken by lower-tier rows (bench sla's --max-num-seqs 32 row, scaled
down): no priority inversion between the drainer and the engine. An interactive arrival starts
in the very next step (a lower row is preempted for it, under the urgent row cap as served),
the lower requests that preemption sends back to the engine's queue neither keep the drainer
from pulling more interactive work (``policies.admission``, on the scheduler's own load) nor
start ahead of an interactive request, and every request still produces its tokens."""

from __future__ import annotations

import pytest

from engine.core.scheduler import Scheduler
from policies.admission import EngineLoad, engine_has_capacity
from tests.engine.fakes import (
    FakeRunner,
    make_requests,
    make_scheduler,
    reference_tokens,
    run_to_completion,
    shares,
    step,
)

SEATS = 8
INTERACTIVE, BATCH, BEST_EFFORT = 0, 1, 2
WEIGHTS = {INTERACTIVE: 6, BATCH: 3, BEST_EFFORT: 1}  # the drain weights, as the worker sets


def load_of(sched: Scheduler) -> EngineLoad:
    """The drainer's view of the engine, as ``AsyncEngine.load`` builds it."""
    s = sched.stats
    return EngineLoad(s.num_running, s.num_waiting, s.num_swapped, s.device_blocks_free,
                      s.device_blocks_total, sched.config.max_num_seqs,
                      s.lowest_running_priority, s.waiting_by_priority, s.swapped_by_priority)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("cap", [None, 4])
def test_urgent_arrivals_start_next_step_when_lower_rows_hold_every_seat(
        mode: str, cap: int | None) -> None:
    sched = make_scheduler(num_blocks=128, max_num_seqs=SEATS, preemption_mode=mode)
    if cap is not None:
        sched.set_urgent_row_cap(cap, INTERACTIVE, WEIGHTS, lower_prefill_tokens=8)
    runner = FakeRunner(sched)
    lows = make_requests(SEATS, prompt_len=6, max_tokens=40, priority=[BATCH, BEST_EFFORT])
    for r in lows:
        sched.add_request(r)
    step(sched, runner)
    assert len(sched.running) == SEATS and not sched.waiting
    urgent = []
    for i in range(5):
        (u,) = make_requests(1, prompt_len=7, max_tokens=30, priority=INTERACTIVE,
                             start_time=10.0 + i)
        # the drainer still pulls interactive: evicted lower requests wait behind it
        assert engine_has_capacity(load_of(sched), INTERACTIVE)
        sched.add_request(u)
        out, _ = step(sched, runner)
        assert shares(out).get(u.request_id) == 7 and len(u.output_token_ids) == 1
        urgent.append(u)
        # each seat came from a lower row, best-effort's first
        assert all(sched.get_request(v).priority > INTERACTIVE  # type: ignore[union-attr]
                   for v in out.preempted_ids)
    evicted = [r for r in lows if r.num_preemptions]
    # five evicted: more than the engine's short queue of one priority (4); the lowest first
    assert len(evicted) == 5
    assert sum(r.priority == BEST_EFFORT for r in evicted) == SEATS // 2
    load = load_of(sched)
    assert engine_has_capacity(load, INTERACTIVE)
    assert not engine_has_capacity(load, BEST_EFFORT)  # they still block their own tier
    # More interactive work keeps arriving while the evicted requests wait: it starts in the
    # step after its arrival, and no lower request leaves the engine's queue in a step that
    # leaves an interactive one waiting.
    for i in range(200):
        if not sched.has_unfinished_requests():
            break
        if i % 3 == 0 and i < 60:
            (u,) = make_requests(1, prompt_len=5, max_tokens=6, priority=INTERACTIVE,
                                 start_time=20.0 + i)
            sched.add_request(u)
            urgent.append(u)
        lower_waiting = {r.request_id for r in sched.waiting if r.priority > INTERACTIVE}
        out, _ = step(sched, runner)
        still = {r.request_id for r in sched.waiting}
        if any(r.priority == INTERACTIVE for r in sched.waiting):
            assert lower_waiting <= still | set(out.preempted_ids)
        assert all(u.num_computed_tokens or u.output_token_ids for u in urgent)
    run_to_completion(sched, runner)
    for r in lows + urgent:
        assert r.output_token_ids == reference_tokens(r)
    assert sched.block_manager.num_used_blocks == 0
