"""`carpool loadtest` end to end, bounded: a local deployment on the tiny random model, Locust
headless for a few seconds, the per-tier report checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli.loadtest import main


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_short_loadtest_serves_every_tier(tmp_path: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "report"
    code = main([
        "--model", str(tiny_model_dir), "--num-blocks", "256", "--max-num-seqs", "8",
        "--run-time", "8s", "--users", "3", "--out", str(out),
        "--chat", "8:8", "--summary", "48:16", "--mix", "chat=0.7,summary=0.3",
        "--rpm", "best-effort=4",  # intended 429s for that tier's tenant
    ])
    assert code == 0, (out / "locust.log").read_text()[-3000:]
    report = json.loads((out / "report.json").read_text())
    rows = {row["tier"]: row for row in report["tiers"]}
    for tier in ("interactive", "batch", "best-effort"):
        row = rows[tier]
        assert row["ok"] > 0, row
        assert row["errors"] == 0, row["error_samples"]
        assert row["ttft_ms"]["p50"] > 0 and row["tpot_ms"]["p50"] > 0
        assert row["tokens_per_s"] > 0
    assert rows["best-effort"]["rate_limited"] > 0  # the rpm limit did bite
    assert rows["interactive"]["rate_limited"] == 0
    for name in ("report.md", "ttft.png", "tpot.png", "locust_stats.csv"):
        assert (out / name).stat().st_size > 0, name
    # Locust saw TTFT/TPOT as their own request types
    stats = (out / "locust_stats.csv").read_text()
    assert "TTFT,interactive" in stats and "TPOT,batch" in stats
