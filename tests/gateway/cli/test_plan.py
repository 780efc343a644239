"""`carpool plan`: a case whose every step can be checked by hand, and bad inputs that must
give a one-line reason (exit 2), never a traceback."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from engine.sim.profile import ModelShape, Profile
from gateway.cli.main import main
from policies.step_cost import StepCost

SHAPE = ModelShape(layers=2, kv_heads=1, head_dim=64, dtype_bytes=2)
BASE, PER_ROW = 0.010, 0.001  # a decode step of b rows: 10 ms + 1 ms per row


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    Profile(StepCost(base=BASE, per_row=PER_ROW), "hand", SHAPE, 16).save(path)
    return path


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_hand_checked_plan(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _plan(capsys, "--profile", str(profile), "--peak-rps", "30",
                           "--tier", "interactive=ttft:1,tpot:0.05,share:3",
                           "--tier", "batch=ttft:20,tpot:0.2,share:1",
                           "--prompt", "32", "--output", "32", "--kv-memory-gb", str(2 / 1024))
    assert code == 0, err
    # Step 2: 0.010 + 0.001 b <= 0.05 (the tightest TPOT)
    tpot_batch = math.floor(round((0.05 - BASE) / PER_ROW, 9))
    assert f"batch <= {tpot_batch}" in out and tpot_batch == 40
    # Step 3: 2 x 2 x 1 x 64 x 2 = 512 B/token; 2 MiB / (512 x 16) blocks; 64 tokens = 4 blocks
    per_token = 2 * 2 * 1 * 64 * 2
    blocks = (2 << 20) // (per_token * 16)
    conc = blocks // math.ceil((32 + 32) / 16)
    assert f"= {per_token:,} bytes per token" in out
    assert f"= {blocks:,} blocks" in out and f"{blocks:,} // 4 = {conc} requests" in out
    # Step 4: min(40, 64) = 40, TPOT-bound
    batch = min(tpot_batch, conc)
    assert f"= {batch} (bound by TPOT)" in out
    # Step 5: 30 req/s x 32 tokens against 40 rows / 50 ms
    tok_s = batch / (BASE + PER_ROW * batch)
    instances = math.ceil(30 * 32 / tok_s)
    assert f"{tok_s:,.1f} tok/s" in out and f"= {instances} instance(s)" in out
    assert instances == 2
    # Step 6 holds at once (no token cost: prefill is free here) and the flags follow.
    assert f"Recommendation: {instances} instance(s)" in out
    assert f"carpool serve --max-num-seqs {batch} " in out
    assert "Headroom:" in out


def test_step6_meets_every_target_it_reports(profile: Path) -> None:
    from engine.sim.planner import PlanInputs, TierTarget, make_plan
    from engine.sim.workload import Lengths

    inputs = PlanInputs((TierTarget("interactive", 0.2, 0.05, 0.5), TierTarget("batch", 0.5, 0.3, 0.5)),
                        40.0, Lengths(16, 200), Lengths(8, 64), 0.01, SHAPE)
    plan = make_plan(inputs, Profile.load(profile).cost_model())
    assert plan.feasible and plan.final is not None
    assert plan.final.instances >= plan.instances_estimate
    for target, got in zip(inputs.targets, plan.final.tiers):
        assert got.ttft_p99 <= target.ttft_p99_s and got.tpot_p99 <= target.tpot_p99_s


@pytest.mark.parametrize(("args", "message"), [
    (["--kv-memory-gb", "0"], "KV cache memory must be > 0 GB"),
    (["--kv-memory-gb", "0.000001"], "fewer than one request of average length needs"),
    (["--tier", "interactive=ttft:1,tpot:0.005"], "impossible TPOT target"),
    (["--tier", "interactive=ttft:0.001,tpot:1"], "impossible TTFT target"),
    (["--tier", "interactive=ttft:1"], "expected <tier>=ttft:S,tpot:S"),
    (["--tier", "gold=ttft:1,tpot:1"], "unknown tier 'gold'"),
    (["--peak-rps", "0"], "peak requests/s must be > 0"),
    (["--prompt", "9:3"], "lengths need 1 <= low <= high"),
])
def test_bad_inputs_give_a_clear_message(profile: Path, capsys: pytest.CaptureFixture[str],
                                         args: list[str], message: str) -> None:
    base = {"--tier": "interactive=ttft:1,tpot:0.1", "--peak-rps": "5", "--kv-memory-gb": "0.01",
            "--prompt": "32", "--output": "32"}
    given = dict(zip(args[::2], args[1::2]))
    flat = [x for k, v in {**base, **given}.items() for x in (k, v)]
    code, out, err = _plan(capsys, "--profile", str(profile), *flat)
    assert code == 2
    assert message in err and "Traceback" not in err and out == ""


def test_missing_profile_says_to_calibrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _plan(capsys, "--profile", str(tmp_path / "none.json"), "--peak-rps", "1",
                         "--tier", "interactive=ttft:1,tpot:0.1")
    assert code == 2 and "carpool calibrate" in err


def test_a_plan_that_runs_out_of_instances_says_so(profile: Path) -> None:
    from engine.sim.planner import PlanInputs, TierTarget, make_plan
    from engine.sim.workload import Lengths
    from gateway.cli.plan_report import render

    # One instance decodes at most 40 rows / 50 ms = 800 tok/s; 100 req/s x 32 tokens is 4x.
    inputs = PlanInputs((TierTarget("interactive", 1.0, 0.05),), 100.0, Lengths(32, 32),
                        Lengths(32, 32), 0.01, SHAPE, max_instances=2)
    plan = make_plan(inputs, Profile.load(profile).cost_model())
    assert not plan.feasible and "more than 2 instances" in plan.reason
    assert plan.instances_estimate == 4 and not plan.checks  # refused before simulating
    assert "No plan meets the targets: more than 2 instances" in render(plan, "test")


def test_an_overloaded_instance_misses_even_when_p99s_look_fine(profile: Path) -> None:
    from engine.sim.planner import PlanInputs, TierTarget, make_plan, simulate_instance
    from engine.sim.workload import Lengths

    inputs = PlanInputs((TierTarget("batch", 1e6, 1.0),), 10.0, Lengths(32, 32),
                        Lengths(32, 32), 0.01, SHAPE)
    plan = make_plan(inputs, Profile.load(profile).cost_model())
    assert plan.final is not None
    check = simulate_instance(plan, Profile.load(profile).cost_model(), 40, 1, 30.0)
    assert not check.ok and check.misses[0].startswith("overloaded: 960.0 tok/s offered > 800.0")
