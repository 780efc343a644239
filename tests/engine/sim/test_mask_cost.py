"""The grammar mask in the step-cost model: a constrained row that samples costs
``per_constrained_row`` more, the simulator charges exactly that for the constrained rows it
schedules and nothing without them, the calibration fit recovers a known mask cost, version-2
profiles still load, and the planner's batch shrinks by what the mask costs."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from engine.core.config import SchedulerConfig
from engine.sim.cost import CalibratedCost, StepLaw, StepShape
from engine.sim.planner import largest_batch
from engine.sim.profile import Profile, Sample, fit
from engine.sim.simulator import Simulator
from engine.sim.workload import Lengths, RequestSpec, constrained_at, load_trace, poisson

LAW = StepLaw(base=0.02, per_row=0.003, per_token=0.0005, per_kv_token=2e-6,
              per_prefill_row=0.015)
MASK = 0.004  # seconds a constrained row adds to its step


def workload(constrained: set[int]) -> list[RequestSpec]:
    """10 requests at t=0 (8-token prompts, 5..50 output tokens), ``constrained`` by index."""
    return [RequestSpec(f"r{i}", 5 + 5 * i, 8, constrained=i in constrained) for i in range(10)]


def run(law: StepLaw, specs: list[RequestSpec]) -> list[tuple[float, tuple[str, ...]]]:
    sim = Simulator(CalibratedCost(law), SchedulerConfig(max_num_seqs=4,
                                                         max_num_batched_tokens=256))
    return [(s.seconds, s.scheduled_ids) for s in sim.run(specs).steps]


def test_step_law_adds_the_mask_per_constrained_row() -> None:
    law = replace(LAW, per_constrained_row=MASK)
    shape = StepShape(6, 40, 900, 1, 3)
    assert law.seconds(shape) == pytest.approx(LAW.seconds(shape) + 3 * MASK, abs=1e-15)
    assert CalibratedCost(law).decode_seconds(8, 100, 2) == pytest.approx(
        CalibratedCost(LAW).decode_seconds(8, 100) + 2 * MASK, abs=1e-15)


def test_simulator_charges_exactly_the_mask_of_the_constrained_rows() -> None:
    specs = workload({0, 3, 4, 9})
    free = run(LAW, specs)
    masked = run(replace(LAW, per_constrained_row=MASK), specs)
    constrained = {s.request_id for s in specs if s.constrained}
    # all arrive at t=0 and the scheduler never looks at the clock: the same steps, and every
    # scheduled row samples (8-token prompts prefill in one step), so each constrained row
    # scheduled pays exactly one mask
    assert [ids for _, ids in masked] == [ids for _, ids in free]
    charged = [sum(r in constrained for r in ids) for _, ids in free]
    assert sum(charged) == sum(s.output_len for s in specs if s.constrained)
    for (m, _), (f, _), n in zip(masked, free, charged):
        assert m - f == pytest.approx(n * MASK, abs=1e-12)
    assert sum(m for m, _ in masked) > sum(f for f, _ in free)


def test_no_constrained_rows_no_change() -> None:
    specs = workload(set())
    assert run(replace(LAW, per_constrained_row=MASK), specs) == run(LAW, specs)


def synthetic(n: int, seed: int, law: StepLaw) -> list[Sample]:
    """Steps of varied shapes, a random number of their sampling rows constrained, timed by
    ``law`` with 2% noise."""
    rng = random.Random(seed)
    out: list[Sample] = []
    for _ in range(n):
        rows = rng.randint(1, 32)
        prefill = 0 if rng.random() < 0.6 else rng.randint(1, rows)
        tokens = rows - prefill + sum(rng.randint(2, 128) for _ in range(prefill))
        kv = rows * rng.randint(8, 400) + tokens
        constrained = rng.randint(0, rows)
        s = law.seconds(StepShape(rows, tokens, kv, prefill, constrained))
        out.append((rows, tokens, kv, prefill, constrained, s * rng.uniform(0.98, 1.02)))
    return out


def test_fit_recovers_a_known_mask_cost() -> None:
    law = replace(LAW, per_constrained_row=MASK)
    got = fit(synthetic(400, 3, law))
    assert got.per_constrained_row == pytest.approx(MASK, rel=0.1)
    assert got.per_prefill_row == pytest.approx(LAW.per_prefill_row, rel=0.1)
    exact = fit([(*s[:5], law.seconds(StepShape(*s[:5]))) for s in synthetic(60, 4, law)])
    assert exact.per_constrained_row == pytest.approx(MASK, rel=1e-6)


def test_fit_without_constrained_steps_learns_no_mask() -> None:
    assert fit(synthetic(200, 5, LAW)).per_constrained_row == pytest.approx(0, abs=2e-4)
    five = [(r, t, kv, p, s) for r, t, kv, p, c, s in synthetic(300, 7, LAW) if c == 0]
    assert len(five) >= 6
    assert fit(five).per_constrained_row == 0.0  # five-field samples: no column to learn from


def test_version_2_profile_loads_with_no_mask(tmp_path: Path) -> None:
    doc = {"version": 2, "model": "m", "block_size": 16, "model_shape": {
        "layers": 30, "kv_heads": 3, "head_dim": 64, "dtype_bytes": 4},
        "coefficients": {"base": 0.05, "per_row": 0.005, "per_token": 0.001,
                         "per_kv_token": 0, "per_prefill_row": 0.01},
        "samples": [[4, 4, 400, 1, 0.08]]}
    (tmp_path / "v2.json").write_text(json.dumps(doc))
    prof = Profile.load(tmp_path / "v2.json")
    assert prof.cost.per_constrained_row == 0.0
    assert prof.samples == [(4, 4, 400, 1, 0, 0.08)]
    prof.save(tmp_path / "v3.json")
    assert Profile.load(tmp_path / "v3.json") == prof


def test_poisson_spreads_the_constrained_share_and_keeps_the_seed() -> None:
    args = (3.0, 200, Lengths(8, 64), Lengths(4, 32))
    free, half = poisson(*args, seed=2), poisson(*args, seed=2, constrained=0.5)
    assert sum(s.constrained for s in half) == 100 and not any(s.constrained for s in free)
    assert [replace(s, constrained=False) for s in half] == free
    assert [constrained_at(i, 0.25) for i in range(8)] == [False, False, False, True] * 2
    with pytest.raises(ValueError, match="constrained share"):
        constrained_at(0, 1.5)


def test_trace_carries_constrained(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt_len": 4, "output_len": 3, "constrained": true}\n'
                    '{"prompt_len": 4, "output_len": 3}\n')
    assert [s.constrained for s in load_trace(path)] == [True, False]


def test_planner_batch_pays_for_the_mask() -> None:
    law = replace(LAW, per_constrained_row=MASK)
    target, kv = 0.2, 100.0
    free = largest_batch(CalibratedCost(law), target, kv, 512)
    assert largest_batch(CalibratedCost(LAW), target, kv, 512, 1.0) == free  # no mask: same
    half = largest_batch(CalibratedCost(law), target, kv, 512, 0.5)
    full = largest_batch(CalibratedCost(law), target, kv, 512, 1.0)
    assert free > half > full >= 1
    cost = CalibratedCost(law)
    assert cost.decode_seconds(full, kv, full) <= target < cost.decode_seconds(
        full + 1, kv, full + 1)
