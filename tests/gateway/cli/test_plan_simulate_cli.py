"""`carpool simulate` beyond seed 000: a Poisson run with tiers and plots, and bad input as a
one-line message (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.sim import plots
from gateway.cli.main import main


def test_poisson_run_prints_tiers_and_writes_plots(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "poisson", "--rate", "8", "--n", "120", "--prompt", "16:64",
                 "--output", "8:32", "--tiers", "interactive=0.5,batch=0.5", "--step-ms", "20",
                 "--max-num-seqs", "8", "--plot", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "interactive" in out and "batch" in out and "requests 120" in out
    if plots.available():
        assert (tmp_path / "queue_and_batch.png").stat().st_size > 0
        assert (tmp_path / "latency_cdf.png").stat().st_size > 0


@pytest.mark.parametrize(("args", "message"), [
    (["poisson", "--rate", "0", "--step-ms", "10"], "need rate > 0"),
    (["poisson", "--step-ms", "0"], "fixed step cost must be > 0"),
    (["poisson", "--step-ms", "10", "--tiers", "gold=1"], "unknown tier 'gold'"),
    (["trace", "--step-ms", "10"], "give the JSONL file"),
])
def test_bad_input_is_one_line(args: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
