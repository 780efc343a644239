"""The doctor's rules: each of seed 004's six symptoms, built as a stats snapshot, fires its rule
and only it; a healthy snapshot fires none; each rule goes quiet just below its threshold.
Snapshots are derived from ``Thresholds`` (never hard-coded verdicts), so moving a threshold
moves the test with it."""

from __future__ import annotations

import dataclasses

import pytest

from policies.doctor import (
    DEFAULT_THRESHOLDS,
    RULES,
    DoctorSnapshot,
    EngineWindow,
    Thresholds,
    TierWindow,
    diagnose,
)

T = DEFAULT_THRESHOLDS
N = T.min_requests * 4  # completions in the window: enough for tails to count


def healthy_tier() -> TierWindow:
    return TierWindow(ttft_p50_s=0.2, ttft_p99_s=0.3, tpot_p50_s=0.02, tpot_p99_s=0.03,
                      queue_wait_p99_s=0.01, completed=N)


def healthy_engine() -> EngineWindow:
    return EngineWindow(max_num_seqs=16, running_avg=8, waiting_avg=0, kv_total=1000,
                        kv_used_avg=300, batch_p99=12, step_tokens_p99=40, finished=N)


def snapshot(tier: TierWindow | None = None, engine: EngineWindow | None = None,
             **engine_changes: float) -> DoctorSnapshot:
    eng = dataclasses.replace(engine or healthy_engine(), **engine_changes)
    return DoctorSnapshot(window_s=60, tiers={"interactive": tier or healthy_tier(),
                                              "batch": healthy_tier()}, engine=eng)


def ttft_tail() -> TierWindow:
    p50 = T.ttft_floor_s
    return dataclasses.replace(healthy_tier(), ttft_p50_s=p50, ttft_p99_s=p50 * T.tail_ratio)


def symptom_snapshots() -> dict[str, DoctorSnapshot]:
    tail = ttft_tail()
    seats = healthy_engine().max_num_seqs
    kv_total = healthy_engine().kv_total
    roomy_kv = kv_total * (1 - T.kv_room) - 1  # free fraction just above kv_room
    return {
        # throughput up, P99 worse: a TTFT tail with queue wait making up most of it
        "batch_wait_tail": snapshot(dataclasses.replace(
            tail, queue_wait_p99_s=T.queue_share * tail.ttft_p99_s)),  # type: ignore[operator]
        # long prompts: steps carry whole prefills, and decode tokens stall behind them
        "prefill_stalls": snapshot(
            dataclasses.replace(healthy_tier(), tpot_p50_s=T.tpot_floor_s,
                                tpot_p99_s=T.tpot_floor_s * T.tail_ratio),
            step_tokens_p99=T.prefill_step_ratio * 12),
        # churn: recompute preemptions per finished request at the threshold
        "recompute_churn": snapshot(preempt_recompute=max(T.min_preemptions,
                                                          T.churn_per_request * N),
                                    kv_used_avg=kv_total * 0.97),
        # every seat busy with long generations, a queue behind them, KV memory spare
        "long_outputs_hold_slots": snapshot(tail, running_avg=seats * T.seats_full,
                                            waiting_avg=T.waiting_min, kv_used_avg=roomy_kv),
        # seats and memory free, yet requests wait inside the engine
        "memory_free_capped": snapshot(running_avg=seats * T.seats_full - 1,
                                       waiting_avg=T.waiting_min, kv_used_avg=roomy_kv),
        # an idle engine holding KV blocks after disconnects
        "kv_not_released": snapshot(running_avg=0, idle_s=T.idle_leak_s, idle_kv_used=7,
                                    aborts=5),
        # interactive's TTFT p99 just past its objective, its budget known
        "ttft_over_objective": snapshot(over_objective()),
    }


PARTS_P99 = {"gateway_in": 0.002, "redis_queue": 0.004, "drainer_to_engine": 0.001,
             "step_wait": 0.11, "prefill": 0.07, "first_token_out": 0.003}


def over_objective(target: float = 0.29) -> TierWindow:
    return dataclasses.replace(healthy_tier(), ttft_target_s=target, ttft_steps_p99=3,
                               ttft_parts_p99_s=PARTS_P99)


def test_healthy_snapshot_has_no_symptom() -> None:
    assert diagnose(snapshot()) == []


def test_no_engine_and_no_traffic_is_healthy() -> None:
    assert diagnose(DoctorSnapshot(window_s=0)) == []


def test_a_rule_for_each_symptom() -> None:
    assert {r.__name__ for r in RULES} == set(symptom_snapshots())


@pytest.mark.parametrize("symptom", sorted(symptom_snapshots()))
def test_each_symptom_fires_its_rule_only(symptom: str) -> None:
    findings = diagnose(symptom_snapshots()[symptom])
    assert [f.symptom for f in findings] == [symptom]
    f = findings[0]
    assert f.title and f.cause and f.knob and f.evidence


def test_swap_thrash_is_memory_free_capped() -> None:
    blocks = max(T.min_swap_blocks, T.swap_thrash_per_request * N)
    s = snapshot(swap_in_blocks=blocks, swap_out_blocks=blocks, preempt_swap=1)
    assert [f.symptom for f in diagnose(s)] == ["memory_free_capped"]
    one_way = snapshot(swap_in_blocks=0, swap_out_blocks=blocks, preempt_swap=1)
    assert diagnose(one_way) == []


def test_batch_wait_tail_from_preemptions() -> None:
    s = snapshot(ttft_tail(), preempt_swap=T.min_preemptions)
    assert "batch_wait_tail" in [f.symptom for f in diagnose(s)]


def _below(name: str) -> DoctorSnapshot:
    """The symptom's snapshot moved just below its rule's threshold."""
    s = symptom_snapshots()[name]
    e = s.engine
    assert e is not None
    tier = s.tiers["interactive"]
    if name == "batch_wait_tail":
        return snapshot(dataclasses.replace(tier, ttft_p99_s=tier.ttft_p50_s * T.tail_ratio * 0.99))  # type: ignore[operator]
    if name == "prefill_stalls":
        return snapshot(tier, e, step_tokens_p99=T.prefill_step_ratio * 12 - 1)
    if name == "recompute_churn":
        return snapshot(tier, e, preempt_recompute=T.churn_per_request * N - 1)
    if name == "long_outputs_hold_slots":
        return snapshot(tier, e, kv_used_avg=e.kv_total * (1 - T.kv_room) + 1)
    if name == "memory_free_capped":
        return snapshot(tier, e, waiting_avg=T.waiting_min - 0.01)
    if name == "ttft_over_objective":  # p99 exactly at the objective meets it
        return snapshot(over_objective(target=healthy_tier().ttft_p99_s or 0.0), e)
    return snapshot(tier, e, idle_s=T.idle_leak_s - 0.1)


def test_ttft_over_objective_names_the_largest_part() -> None:
    [f] = diagnose(snapshot(over_objective()))
    assert f.evidence["largest_part"] == max(PARTS_P99, key=lambda k: PARTS_P99[k])
    assert "wait for the step in flight" in f.cause
    moved = {**PARTS_P99, "redis_queue": 0.5}
    [g] = diagnose(snapshot(dataclasses.replace(over_objective(), ttft_parts_p99_s=moved)))
    assert g.evidence["largest_part"] == "redis_queue" and "Redis" in g.cause
    assert diagnose(snapshot(dataclasses.replace(over_objective(), ttft_target_s=None))) == []


@pytest.mark.parametrize("symptom", sorted(symptom_snapshots()))
def test_each_rule_quiet_just_below_its_threshold(symptom: str) -> None:
    assert symptom not in [f.symptom for f in diagnose(_below(symptom))]


def test_too_few_requests_mean_no_tail() -> None:
    few = dataclasses.replace(ttft_tail(), completed=T.min_requests - 1,
                              queue_wait_p99_s=ttft_tail().ttft_p99_s)
    assert diagnose(snapshot(few)) == []


def test_thresholds_are_one_object() -> None:
    """A stricter Thresholds turns a symptom off without touching the rules."""
    s = symptom_snapshots()["recompute_churn"]
    strict = Thresholds(churn_per_request=T.churn_per_request * 100)
    assert diagnose(s, strict) == []
