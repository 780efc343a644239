"""The load-test report alone, from synthetic per-request records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from loadtests.report import build_report, percentile, write_report


def _records(n: int, tier: str, rng: random.Random, status: int = 200) -> list[dict]:
    out = []
    for i in range(n):
        ok = status == 200
        out.append({
            "tier": tier, "kind": "chat", "start": 1000.0 + i * 0.1, "status": status, "ok": ok,
            "ttft_ms": rng.uniform(5, 500) if ok else None,
            "tpot_ms": rng.uniform(1, 50) if ok else None,
            "e2e_ms": rng.uniform(100, 2000) if ok else None,
            "completion_tokens": 10 if ok else None,
            **({} if ok else {"error": "slow down"}),
        })
    return out


def test_percentile_matches_numpy() -> None:
    rng = random.Random(1)
    for n in (1, 2, 7, 100):
        xs = [rng.uniform(0, 100) for _ in range(n)]
        for q in (50, 90, 99):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([], 50) is None


def test_rows_per_tier_count_429_apart_from_errors() -> None:
    rng = random.Random(0)
    recs = _records(20, "interactive", rng) + _records(5, "batch", rng)
    recs += _records(3, "batch", rng, status=429) + _records(2, "best-effort", rng, status=500)
    rows = {r.tier: r for r in build_report(recs, duration_s=10.0)}
    assert rows["interactive"].ok == 20 and rows["interactive"].errors == 0
    assert rows["batch"].ok == 5 and rows["batch"].rate_limited == 3
    assert rows["best-effort"].errors == 2 and rows["best-effort"].ok == 0
    assert rows["best-effort"].ttft_ms["p50"] is None
    assert rows["all"].requests == 30
    assert rows["interactive"].tokens_per_s == pytest.approx(20 * 10 / 10.0)
    ttfts = [r["ttft_ms"] for r in recs if r["tier"] == "interactive"]
    assert rows["interactive"].ttft_ms["p99"] == pytest.approx(float(np.percentile(ttfts, 99)))


def test_write_report_files(tmp_path: Path) -> None:
    rng = random.Random(2)
    log = tmp_path / "requests.jsonl"
    recs = _records(10, "interactive", rng) + _records(4, "batch", rng, status=429)
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_report(log, tmp_path / "out", start=1000.0, end=1010.0, meta={"model": "tiny"})
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [t["tier"] for t in data["tiers"]] == ["interactive", "batch", "best-effort", "all"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| interactive | 10 | 10 | 0 | 0 |" in md
    assert "| batch | 4 | 0 | 4 | 0 |" in md
    for name in ("ttft.png", "tpot.png"):
        assert (tmp_path / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
