"""``carpool bench sla``: does interactive keep its latency when the other tiers overload the
server, and does a light tenant keep its share beside a heavy one in the same tier (issue 11)?

One command, one run, one table. It starts embedded Redis and ``carpool serve`` (the real
engine: bundled SmolLM2, or ``--model DIR``; ``--engine echo`` for the FAKE one in tests) as a
process of its own, makes one tenant per stream, and streams chat completions over HTTP from
this process (``sla_client.py``). Every request has a distinct prompt and asks for 32-64
tokens. First it calibrates capacity: output tokens/s of a closed loop at saturation, divided
by the mean tokens of a finished request, gives completions/s. Then the rows (``sla_load.py``
says how a row offers load, cuts what is left and counts tokens), each followed by a drain
that waits for the engine and the queues to empty and reads ``/metrics`` and Redis (there also
the server's fitted step-cost law, which prices what bulk can reach, ``sla_frontier.law_reach``):
  alone      interactive at ``--interactive-x`` x capacity
  overload   the same plus batch and best-effort at ``--overload-x`` x capacity in all, tiers on
  fcfs       the same offered load sent by one tenant in one tier: first come first served
  light      a light tenant alone in ``--fair-tier``
  heavy      the same plus a heavy tenant in that tier sending 10x the light one's rate
  backlog    every tier offered ``--backlog-x`` x capacity: best-effort's share vs its WRR share
  overload32 (``--small-seats N``) the overload row on a second server with --max-num-seqs N,
             warmed up first like the first server (see ``warm_up``)
``--rows`` runs some of them (e.g. ``light,heavy``, or ``alone,overload32``: naming overload32
implies ``--small-seats 32`` unless given). Then the issue's targets as ratios of these rows,
met or missed (``sla_report.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from gateway.bench.sla_client import ChatTarget
from gateway.bench.sla_load import Prompts
from gateway.bench.sla_report import (
    COLUMNS,
    Row,
    Target,
    frontier_lines,
    hygiene,
    row_cells,
    shares_line,
    table,
    targets,
    targets_table,
)
from gateway.bench.sla_server import (
    ROWS,
    SMALL_ROW,
    STREAM_TIERS,
    Bench,
    cpu_model,
    make_tenants,
    prepare,
    run_rows,
    serving,
    warm_up,
)
from gateway.bench.sla_split import budget_table
from gateway.bench.sla_sweep import main_sweep, parse_budgets
from gateway.bench.sla_targets import reach_missing, restated_targets
from policies.tiers import BATCH, BEST_EFFORT


def run(args: argparse.Namespace) -> tuple[list[Row], float]:
    """Every row of one run: (rows, capacity in completions/s)."""
    from gateway.bus.embedded import EmbeddedRedis
    from gateway.process import run_loop

    with EmbeddedRedis() as redis:
        keys = run_loop(make_tenants(redis.url, args.fair_tier))
        prompts = Prompts(args.seed)
        with serving(redis.url, args) as url:
            host, port = url.removeprefix("http://").split(":")
            bench = Bench(args, ChatTarget(host, int(port), ""), redis.url, keys, prompts)
            run_loop(prepare(bench))
            rows = run_loop(run_rows(bench))
        if SMALL_ROW in args.rows:
            with serving(redis.url, args, "--max-num-seqs", str(args.small_seats)) as url:
                bench.target.port = int(url.rsplit(":", 1)[1])
                run_loop(warm_up(bench, args.small_seats))
                rows += run_loop(run_rows(bench, overload_as=SMALL_ROW))
    return rows, bench.capacity


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="carpool bench sla", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="local HF checkpoint dir (default: SmolLM2)")
    p.add_argument("--engine", choices=("real", "echo"), default="real")
    p.add_argument("--echo-step-ms", type=float, default=20.0)
    p.add_argument("--duration", type=float, default=25.0, help="seconds each row offers load")
    p.add_argument("--grace", type=float, default=20.0,
                   help="seconds the probe requests get to finish after a row's offering")
    p.add_argument("--warmup", type=float, default=8.0,
                   help="seconds of 4 streams first (their finished calls give tokens/request)")
    p.add_argument("--calib-duration", type=float, default=20.0)
    p.add_argument("--calib-concurrency", type=int, default=64)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--interactive-x", type=float, default=0.5,
                   help="interactive rate, x capacity")
    p.add_argument("--overload-x", type=float, default=2.0,
                   help="batch + best-effort rate in the overload rows, x capacity")
    p.add_argument("--light-x", type=float, default=0.2, help="light tenant rate, x capacity")
    p.add_argument("--backlog-x", type=float, default=1.0,
                   help="each tier's rate in the backlog row, x capacity")
    p.add_argument("--fair-tier", default=BATCH, choices=tuple(STREAM_TIERS.values()),
                   help="the tier of the light and the heavy tenant")
    p.add_argument("--small-seats", type=int, default=0, metavar="N",
                   help=f"also the overload row on a server with --max-num-seqs N (e.g. 32); "
                        f"with --rows, only when it names {SMALL_ROW}")
    p.add_argument("--rows", type=_row_names, default=None, metavar="NAMES",
                   help=f"comma-separated rows to run, in the fixed order (default: all of "
                        f"{','.join(ROWS)}, and {SMALL_ROW} with --small-seats); naming "
                        f"{SMALL_ROW} implies --small-seats 32; the targets need their rows")
    p.add_argument("--tpot-budgets", type=parse_budgets, default=None, metavar="X,X,...",
                   help="instead of the rows: one server per interactive TPOT budget (x a lone "
                        "step, e.g. 1.2,1.4,1.6,1.8,2), its overload row, bulk goodput each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-log", action="store_true", help="show the server's stderr")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the figures here")
    p.add_argument("--quick", action="store_true",
                   help="tiny durations (tests; the figures mean little)")
    args = p.parse_args(argv)
    if args.rows is None:
        args.rows = ROWS + ((SMALL_ROW,) if args.small_seats else ())
    elif SMALL_ROW in args.rows and not args.small_seats:
        args.small_seats = 32
    if args.quick:
        args.duration, args.grace, args.warmup, args.echo_step_ms = 1.0, 5.0, 0.3, 10.0
        args.calib_duration, args.calib_concurrency, args.drain_timeout = 1.0, 8, 10.0
    return args


def _row_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in (*ROWS, SMALL_ROW)]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"rows are some of {','.join((*ROWS, SMALL_ROW))}, got {text!r}")
    return names


def header(args: argparse.Namespace, capacity: float, weights: Mapping[str, int]) -> str:
    return (f"carpool bench sla: {args.engine} engine ({args.model or 'bundled SmolLM2'}), "
            f"CPU {cpu_model()} x {os.cpu_count()}, streaming chat over HTTP, distinct prompts, "
            f"32-64 output tokens\ncapacity {capacity:.2f} completions/s; rows offer "
            f"{args.duration:g} s each (probe grace {args.grace:g} s); interactive "
            f"{args.interactive_x:g}x, bulk {args.overload_x:g}x, light {args.light_x:g}x "
            f"(heavy 10x that, tier {args.fair_tier}), backlog {args.backlog_x:g}x per tier; "
            f"WRR weights {dict(weights)}; FCFS row: one tenant, one tier\n"
            f"percentiles nearest-rank over the row's calls (p99 of under 100 is their max); "
            f"goodput and BE share count output tokens received in the offering window; "
            f"shed = answered at once with 429/503 and Retry-After (not in TTFT, not 5xx)")


def be_wrr_share(weights: Mapping[str, int]) -> float:
    return weights.get(BEST_EFFORT, 0) / sum(weights.values())


def report(args: argparse.Namespace, rows: list[Row], capacity: float, took_s: float) -> None:
    """Print the header, the table and the targets (and write them to ``--json``)."""
    from gateway.config import GatewayConfig

    weights = GatewayConfig.from_env().tier_weights  # the server's: it inherits this env
    print(header(args, capacity, weights) + f"; took {took_s:.0f} s\n")
    print(table(rows) + "\n")
    print("TTFT budget (server side, from each row's /metrics): where the time to first token "
          "went, per tier, p50 / p99; steps: engine steps from the worker's read to the first "
          "token, that one included\n")
    print(budget_table([(r.name, r.budget) for r in rows]) + "\n")
    for row in rows:
        if row.name == "backlog":
            print(shares_line(row, weights) + "\n")
    by_name = {r.name: r for r in rows}
    goals = restated_targets(by_name, be_wrr_share(weights)) + hygiene(rows)
    print("targets (restated on the law, issue 39):\n")
    print(targets_table(goals) + "\n")
    if (why := reach_missing(by_name)) is not None and "overload" in by_name:
        print(f"bulk goodput target not measured: {why}\n")
    ratios = [t for t in targets(by_name, be_wrr_share(weights)) if t not in goals]
    print("issue 11's ratios, for reference (docs/slo.md says which cannot hold on a CPU):\n")
    print(targets_table(ratios))
    for line in frontier_lines({r.name: r for r in rows}):
        print("\n" + line)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "capacity_rps": capacity, "columns": list(COLUMNS),
            "rows": [row_cells(r) for r in rows],
            "targets": [_target_json(t) for t in goals],
            "ratios": [_target_json(t) for t in ratios],
            "ttft_budget": {r.name: {t: dataclasses.asdict(b) for t, b in r.budget.items()}
                            for r in rows}}, indent=2))


def _target_json(t: Target) -> dict[str, object]:
    return {"what": t.what, "value": None if math.isnan(t.value) else t.value,
            "limit": t.limit, "at_most": t.at_most, "met": t.met}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tpot_budgets:
        return main_sweep(args)
    t0 = time.monotonic()
    rows, capacity = run(args)
    report(args, rows, capacity, time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
