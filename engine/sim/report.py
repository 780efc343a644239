"""Plain-text tables for simulation results (the CLI prints these; tests read the numbers from
the results, not from the text)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.sim.metrics import RunResult, TierSummary


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def seconds(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f} s"


def tier_table(summaries: Sequence[TierSummary]) -> str:
    rows = [[s.tier, str(s.n), seconds(s.ttft_p50), seconds(s.ttft_p99), seconds(s.tpot_p50, 4),
             seconds(s.tpot_p99, 4), seconds(s.latency_mean), seconds(s.latency_p99)]
            for s in summaries]
    return table(["tier", "n", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "latency mean",
                  "latency p99"], rows)


def run_overview(result: RunResult) -> str:
    steps = result.steps
    busy = sum(s.seconds for s in steps)
    mean_batch = sum(s.running for s in steps) / len(steps) if steps else 0.0
    lines = [
        (f"requests {len(result.requests)}, output tokens {result.output_tokens}, "
        f"makespan {result.makespan:.2f} s, throughput {result.throughput:.1f} tok/s"),
        (f"steps {len(steps)} (busy {busy:.2f} s), mean batch {mean_batch:.1f} rows, "
        f"max queue depth {max((s.waiting for s in steps), default=0)}, "
        f"preemptions {result.preemptions}"),
    ]
    return "\n".join(lines)
