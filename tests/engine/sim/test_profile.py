"""The calibrated profile: the fit recovers a known step-cost law (through stalled steps, and
from one workload's steps well enough to predict another's), the file round-trips (version 1
too), and a bad file gives a clear message."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from engine.core.config import SchedulerConfig
from engine.sim.cost import CalibratedCost, FixedCost, StepLaw, StepShape
from engine.sim.kv import kv_capacity
from engine.sim.profile import ModelShape, Profile, Sample, fit
from engine.sim.simulator import Simulator
from engine.sim.workload import Lengths, at_once, poisson
from policies.step_cost import StepCost

TRUE = StepLaw(base=0.02, per_row=0.003, per_token=0.0005, per_kv_token=2e-6,
               per_prefill_row=0.015)


def truth(shape: StepShape) -> float:
    """The law written out by hand (the reference the fit is checked against)."""
    return (0.02 + 0.003 * shape.rows + 0.0005 * shape.tokens + 2e-6 * shape.kv_tokens
            + 0.015 * shape.prefill_rows)


def samples(n: int, seed: int, stall_every: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rows = rng.randint(1, 32)
        prefill = 0 if rng.random() < 0.6 else rng.randint(1, rows)
        tokens = rows - prefill + sum(rng.randint(2, 128) for _ in range(prefill))
        kv = rows * rng.randint(8, 400) + tokens
        s = truth(StepShape(rows, tokens, kv, prefill)) * rng.uniform(0.97, 1.03)
        if stall_every and i % stall_every == 0:
            s *= 4  # another process held the core
        out.append((rows, tokens, kv, prefill, s))
    return out


def test_fit_recovers_the_coefficients_through_stalls() -> None:
    cost = fit(samples(300, 1, stall_every=10))
    for name in ("base", "per_row", "per_token", "per_kv_token", "per_prefill_row"):
        assert getattr(cost, name) == pytest.approx(getattr(TRUE, name), rel=0.1), name
    for shape in [StepShape(1, 1, 50), StepShape(16, 16, 3000), StepShape(8, 520, 2000, 2),
                  StepShape(32, 32, 12000), StepShape(16, 140, 3200, 1)]:
        assert cost.seconds(shape) == pytest.approx(truth(shape), rel=0.03)


def served_steps(specs: list, seed: int) -> list[Sample]:
    """The shapes the real scheduler makes of a workload (16 seats), timed by the true law
    with +-5% noise: what recording a real run gives on a machine that follows the law."""
    shapes: list[StepShape] = []

    class Recording(FixedCost):
        def step_seconds(self, shape: StepShape) -> float:
            shapes.append(shape)
            return truth(shape)

    Simulator(Recording(1.0), SchedulerConfig(max_num_seqs=16)).run(specs)
    rng = random.Random(seed)
    return [(s.rows, s.tokens, s.kv_tokens, s.prefill_rows, truth(s) * rng.uniform(0.95, 1.05))
            for s in shapes]


def test_a_law_fitted_on_one_workload_predicts_another() -> None:
    """Fit on a Poisson run's steps, score on the seed workload's (100 at once, 20/200
    tokens), whose steps are mostly full decode batches on long contexts: the held-out busy
    time comes out as the true law's."""
    train = served_steps(poisson(3.0, 60, Lengths(16, 128), Lengths(16, 64), seed=3), 1)
    held = served_steps(at_once(100, [20, 200], prompt_len=8), 2)
    assert any(p for *_, p, _ in train) and max(kv for _, _, kv, _, _ in held) > 16 * 150
    law = CalibratedCost(fit(train))
    predicted = sum(law.step_seconds(StepShape(r, t, kv, p)) for r, t, kv, p, _ in held)
    assert predicted == pytest.approx(sum(truth(StepShape(*s[:4])) for s in held), rel=0.03)


def test_a_plain_step_cost_is_the_law_without_prefill_rows() -> None:
    plain = StepCost(base=0.01, per_row=0.002)
    assert CalibratedCost(plain).step_seconds(StepShape(4, 40, 100, 3)) == pytest.approx(0.018)
    assert Profile(plain, "m", ModelShape(1, 1, 1, 1), 16).cost == StepLaw(0.01, 0.002)


def test_profile_round_trips(tmp_path: Path) -> None:
    prof = Profile.from_samples(samples(50, 2), model="m", shape=ModelShape(30, 3, 64, 4),
                                block_size=16, device="cpu", cpu="x")
    prof.save(tmp_path / "p.json")
    back = Profile.load(tmp_path / "p.json")
    assert back == prof
    med, p90 = back.fit_error()
    assert 0 <= med <= p90 < 0.1


def test_version_1_profile_loads(tmp_path: Path) -> None:
    doc = {"version": 1, "model": "m", "block_size": 16, "model_shape": {
        "layers": 30, "kv_heads": 3, "head_dim": 64, "dtype_bytes": 4},
        "coefficients": {"base": 0.05, "per_row": 0.005, "per_token": 0.001, "per_kv_token": 0},
        "samples": [[4, 4, 400, 0.08]]}
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    prof = Profile.load(tmp_path / "v1.json")
    assert prof.cost == StepLaw(0.05, 0.005, 0.001, 0.0, 0.0)
    assert prof.samples == [(4, 4, 400, 0, 0, 0.08)]


@pytest.mark.parametrize(("text", "message"), [("{", "is not JSON"), ("{}", "not a version-3"),
                                               ('{"version": 1}', "malformed")])
def test_bad_profile_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        Profile.load(path)


def test_kv_capacity_formula() -> None:
    shape = ModelShape(layers=30, kv_heads=3, head_dim=64, dtype_bytes=4)  # SmolLM2-135M fp32
    kv = kv_capacity(1.0, shape, 16, avg_seq_len=300)
    assert kv.bytes_per_token == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv.num_blocks == (1 << 30) // (46_080 * 16)
    assert kv.blocks_per_request == 19  # ceil(300 / 16)
    assert kv.concurrency == kv.num_blocks // 19
    with pytest.raises(ValueError, match="positive number of GB"):
        kv_capacity(0.0, shape, 16, 300)
