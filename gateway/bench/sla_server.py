"""The servers and rows of ``carpool bench sla`` (``sla.py``) and of its TPOT budget sweep
(``sla_sweep.py``): embedded Redis's tenants, a ``carpool serve`` process, its calibration and
warm-up, and the rows run through it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from redis.exceptions import RedisError

from gateway.bench.sla_client import ChatTarget, metric_sum, parse_metrics
from gateway.bench.sla_load import Prompts, Stream, calibrate, run_row, tokens_per_request
from gateway.bench.sla_report import Row
from gateway.bench.sla_split import gained, preemptions, tier_budget
from gateway.bench.sla_targets import held_target
from gateway.worker.urgent_demand import WINDOW_S as DEMAND_WINDOW_S
from policies.tiers import BATCH, BEST_EFFORT, INTERACTIVE

SECRET = "bench-sla-secret"
NAMESPACE = "sla"
# stream -> tier its tenant may use ("light" and "heavy" get --fair-tier; "fcfs" sends all)
STREAM_TIERS = {"interactive": INTERACTIVE, "batch": BATCH, "best-effort": BEST_EFFORT}
# the rows of one server, in the order they run (``--rows`` picks some)
ROWS = ("alone", "overload", "fcfs", "light", "heavy", "backlog")
SMALL_ROW = "overload32"  # the overload row on the second, small-seat server
TARGET_SAMPLE_S = 1.0  # how often a row reads the TPOT target in force (the status's period)


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
        targets: list[tuple[float, float]] = []
        sampler = asyncio.create_task(self.sample_tpot_target(targets))
        try:
            run = await run_row(self.target, self.prompts, streams, duration, self.args.grace)
        finally:
            sampler.cancel()
        cut_at = time.perf_counter()
        kv_used, left, after = await self.drain()
        d = gained(before, after)
        budgets = {t: b for t in (*STREAM_TIERS.values(),) if (b := tier_budget(d, t))}
        return Row(name, run, cut_at, kv_used, left,
                   metric_sum(after, "carpool_requests_total")
                   - metric_sum(before, "carpool_requests_total"), await self.step_law(),
                   budgets, preemptions(d),
                   held_target(targets, run.start + DEMAND_WINDOW_S, run.end))

    async def sample_tpot_target(self, into: list[tuple[float, float]]) -> None:
        """Append (``time.perf_counter()``, interactive's TPOT target in force) every
        TARGET_SAMPLE_S while the row runs. Why not once after the drain: a derived target follows interactive's demand
        (its step alone at the rate it asks), and with no demand left after the drain it is
        the small step's (bench sla at 0.5x capacity: 114 ms read after the row against
        115-180 ms held while it ran)."""
        while True:
            try:
                target = await self.tpot_target()
            except (OSError, RedisError):  # a read lost to a busy server: the next one counts
                target = None
            if target is not None:
                into.append((time.perf_counter(), target))
            await asyncio.sleep(TARGET_SAMPLE_S)

    async def tpot_target(self) -> float | None:
        """Interactive's TPOT target the server's worker holds now (configured or derived)."""
        from gateway.bus.client import redis_client
        from gateway.bus.keys import RedisKeys
        from gateway.http.shedding import read_statuses

        client = redis_client(self.redis_url)
        try:
            statuses = await read_statuses(client, RedisKeys(NAMESPACE))
        finally:
            await client.aclose()
        for status in statuses:
            tpot = (status.get("tiers") or {}).get(INTERACTIVE, {}).get("tpot_p99_s")
            if tpot:
                return float(tpot)
        return None

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


async def run_rows(bench: Bench, overload_as: str | None = None) -> list[Row]:
    """The rows on one server (``overload_as``: only the overload row, by that name)."""
    a, cap = bench.args, bench.capacity
    inter = bench.stream("interactive", a.interactive_x * cap, probe=True)
    bulk = [bench.stream("batch", a.overload_x * cap / 2),
            bench.stream("best-effort", a.overload_x * cap / 2)]
    if overload_as is not None:
        return [await bench.row(overload_as, [inter, *bulk], a.duration)]
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


def cpu_model() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5,
                             check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"
