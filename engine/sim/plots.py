"""Optional PNG plots of a run: queue depth and batch size over time, latency CDF per tier.
Drawn only where matplotlib is installed (it is not a dependency); ``write_plots`` returns
the files written, or ``[]`` without matplotlib."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.sim.metrics import RunResult


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plots(result: RunResult, out_dir: str | Path) -> list[Path]:
    if not available():
        return []
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t = [s.start for s in result.steps]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.step(t, [s.waiting for s in result.steps], where="post", label="queue depth")
    ax.step(t, [s.running for s in result.steps], where="post", label="batch size (rows)")
    ax.set_xlabel("simulated time (s)")
    ax.legend()
    fig.tight_layout()
    timeline = out / "queue_and_batch.png"
    fig.savefig(timeline)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for tier in result.tiers():
        lat = sorted(r.latency for r in result.requests if r.tier == tier)
        ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=tier)
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("fraction of requests")
    ax.legend()
    fig.tight_layout()
    cdf = out / "latency_cdf.png"
    fig.savefig(cdf)
    plt.close(fig)
    return [timeline, cdf]
