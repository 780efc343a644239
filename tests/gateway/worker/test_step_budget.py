"""The step budget: synthetic steps from a known cost law give the cap that law implies; with
the real tiny-model engine inside a worker the cap reaches the engine's scheduler."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.outputs import ScheduledRequest, SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.frontend.async_engine import AsyncEngine
from gateway.worker.step_budget import MAX_GAP_S, StepBudget
from gateway.worker.step_pricing import (
    LOWER_PROMPT_PER_OUTPUT,
    MIN_LOWER_PREFILL_RATE,
    MIN_LOWER_PREFILL_TOKENS,
)
from gateway.worker.tpot_target import PAST_SHARE_ENTER, PAST_SHARE_EXIT, TARGET_LOG_STEP
from gateway.worker.urgent_demand import UrgentDemand
from gateway.worker.worker import Worker
from policies.admission import EngineLoad
from policies.owed_seats import BACKLOG_ENTER, BACKLOG_EXIT, owed_seats
from policies.step_cost import StepCostModel
from policies.tiers import (
    BATCH,
    DERIVED_TPOT_HEADROOM,
    INTERACTIVE,
    SMALL_BATCH_ROWS,
    TierSLO,
    tier_priority,
)
from tests.gateway.harness import make_config

# the synthetic engine's true cost law: seconds = A + B*rows + C*tokens + D*kv_tokens
A, B, C, D = 0.03, 0.004, 0.001, 2e-5
MAX_SEQS = 256
URGENT, LOWER = tier_priority(INTERACTIVE), tier_priority(BATCH)


def true_cost(rows: int, tokens: int, kv: int) -> float:
    return A + B * rows + C * tokens + D * kv


def capped_step(rows: int, kv: float, urgent: int = SMALL_BATCH_ROWS) -> float:
    """The true law's step of ``rows`` decode rows at ``kv`` context, the rows past
    ``urgent`` lower ones each with a prompt token on top (LOWER_PROMPT_PER_OUTPUT; a prompt
    token is a token and a KV entry)."""
    return (true_cost(rows, rows, 0) + D * rows * kv
            + max(0, rows - urgent) * (C + D) * LOWER_PROMPT_PER_OUTPUT)


class RecordingEngine:
    """Just what StepBudget uses of an EngineClient."""

    def __init__(self) -> None:
        self.caps: list[tuple[int | None, int]] = []
        self.weights: list[dict[int, int]] = []
        self.prefill: list[int | None] = []
        self.backlogged: list[bool] = []
        self.observers: list[Any] = []

    def set_urgent_row_cap(self, cap: int | None, urgent_priority: int = 0,
                           weights: Any = None, lower_prefill_tokens: Any = None,
                           urgent_backlogged: bool = False, lower_prefill_chunk: int = 1) -> None:
        self.caps.append((cap, urgent_priority))
        self.weights.append(dict(weights or {}))
        self.prefill.append(lower_prefill_tokens)
        self.backlogged.append(urgent_backlogged)

    def add_step_observer(self, observer: Any) -> Any:
        self.observers.append(observer)
        return lambda: self.observers.remove(observer)

    def load(self) -> EngineLoad:
        return EngineLoad(0, 0, 0, 100, 100, MAX_SEQS, None)


def synthetic_step(rows: int, context: int, prefill: int = 0, urgent: int = 0
                   ) -> tuple[SchedulerOutput, float]:
    """``rows`` decode rows at ``context`` tokens each, plus an optional prefill row; the first
    ``urgent`` decode rows interactive's, the rest a lower tier's."""
    params = SamplingParams()
    sched = [ScheduledRequest(f"d{i}", [1], context - 1, [], True, params, 1,
                              priority=URGENT if i < urgent else LOWER) for i in range(rows)]
    if prefill:
        sched.append(ScheduledRequest("p", [1] * prefill, 0, [], True, params, 0,
                                      priority=LOWER))
    n = len(sched)
    tokens = rows + prefill
    kv = rows * context + prefill
    return SchedulerOutput(scheduled=sched), true_cost(n, tokens, kv)


def feed(budget: StepBudget, engine: RecordingEngine, steps: int, context: int = 200) -> None:
    (observe,) = engine.observers
    for i in range(steps):
        out, seconds = synthetic_step(1 + (i * 7) % 40, context, prefill=(i % 3) * 50)
        observe(out, seconds)


def test_no_cap_before_the_first_step() -> None:
    engine = RecordingEngine()
    budget = StepBudget(engine, model=StepCostModel(min_samples=16))  # type: ignore[arg-type]
    budget.attach()
    assert budget.update() is None and engine.caps == [] and budget.target_s is None


@pytest.mark.parametrize("slo", [TierSLO(), TierSLO(tpot_p99_s=0.25)])
def test_a_cold_model_sets_a_provisional_cap_from_the_first_steps(slo: TierSLO) -> None:
    """Under min_samples steps the cap comes from the mean seconds per row seen (a fresh
    server met by overload ran its first 16 steps uncapped), with the smallest prefill
    allowance; the batch bound waits for the full model."""
    engine = RecordingEngine()
    budget = StepBudget(engine, slo=slo, model=StepCostModel(min_samples=16))  # type: ignore[arg-type]
    budget.attach()
    steps = [synthetic_step(1 + (i * 7) % 40, 200, prefill=(i % 3) * 50) for i in range(10)]
    for out, seconds in steps:
        engine.observers[0](out, seconds)
    per_row = sum(sec / len(out.scheduled) for out, sec in steps) / len(steps)
    target = slo.tpot_p99_s or DERIVED_TPOT_HEADROOM * SMALL_BATCH_ROWS * per_row
    expected = max(r for r in range(MAX_SEQS + 1) if r * per_row <= target * (1 + 1e-9))
    assert budget.cold and budget.update() == expected
    assert engine.caps == [(expected, 0)] and engine.prefill == [MIN_LOWER_PREFILL_TOKENS]
    assert budget.target_s == pytest.approx(target) and budget.row_limit is None
    feed(budget, engine, 200)  # warm: the full model's cap replaces it
    cap = budget.update()
    kv = budget.model.mean_kv_per_row()
    assert not budget.cold and budget.target_s is not None
    assert cap == max(r for r in range(MAX_SEQS + 1)
                      if capped_step(r, kv) <= budget.target_s * (1 + 1e-9))


def test_the_derived_target_is_logged_again_when_it_moves(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    """Said at the first warm fit and again only when it moved TARGET_LOG_STEP or more since
    last said (the first fit comes in the start's prompt steps; the target in force later
    was not in the log)."""
    engine = RecordingEngine()
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.attach()
    observe = engine.observers[0]

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("interactive TPOT target")]

    with caplog.at_level("INFO", logger="carpool.worker"):
        feed(budget, engine, 200)  # warm; two 4-row decode steps among them
        budget.update()
        assert len(said()) == 1 and "predicted 4-row step" in said()[0]
        # measured 4-row steps: 50 ms, then 50.5 (the median moves ~1 %), then 100 ms
        for seconds, count, lines in ((0.05, 16, 2), (0.0505, 16, 2), (0.1, 300, 3)):
            for _ in range(count):
                observe(synthetic_step(SMALL_BATCH_ROWS, 200)[0], seconds)
            budget.update()
            assert len(said()) == lines, (seconds, said())
    assert said()[1].startswith(f"interactive TPOT target {DERIVED_TPOT_HEADROOM * 50:.0f} ms")
    assert said()[2] == (f"interactive TPOT target {DERIVED_TPOT_HEADROOM * 100:.0f} ms "
                         "(derived from the measured 4-row step, 100 ms, median of 256)")
    assert TARGET_LOG_STEP == 0.1  # the ~1 % move stayed under it


def test_the_derived_target_follows_the_measured_small_step() -> None:
    """Once MIN_SMALL_STEPS decode-only steps of SMALL_BATCH_ROWS rows were seen, the target
    is the headroom over their median, not the model's prediction; steps of other sizes or
    with a prompt do not count."""
    engine = RecordingEngine()
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.attach()
    feed(budget, engine, 200)
    budget.update()
    predicted = budget.target_s
    assert predicted is not None
    observe = engine.observers[0]
    # 15 measured 4-row decode steps (one short), plus others that must not count
    for i in range(15):
        observe(synthetic_step(SMALL_BATCH_ROWS, 200)[0], 0.1 + 0.001 * i)
    for rows, prefill in ((SMALL_BATCH_ROWS - 1, 0), (SMALL_BATCH_ROWS + 1, 0),
                          (SMALL_BATCH_ROWS - 1, 20)):
        for _ in range(30):
            observe(synthetic_step(rows, 200, prefill=prefill)[0], 0.9)
    budget.update()  # feed() brought 2 4-row decode steps of the true law: 17 now
    small = budget._tpot.small_steps
    assert len(small) == 17
    assert budget.target_s == pytest.approx(DERIVED_TPOT_HEADROOM * sorted(small)[8])
    assert budget.target_s != pytest.approx(predicted)


def test_derived_target_gives_the_cap_the_cost_law_implies() -> None:
    engine = RecordingEngine()
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.attach()
    feed(budget, engine, 200)
    cap = budget.update()
    kv = budget.model.mean_kv_per_row()  # the decode context the model plans with
    small = A + (B + C + D * kv) * SMALL_BATCH_ROWS
    assert budget.target_s == pytest.approx(DERIVED_TPOT_HEADROOM * small, rel=1e-6)
    expected = max(r for r in range(MAX_SEQS + 1)
                   if capped_step(r, kv) <= budget.target_s * (1 + 1e-9))
    assert cap == expected and engine.caps == [(cap, 0)]
    # the seats under the cap follow the drain weights, by priority (interactive's included)
    assert engine.weights == [{0: 6, 1: 3, 2: 1}]
    assert SMALL_BATCH_ROWS <= cap < MAX_SEQS
    # the lower-tier prompt tokens that fit in what the capped step leaves of the target
    spare = budget.target_s - (true_cost(cap, cap, 0) + D * cap * kv)
    assert engine.prefill == [max(MIN_LOWER_PREFILL_RATE, int(spare / (C + D)))]
    assert budget.update() == cap and len(engine.caps) == 1  # set again only when it changes


@pytest.mark.parametrize("urgent", [0, SMALL_BATCH_ROWS, 9])
def test_lower_rows_under_the_cap_are_priced_with_their_prompts(urgent: int) -> None:
    """TPOT is the mean step: past the worker's ``urgent`` interactive rows, each row under
    the cap is a lower one bringing about a prompt token a step, so the cap is the most rows
    whose decode step plus those tokens stays within the target under the true law (a cap
    priced for decode rows alone ran the 32-seat bench row at 1.52x alone's TPOT)."""
    engine = RecordingEngine()
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.urgent_rows = lambda: urgent
    budget.attach()
    feed(budget, engine, 200)
    cap = budget.update()
    kv = budget.model.mean_kv_per_row()
    target = budget.target_s
    assert cap is not None and target is not None
    decode_only = max(r for r in range(MAX_SEQS + 1)
                      if true_cost(r, r, 0) + D * r * kv <= target * (1 + 1e-9))
    assert cap == max(r for r in range(decode_only + 1)
                      if capped_step(r, kv, urgent) <= target * (1 + 1e-9))
    if urgent + 1 < decode_only:  # lower rows fit beside the urgent ones: fewer of them
        assert cap < decode_only
    else:  # the urgent rows alone fill the decode cap: nothing to price
        assert cap == decode_only


def test_explicit_target_and_no_cap_when_it_allows_every_seat() -> None:
    engine = RecordingEngine()
    budget = StepBudget(engine, slo=TierSLO(tpot_p99_s=0.2))  # type: ignore[arg-type]
    budget.attach()
    feed(budget, engine, 100, context=100)
    cap = budget.update()
    kv = budget.model.mean_kv_per_row()
    assert cap == max(r for r in range(MAX_SEQS + 1) if capped_step(r, kv) <= 0.2 + 1e-12)
    budget.slo = TierSLO(tpot_p99_s=100.0)  # every seat fits: the cap is lifted
    assert budget.update() is None and engine.caps[-1] == (None, 0)
    assert engine.prefill[-1] is None  # and its prefill allowance with it
    budget.detach()
    assert engine.observers == []


pytestmark = pytest.mark.timeout(60)


async def test_a_worker_sets_the_cap_on_the_real_engine(redis_url: str,
                                                        tiny_model_dir: Path) -> None:
    engine = AsyncEngine.from_kwargs(model=str(tiny_model_dir), dtype="float32", num_blocks=128,
                                     max_num_seqs=16)
    client = aioredis.Redis.from_url(redis_url)
    worker = Worker(client, engine, make_config())
    budget = worker.step_budget
    budget.refit_interval_s = 0.05
    budget.slo = TierSLO(tpot_p99_s=1e-6)  # unreachable: only the urgent rows may run
    await worker.start()
    try:
        params = SamplingParams(max_tokens=200, ignore_eos=True)
        for i in range(4):
            engine.add_request(f"bulk{i}", [3 + i, 4, 5], params, priority=1)
        for _ in range(400):  # past the cold model's provisional cap
            if not budget.cold and engine.stats().scheduler.urgent_row_cap is not None:
                break
            await asyncio.sleep(0.01)
        assert budget.model.num_samples >= budget.model.min_samples
        assert budget.cap == 0 and engine.stats().scheduler.urgent_row_cap == 0
        # an interactive arrival now runs alone: the bulk rows are held back
        outs = [o async for o in engine.generate(
            "inter", [7, 8], SamplingParams(max_tokens=3, ignore_eos=True), priority=0)]
        assert outs[-1].finished
        assert engine.stats().scheduler.rows_held_back >= 4 * 3
    finally:
        for i in range(4):
            engine.abort(f"bulk{i}")
        await worker.stop()
        await engine.shutdown()
        await client.aclose()


def test_owed_lower_rows_follow_the_cap_in_force() -> None:
    """The drainer's lower limit past the bound: ``policies.owed_seats`` beside the cap last
    set, every lower tier counted; none before a cap is set."""
    engine = RecordingEngine()
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.attach()
    assert budget.owed_lower_rows(100) == 0  # no cap yet
    feed(budget, engine, 200)
    cap = budget.update()
    assert cap is not None
    for urgent in range(4 * cap):
        assert budget.owed_lower_rows(urgent) == owed_seats(urgent, cap, 0, {0: 6, 1: 3, 2: 1})
    assert budget.owed_lower_rows(3 * cap) == 3 * cap * 4 // 6  # every urgent row counts


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# a law whose prompt tokens cost more than its rows: pricing the lower prompts cuts the cap in
# force well under the decode rows that fit the target
STEEP = (0.05, 0.002, 0.004, 0.0)


def steep_budget() -> tuple[StepBudget, RecordingEngine, Clock, int]:
    """A warm budget on the STEEP law with a configured 0.2 s target; its cap."""
    engine = RecordingEngine()
    budget = StepBudget(engine, slo=TierSLO(tpot_p99_s=0.2))  # type: ignore[arg-type]
    clock = Clock()
    budget.demand = UrgentDemand(window_s=10.0, clock=clock)
    budget.attach()
    a, b, c, _ = STEEP
    for i in range(200):
        out, _s = synthetic_step(1 + (i * 7) % 40, 200, prefill=(i % 3) * 50)
        rows, tokens = len(out.scheduled), out.num_batched_tokens
        engine.observers[0](out, a + b * rows + c * tokens)
    cap = budget.update()
    assert cap is not None and engine.backlogged == [False]  # nothing finished: unknown
    return budget, engine, clock, cap


def target_rows() -> tuple[int, float]:
    """The decode rows within the 0.2 s target and their step, by the true STEEP law (a
    decode row is one token)."""
    a, b, c, _ = STEEP
    rows = max(r for r in range(MAX_SEQS + 1) if a + (b + c) * r <= 0.2 * (1 + 1e-9))
    return rows, a + (b + c) * rows


def ask(budget: StepBudget, clock: Clock, fill: float) -> None:
    """A 10 s window of interactive starts asking ``fill`` x the target's decode rows
    (Little's law: rows = tokens/s x step), evenly spread, each 40 tokens."""
    rows, step = target_rows()
    tokens = 40
    rate = fill * rows / step / tokens
    clock.now += 10.0
    for _ in range(round(rate * 10)):
        clock.now += 10.0 / round(rate * 10)
        budget.demand.started()
        budget.demand.finished(tokens)


@pytest.mark.parametrize("fill", [0.8, 0.95, 1.15, 1.4])
def test_interactive_is_backlogged_when_its_demand_passes_the_capped_batch(fill: float) -> None:
    """Interactive asking ``fill`` x the decode rows that fit the TPOT target, in such steps:
    past BACKLOG_ENTER x them, the engine and the drainer owe the lower tiers seats for every
    interactive row; within, only past the cap. The cap in force is smaller (it prices lower
    prompts): it is not the measure (by it, 0.95 x those rows would be backlogged)."""
    budget, engine, clock, cap = steep_budget()
    a, b, c, _ = STEEP
    rows, step = target_rows()
    by_cap = fill * rows * (a + (b + c) * cap) / step > cap  # Little's law at the cap
    assert cap < 0.8 * rows and by_cap is (fill > 0.9)
    ask(budget, clock, fill)
    assert budget.update() == cap
    backlogged = fill > BACKLOG_ENTER
    assert engine.backlogged[-1] is backlogged and budget.urgent_backlogged is backlogged
    assert len(engine.backlogged) == 1 + backlogged  # set again only when it changes
    urgent = cap // 2  # within the cap: owed only when backlogged
    assert budget.owed_lower_rows(urgent) == owed_seats(urgent, cap, 0, {0: 6, 1: 3, 2: 1},
                                                        backlogged=backlogged)
    assert budget.owed_lower_rows(urgent) == (urgent * 4 // 6 if backlogged else 0)


def test_backlogged_interactive_must_fall_under_the_exit_margin_to_be_within_again() -> None:
    """The hysteresis (``BACKLOG_ENTER`` / ``BACKLOG_EXIT``), against a plain state machine:
    a demand between the two keeps whichever judgement was in force."""
    budget, engine, clock, _ = steep_budget()
    state = False
    for fill in (1.15, 1.4, 1.15, 1.1, 1.0, 1.15, 0.8, 1.3):
        ask(budget, clock, fill)
        budget.update()
        state = fill > (BACKLOG_EXIT if state else BACKLOG_ENTER)
        assert budget.urgent_backlogged is state, fill
    assert engine.backlogged == [False, True, False, True]


def test_the_published_law_is_the_fitted_one_and_none_while_cold() -> None:
    """What the tier status publishes for operators and ``bench sla``: a law that prices the
    synthetic engine's steps as its true law does, with the window's context per row."""
    engine = RecordingEngine()
    budget = StepBudget(engine, model=StepCostModel(min_samples=16))  # type: ignore[arg-type]
    budget.attach()
    feed(budget, engine, 5)
    budget.update()
    assert budget.law is None  # cold: a per-row mean is no law
    feed(budget, engine, 200)
    budget.update()
    law = budget.law
    assert law is not None
    # the synthetic steps' columns are collinear (a fixed context), so the coefficients are
    # one of many fits: the law must give the true cost of every such step back
    for rows, context, prefill in ((1, 200, 0), (17, 200, 50), (40, 200, 100), (8, 200, 0)):
        out, seconds = synthetic_step(rows, context, prefill)
        n, tokens = len(out.scheduled), rows + prefill
        kv = rows * context + prefill
        predicted = (law["base_s"] + law["per_row_s"] * n + law["per_token_s"] * tokens
                     + law["per_kv_token_s"] * kv + law["per_prefill_row_s"] * (prefill > 0))
        assert predicted == pytest.approx(seconds, rel=1e-6)
    assert law["kv_per_row"] == pytest.approx(budget.model.mean_kv_per_row())
    fed = [(i % 3) * 50 for n in (5, 200) for i in range(n)]  # what ``feed`` sent
    prompts = [p for p in fed if p]
    assert law["prefill_tokens"] == pytest.approx(sum(prompts) / len(prompts))
    assert law["steps"] == 205


def demand(budget: StepBudget, clock: Clock, tokens_s: float, prompt: int = 0,
           tokens: int = 40) -> float:
    """A fresh 10 s window of interactive starts asking ``tokens_s`` decode tokens a second,
    each with a ``prompt``-token prompt; returns the rate the budget reads."""
    budget.demand = UrgentDemand(window_s=10.0, clock=clock)
    clock.now += 10.0
    starts = max(1, round(tokens_s / tokens * 10))
    for _ in range(starts):
        clock.now += 10.0 / starts
        budget.demand.started(prompt)
        budget.demand.finished(tokens)
    asked = budget.demand.tokens_per_s()
    assert asked is not None
    return asked


def warm_budget() -> tuple[StepBudget, Clock, float]:
    """A budget fed the true law, with its small-step target."""
    engine = RecordingEngine()
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.attach()
    feed(budget, engine, 200)
    budget.update()
    assert budget.target_s is not None
    return budget, Clock(), budget.target_s


@pytest.mark.parametrize("share_used", [0.3, 0.59, 0.64])
@pytest.mark.parametrize("prompt", [0, 10])
def test_the_derived_target_covers_interactives_own_step_alone(share_used: float,
                                                                prompt: int) -> None:
    """Interactive whose rows and prompts take ``share_used`` of each second (its prompts at
    the true law's cost per token; its rows far under the 256 seats): the target is the
    headroom over the step its load runs in alone (Little's law: rows = tokens/s x step),
    past its weight's share (0.6) the step at the share, when that is longer than the small
    step's target. Under the share it is not backlogged; past it, it is once it asks
    BACKLOG_ENTER x the rows that target allows."""
    budget, clock, small_target = warm_budget()
    kv = budget.model.mean_kv_per_row()
    marginal = B + C + D * kv  # a decode row of the true law
    per_prompt_s = prompt * (C + D)  # a prompt token: a token and a KV entry
    # the rate whose load (its decode rows plus its prompts) is
    # share_used of each second
    tokens_s = share_used / (marginal + per_prompt_s / 10)
    asked = demand(budget, clock, tokens_s, prompt, tokens=10)  # 10 tokens: fine steps
    assert asked == pytest.approx(tokens_s, rel=0.02)  # whole starts in the window
    budget.update()
    busy = per_prompt_s * budget.demand.starts_per_s()
    alone = A / (1.0 - min(busy + marginal * asked, 0.6))
    expected = max(small_target, DERIVED_TPOT_HEADROOM * alone)
    assert budget.target_s == pytest.approx(expected, rel=2e-3)
    if share_used < 0.6:
        assert budget.urgent_backlogged is False
        assert budget.model.max_rows_within(budget.target_s) >= asked * alone
    else:
        # backlogged once its demand keeps BACKLOG_ENTER x the target's decode rows (true
        # law) running, its prompts' tokens stretching each step
        rows = max(r for r in range(MAX_SEQS + 1) if A + marginal * r <= budget.target_s)
        spare = 1.0 - (C + D) * asked * prompt / 10
        need = asked * (A + marginal * rows) / spare
        assert budget.urgent_backlogged is (need > BACKLOG_ENTER * rows)
    if share_used == 0.59:  # its step alone is past the small step's target
        assert budget.target_s > 1.05 * small_target


def test_past_its_share_the_target_is_the_step_at_the_share_and_never_flips() -> None:
    """Its demand is +-20 % between refits: past the share the target is that of the step at
    the share, so a noisy demand near it moves the target a little, never from its step
    alone down to the small step's and back."""
    budget, clock, small_target = warm_budget()
    marginal = B + C + D * budget.model.mean_kv_per_row()
    targets = {}
    for used in (0.57, 0.63, 0.57, 0.5, 0.62, 0.65, 0.59):
        asked = demand(budget, clock, used / marginal, tokens=10)
        budget.update()
        expected = DERIVED_TPOT_HEADROOM * A / (1.0 - min(marginal * asked, 0.6))
        assert budget.target_s == pytest.approx(max(small_target, expected), rel=2e-3), used
        targets[used] = budget.target_s
    assert targets[0.63] == pytest.approx(targets[0.65], rel=1e-6)  # flat past the share
    assert targets[0.57] < targets[0.62] and targets[0.57] > 1.05 * small_target


def test_past_its_share_by_the_margins_interactive_is_backlogged_at_the_small_target(
        ) -> None:
    """Past PAST_SHARE_ENTER x its 0.6 share of each second interactive is backlogged
    whatever rows its target holds, at the small step's target (the weights decide), and
    within again only under PAST_SHARE_EXIT x the share (a plain state machine over the
    asked shares); in between, the step at
    its share."""
    budget, clock, small_target = warm_budget()
    marginal = B + C + D * budget.model.mean_kv_per_row()
    at_share = DERIVED_TPOT_HEADROOM * A / (1 - 0.6)
    state = False
    for used in (0.5, 0.64, 0.7, 0.62, 0.58, 0.64, 0.68, 0.3):
        demand(budget, clock, used / marginal, tokens=10)
        budget.update()
        asked = budget._tpot.asked_share
        assert asked == pytest.approx(used, rel=0.02)
        state = asked >= 0.6 * (PAST_SHARE_EXIT if state else PAST_SHARE_ENTER)
        assert budget.urgent_backlogged is state, used
        if state:
            assert budget.target_s == pytest.approx(small_target, rel=1e-6)
        elif asked >= 0.6:
            assert budget.target_s == pytest.approx(at_share, rel=2e-3)
    assert budget.urgent_backlogged is False


def test_the_alone_step_takes_its_base_from_the_measured_small_step() -> None:
    """Once the 4-row decode step is measured, the alone step's base is that step less four
    rows at the fitted slope, not the fit's intercept (which moves between refits)."""
    budget, clock, _ = warm_budget()
    observe = budget.engine.observers[0]  # type: ignore[attr-defined]
    measured = 0.09  # slower than the true law's 4-row step (~0.067 s): the base follows it
    for _ in range(20):
        observe(synthetic_step(SMALL_BATCH_ROWS, 200)[0], measured)
    marginal = B + C + D * 200
    used = 0.5
    asked = demand(budget, clock, used / marginal, tokens=10)
    budget.update()
    kv = budget.model.mean_kv_per_row()
    kv_marginal = budget.model.decode_row_cost(kv)  # the 20 off-law steps moved the fit a little
    assert kv_marginal == pytest.approx(B + C + D * kv, rel=0.05)  # its slope, near the law's
    base = measured - SMALL_BATCH_ROWS * kv_marginal
    assert abs(budget.model.cost.base - base) > 0.005  # not the fit's intercept
    expected = DERIVED_TPOT_HEADROOM * base / (1.0 - kv_marginal * asked)
    assert expected > DERIVED_TPOT_HEADROOM * measured  # the alone step is the longer one
    assert budget.target_s == pytest.approx(expected, rel=5e-3)


@pytest.mark.parametrize("budget_x", [1.0, 1.5, 2.0])
def test_the_tpot_budget_setting_scales_the_derived_target(budget_x: float) -> None:
    """The tier's ``tpot_budget_x`` replaces the default headroom over the same lone step."""
    engine = RecordingEngine()
    default, scaled = StepBudget(engine), StepBudget(  # type: ignore[arg-type]
        engine, TierSLO(tpot_budget_x=budget_x))  # type: ignore[arg-type]
    for budget in (default, scaled):
        budget.attach()
    for i in range(200):  # both observe the same steps (``feed``'s)
        out, seconds = synthetic_step(1 + (i * 7) % 40, 200, prefill=(i % 3) * 50)
        for observe in engine.observers:
            observe(out, seconds)
    default.update()
    scaled.update()
    assert default.target_s is not None and scaled.target_s is not None
    assert scaled.target_s == pytest.approx(default.target_s / DERIVED_TPOT_HEADROOM * budget_x)


def test_the_loop_sees_each_steps_period_and_the_law_its_compute() -> None:
    """A step's period runs from the previous step's end to its own (the wait between steps
    is every decode row's too), at most ``MAX_GAP_S`` of wait; a step of prompts alone has
    none (it may follow an idle engine); the step-cost law is fed the compute seconds."""
    engine = RecordingEngine()
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.attach()
    out, _ = synthetic_step(4, 100, urgent=4)
    observe = engine.observers[0]
    observe(out, 0.01)
    time.sleep(0.05)
    observe(out, 0.01)
    time.sleep(MAX_GAP_S + 0.15)
    observe(out, 0.01)
    prompts, _ = synthetic_step(0, 100, prefill=30)
    time.sleep(0.05)
    observe(prompts, 0.01)  # prompts alone: maybe after an idle engine, no row waited
    first, second, third, fourth = budget._feed()
    assert first.seconds == 0.01  # no step before it: its compute
    assert 0.05 <= second.seconds <= 0.01 + MAX_GAP_S
    assert third.seconds == pytest.approx(0.01 + MAX_GAP_S)
    assert fourth.seconds == 0.01
    assert budget.model.num_samples == 4
    assert [s for *_, s in budget.model.rows_and_seconds()][-4:] == [0.01] * 4
