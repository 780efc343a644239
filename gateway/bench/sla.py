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
import asyncio
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.bench.sla_client import ChatTarget, metric_sum, parse_metrics
from gateway.bench.sla_load import Prompts, Stream, calibrate, run_row, tokens_per_request
from gateway.bench.sla_report import (
    COLUMNS,
    Row,
    frontier_lines,
    row_cells,
    shares_line,
    table,
    targets,
    targets_table,
)
from policies.tiers import BATCH, BEST_EFFORT, INTERACTIVE

SECRET = "bench-sla-secret"
NAMESPACE = "sla"
# stream -> tier its tenant may use ("light" and "heavy" get --fair-tier; "fcfs" sends all)
STREAM_TIERS = {"interactive": INTERACTIVE, "batch": BATCH, "best-effort": BEST_EFFORT}
# the rows of one server, in the order they run (``--rows`` picks some)
ROWS = ("alone", "overload", "fcfs", "light", "heavy", "backlog")
SMALL_ROW = "overload32"  # the overload row on the second, small-seat server


@dataclass
class Bench:
    args: argparse.Namespace
    target: ChatTarget
    redis_url: str
    keys: dict[str, str]  # stream name -> API key of its tenant
    prompts: Prompts
    capacity: float = 0.0  # completions/s at saturation

    def stream(self, name: str, rate: float, probe: bool = False, tier: str | None = None,
               key: str | None = None) -> Stream:
        tier = tier or STREAM_TIERS.get(name, self.args.fair_tier)
        return Stream(name, key or self.keys[name], tier, rate, probe)

    async def row(self, name: str, streams: list[Stream], duration: float) -> Row:
        before = await self.metrics()
        run = await run_row(self.target, self.prompts, streams, duration, self.args.grace)
        cut_at = time.perf_counter()
        kv_used, left, after = await self.drain()
        return Row(name, run, cut_at, kv_used, left,
                   metric_sum(after, "carpool_requests_total")
                   - metric_sum(before, "carpool_requests_total"), await self.step_law())

    async def step_law(self) -> dict[str, float] | None:
        """The server's fitted step-cost law now (its worker's tier status; None while its
        model is cold): the steps of the row just run are the last in its window."""
        from gateway.bus.client import redis_client
        from gateway.bus.keys import RedisKeys
        from gateway.http.shedding import read_statuses, step_costs

        client = redis_client(self.redis_url)
        try:
            laws = step_costs(await read_statuses(client, RedisKeys(NAMESPACE)))
        finally:
            await client.aclose()
        return next(iter(laws.values()), None)

    async def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        from gateway.bench.client import LeanClient

        client = LeanClient(self.target.host, self.target.port)
        try:
            return parse_metrics((await client.get("/metrics")).body.decode())
        finally:
            await client.aclose()

    async def drain(self) -> tuple[float, int, dict[str, list[tuple[dict[str, str], float]]]]:
        """Wait (up to --drain-timeout) for an idle engine and empty queues, then one more
        metrics sample: (KV blocks used, queue entries left, the metrics)."""
        deadline = time.monotonic() + self.args.drain_timeout
        while True:
            await asyncio.sleep(1.1)  # the server samples its engine gauges every second
            m = await self.metrics()
            busy = metric_sum(m, "carpool_engine_requests")
            left = await queue_entries(self.redis_url, NAMESPACE)
            if (busy == 0 and left == 0) or time.monotonic() > deadline:
                return metric_sum(m, "carpool_kv_blocks", state="used"), left, m


async def queue_entries(redis_url: str, ns: str) -> int:
    """Entries in every queue stream of namespace ``ns`` (queued + running ones)."""
    from gateway.bus.client import redis_client

    client = redis_client(redis_url)
    try:
        total = 0
        async for key in client.scan_iter(match=f"{ns}:*:q:*", _type="stream"):
            total += int(await client.xlen(key))
        return total
    finally:
        await client.aclose()


async def make_tenants(redis_url: str, fair_tier: str) -> dict[str, str]:
    """One tenant per stream, each allowed only its tier; ``fcfs`` sends every stream's
    requests of the FCFS row in one tier (interactive). Returns stream -> key."""
    from gateway.bus.client import redis_client
    from gateway.bus.keys import RedisKeys
    from gateway.tenancy.tenants import Tenant, TenantQuota, TenantStore

    tiers = {**STREAM_TIERS, "light": fair_tier, "heavy": fair_tier, "fcfs": INTERACTIVE,
             "calibration": BATCH}
    client = redis_client(redis_url)
    store = TenantStore(client, RedisKeys(NAMESPACE), SECRET.encode())
    keys = {}
    try:
        for name, tier in tiers.items():
            tid = f"sla-{name}"
            await store.put(Tenant(tid, f"bench sla ({name})",
                                   TenantQuota(allowed_tiers=(tier,), default_tier=tier)))
            keys[name], _ = await store.issue_key(tid)
    finally:
        await client.aclose()
    return keys


async def run_rows(bench: Bench, small_seats: bool = False) -> list[Row]:
    """The rows on one server (``small_seats``: only the overload row, named overload32)."""
    a, cap = bench.args, bench.capacity
    inter = bench.stream("interactive", a.interactive_x * cap, probe=True)
    bulk = [bench.stream("batch", a.overload_x * cap / 2),
            bench.stream("best-effort", a.overload_x * cap / 2)]
    if small_seats:
        return [await bench.row("overload32", [inter, *bulk], a.duration)]
    fcfs = [bench.stream(s.name, s.rate, s.probe, INTERACTIVE, bench.keys["fcfs"])
            for s in (inter, *bulk)]
    light = bench.stream("light", a.light_x * cap, probe=True)
    plan = {"alone": [inter], "overload": [inter, *bulk], "fcfs": fcfs, "light": [light],
            "heavy": [light, bench.stream("heavy", 10 * light.rate)],
            "backlog": [bench.stream(n, a.backlog_x * cap, probe=n == "interactive")
                        for n in STREAM_TIERS]}
    return [await bench.row(name, streams, a.duration) for name, streams in plan.items()
            if name in a.rows]


async def prepare(bench: Bench) -> None:
    """Learn the served model's name, warm the engine up, calibrate capacity, drain."""
    from gateway.bench.client import LeanClient

    client = LeanClient(bench.target.host, bench.target.port,
                        {"Authorization": f"Bearer {bench.keys['calibration']}"})
    try:
        bench.target.model = (await client.get("/v1/models")).json()["data"][0]["id"]
    finally:
        await client.aclose()
    key, concurrency = bench.keys["calibration"], bench.args.calib_concurrency
    await calibrate(bench.target, bench.prompts, key, BATCH, 4, bench.args.warmup)
    tok_s = await calibrate(bench.target, bench.prompts, key, BATCH, concurrency,
                            bench.args.calib_duration)
    mean, finished = tokens_per_request(bench.target.calls, bench.prompts)
    bench.capacity = tok_s / mean
    print(f"capacity: {tok_s:.1f} output tokens/s at concurrency {concurrency}, {mean:.1f} "
          f"tokens a request (from {finished} finished) -> {bench.capacity:.2f} completions/s",
          flush=True)
    await bench.drain()


async def warm_up(bench: Bench, seats: int) -> None:
    """Serve the calibration tenant first as ``prepare`` does on the first server (4 streams,
    then a closed loop on every seat, ``--warmup`` s each), then drain: the small-seat row is
    then measured on a server that has run, like the overload row it is compared with (a
    fresh one pays its first steps' set-up and a step-cost model still learning)."""
    key, warmup = bench.keys["calibration"], bench.args.warmup
    await calibrate(bench.target, bench.prompts, key, BATCH, 4, warmup)
    await calibrate(bench.target, bench.prompts, key, BATCH, seats, warmup)
    await bench.drain()


@contextlib.contextmanager
def serving(redis_url: str, args: argparse.Namespace, *extra: str) -> Iterator[str]:
    """A ``carpool serve`` process (its own, real or echo engine) on a free port."""
    from gateway.bench.gateway import wait_ready
    from gateway.process import child_env, free_port, stop_children

    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli.main", "serve", "--port", str(port), "--no-demo",
           "--namespace", NAMESPACE, "--engine", args.engine, *extra]
    if args.model:
        cmd += ["--model", args.model]
    if args.engine == "echo":
        cmd += ["--echo-step-ms", str(args.echo_step_ms)]
    env = child_env(REDIS_URL=redis_url, CARPOOL_SECRET=SECRET)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=None if args.server_log else subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout=300)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_children([proc])


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
                rows += run_loop(run_rows(bench, small_seats=True))
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


def cpu_model() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5,
                             check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def be_wrr_share(weights: Mapping[str, int]) -> float:
    return weights.get(BEST_EFFORT, 0) / sum(weights.values())


def report(args: argparse.Namespace, rows: list[Row], capacity: float, took_s: float) -> None:
    """Print the header, the table and the targets (and write them to ``--json``)."""
    from gateway.config import GatewayConfig

    weights = GatewayConfig.from_env().tier_weights  # the server's: it inherits this env
    print(header(args, capacity, weights) + f"; took {took_s:.0f} s\n")
    print(table(rows) + "\n")
    for row in rows:
        if row.name == "backlog":
            print(shares_line(row, weights) + "\n")
    goals = targets({r.name: r for r in rows}, be_wrr_share(weights))
    print(targets_table(goals))
    for line in frontier_lines({r.name: r for r in rows}):
        print("\n" + line)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "capacity_rps": capacity, "columns": list(COLUMNS),
            "rows": [row_cells(r) for r in rows],
            "targets": [{"what": t.what, "value": None if math.isnan(t.value) else t.value,
                         "limit": t.limit, "at_most": t.at_most, "met": t.met}
                        for t in goals]}, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    rows, capacity = run(args)
    report(args, rows, capacity, time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
