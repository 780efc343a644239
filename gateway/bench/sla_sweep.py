"""``carpool bench sla --tpot-budgets 1.2,1.4,...``: how bulk goodput moves with interactive's
TPOT budget (``TierSLO.tpot_budget_x``, a multiple of a lone step).

One row per budget: a server of its own started with ``--tier-slos
'interactive=tpot_budget:X'``, warmed up like the first server, then the overload row. The
alone row (interactive alone: no lower row shares its steps, so the budget does not bind it)
runs once, on the first server, which also calibrates capacity. Each row prints the TPOT
target the worker derived from the budget, interactive's TPOT p50 against it, its TTFT p99,
the bulk goodput and the law's reach within that budget.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.bench.sla_report import Row, server_reach
from gateway.bench.sla_targets import bulk_reach

SWEEP_COLUMNS = ("TPOT budget x lone step", "TPOT target ms", "int. TPOT p50 ms",
                 "int. TPOT p50 / target", "int. TTFT p99 ms", "int. TTFT p99 steps",
                 "bulk goodput tok/s", "law's reach tok/s", "goodput / reach")


@dataclass(frozen=True)
class SweepRow:
    budget_x: float
    row: Row  # the overload row on that budget's server


def parse_budgets(text: str) -> tuple[float, ...]:
    """``"1.2,1.4"`` -> (1.2, 1.4): each a multiple of a lone step in [1, 10]."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"budgets are numbers, got {text!r}") from exc
    if not values or any(not 1.0 <= v <= 10.0 for v in values):
        raise argparse.ArgumentTypeError(f"budgets are multiples of a lone step in [1, 10], "
                                         f"got {text!r}")
    return values


def sweep_cells(alone: Row, item: SweepRow, fcfs: Row | None) -> list[str]:
    """One table line: the budget, what the worker made of it, and what bulk got."""
    over = item.row
    target_ms = (over.tpot_target_s or math.nan) * 1000
    tpot = over.tpot_ms("interactive", 0.5)
    reach = math.nan
    if fcfs is not None:
        alone_tpot = alone.tpot_ms("interactive", 0.5)
        got = server_reach({"alone": alone, "overload": over, "fcfs": fcfs},
                           target_ms / alone_tpot) if alone_tpot > 0 else None
        reach = bulk_reach(got.bulk_tokens_s, {"fcfs": fcfs}) if got is not None else math.nan
    return [f"{item.budget_x:g}", _f(target_ms), _f(tpot), _f(tpot / target_ms, 2),
            _f(over.ttft_ms("interactive", 0.99)), _f(over.ttft_steps_p99()),
            _f(over.bulk_goodput, 1), _f(reach, 1), _f(over.bulk_goodput / reach, 2)]


def sweep_table(alone: Row, items: Sequence[SweepRow], fcfs: Row | None) -> str:
    lines = ["| " + " | ".join(SWEEP_COLUMNS) + " |", "|" + "---|" * len(SWEEP_COLUMNS)]
    lines += ["| " + " | ".join(sweep_cells(alone, i, fcfs)) + " |" for i in items]
    return "\n".join(lines)


def _f(x: float, digits: int = 0) -> str:
    return "-" if math.isnan(x) or math.isinf(x) else f"{x:,.{digits}f}"


def run_sweep(args: argparse.Namespace) -> tuple[Row, Row, list[SweepRow], float]:
    """The alone and FCFS rows on a first server (which calibrates), then the overload row on
    a server per budget: (alone, fcfs, the budgets' rows, capacity)."""
    from gateway.bench import sla_server as sla  # the bench's servers and rows
    from gateway.bench.sla_client import ChatTarget
    from gateway.bench.sla_load import Prompts
    from gateway.bus.embedded import EmbeddedRedis
    from gateway.process import run_loop

    with EmbeddedRedis() as redis:
        keys = run_loop(sla.make_tenants(redis.url, args.fair_tier))
        args.rows = ("alone", "fcfs")
        with sla.serving(redis.url, args) as url:
            host, port = url.removeprefix("http://").split(":")
            bench = sla.Bench(args, ChatTarget(host, int(port), ""), redis.url, keys,
                              Prompts(args.seed))
            run_loop(sla.prepare(bench))
            alone, fcfs = run_loop(sla.run_rows(bench))
        items = []
        for x in args.tpot_budgets:
            with sla.serving(redis.url, args, "--tier-slos",
                             f"interactive=tpot_budget:{x:g}") as url:
                bench.target.port = int(url.rsplit(":", 1)[1])
                run_loop(sla.warm_up(bench, args.calib_concurrency))
                [row] = run_loop(sla.run_rows(bench, overload_as=f"overload at {x:g}x"))
                items.append(SweepRow(x, row))
                print(sweep_table(alone, items[-1:], fcfs).splitlines()[-1], flush=True)
    return alone, fcfs, items, bench.capacity


def main_sweep(args: argparse.Namespace) -> int:
    from gateway.bench.sla_server import cpu_model

    alone, fcfs, items, capacity = run_sweep(args)
    print(f"carpool bench sla --tpot-budgets: {args.engine} engine "
          f"({args.model or 'bundled SmolLM2'}), CPU {cpu_model()}; capacity "
          f"{capacity:.2f} completions/s, rows of {args.duration:g} s")
    print(f"interactive alone: TPOT p50 {alone.tpot_ms('interactive', 0.5):.0f} ms, TTFT p99 "
          f"{alone.ttft_ms('interactive', 0.99):.0f} ms; FCFS bulk goodput "
          f"{fcfs.bulk_goodput:.1f} tok/s; one server per budget, its overload row:\n")
    print(sweep_table(alone, items, fcfs))
    return 0
