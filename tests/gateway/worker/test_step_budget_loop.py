"""The step budget corrects its law by measurement: the target follows interactive's measured
step alone where the law's runs short, and steps beside lower rows that run longer than the law
says lower the cap until their mean is back at the target (``policies.tpot_loop``)."""

from __future__ import annotations

import pytest

from engine.core.outputs import ScheduledRequest, SchedulerOutput
from engine.core.sampling_params import SamplingParams
from gateway.worker.step_budget import TPOT_AIM, StepBudget
from policies.tiers import DERIVED_TPOT_HEADROOM, TierSLO
from policies.tpot_loop import MIN_ALONE_STEPS
from tests.gateway.worker.test_step_budget import (
    LOWER,
    URGENT,
    A,
    B,
    C,
    D,
    RecordingEngine,
    demand,
    feed,
    synthetic_step,
    true_cost,
    warm_budget,
)

URGENT_ROWS = 4
CONTEXT = 200
TARGET = 0.15  # configured: room for ~10 lower rows beside interactive's 4 at the law


def step_of(rows: int, urgent: int, slower: float = 1.0) -> tuple[object, float]:
    """A decode step of ``rows`` rows at CONTEXT, ``urgent`` of them interactive's, taking
    ``slower`` times the true law's seconds."""
    out, seconds = synthetic_step(rows, CONTEXT, urgent=urgent)
    return out, seconds * slower


def target_after_alone_steps(slower: float, lower_held: int, used: float = 0.4) -> float:
    """The target once interactive, asking ``used`` of the machine by the law (0.4: its
    step alone past the small step's at 1.3x the law; under its 0.6 share even then), ran
    MIN_ALONE_STEPS steps alone at ``slower`` times the true law, beside ``lower_held``
    lower-tier requests held."""
    budget, clock, _ = warm_budget()
    budget.lower_held = lambda: lower_held
    marginal = B + C + D * budget.model.mean_kv_per_row()
    demand(budget, clock, used / marginal, tokens=10)
    budget.update()
    (observe,) = budget.engine.observers  # type: ignore[attr-defined]
    for i in range(MIN_ALONE_STEPS):
        observe(*step_of(URGENT_ROWS + i % 3, URGENT_ROWS + i % 3, slower=slower))
    budget.update()
    assert budget.target_s is not None and not budget.urgent_backlogged
    return budget.target_s


def test_the_target_follows_interactives_steps_alone_where_the_law_runs_short() -> None:
    """Interactive's steps alone run 1.3x the true law. The law refits on them either way;
    its figure for interactive's step alone, and the target with it, is raised further by
    what those steps measured against it, but only while the lower tiers hold nothing: beside
    held lower work, steps of interactive rows alone are an overload's (more of its requests
    at once), not its step alone."""
    alone, beside_lower = target_after_alone_steps(1.3, 0), target_after_alone_steps(1.3, 3)
    assert alone > 1.1 * beside_lower
    assert target_after_alone_steps(1.0, 0) == pytest.approx(target_after_alone_steps(1.0, 3))


def overloaded_budget(slower: float) -> StepBudget:
    """A budget whose interactive, asking 0.58 of the machine, ran MIN_ALONE_STEPS steps
    alone at ``slower`` times the true law, and then lower work came and the law refit on 400
    more steps, at the true law."""
    budget, clock, _ = warm_budget()
    marginal = B + C + D * budget.model.mean_kv_per_row()
    demand(budget, clock, 0.58 / marginal, tokens=10)
    budget.update()
    (observe,) = budget.engine.observers  # type: ignore[attr-defined]
    for i in range(MIN_ALONE_STEPS):
        observe(*step_of(URGENT_ROWS + 2 + i % 3, URGENT_ROWS + 2 + i % 3, slower=slower))
    budget.update()
    budget.lower_held = lambda: 3
    feed(budget, budget.engine, 400)  # type: ignore[arg-type]
    budget.update()
    return budget


def target_after_overload(slower: float) -> tuple[float, float | None]:
    """``overloaded_budget``'s target and alone bias."""
    budget = overloaded_budget(slower)
    assert budget.target_s is not None
    return budget.target_s, budget.last_alone_bias


def test_under_a_sustained_overload_the_last_steps_alone_stay_the_measure() -> None:
    """Steps alone age out after ALONE_MAX_AGE_S only while new ones can come: 200 s into an
    overload the bias still scales the law; once the lower tiers hold nothing, they go."""
    budget = overloaded_budget(0.7)
    now = budget.clock()
    budget.clock = lambda: now + 200.0
    budget.update()
    assert budget.last_alone_bias == pytest.approx(0.7, abs=0.03)
    budget.lower_held = lambda: 0
    budget.update()  # the lower tiers held work at the last refit: not yet
    assert budget.last_alone_bias is not None
    budget.update()
    assert budget.last_alone_bias is None


def test_a_law_that_overprices_interactives_steps_alone_no_longer_holds_the_target_up(
        ) -> None:
    """Interactive's steps alone ran 0.7x the law that holds once lower work arrived (under
    overload the law refits on bulk rows and prices interactive's step alone up): the target
    follows its step alone as measured, lower than the law's figure, which stands where its
    steps alone ran at the law."""
    at_law, at_law_bias = target_after_overload(1.0)
    faster, bias = target_after_overload(0.7)
    assert at_law_bias == pytest.approx(1.0, abs=0.02)
    assert bias == pytest.approx(0.7, abs=0.03)
    assert faster < 0.9 * at_law


def test_interactives_step_alone_is_priced_at_its_own_rows_context() -> None:
    """Interactive's rows at 40 tokens of context beside lower rows at 360 (the mean row's
    200, as in the steps the law was fitted on): its step alone, and the target, are priced
    at 40, not at the mean, whose longer context would price them up."""
    budget, clock, small_target = warm_budget()
    (observe,) = budget.engine.observers  # type: ignore[attr-defined]
    params = SamplingParams()
    for _ in range(40):
        sched = [ScheduledRequest(f"r{i}", [1], (40 if i < 4 else 360) - 1, [], True, params,
                                  1, priority=URGENT if i < 4 else LOWER) for i in range(8)]
        observe(SchedulerOutput(scheduled=sched), true_cost(8, 8, 4 * 40 + 4 * 360))
    own, mean = B + C + D * 40, B + C + D * budget.model.mean_kv_per_row()
    asked = demand(budget, clock, 0.58 / own, tokens=10)
    budget.update()
    assert budget.urgent_kv_per_row() == pytest.approx(40)
    assert budget.target_s == pytest.approx(DERIVED_TPOT_HEADROOM * A / (1 - own * asked),
                                            rel=5e-3)
    assert budget.target_s > 1.05 * small_target  # its step alone, not the small step's
    assert 1 - mean * asked < 0.9 * (1 - own * asked)  # the mean would price it far longer


@pytest.mark.parametrize("slower", [1.6, 0.6])
def test_steps_off_the_law_beside_lower_rows_move_the_cap_until_they_meet_the_target(
        slower: float) -> None:
    """The lower rows' steps run ``slower`` times the law (1.6: the cap must come down, 0.6:
    it may go up): each refit's window of steps at the cap moves the gain, and the steps end
    within 10 % of what the loop aims at (``TPOT_AIM`` x the target), nearer than the law's
    own cap put them."""
    engine = RecordingEngine()
    budget = StepBudget(engine, slo=TierSLO(tpot_p99_s=TARGET))  # type: ignore[arg-type]
    budget.attach()
    feed(budget, engine, 200)
    budget.urgent_rows = lambda: URGENT_ROWS
    budget.lower_held = lambda: 20  # lower work waits: the cap holds it back
    (observe,) = engine.observers
    first = budget.update()
    assert first is not None and first > URGENT_ROWS + 4

    def seconds_at(cap: int) -> float:  # interactive's rows at the law, the lower ones off it
        lower = cap - URGENT_ROWS
        return (true_cost(cap, cap, cap * CONTEXT)
                + (slower - 1.0) * lower * (B + C + D * CONTEXT))

    cap = first
    for i in range(15):  # 75 steps: the law, refit on 275, still mostly the old ones
        out, _ = step_of(cap, URGENT_ROWS)
        for _ in range(5):
            observe(out, seconds_at(cap))
        new = budget.update()
        cap = cap if new is None else new  # 0 is a cap; None (every seat) keeps the last
        if i == 0:  # the first window's error moved the price before the law learned it
            assert (budget.gain < 1.0) == (slower > 1.0) and budget.gain != 1.0
    assert (cap < first) == (slower > 1.0)
    aim = TPOT_AIM * TARGET
    assert seconds_at(cap) == pytest.approx(aim, rel=0.1)
    assert abs(seconds_at(first) - aim) > 2 * abs(seconds_at(cap) - aim)


def test_the_loop_takes_lower_rows_away_but_never_the_cap_below_interactives_rows() -> None:
    """Lower rows costing 6x the law: the loop lowers the cap to interactive's own 8 rows and
    no further (under them, the lower tiers would be owed seats for every interactive row past
    it: the 32-seat row ran 16-32 rows a step at gain 0.5, cap 0)."""
    urgent = 8
    engine = RecordingEngine()
    budget = StepBudget(engine, slo=TierSLO(tpot_p99_s=TARGET))  # type: ignore[arg-type]
    budget.attach()
    feed(budget, engine, 200)
    budget.urgent_rows = lambda: urgent
    budget.lower_held = lambda: 20
    (observe,) = engine.observers
    cap = first = budget.update()
    assert first is not None and first > urgent
    caps = []
    for _ in range(15):
        out, seconds = step_of(cap, urgent)
        lower = cap - urgent
        for _ in range(5):
            observe(out, seconds + 5.0 * lower * (B + C + D * CONTEXT))
        new = budget.update()
        cap = cap if new is None else new  # 0 is a cap; None (every seat) keeps the last
        caps.append(cap)
    assert min(caps) == urgent  # reached, never passed
