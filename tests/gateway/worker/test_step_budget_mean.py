"""The step budget holds the *mean* step interactive runs in within its TPOT target: lower
prompt chunks pay a prefill row each, and interactive's own prompts take their share of every
second first. Reference: a plain step-by-step simulation of that mean on the true cost law."""

from __future__ import annotations

import pytest

from engine.core.outputs import ScheduledRequest, SchedulerOutput
from engine.core.sampling_params import SamplingParams
from gateway.worker.step_budget import StepBudget
from gateway.worker.step_pricing import (
    LOWER_PROMPT_PER_OUTPUT,
    MIN_LOWER_PREFILL_RATE,
    MIN_LOWER_PREFILL_TOKENS,
    prefill_allowance,
)
from gateway.worker.urgent_demand import UrgentDemand
from tests.gateway.worker.test_step_budget import MAX_SEQS, RecordingEngine

# true law: seconds = A + B*rows + C*tokens + D*kv_tokens + X*prefill_rows (bench sla's
# 32-seat server, roughly: 40 ms, 1.8 ms a token, 19 ms a prefill row)
A, B, C, D, X = 0.040, 0.0005, 0.0018, 1e-6, 0.019
CONTEXT = 100
PROMPT = 44  # interactive prompt tokens



def law(rows: int, tokens: int, kv: float, prefill_rows: int) -> float:
    return A + B * rows + C * tokens + D * kv + X * prefill_rows


def fed_budget(starts_s: float) -> StepBudget:
    """A warm budget whose model saw steps of the true law, interactive starting ``starts_s``
    requests a second of ``PROMPT`` tokens each."""
    engine = RecordingEngine()
    clock = [0.0]
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.demand = UrgentDemand(window_s=10.0, clock=lambda: clock[0])
    budget.attach()
    (observe,) = engine.observers
    params = SamplingParams()
    for i in range(300):
        rows, chunk = 1 + (i * 7) % 30, (0, 16, 44)[i % 3]
        context = CONTEXT + (i * 13) % 50  # varied: kv must not follow rows and tokens
        sched = [ScheduledRequest(f"d{j}", [1], context - 1, [], True, params, 1)
                 for j in range(rows)]
        if chunk:
            sched.append(ScheduledRequest("p", [1] * chunk, 0, [], True, params, 0))
        kv = rows * context + chunk
        observe(SchedulerOutput(scheduled=sched),
                law(len(sched), rows + chunk, kv, 1 if chunk else 0))
    for k in range(int(starts_s * 10)):
        clock[0] = k / starts_s
        budget.demand.started(PROMPT)
    clock[0] = 10.0
    return budget


def simulated_mean_step(cap: int, urgent: int, target: float, kv: float, starts_s: float,
                        steps: int = 20_000) -> float:
    """Step by step: ``cap`` rows decode; the lower ones bring LOWER_PROMPT_PER_OUTPUT prompt
    tokens a step, computed in chunks of the allowance (a prefill row each); interactive's
    prompts arrive every 1/starts_s seconds and join the next step."""
    decode = law(cap, cap, cap * kv, 0)
    token = C + D  # a prompt token: a token computed and a KV entry
    chunk = max(MIN_LOWER_PREFILL_TOKENS, (target - decode) / token)
    backlog, now, next_arrival = 0.0, 0.0, 1 / starts_s if starts_s else float("inf")
    for _ in range(steps):
        step = decode
        backlog += (cap - urgent) * LOWER_PROMPT_PER_OUTPUT
        if backlog >= chunk:
            backlog -= chunk
            step += token * chunk + X
        while next_arrival <= now:
            step += token * PROMPT + X
            next_arrival += 1 / starts_s
        now += step
    return now / steps


@pytest.mark.parametrize("starts_s", [0.0, 1.7, 3.0])
@pytest.mark.parametrize("urgent", [2, 4])
def test_the_cap_keeps_the_simulated_mean_step_within_the_target(starts_s: float,
                                                                  urgent: int) -> None:
    budget = fed_budget(starts_s)
    budget.urgent_rows = lambda: urgent
    cap = budget.update()
    target, kv = budget.target_s, budget.model.mean_kv_per_row()
    assert cap is not None and target is not None and not budget.cold
    assert budget.model.per_prefill_row == pytest.approx(X, rel=1e-6)  # the fit found it
    decode_cap = budget.model.max_rows_within(target, limit=MAX_SEQS)  # decode rows alone
    fits = [c for c in range(urgent, decode_cap + 1)
            if simulated_mean_step(c, urgent, target, kv, starts_s) <= target]
    reference = max(fits, default=urgent)  # never under interactive's own rows
    assert abs(cap - reference) <= 1  # the closed form against the simulation's rounding
    if cap > urgent:
        assert simulated_mean_step(cap, urgent, target, kv, starts_s) <= target * 1.01
    if starts_s:  # interactive's own prompts leave the lower rows less than without them
        without = fed_budget(0.0).plan(MAX_SEQS, urgent)
        assert without is not None and (cap < without or cap == urgent)


def test_the_allowance_prices_a_prompt_token_with_its_prefill_row_whichever_column_has_it(
        ) -> None:
    """Every prompt of one length (bench sla's alone row: interactive's 44-token prompts) makes
    tokens and prefill rows collinear: the fit may put the prompt's whole cost in the prefill
    row, and the allowance must still price a token at its row's cost shared over its tokens
    (it priced the KV entry alone: 2,788 tokens a step)."""
    engine = RecordingEngine()
    budget = StepBudget(engine)  # type: ignore[arg-type]
    budget.attach()
    (observe,) = engine.observers
    params = SamplingParams()
    for i in range(300):
        rows, context = 2 + i % 4, CONTEXT + (i * 13) % 50
        sched = [ScheduledRequest(f"d{j}", [1], context - 1, [], True, params, 1)
                 for j in range(rows)]
        prompt = i % 10 == 0
        if prompt:
            sched.append(ScheduledRequest("p", [1] * PROMPT, 0, [], True, params, 0))
        observe(SchedulerOutput(scheduled=sched), law(len(sched), rows + PROMPT * prompt,
                                                      rows * context + PROMPT * prompt, prompt))
    budget.urgent_rows = lambda: 2
    cap = budget.update()
    assert cap is not None and budget.target_s is not None and not budget.cold
    kv = budget.model.mean_kv_per_row()
    spare = budget.target_s - budget.model.predict_decode(cap, kv)
    per_token = (X + PROMPT * C) / PROMPT + D  # the true law's prompt token, row shared
    expected = max(MIN_LOWER_PREFILL_RATE, int(spare / per_token))
    (allowance,) = engine.prefill
    assert allowance is not None and abs(allowance - expected) <= 1


@pytest.mark.parametrize("backlogged", [False, True])
def test_the_allowance_floor_is_a_chunk_a_step_only_while_interactive_is_backlogged(
        backlogged: bool) -> None:
    """A cap whose decode rows leave nothing of the target: the allowance is its floor,
    MIN_LOWER_PREFILL_RATE on average (banked into chunks by the engine) while interactive's
    TPOT is promised, a whole MIN_LOWER_PREFILL_TOKENS a step while it is backlogged (the
    weights need the lower prompts started)."""
    budget = fed_budget(0.0)
    budget.update()  # the model fitted
    model = budget.model
    assert not budget.cold
    cap = MAX_SEQS // 2
    over = model.predict_decode(cap, model.mean_kv_per_row()) * 0.9  # a target it passes
    got = prefill_allowance(model, cap, over, cold=False, backlogged=backlogged)
    assert got == (MIN_LOWER_PREFILL_TOKENS if backlogged else MIN_LOWER_PREFILL_RATE)
    assert MIN_LOWER_PREFILL_RATE < MIN_LOWER_PREFILL_TOKENS
