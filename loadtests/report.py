"""Per-tier load-test report from the locustfile's per-request JSON lines.

Exact percentiles come from the raw per-request numbers (Locust's own tables round into
buckets). Written as ``report.json``, ``report.md`` and PNG plots of TTFT and TPOT over time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TIERS = ("interactive", "batch", "best-effort")
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class TierReport:
    tier: str
    requests: int
    ok: int
    rate_limited: int  # HTTP 429: intended refusals (quotas, full queues)
    errors: int  # anything else that failed
    ttft_ms: dict[str, float | None]  # "p50" | "p90" | "p99"
    tpot_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    completion_tokens: int
    tokens_per_s: float
    error_samples: tuple[str, ...] = ()


def load_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _pcts(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in PERCENTILES}


def tier_report(tier: str, records: Sequence[dict[str, Any]], duration_s: float) -> TierReport:
    ok = [r for r in records if r.get("ok")]
    limited = [r for r in records if r.get("status") == 429]
    failed = [r for r in records if not r.get("ok") and r.get("status") != 429]
    tokens = sum(int(r.get("completion_tokens") or 0) for r in ok)

    def field(name: str) -> list[float]:
        return [float(r[name]) for r in ok if r.get(name) is not None]

    return TierReport(
        tier=tier,
        requests=len(records),
        ok=len(ok),
        rate_limited=len(limited),
        errors=len(failed),
        ttft_ms=_pcts(field("ttft_ms")),
        tpot_ms=_pcts(field("tpot_ms")),
        e2e_ms=_pcts(field("e2e_ms")),
        completion_tokens=tokens,
        tokens_per_s=tokens / duration_s if duration_s > 0 else 0.0,
        error_samples=tuple(
            sorted({f"{r.get('status')}: {r.get('error', '')}"[:160] for r in failed})[:5]
        ),
    )


def build_report(
    records: Sequence[dict[str, Any]], duration_s: float, tiers: Iterable[str] = TIERS
) -> list[TierReport]:
    """One row per tier (in ``tiers`` order, then any other tier seen), then "all"."""
    names = list(tiers) + sorted({str(r["tier"]) for r in records} - set(tiers))
    rows = [tier_report(t, [r for r in records if r["tier"] == t], duration_s) for t in names]
    rows.append(tier_report("all", list(records), duration_s))
    return rows


_COLUMNS = (
    "tier", "requests", "ok", "429", "errors",
    "TTFT p50 ms", "TTFT p90", "TTFT p99", "TPOT p50 ms", "TPOT p90", "TPOT p99",
    "E2E p50 ms", "E2E p99", "tokens/s",
)


_LEGEND = (
    "TTFT: request start to first content token; TPOT: mean time per output token after the "
    "first; E2E: start to end of stream (all client-side, successful requests only). "
    "tokens/s: completion tokens of successful requests over the whole run."
)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def to_markdown(rows: Sequence[TierReport], meta: dict[str, Any]) -> str:
    head = ", ".join(f"{k}: {v}" for k, v in meta.items())
    lines = [
        "# Carpool load test",
        "",
        head,
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|---|" + "---:|" * (len(_COLUMNS) - 1),
    ]
    for r in rows:
        lines.append(
            f"| {r.tier} | {r.requests} | {r.ok} | {r.rate_limited} | {r.errors} | "
            + " | ".join(_fmt(r.ttft_ms[f"p{q}"]) for q in PERCENTILES) + " | "
            + " | ".join(_fmt(r.tpot_ms[f"p{q}"]) for q in PERCENTILES) + " | "
            + f"{_fmt(r.e2e_ms['p50'])} | {_fmt(r.e2e_ms['p99'])} | {r.tokens_per_s:.1f} |"
        )
    errors = [f"- {r.tier}: {e}" for r in rows if r.tier != "all" for e in r.error_samples]
    if errors:
        lines += ["", "Errors (samples):", *errors]
    lines += [
        "",
        _LEGEND,
        "",
        "Plots: ttft.png, tpot.png (per request, by tier, over the run).",
        "",
    ]
    return "\n".join(lines)


def plot(records: Sequence[dict[str, Any]], out_dir: Path, t0: float) -> list[Path]:
    """Scatter of each request's TTFT and TPOT against when it started, one colour per tier."""
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    written = []
    for metric, title in (("ttft_ms", "Time to first token"), ("tpot_ms", "Time per output token")):
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for i, tier in enumerate(_plot_tiers(records)):
            pts = [(r["start"] - t0, r[metric]) for r in records
                   if r["tier"] == tier and r.get("ok") and r.get(metric) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, s=10, alpha=0.7, color=f"C{i}", label=f"{tier} (n={len(pts)})")
        values = [r[metric] for r in records if r.get("ok") and r.get(metric)]
        if values and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_yscale("log")  # tiers can differ by orders of magnitude under load
        ax.set_xlabel("request start (s since test start)")
        ax.set_ylabel(f"{metric.split('_')[0].upper()} (ms)")
        ax.set_title(title + " by tier")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        path = out_dir / f"{metric.split('_')[0]}.png"
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _plot_tiers(records: Sequence[dict[str, Any]]) -> list[str]:
    """Every tier in a fixed order, so a tier keeps its colour across plots and runs."""
    return list(TIERS) + sorted({str(r["tier"]) for r in records} - set(TIERS))


def write_report(
    log_path: Path, out_dir: Path, *, start: float, end: float, meta: dict[str, Any]
) -> list[TierReport]:
    """Read the request log and write report.json, report.md, ttft.png and tpot.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records = load_records(log_path)
    rows = build_report(records, end - start)
    meta = {**meta, "duration_s": round(end - start, 1), "requests": len(records)}
    (out_dir / "report.json").write_text(
        json.dumps({"meta": meta, "tiers": [asdict(r) for r in rows]}, indent=2) + "\n"
    )
    (out_dir / "report.md").write_text(to_markdown(rows, meta))
    plot(records, out_dir, start)
    return rows
