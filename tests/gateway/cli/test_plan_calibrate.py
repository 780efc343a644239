"""`carpool calibrate` on the tiny model: every grid step is recorded with its shape, the served
run mixes prefills into decode batches, and the profile it writes is the one `carpool plan` /
`simulate` read (timings are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.sim.profile import Profile
from gateway.cli.main import main


def test_calibrate_writes_the_grid_profile(tiny_model_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    code = main(["calibrate", "--model", str(tiny_model_dir), "--rows", "1,3", "--prompts", "5,9",
                 "--decode-steps", "4", "--mixed-requests", "0", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    prof = Profile.load(out)
    shapes = [(r, t, kv, pre) for r, t, kv, pre, _, _ in prof.samples]
    expected = []
    for p in (5, 9):
        for r in (1, 3):
            expected.append((r, r * p, r * p, r))  # one prefill step, first tokens sampled
            expected += [(r, r, r * (p + i), 0) for i in range(1, 5)]  # four decode steps
    assert shapes == expected
    assert prof.shape.layers == 2 and prof.model and str(out) in capsys.readouterr().out


def test_calibrate_served_run_mixes_prefill_into_decode(tiny_model_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Grid off, 12 requests one every 3 steps into 4 seats: the batch fills, a queue forms,
    and new requests prefill beside running decodes on unequal contexts."""
    out = tmp_path / "p.json"
    code = main(["calibrate", "--model", str(tiny_model_dir), "--rows", "1", "--prompts", "1",
                 "--max-prefill-tokens", "0", "--mixed-requests", "12", "--max-num-seqs", "4",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    samples = Profile.load(out).samples
    assert max(r for r, *_ in samples) == 4
    assert sum(pre for _, _, _, pre, _, _ in samples) >= 12  # every request prefilled
    assert any(0 < pre < r for r, _, _, pre, _, _ in samples)  # a prefill among decodes
    # --constrained-share 0.25 (the default): 3 of the 12 under a JSON Schema, so the fit sees
    # steps with 0, 1, 2 or 3 constrained rows, never more than the seats or the constrained
    constrained = [c for r, _, _, _, c, _ in samples]
    assert max(constrained) <= 3 and len(set(constrained)) >= 3
    assert all(c <= r for r, _, _, _, c, _ in samples)
    assert "constrained_rows" in capsys.readouterr().out


def test_calibrate_bad_grid_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--rows", "0,x"]) == 2
    assert "--rows" in capsys.readouterr().err
