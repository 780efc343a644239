"""`carpool calibrate` on the tiny model: every grid step is recorded with its shape, and the
profile it writes is the one `carpool plan` / `simulate` read (timings are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.sim.profile import Profile
from gateway.cli.main import main


def test_calibrate_writes_the_grid_profile(tiny_model_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    code = main(["calibrate", "--model", str(tiny_model_dir), "--rows", "1,3", "--prompts", "5,9",
                 "--decode-steps", "4", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    prof = Profile.load(out)
    shapes = [(r, t, kv) for r, t, kv, _ in prof.samples]
    expected = []
    for p in (5, 9):
        for r in (1, 3):
            expected.append((r, r * p, r * p))  # one prefill step, first tokens sampled
            expected += [(r, r, r * (p + i)) for i in range(1, 5)]  # four decode steps
    assert shapes == expected
    assert prof.shape.layers == 2 and prof.model and str(out) in capsys.readouterr().out


def test_calibrate_bad_grid_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--rows", "0,x"]) == 2
    assert "--rows" in capsys.readouterr().err
