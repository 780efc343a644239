"""The calibrated profile: the fit recovers known coefficients despite stalled steps, the
file round-trips, and a bad file gives a clear message."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.sim.kv import kv_capacity
from engine.sim.profile import ModelShape, Profile, fit
from policies.step_cost import StepCost

TRUE = StepCost(base=0.02, per_row=0.003, per_token=0.0005, per_kv_token=2e-6)


def samples(n: int, seed: int, stall_every: int = 0) -> list[tuple[int, int, int, float]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rows = rng.randint(1, 32)
        tokens = rows if rng.random() < 0.7 else rows + rng.randint(16, 512)
        kv = rows * rng.randint(8, 400) + tokens
        s = TRUE.predict(rows, tokens, kv) * rng.uniform(0.97, 1.03)
        if stall_every and i % stall_every == 0:
            s *= 4  # another process held the core
        out.append((rows, tokens, kv, s))
    return out


def test_fit_recovers_the_coefficients_through_stalls() -> None:
    cost = fit(samples(300, 1, stall_every=10))
    for rows, tokens, kv in [(1, 1, 50), (16, 16, 3000), (8, 520, 2000), (32, 32, 12000)]:
        assert cost.predict(rows, tokens, kv) == pytest.approx(TRUE.predict(rows, tokens, kv),
                                                              rel=0.05)


def test_profile_round_trips(tmp_path: Path) -> None:
    prof = Profile.from_samples(samples(50, 2), model="m", shape=ModelShape(30, 3, 64, 4),
                                block_size=16, device="cpu", cpu="x")
    prof.save(tmp_path / "p.json")
    back = Profile.load(tmp_path / "p.json")
    assert back == prof
    med, p90 = back.fit_error()
    assert 0 <= med <= p90 < 0.1


@pytest.mark.parametrize(("text", "message"), [("{", "is not JSON"), ("{}", "not a version-1"),
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
